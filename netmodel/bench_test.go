package netmodel

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkIterationTime prices one candidate placement of N workers on
// the time-varying example cluster, spread over as many nodes and racks as
// N needs (the slow path: every hop crosses the network).
func BenchmarkIterationTime(b *testing.B) {
	tp, err := LoadTopologyFile(filepath.Join("examples", "time-varying.json"))
	if err != nil {
		b.Fatal(err)
	}
	job := &JobComm{Name: "bench", Bytes: 1e8, Overlap: 0.4, Compute: map[string]float64{"v100": 0.05, "p100": 0.08, "k80": 0.2}}
	nodes := tp.Nodes()
	for _, n := range []int{1, 2, 4, 8, 16, 32, 64} {
		var p Placement
		for i := 0; i < n; i++ {
			p = append(p, Worker{nodes[(i*7)%len(nodes)].ID, i / len(nodes)})
		}
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tp.IterationTime(job, p, 5*time.Hour); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSensitivity(b *testing.B) {
	tp, err := LoadTopologyFile(filepath.Join("examples", "uncongested.json"))
	if err != nil {
		b.Fatal(err)
	}
	job := &JobComm{Name: "bench", Bytes: 1e8, Overlap: 0.4, Compute: map[string]float64{"v100": 0.05}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tp.Sensitivity(job, "v100", 8); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCalibrate(b *testing.B) {
	data := loadGavel(b)
	cfg := DefaultCalibrationConfig()
	for b.Loop() {
		if _, err := Calibrate(data, cfg); err != nil {
			b.Fatal(err)
		}
	}
}
