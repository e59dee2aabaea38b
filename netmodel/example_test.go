package netmodel_test

import (
	"fmt"
	"log"
	"os"
	"time"

	"github.com/hadar-sched/hadar/netmodel"
)

// How the simulator prices placements: calibrate once, build a job from
// its throughput profile, price candidates.
func Example() {
	f, err := os.Open("testdata/gavel/simulation_throughputs.json")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	data, err := netmodel.LoadGavelThroughputs(f)
	if err != nil {
		log.Fatal(err)
	}
	rep, err := netmodel.Calibrate(data, netmodel.DefaultCalibrationConfig())
	if err != nil {
		log.Fatal(err)
	}
	tp, err := netmodel.LoadTopologyFile("examples/time-varying.json")
	if err != nil {
		log.Fatal(err)
	}
	const model = "Transformer (batch size 64)"
	job, err := rep.Job(model, 4, map[string]float64{
		"v100": data.Tables["v100"][netmodel.GavelKey{Model: model, SF: 4}],
		"p100": data.Tables["p100"][netmodel.GavelKey{Model: model, SF: 4}],
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range []struct {
		name string
		p    netmodel.Placement
		at   time.Duration
	}{
		{"one node", netmodel.Placement{{Node: "v100-0", GPU: 0}, {Node: "v100-0", GPU: 1}, {Node: "v100-0", GPU: 2}, {Node: "v100-0", GPU: 3}}, 0},
		{"one rack", netmodel.Placement{{Node: "v100-0", GPU: 0}, {Node: "v100-1", GPU: 0}, {Node: "v100-2", GPU: 0}, {Node: "v100-0", GPU: 1}}, 0},
		{"three racks, quiet", netmodel.Placement{{Node: "v100-0", GPU: 0}, {Node: "v100-3", GPU: 0}, {Node: "v100-6", GPU: 0}, {Node: "v100-0", GPU: 1}}, time.Hour},
		{"three racks, busy", netmodel.Placement{{Node: "v100-0", GPU: 0}, {Node: "v100-3", GPU: 0}, {Node: "v100-6", GPU: 0}, {Node: "v100-0", GPU: 1}}, 5 * time.Hour},
	} {
		pr, err := tp.Price(&job, c.p, c.at)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-18s %-10s %5.2f steps/s  slowdown %.2f\n", c.name, pr.Locality, pr.Throughput, pr.Slowdown)
	}
	// Output:
	// one node           same-node  19.66 steps/s  slowdown 1.00
	// one rack           same-rack   9.87 steps/s  slowdown 1.99
	// three racks, quiet cross-rack  9.86 steps/s  slowdown 1.99
	// three racks, busy  cross-rack  2.53 steps/s  slowdown 7.76
}
