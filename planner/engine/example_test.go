package engine_test

import (
	"context"
	"fmt"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/speed"
)

// The loop a live caller (the sidecar) runs: build the estimates and a
// scheduler on them, tell the engine what the cluster is and which jobs
// arrived, plan, carry the decision out, report progress, plan again.
func Example() {
	est, _ := engine.NewEstimates(profile.Default(), engine.LearnConfig{On: true})
	model := speed.Model{Profile: est}
	sched, _ := registry.New("gavel-maxmin", registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: model})
	e, _ := engine.New(engine.Config{Round: 360, Speed: model}, sched)

	ctx := context.Background()
	e.SetNodes([]planner.Node{
		{ID: "node-1", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "node-2", Rack: "r2", GPUs: map[planner.GPUType]int{"k80": 4}},
	}, 0)
	e.Admit(planner.Job{ID: "resnet", Model: "ResNet-18 (batch size 16)", ScaleFactor: 4, TotalSteps: 50000, Weight: 1}, 0)
	e.Admit(planner.Job{ID: "lm", Model: "LM (batch size 20)", ScaleFactor: 4, TotalSteps: 20000, Weight: 1}, 0)

	d, _ := e.Plan(ctx, 0, engine.Boundary)
	for _, jd := range d.Changes() {
		fmt.Println(jd.Job, jd.Action, jd.To.Units[0].Slots[0].Node)
	}

	// Progress as measured; a job that finishes leaves; capacity changes.
	e.Progress("resnet", 12000, 300)
	e.Complete("lm", 330)
	d, _ = e.Plan(ctx, 330, engine.Fill) // something changed: a fill runs
	fmt.Println(d.Kind, len(d.Changes()))
	d, _ = e.Plan(ctx, 360, engine.Boundary)
	fmt.Println(d.Jobs[0].Job, d.Jobs[0].Action)
	// Max-min fairness gives the V100s to the job they speed up most (lm);
	// once lm is done, resnet moves to them at the next round boundary.
	//
	// Output:
	// resnet start node-2
	// lm start node-1
	// fill 0
	// resnet move
}
