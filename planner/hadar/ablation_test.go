package hadar_test

import (
	"context"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

// Every ablation of docs/results.md runs a contested trace to the end in
// both fidelities, never placing more GPUs than are free (the engine
// refuses such a plan), and flat prices change decisions.
func TestAblationsCompleteEveryJob(t *testing.T) {
	c, err := planner.ParseClusterSpec("v100=8,p100=8,k80=8", 4)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: 40, RatePerHour: 6, Seed: 2, Profile: profile.Default(), Reference: "v100"})
	if err != nil {
		t.Fatal(err)
	}
	for _, fid := range []sim.Fidelity{sim.Improved, sim.Gavel} {
		restarts := map[string]int{}
		for _, name := range []string{"hadar", "hadar:flat", "hadar:nobackfill", "hadar:flat:nobackfill", "hadar:noguide", "hadar:nodeprices", "hadar-jct:flat", "hadare:flat"} {
			model := speed.Model{Profile: profile.Default(), IgnoreSpread: fid == sim.Gavel}
			s, err := registry.New(name, registry.Options{Types: c.Types(), Speed: model, RestartCost: 20, MergeCost: 10, GavelFidelity: fid == sim.Gavel})
			if err != nil {
				t.Fatal(err)
			}
			res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: model, Fidelity: fid, RestartCost: 20, MergeCost: 10}, s)
			if err != nil {
				t.Fatalf("%s/%s: %v", fid, name, err)
			}
			if res.Completed != len(jobs) {
				t.Fatalf("%s/%s: %d of %d jobs completed", fid, name, res.Completed, len(jobs))
			}
			for _, j := range res.Jobs {
				restarts[name] += j.Restarts
			}
		}
		if restarts["hadar"] == restarts["hadar:flat"] {
			t.Errorf("%s: flat prices left the restarts unchanged (%d): prices do not matter", fid, restarts["hadar"])
		}
	}
}
