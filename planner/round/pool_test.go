package round

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

func TestFitsPlacement(t *testing.T) {
	pool := NewPool(planner.Cluster{Nodes: []planner.Node{
		{ID: "a", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "b", GPUs: map[planner.GPUType]int{"v100": 2, "k80": 8}},
	}})
	unit := func(node string, t planner.GPUType, n int) planner.Unit {
		return planner.Unit{Slots: []planner.Slot{{Node: node, Type: t, Count: n}}}
	}
	for _, c := range []struct {
		name string
		p    planner.Placement
		want bool
	}{
		{"empty fits nothing", planner.Placement{}, false},
		{"one unit", planner.Placement{Units: []planner.Unit{unit("a", "v100", 4)}}, true},
		{"units together beyond a node", planner.Placement{Units: []planner.Unit{unit("a", "v100", 3), unit("a", "v100", 2)}}, false},
		{"units on two nodes", planner.Placement{Units: []planner.Unit{unit("a", "v100", 3), unit("b", "v100", 2)}}, true},
		{"node not offered", planner.Placement{Units: []planner.Unit{unit("c", "v100", 1)}}, false},
		{"type the node lacks", planner.Placement{Units: []planner.Unit{unit("a", "k80", 1)}}, false},
	} {
		if got := pool.FitsPlacement(c.p); got != c.want {
			t.Errorf("%s: FitsPlacement = %v, want %v", c.name, got, c.want)
		}
	}
	// Asking takes nothing.
	if got := pool.Free("a", "v100"); got != 4 {
		t.Errorf("free v100 on a after the checks = %d, want 4", got)
	}
}
