package engine_test

import (
	"context"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/speed"
)

// TestWaitingJobTakesTheGPUsAFinishedJobLeft is issue 32 item 8a's
// workload: three 2-worker jobs under gavel-maxmin in 30 s rounds, with
// a 30-minute minimum run time, on one node of 2 V100s and 2 K80s. Two
// run, one on each type; the third waits. When the job on the V100s
// completes, the next boundary starts the third there. On e516909 it did
// not: Gavel's choice pass, planning as if the job on the K80s (pinned by
// its minimum run time) could move, gave that job the V100s, which it had
// never run on (priority +Inf, the lower index first among ties), and the
// waiting job the K80s; the engine kept the pinned job where it was and
// the waiting one waited ("the GPUs the policy gave it are kept by a job
// within its minimum run time: it waits") with both V100s idle until the
// other job ended. Fixed by 6c07d2c (pins as constraints).
func TestWaitingJobTakesTheGPUsAFinishedJobLeft(t *testing.T) {
	ctx := context.Background()
	types := []planner.GPUType{"k80", "v100"}
	sp := speed.Model{Profile: profile.Default()}
	sched, err := registry.New("gavel-maxmin", registry.Options{Types: types, Speed: sp})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Round: 30, MinRunTime: 1800, Speed: sp}, sched)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetNodes([]planner.Node{{ID: "dev", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 2, "k80": 2}}}, 0); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ddp-a", "ddp-b", "ddp-c"} {
		if err := e.Admit(job(id, 2, 1e7), 0); err != nil {
			t.Fatal(err)
		}
	}
	on := map[string]planner.GPUType{} // the type each running job runs on
	var waiting string
	d, err := e.Plan(ctx, 0, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	for _, jd := range d.Jobs {
		switch jd.Action {
		case engine.Start:
			on[jd.Job] = jd.To.Units[0].Slots[0].Type
		case engine.Wait:
			waiting = jd.Job
		}
	}
	if len(on) != 2 || waiting == "" {
		t.Fatalf("at 0 s: %v; want two jobs started and one waiting", actions(d))
	}
	var onV100 string
	for id, ty := range on {
		if ty == "v100" {
			onV100 = id
		}
	}
	if onV100 == "" {
		t.Fatalf("at 0 s: no job on the V100s (%v)", on)
	}
	// Rounds go by; the one on the V100s completes between two boundaries.
	at := 0.0
	for ; at < 300; at += 30 {
		if d, err = e.Plan(ctx, at, engine.Boundary); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Complete(onV100, at-15); err != nil {
		t.Fatal(err)
	}
	// Whether or not a fill runs before it, the next boundary starts the
	// waiting job, on the V100s the finished job left.
	if d, err = e.Plan(ctx, at, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	for _, jd := range d.Jobs {
		if jd.Job == waiting && (jd.Action != engine.Start || jd.To.Units[0].Slots[0].Type != "v100") {
			t.Fatalf("at %v s, the V100s idle since %v s: %s %s (%s); want it started on the V100s", at, at-15, waiting, jd.Action, jd.Reason.Why)
		}
		if jd.Job != waiting && jd.Action != engine.Keep {
			t.Fatalf("at %v s: %s %s (%s); want it kept within its minimum run time", at, jd.Job, jd.Action, jd.Reason.Why)
		}
	}
}
