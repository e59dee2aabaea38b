package round

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/policy"
)

// fixedPolicy returns the same shares for every job it knows, 0 for the
// others.
type fixedPolicy map[string][]float64

func (fixedPolicy) Name() string { return "fixed" }

func (f fixedPolicy) Allocate(in policy.Input) (policy.Allocation, error) {
	a := policy.Allocation{X: make([][]float64, len(in.Jobs))}
	for i, j := range in.Jobs {
		a.X[i] = make([]float64, len(in.Types))
		copy(a.X[i], f[j.ID])
	}
	return a, nil
}

// Gavel's round mechanism (scheduler.py) gives GPUs its allocation leaves
// idle to jobs that have no share on them, as long as the allocation knows
// the job; a job that arrived after the last reset is counted against the
// GPUs but not placed. The gavel fidelity used to leave such GPUs idle,
// which starved short jobs under gavel-makespan (docs/results.md).
func TestGavelMechanismFillsIdleGPUsWithZeroShareJobs(t *testing.T) {
	c := twoTypeCluster() // k80: 4 GPUs on k0; v100: 8 GPUs on v0, v1
	long, short, late := job("long", 4), job("short", 1), job("late", 4)
	// Types sort as k80, v100: the allocation gives short a share of
	// v100 only, and v100 is full with long and its twin.
	twin := job("twin", 4)
	shares := fixedPolicy{"long": {0, 1}, "twin": {0, 1}, "short": {0, 0.1}}
	for _, gavel := range []bool{false, true} {
		s := &PolicyScheduler{Policy: shares, ResetInterval: 1920, Gavel: gavel}
		v := view(c, long, twin, short)
		v.Now = 0
		ps, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		ran := len(ps[2].Units) == 1
		if ran != gavel {
			t.Fatalf("gavel=%v: short placed=%v (%v); Gavel places a zero-share job on idle GPUs", gavel, ran, ps[2])
		}
		if gavel && ps[2].Units[0].Slots[0].Type != "k80" {
			t.Fatalf("short placed on %v, want the idle k80", ps[2].Units[0].Slots)
		}
		if !gavel {
			continue
		}
		// 360 s later a job arrives: the allocation (reset every 1920 s)
		// does not know it. It is counted against the K80s ahead of
		// nothing else, so it is not placed and its GPUs stay idle.
		v = view(c, long, twin, short, late)
		v.Now = 360
		ps, err = s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps[3].Units) != 0 {
			t.Fatalf("a job that arrived after the reset was placed at %v", ps[3])
		}
		if len(ps[2].Units) != 1 {
			t.Fatal("short lost its K80 to a job the allocation does not know")
		}
	}
}

// Within a type, Gavel ranks jobs by share over the time they ran there
// since the last reset (plus half a round), not since their arrival.
func TestGavelPriorityCountsTimeSinceTheLastReset(t *testing.T) {
	c := planner.Cluster{Nodes: []planner.Node{{ID: "v0", GPUs: map[planner.GPUType]int{"v100": 4}}}}
	a, b := job("a", 4), job("b", 4)
	a.Throughput, b.Throughput = []float64{1}, []float64{1}
	// a ran 1000 s before the reset at t=0 (a job of an earlier
	// allocation), b none.
	a.Received, b.Received = []float64{1000}, []float64{0}
	s := &PolicyScheduler{Policy: fixedPolicy{"a": {0.5}, "b": {0.5}}, ResetInterval: 1920, Gavel: true}
	v := &View{Now: 0, Round: 360, Types: c.Types(), Capacity: []float64{4}, Cluster: c, Pool: NewPool(c), Jobs: []*JobView{a, b}}
	if _, err := s.Schedule(v); err != nil {
		t.Fatal(err)
	}
	// Since the reset b ran 360 s and a none: a goes first, although over
	// its whole life it received more (the old priority would pick b).
	b.Received = []float64{360}
	v = &View{Now: 720, Round: 360, Types: c.Types(), Capacity: []float64{4}, Cluster: c, Pool: NewPool(c), Jobs: []*JobView{a, b}}
	ps, err := s.Schedule(v)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps[0].Units) != 1 || len(ps[1].Units) != 0 {
		t.Fatalf("placements %v: a has run less since the reset and must go first", ps)
	}
	s.Gavel = false
	v = &View{Now: 720, Round: 360, Types: c.Types(), Capacity: []float64{4}, Cluster: c, Pool: NewPool(c), Jobs: []*JobView{a, b}}
	if ps, err = s.Schedule(v); err != nil {
		t.Fatal(err)
	}
	if len(ps[1].Units) != 1 {
		t.Fatalf("placements %v: Assign's own priority (time since arrival) picks b", ps)
	}
}
