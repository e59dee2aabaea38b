package round

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

func twoTypeCluster() planner.Cluster {
	return planner.Cluster{Nodes: []planner.Node{
		{ID: "v0", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "v1", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "k0", GPUs: map[planner.GPUType]int{"k80": 4}},
	}}
}

func view(c planner.Cluster, jobs ...*JobView) *View {
	v := &View{Now: 1000, Round: 360, Types: c.Types(), Cluster: c, Pool: NewPool(c), Jobs: jobs}
	for _, t := range v.Types {
		v.Capacity = append(v.Capacity, float64(c.Capacity(t)))
	}
	return v
}

func job(id string, sf int) *JobView {
	return &JobView{Job: planner.Job{ID: id, Model: "m", ScaleFactor: sf, TotalSteps: 1, Weight: 1}, Remaining: 1,
		Throughput: []float64{1, 2}, Received: make([]float64, 2)}
}

func TestPackUsesFewestServers(t *testing.T) {
	p := NewPool(twoTypeCluster())
	p.Take(planner.Unit{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 3}}})
	// 1 free on v0, 4 on v1: a 4-GPU job goes whole onto v1.
	u, ok := p.Pack("v100", 4)
	if !ok || len(u.Slots) != 1 || u.Slots[0].Node != "v1" {
		t.Fatalf("Pack(4) = %v, %v; want all on v1", u.Slots, ok)
	}
	// A 1-GPU job takes the best fit: v0's last GPU, not a hole in v1.
	u, ok = p.Pack("v100", 1)
	if !ok || u.Slots[0].Node != "v0" {
		t.Fatalf("Pack(1) = %v; want the best-fitting node v0", u.Slots)
	}
	// 5 GPUs must span both nodes, the fuller piece first.
	u, ok = p.Pack("v100", 5)
	if !ok || u.Nodes() != 2 || u.GPUs() != 5 {
		t.Fatalf("Pack(5) = %v", u.Slots)
	}
	if _, ok := p.Pack("v100", 6); ok {
		t.Fatal("Pack(6) succeeded with 5 free")
	}
}

func TestAssignLeaseExtensionAndPriority(t *testing.T) {
	c := twoTypeCluster()
	a, b, d := job("a", 4), job("b", 4), job("d", 4)
	// a ran on v1 and has had little of its share; b has had more.
	a.Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v1", Type: "v100", Count: 4}}}}}
	a.Received = []float64{0, 100}
	b.Received = []float64{0, 600}
	v := view(c, a, b, d)
	// Types sort as k80, v100. Everyone wants v100 half the time.
	x := [][]float64{{0, 0.5}, {0, 0.5}, {0, 0.5}}
	ps := Assign(v, x, AssignOptions{})
	// d never served: first; a (share 0.1 of 0.5) next; b waits.
	if len(ps[2].Units) != 1 || len(ps[0].Units) != 1 || len(ps[1].Units) != 0 {
		t.Fatalf("placements %v", ps)
	}
	if !ps[0].Units[0].Equal(a.Placement.Units[0]) {
		t.Fatalf("a moved from v1 to %v: lease extension must keep its GPUs", ps[0].Units[0].Slots)
	}
	// With backfill, b takes the idle K80s.
	v = view(c, a, b, d)
	ps = Assign(v, x, AssignOptions{Backfill: true})
	if len(ps[1].Units) != 1 || ps[1].Units[0].Slots[0].Type != "k80" {
		t.Fatalf("backfill placed b at %v, want the idle k80 node", ps[1])
	}
}

func TestAssignMidRoundKeepsRunningJobs(t *testing.T) {
	c := twoTypeCluster()
	run, wait := job("run", 4), job("wait", 4)
	run.Running = true
	run.Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 4}}}}}
	v := view(c, run, wait)
	v.MidRound = true
	v.Pool.Take(run.Placement.Units[0])
	ps := Assign(v, [][]float64{{0, 1}, {0, 1}}, AssignOptions{})
	if len(ps[0].Units) != 0 {
		t.Fatal("a running job was re-placed mid-round")
	}
	if len(ps[1].Units) != 1 || ps[1].Units[0].Slots[0].Node != "v1" {
		t.Fatalf("waiting job placed at %v, want v1", ps[1])
	}
}

func TestSpreadLeaseMovesWhenANodeIsFree(t *testing.T) {
	c := twoTypeCluster()
	j := job("j", 4)
	j.Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{
		{Node: "v0", Type: "v100", Count: 2}, {Node: "v1", Type: "v100", Count: 2},
	}}}}
	v := view(c, j)
	ps := Assign(v, [][]float64{{0, 1}}, AssignOptions{})
	if got := ps[0].Units[0]; got.Nodes() != 1 {
		t.Fatalf("spread job kept %v although a whole node is free", got.Slots)
	}
	// When no single node has room, the spread lease is kept (no restart).
	b0, b1 := job("b0", 2), job("b1", 2)
	b0.Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 2}}}}}
	b1.Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v1", Type: "v100", Count: 2}}}}}
	v = view(c, j, b0, b1)
	ps = Assign(v, [][]float64{{0, 1}, {0, 1}, {0, 1}}, AssignOptions{})
	if !ps[0].Units[0].Equal(j.Placement.Units[0]) {
		t.Fatalf("spread job moved to %v although no node could hold it whole", ps[0].Units[0].Slots)
	}
}
