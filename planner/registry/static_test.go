package registry

import (
	"context"
	"fmt"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

// Hadar's objective is the makespan: on issue 35's static check (100 jobs
// at t=0) it finishes no later than gavel-makespan, with and without a
// minimum run time. Its tenancy (running jobs keep their GPUs beyond their
// commitments) once held GPUs the makespan's critical jobs needed: 34,805
// s against gavel-makespan's 32,620 s with no minimum run time.
func TestHadarStaticMakespanAtMostGavels(t *testing.T) {
	jobs, err := trace.Load("../trace/testdata/static-100.csv")
	if err != nil {
		t.Fatal(err)
	}
	c, err := planner.ParseClusterSpec("v100=36,p100=36,k80=36", 4)
	if err != nil {
		t.Fatal(err)
	}
	model := speed.Model{Profile: profile.Default()}
	for _, minRun := range []float64{0, 1800} {
		t.Run(fmt.Sprintf("min-run-time=%.0fs", minRun), func(t *testing.T) {
			o := Options{Types: c.Types(), Speed: model, RestartCost: 20, MinRunTime: minRun}
			if minRun == 0 {
				o.MinRunTime = -1 // none
			}
			makespan := map[string]float64{}
			for _, name := range []string{"gavel-makespan", "hadar"} {
				s, err := New(name, o)
				if err != nil {
					t.Fatal(err)
				}
				res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: model, RestartCost: 20, MinRunTime: minRun}, s)
				if err != nil {
					t.Fatal(err)
				}
				if res.Completed != len(jobs) {
					t.Fatalf("%s: %d of %d jobs completed", name, res.Completed, len(jobs))
				}
				makespan[name] = res.Makespan
			}
			if makespan["hadar"] > makespan["gavel-makespan"] {
				t.Fatalf("hadar's makespan %.0f s; want at most gavel-makespan's %.0f s", makespan["hadar"], makespan["gavel-makespan"])
			}
			t.Logf("hadar %.0f s, gavel-makespan %.0f s", makespan["hadar"], makespan["gavel-makespan"])
		})
	}
}
