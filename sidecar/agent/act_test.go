package agent

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/jobform"
)

func onGPUs(slots ...planner.Slot) planner.Placement {
	return planner.Placement{Units: []planner.Unit{{Slots: slots}}}
}

// A job is written after another only when its new workers sit on GPUs the
// other gives up in the same decision.
func TestStartsWaitOnlyForTheGPUsTheyTake(t *testing.T) {
	leaves := engine.JobDecision{Job: "x", Action: engine.Stop, From: onGPUs(planner.Slot{Node: "n1", Type: "p100", Count: 2})}
	shrinks := engine.JobDecision{Job: "z", Action: engine.Move,
		From: onGPUs(planner.Slot{Node: "n2", Type: "v100", Count: 2}),
		To:   onGPUs(planner.Slot{Node: "n2", Type: "v100", Count: 1}, planner.Slot{Node: "n3", Type: "k80", Count: 1})}
	fresh := func(node string, typ planner.GPUType) []jobform.Unit {
		return []jobform.Unit{{ID: 0, Workers: []jobform.Worker{{Node: "n9", Type: "k80"}, {Node: node, Type: typ}}}}
	}
	tests := []struct {
		name  string
		jd    engine.JobDecision
		fresh []jobform.Unit
		want  bool
	}{
		{"the GPUs a stopped job leaves", leaves, fresh("n1", "p100"), true},
		{"another type on the same node", leaves, fresh("n1", "v100"), false},
		{"the same type on another node", leaves, fresh("n4", "p100"), false},
		{"the GPU a move gives up", shrinks, fresh("n2", "v100"), true},
		{"where a move goes, not what it leaves", shrinks, fresh("n3", "k80"), false},
	}
	for _, tc := range tests {
		if got := takesFrom(tc.fresh, released(tc.jd)); got != tc.want {
			t.Errorf("%s: waits %v, want %v (released %v)", tc.name, got, tc.want, released(tc.jd))
		}
	}
}
