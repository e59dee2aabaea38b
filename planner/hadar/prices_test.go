package hadar

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// rates is a profile of steps/s per model and GPU type, the same at every
// width and placement.
type rates map[string]map[planner.GPUType]float64

func (r rates) Throughput(model string, _ int, t planner.GPUType, _ bool) (float64, error) {
	m, ok := r[model]
	if !ok {
		return 0, fmt.Errorf("no model %q", model)
	}
	return m[t], nil
}

// tj is a test job: its model is its ID, sf workers, rem steps left.
type tj struct {
	id  string
	sf  int
	rem float64
}

// bench is a small cluster and a profile to plan on.
type bench struct {
	t       *testing.T
	cluster planner.Cluster
	prof    rates
}

func newBench(t *testing.T, nodes ...planner.Node) *bench {
	return &bench{t: t, cluster: planner.Cluster{Nodes: nodes}, prof: rates{}}
}

func node(id string, ty planner.GPUType, n int) planner.Node {
	return planner.Node{ID: id, Rack: "r", GPUs: map[planner.GPUType]int{ty: n}}
}

// sched is a scheduler on the bench's profile; the fluid guide is off so
// that prices alone decide the types.
func (b *bench) sched(cfg Config) *Scheduler {
	b.t.Helper()
	cfg.Speed = speed.Model{Profile: b.prof}
	cfg.NoFluidGuide = true
	if cfg.Utility == "" {
		cfg.Utility = AvgJCT
	}
	if cfg.Horizon == 0 {
		cfg.Horizon = 4
	}
	if cfg.MinRunTime == 0 {
		// These tests are about prices and commitments: no minimum run
		// time unless a test sets one (restart_test.go).
		cfg.MinRunTime = -1
	}
	s, err := New(cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// view of jobs at time now (a round boundary unless mid), each with the
// placement it had in prev.
func (b *bench) view(now float64, mid bool, prev map[string]planner.Placement, jobs ...tj) *round.View {
	c := b.cluster
	v := &round.View{Now: now, Round: 360, MidRound: mid, Types: c.Types(), Cluster: c, Pool: round.NewPool(c)}
	for _, ty := range v.Types {
		v.Capacity = append(v.Capacity, float64(c.Capacity(ty)))
	}
	v.Reasons = make([]round.Reason, len(jobs))
	for _, j := range jobs {
		jv := &round.JobView{Job: planner.Job{ID: j.id, Model: j.id, ScaleFactor: j.sf, TotalSteps: j.rem, Weight: 1},
			Remaining: j.rem, Received: make([]float64, len(v.Types)), Placement: prev[j.id]}
		for _, ty := range v.Types {
			jv.Throughput = append(jv.Throughput, b.prof[j.id][ty])
		}
		if mid && len(prev[j.id].Units) > 0 {
			jv.Running = true
			for _, u := range prev[j.id].Units {
				v.Pool.Take(u)
			}
		}
		v.Jobs = append(v.Jobs, jv)
	}
	return v
}

func (b *bench) run(s *Scheduler, v *round.View) map[string]planner.Placement {
	b.t.Helper()
	ps, err := s.Schedule(v)
	if err != nil {
		b.t.Fatal(err)
	}
	out := map[string]planner.Placement{}
	for i, p := range ps {
		if len(p.Units) > 0 {
			out[v.Jobs[i].ID] = p
		}
	}
	return out
}

func typeOf(p planner.Placement) planner.GPUType {
	if len(p.Units) == 0 {
		return ""
	}
	return p.Units[0].Slots[0].Type
}

// A job choosing between a type other jobs have committed most of and an
// idle slower type: the committed type's price has risen (the dual price of
// a contested resource), so a job with a small advantage there takes the
// idle type. With flat prices (U = L) it takes the faster type, as a
// greedy scheduler would.
func TestPricesSteerJobsAwayFromCommittedTypes(t *testing.T) {
	b := newBench(t, node("v0", "v100", 4), node("k0", "k80", 4))
	b.prof["short"] = map[planner.GPUType]float64{"v100": 10, "k80": 2}
	b.prof["long"] = map[planner.GPUType]float64{"v100": 10, "k80": 8}
	jobs := []tj{{"short", 3, 10 * 360 * 2}, {"long", 1, 10 * 360 * 400}}
	for _, flat := range []bool{false, true} {
		s := b.sched(Config{FlatPrices: flat})
		got := b.run(s, b.view(0, false, nil, jobs...))
		if typeOf(got["short"]) != "v100" {
			t.Fatalf("flat=%v: short runs on %v, want v100", flat, got["short"])
		}
		want := planner.GPUType("k80")
		if flat {
			want = "v100"
		}
		if typeOf(got["long"]) != want {
			lo, hi, _ := s.Bounds()
			t.Fatalf("flat=%v: long runs on %v, want %s (L=%.3g U=%.3g)", flat, got["long"], want, lo, hi)
		}
	}
}

// A job admitted in one round holds its schedule: a job arriving the next
// round, worth more per GPU, cannot take its GPUs, while a scheduler that
// forgets its commitments (fresh each round) hands them over.
func TestCommittedScheduleConstrainsALaterArrival(t *testing.T) {
	b := newBench(t, node("v0", "v100", 4), node("k0", "k80", 4))
	b.prof["a"] = map[planner.GPUType]float64{"v100": 10}
	b.prof["b"] = map[planner.GPUType]float64{"v100": 10}
	a := tj{"a", 4, 10 * 360 * 100}
	s := b.sched(Config{})
	first := b.run(s, b.view(0, false, nil, a))
	if typeOf(first["a"]) != "v100" {
		t.Fatalf("a placed at %v", first["a"])
	}
	// b arrives: ten times shorter, so worth ten times more per GPU.
	bj := tj{"b", 4, 10 * 360 * 10}
	a.rem -= 10 * 360
	second := b.run(s, b.view(360, false, first, a, bj))
	if !second["a"].Units[0].Equal(first["a"].Units[0]) {
		t.Fatalf("a moved from %v to %v: its committed schedule must stand", first["a"], second["a"])
	}
	if len(second["b"].Units) != 0 {
		t.Fatalf("b took %v, GPUs a's schedule holds", second["b"])
	}
	if r := s.jobs["b"]; len(r.Segs) == 0 || r.Segs[0].From <= s.cur {
		t.Fatalf("b should be postponed to when a's commitment ends; its schedule is %+v", r.Segs)
	}
	// Without memory, b's higher value wins the V100s.
	fresh := b.run(b.sched(Config{}), b.view(360, false, first, a, bj))
	if typeOf(fresh["b"]) != "v100" || len(fresh["a"].Units) != 0 {
		t.Fatalf("a scheduler without commitments gave a %v and b %v; want b on the v100s", fresh["a"], fresh["b"])
	}
}

// A job with no paying schedule anywhere over the horizon is not admitted
// but runs on GPUs no commitment holds (for the round), unless backfill is
// off.
func TestBackfillRunsRejectedJobsOnUncommittedGPUs(t *testing.T) {
	b := newBench(t, node("k0", "k80", 4))
	b.prof["hi"] = map[planner.GPUType]float64{"k80": 10}
	b.prof["lo"] = map[planner.GPUType]float64{"k80": 10}
	jobs := []tj{{"hi", 3, 10 * 360 * 20}, {"lo", 1, 10 * 360 * 20000}}
	for _, off := range []bool{false, true} {
		s := b.sched(Config{NoBackfill: off})
		v := b.view(0, false, nil, jobs...)
		got := b.run(s, v)
		if len(s.jobs["lo"].Segs) != 0 || s.jobs["lo"].Admitted {
			t.Fatalf("lo was admitted (%+v) at a price above its value", s.jobs["lo"].Segs)
		}
		if placed := len(got["lo"].Units) == 1; placed == off {
			t.Fatalf("NoBackfill=%v: lo placed=%v (%s)", off, placed, v.Reasons[1].Why)
		}
	}
}

// L and U come from the jobs seen: L the lowest value per GPU-round over
// FloorRatio, U the highest; alpha = max(1, ln(U/L)).
func TestPriceBoundsFollowTheWorkload(t *testing.T) {
	b := newBench(t, node("v0", "v100", 4))
	b.prof["x"] = map[planner.GPUType]float64{"v100": 10}
	b.prof["y"] = map[planner.GPUType]float64{"v100": 10}
	s := b.sched(Config{})
	b.run(s, b.view(0, false, nil, tj{"x", 1, 3600}, tj{"y", 2, 36000}))
	// Value per GPU-round: R * best / (remaining * sf).
	dx, dy := 360*10/3600.0, 360*10/(36000.0*2)
	lo, hi, alpha := s.Bounds()
	if math.Abs(lo-dy/4) > 1e-12 || math.Abs(hi-dx) > 1e-12 {
		t.Fatalf("L=%v U=%v, want %v and %v", lo, hi, dy/4, dx)
	}
	if want := math.Log(hi / lo); math.Abs(alpha-want) > 1e-12 {
		t.Fatalf("alpha %v, want ln(U/L) = %v", alpha, want)
	}
	// A job worth more widens U; it never shrinks back.
	b.prof["z"] = map[planner.GPUType]float64{"v100": 10}
	b.run(s, b.view(360, false, nil, tj{"x", 1, 3600}, tj{"z", 1, 360}))
	if _, hi2, _ := s.Bounds(); hi2 <= hi {
		t.Fatalf("U %v did not widen to the new job's value", hi2)
	}
	flat := b.sched(Config{FlatPrices: true})
	b.run(flat, b.view(0, false, nil, tj{"x", 1, 3600}, tj{"y", 2, 36000}))
	if lo, hi, alpha := flat.Bounds(); hi > lo*(1+1e-9) || alpha != 1 {
		t.Fatalf("flat prices: L=%v U=%v alpha=%v", lo, hi, alpha)
	}
}

// Revisions: a job that finishes early releases its future slots at once;
// a commitment on a node that left is dropped and the job planned again.
func TestRevisionsOnEarlyFinishAndLostCapacity(t *testing.T) {
	b := newBench(t, node("v0", "v100", 4), node("v1", "v100", 4))
	b.prof["a"] = map[planner.GPUType]float64{"v100": 10}
	b.prof["b"] = map[planner.GPUType]float64{"v100": 10}
	b.prof["c"] = map[planner.GPUType]float64{"v100": 10}
	a, bj, cj := tj{"a", 4, 10 * 360 * 50}, tj{"b", 4, 10 * 360 * 50}, tj{"c", 4, 10 * 360 * 5}
	s := b.sched(Config{})
	first := b.run(s, b.view(0, false, nil, a, bj))
	// c arrives mid-round: both nodes are committed, so it is postponed
	// past the horizon (not admitted).
	got := b.run(s, b.view(100, true, first, a, bj, cj))
	if len(got["c"].Units) != 0 || len(s.jobs["c"].Segs) != 0 {
		t.Fatalf("c placed at %v / committed %+v on GPUs a and b hold", got["c"], s.jobs["c"].Segs)
	}
	// a finishes early (it leaves): its GPUs are c's at once.
	delete(first, "a")
	got = b.run(s, b.view(200, true, first, bj, cj))
	if len(got["c"].Units) != 1 {
		t.Fatalf("c still waits after a released its commitment")
	}
	// The node under c leaves the cluster: c's commitment is dropped and
	// c is planned again on what is left.
	cNode := got["c"].Units[0].Slots[0].Node
	var left []planner.Node
	for _, n := range b.cluster.Nodes {
		if n.ID != cNode {
			left = append(left, n)
		}
	}
	b.cluster.Nodes = append(left, node("v2", "v100", 4))
	prev := map[string]planner.Placement{"b": first["b"], "c": got["c"]}
	got = b.run(s, b.view(360, false, prev, bj, cj))
	if n := got["c"].Units[0].Slots[0].Node; n != "v2" {
		t.Fatalf("c runs on %s after its node left, want v2", n)
	}
	for _, sg := range s.jobs["c"].Segs {
		if sg.Unit.Slots[0].Node == cNode {
			t.Fatalf("c still holds a commitment on the departed node %s: %+v", cNode, s.jobs["c"].Segs)
		}
	}
}

// The calendar, the commitments and the bounds survive SaveState/LoadState:
// a restored scheduler plans the next round exactly as the original.
func TestStateRoundTripPlansAlike(t *testing.T) {
	b := newBench(t, node("v0", "v100", 4), node("k0", "k80", 4), node("p0", "p100", 4))
	for i := range 6 {
		b.prof[fmt.Sprint("j", i)] = map[planner.GPUType]float64{"v100": 10, "p100": 6, "k80": float64(1 + i)}
	}
	jobs := []tj{{"j0", 2, 1e5}, {"j1", 1, 4e5}, {"j2", 4, 3e4}, {"j3", 1, 9e5}}
	for _, util := range []Utility{AvgJCT, Makespan} {
		s := b.sched(Config{Utility: util})
		prev := b.run(s, b.view(0, false, nil, jobs...))
		prev = b.run(s, b.view(360, false, prev, jobs...))
		data, err := s.SaveState()
		if err != nil {
			t.Fatal(err)
		}
		r := b.sched(Config{Utility: util})
		if err := r.LoadState(data); err != nil {
			t.Fatal(err)
		}
		more := append(jobs, tj{"j4", 2, 2e5}, tj{"j5", 1, 5e3})
		want := b.run(s, b.view(720, false, prev, more...))
		got := b.run(r, b.view(720, false, prev, more...))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: restored scheduler placed %v, original %v", util, got, want)
		}
		sa, _ := s.SaveState()
		sb, _ := r.SaveState()
		if !bytes.Equal(sa, sb) {
			t.Fatalf("%s: states differ after the same round", util)
		}
		// Broken states are refused and leave the scheduler as it was.
		bad := bytes.Replace(data, []byte(`"slot":1`), []byte(`"slot":5`), 1)
		if err := r.LoadState(bad); err == nil {
			t.Fatalf("%s: a state with commitments before its current slot was loaded", util)
		}
		if sc, _ := r.SaveState(); !bytes.Equal(sc, sb) {
			t.Fatalf("%s: a refused state changed the scheduler", util)
		}
	}
}

// A node of a new GPU type joining between a round boundary and a
// mid-round fill changes the type indices: the fluid guide solved at the
// boundary must not be applied to the new types (found in CI: a fill after
// a join panicked indexing the guide's rows by the new types).
func TestFluidGuideFollowsTypeChangesMidRound(t *testing.T) {
	b := newBench(t, node("v0", "v100", 2), node("k0", "k80", 2))
	b.prof["a"] = map[planner.GPUType]float64{"v100": 10, "k80": 4, "p100": 7}
	b.prof["b"] = map[planner.GPUType]float64{"v100": 9, "k80": 5, "p100": 7}
	s, err := New(Config{Speed: speed.Model{Profile: b.prof}, Utility: AvgJCT, Horizon: 4})
	if err != nil {
		t.Fatal(err)
	}
	v := b.view(0, false, nil, tj{"a", 2, 360 * 10 * 50}, tj{"b", 2, 360 * 10 * 50})
	v.Epoch = 1
	prev := b.run(s, v)

	b.cluster.Nodes = append(b.cluster.Nodes, node("p0", "p100", 2))
	b.prof["c"] = map[planner.GPUType]float64{"v100": 3, "k80": 1, "p100": 3}
	v = b.view(30, true, prev, tj{"a", 2, 360 * 10 * 50}, tj{"b", 2, 360 * 10 * 50}, tj{"c", 2, 360 * 10 * 50})
	v.Epoch = 2
	got := b.run(s, v)
	for id, p := range got {
		for _, u := range p.Units {
			for _, sl := range u.Slots {
				if b.prof[id][sl.Type] <= 0 {
					t.Fatalf("job %s placed on %s, which it cannot run on", id, sl.Type)
				}
			}
		}
	}
	// Fewer types than the guide was solved for: the cached rows are longer
	// than the view's types.
	b.cluster.Nodes = b.cluster.Nodes[:1]
	v = b.view(60, true, got, tj{"a", 2, 360 * 10 * 50})
	v.Epoch = 3
	b.run(s, v)
}
