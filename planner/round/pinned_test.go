package round

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/policy"
)

// firstFit is a policy a test can check by hand: each job, in order,
// takes all its time on the first type with GPUs left for it. It records
// the input it was given.
type firstFit struct{ seen *policy.Input }

func (firstFit) Name() string { return "first-fit" }

func (f firstFit) Allocate(in policy.Input) (policy.Allocation, error) {
	*f.seen = in
	left := append([]float64(nil), in.Capacity...)
	a := policy.Allocation{X: make([][]float64, len(in.Jobs))}
	for i, jb := range in.Jobs {
		a.X[i] = make([]float64, len(in.Types))
		for j := range in.Types {
			if left[j] >= float64(jb.ScaleFactor) && jb.Throughput[j] > 0 {
				a.X[i][j], left[j] = 1, left[j]-float64(jb.ScaleFactor)
				break
			}
		}
	}
	return a, nil
}

func unitOn(node string, t planner.GPUType, n int) planner.Placement {
	return planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: node, Type: t, Count: n}}}}}
}

// A job within its minimum run time holds its GPUs in the allocation: the
// policy shares out only what it leaves, and nothing is chosen onto them.
// One k80 and one v100; b arrived first and waits, a runs on the v100,
// pinned. Planning as if a could move, first-fit gives b the v100 and a
// the k80: a move the engine refuses, so b would wait. Around the pin, b
// gets the k80 and a keeps the v100.
func TestPinnedJobHoldsItsGPUsInTheAllocation(t *testing.T) {
	c := planner.Cluster{Nodes: []planner.Node{
		{ID: "k0", GPUs: map[planner.GPUType]int{"k80": 1}},
		{ID: "v0", GPUs: map[planner.GPUType]int{"v100": 1}},
	}}
	b, a := job("b", 1), job("a", 1)
	a.Placement, a.Running, a.Pinned = unitOn("v0", "v100", 1), true, true
	a.Received = []float64{0, 600}
	v := view(c, b, a)
	var seen policy.Input
	s := &PolicyScheduler{Policy: firstFit{&seen}, Backfill: true}
	out, err := s.Schedule(v)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen.Jobs) != 1 || seen.Jobs[0].ID != "b" || seen.Capacity[0] != 1 || seen.Capacity[1] != 0 {
		t.Fatalf("policy input: jobs %v capacity %v; want b alone on k80=1, v100=0 (a holds the v100)", seen.Jobs, seen.Capacity)
	}
	if !samePlacement(out[1], a.Placement) {
		t.Fatalf("pinned a placed on %v; want its v100 %v", out[1], a.Placement)
	}
	if !samePlacement(out[0], unitOn("k0", "k80", 1)) {
		t.Fatalf("b placed on %v; want the k80", out[0])
	}
	// Once the pin is over, the policy plans every job again.
	a.Pinned = false
	v = view(c, b, a)
	if _, err := s.Schedule(v); err != nil {
		t.Fatal(err)
	}
	if len(seen.Jobs) != 2 {
		t.Fatalf("policy input after the pin: %d jobs; want both", len(seen.Jobs))
	}
}

// Two types identical for every job are one resource: a job the
// allocation shares between them stays on the one it runs on, and a
// waiting job takes the other. x gives a half on each to the running job
// a (on v100b), whose time there makes v100 look never served (so, types
// apart, a's v100 pair comes first); a new b has a smaller share of v100.
func TestNoMoveBetweenIdenticalTypes(t *testing.T) {
	c := planner.Cluster{Nodes: []planner.Node{
		{ID: "v0", GPUs: map[planner.GPUType]int{"v100": 2}},
		{ID: "w0", GPUs: map[planner.GPUType]int{"v100b": 2}},
	}}
	a, b := job("a", 2), job("b", 2)
	for _, jb := range []*JobView{a, b} {
		jb.Throughput = []float64{3, 3}
	}
	a.Placement, a.Running = unitOn("w0", "v100b", 2), true
	a.Received = []float64{0, 700}
	v := view(c, a, b)
	out := Assign(v, [][]float64{{0.5, 0.5}, {0.4, 0}}, AssignOptions{Backfill: true})
	if !samePlacement(out[0], a.Placement) {
		t.Fatalf("a placed on %v; want its v100b GPUs %v (no move between identical types)", out[0], a.Placement)
	}
	if !samePlacement(out[1], unitOn("v0", "v100", 2)) {
		t.Fatalf("b placed on %v; want the v100s", out[1])
	}
	// Backfill too keeps a job on the identical type it runs on.
	v = view(c, a)
	out = Assign(v, [][]float64{{0, 0}}, AssignOptions{Backfill: true})
	if !samePlacement(out[0], a.Placement) {
		t.Fatalf("backfilled a placed on %v; want its v100b GPUs", out[0])
	}
}

func samePlacement(p, q planner.Placement) bool {
	if len(p.Units) != len(q.Units) {
		return false
	}
	for k := range p.Units {
		if !p.Units[k].Equal(q.Units[k]) {
			return false
		}
	}
	return true
}

// A running job past its minimum run time moves to another type only when
// it is owed at least a round there: the move holds it there for its
// minimum run time, so a smaller debt would be repaid many times over
// (the rotation that doubled gavel-maxmin's restarts once pins were
// planned around). a runs on the k80 and has never run on the v100, which
// makes its v100 pair come first.
func TestMoveOnlyWhenOwedARound(t *testing.T) {
	c := planner.Cluster{Nodes: []planner.Node{
		{ID: "k0", GPUs: map[planner.GPUType]int{"k80": 1}},
		{ID: "v0", GPUs: map[planner.GPUType]int{"v100": 1}},
	}}
	for _, tc := range []struct {
		name  string
		hold  float64
		x     []float64 // a's share on k80, v100; age 1000 s, 900 s run on the k80
		moves bool
	}{
		{"owed 300 s on the v100, less than a round", 1800, []float64{0.2, 0.3}, false},
		{"owed 500 s on the v100, more than a round", 1800, []float64{0.5, 0.5}, true},
		{"no minimum run time: any debt moves it", 0, []float64{0.2, 0.3}, true},
	} {
		a := job("a", 1)
		a.Placement, a.Running, a.Hold = unitOn("k0", "k80", 1), true, tc.hold
		a.Received = []float64{900, 0}
		out := Assign(view(c, a), [][]float64{tc.x}, AssignOptions{Backfill: true})
		want := a.Placement
		if tc.moves {
			want = unitOn("v0", "v100", 1)
		}
		if !samePlacement(out[0], want) {
			t.Errorf("%s: a placed on %v; want %v", tc.name, out[0], want)
		}
	}
}
