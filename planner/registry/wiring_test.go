package registry

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Without queues the scheduler is Build's, its placer returned; with them
// it is the queues' scheduler, without a placer; an error says so, with no
// scheduler.
func TestScheduler(t *testing.T) {
	o := Options{Types: []planner.GPUType{"v100"}, Speed: speed.Model{Profile: profile.Default()}}
	s, pl, err := Scheduler("hadar", placement.Delay, nil, o, placement.Config{})
	if err != nil || s == nil || pl == nil {
		t.Fatalf("alone: %v, %v, %v", s, pl, err)
	}
	want, _, _ := Build("hadar", placement.Delay, o, placement.Config{})
	if s.Name() != want.Name() {
		t.Fatalf("alone: %q, Build makes %q", s.Name(), want.Name())
	}
	qc := queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1}}}
	s, pl, err = Scheduler("gavel-maxmin", placement.Delay, &qc, o, placement.Config{})
	if err != nil || pl != nil {
		t.Fatalf("queues: placer %v, %v", pl, err)
	}
	if _, ok := s.(*queue.Scheduler); !ok || s.Name() != "queues(gavel-maxmin)" {
		t.Fatalf("queues: %T %q", s, s.Name())
	}
	if s, _, err := Scheduler("nope", placement.Pack, &qc, o, placement.Config{}); err == nil || s != nil {
		t.Fatalf("an unknown policy in queues: %v, %v", s, err)
	}
}

// A live minimum run time of 0 is none (negative) for the scheduler and
// the placer alike; any other is passed on as it is.
func TestLive(t *testing.T) {
	o, pc := Live(speed.Model{}, 0, 5, 2)
	if o.MinRunTime != -1 || pc.MinRunTime != -1 || o.RestartCost != 5 || pc.RestartCost != 5 || o.MergeCost != 2 {
		t.Fatalf("none: %+v, %+v", o, pc)
	}
	o, pc = Live(speed.Model{}, 15, 5, 2)
	if o.MinRunTime != 15 || pc.MinRunTime != 15 {
		t.Fatalf("15 s: %+v, %+v", o, pc)
	}
}
