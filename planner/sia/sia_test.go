package sia

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// one GPU per node, node "<type>-<k>", types as given.
func cluster(gpus map[planner.GPUType]int) planner.Cluster {
	var c planner.Cluster
	for _, t := range []planner.GPUType{"k80", "p100", "v100"} {
		for k := range gpus[t] {
			c.Nodes = append(c.Nodes, planner.Node{ID: fmt.Sprintf("%s-%d", t, k), GPUs: map[planner.GPUType]int{t: 1}})
		}
	}
	return c
}

// tp maps a type to a job's throughput.
type tp map[planner.GPUType]float64

// job is a waiting job; view sets its throughputs.
func job(id string, width int) *round.JobView {
	return &round.JobView{Job: planner.Job{ID: id, Model: "m", ScaleFactor: width, TotalSteps: 1e6, Weight: 1}, Remaining: 1e6}
}

func view(c planner.Cluster, now float64, jobs []*round.JobView, speeds []tp) *round.View {
	v := &round.View{Now: now, Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c), Jobs: jobs}
	for _, t := range v.Types {
		v.Capacity = append(v.Capacity, float64(c.Capacity(t)))
	}
	for i, jb := range jobs {
		jb.Throughput = make([]float64, len(v.Types))
		jb.Received = make([]float64, len(v.Types))
		for j, t := range v.Types {
			jb.Throughput[j] = speeds[i][t]
		}
	}
	return v
}

func on(node string, t planner.GPUType, n int) planner.Placement {
	return planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: node, Type: t, Count: n}}}}}
}

// typeOf is the one type placement p runs on, "" if none.
func typeOf(t *testing.T, p planner.Placement) planner.GPUType {
	t.Helper()
	var ty planner.GPUType
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			if ty != "" && sl.Type != ty {
				t.Fatalf("placement %v spans types", p)
			}
			ty = sl.Type
		}
	}
	return ty
}

func schedule(t *testing.T, cfg Config, v *round.View) []planner.Placement {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := s.Schedule(v)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// Two jobs, one V100 and one K80, each job's slowest type the K80 (its
// normalized goodput 1, its width). a is 1.11 on the V100, b 5. With
// p = -0.5 a choice gains lambda_n - e^p: a on the K80 and b on the V100
// gain 0.1 + 0.653, the other way 0.151 + 0.1; with p = 1 (e + lambda_n)
// 2.1 + 6.1 against 2.21 + 2.1. Both exponents agree.
func TestSiaPicksTheNormalizedGoodputOptimum(t *testing.T) {
	for _, p := range []float64{-0.5, 1} {
		c := cluster(map[planner.GPUType]int{"v100": 1, "k80": 1})
		v := view(c, 0, []*round.JobView{job("a", 1), job("b", 1)}, []tp{{"v100": 10, "k80": 9}, {"v100": 10, "k80": 2}})
		ps := schedule(t, Config{P: p}, v)
		if typeOf(t, ps[0]) != "k80" || typeOf(t, ps[1]) != "v100" {
			t.Fatalf("p=%v: a on %q, b on %q; want a on k80, b on v100", p, typeOf(t, ps[0]), typeOf(t, ps[1]))
		}
	}
}

// A job runs on a K80 (its slowest type: 1), 1.11 on a V100 that is
// free. With R = 20 s the restart factor of a 100 s old job is
// (100 - 0) / (100 + 20) = 0.83: the move is worth 0.93, below staying
// (1), and it stays. At 10,000 s the factor is 0.998 and it moves. (A
// job younger than R has no factor: nothing of it is lost yet.)
func TestSiaRestartFactorKeepsARunningJob(t *testing.T) {
	for _, tc := range []struct {
		age  float64
		want planner.GPUType
	}{{100, "k80"}, {10000, "v100"}} {
		c := cluster(map[planner.GPUType]int{"v100": 1, "k80": 1})
		a := job("a", 1)
		a.Placement, a.Running = on("k80-0", "k80", 1), true
		v := view(c, tc.age, []*round.JobView{a}, []tp{{"v100": 10, "k80": 9}})
		s, err := New(Config{RestartCost: 20})
		if err != nil {
			t.Fatal(err)
		}
		ps, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := typeOf(t, ps[0]); got != tc.want {
			t.Fatalf("age %v s: on %q, want %q", tc.age, got, tc.want)
		}
		if moved := s.restarts["a"]; moved != map[bool]int{true: 1, false: 0}[tc.want == "v100"] {
			t.Fatalf("age %v s: %d restarts counted", tc.age, moved)
		}
	}
	// Without a restart cost there is no factor: it moves at once.
	c := cluster(map[planner.GPUType]int{"v100": 1, "k80": 1})
	a := job("a", 1)
	a.Placement, a.Running = on("k80-0", "k80", 1), true
	if got := typeOf(t, schedule(t, Config{}, view(c, 100, []*round.JobView{a}, []tp{{"v100": 10, "k80": 8}}))[0]); got != "v100" {
		t.Fatalf("no restart cost: on %q, want v100", got)
	}
}

// One K80, two jobs of the same goodput (a term of lambda_n - 1 = 0.1
// each): a runs on it, b waits with weight 1.2. Sia's own (stay
// 0) runs b, 0.12 against 0.1; a stay of 0.5 makes a's term 0.15 where
// it runs and it stays, its reason naming the stay; at 0.1 (0.11) b
// still wins. A stay that is not a finite number >= 0 is refused.
func TestSiaStayHoldsARunningJob(t *testing.T) {
	for _, tc := range []struct {
		stay float64
		want string
	}{{0, "b"}, {0.1, "b"}, {0.5, "a"}} {
		c := cluster(map[planner.GPUType]int{"k80": 1})
		a, b := job("a", 1), job("b", 1)
		b.Weight = 1.2
		a.Placement, a.Running = on("k80-0", "k80", 1), true
		v := view(c, 100, []*round.JobView{a, b}, []tp{{"k80": 1}, {"k80": 1}})
		v.Reasons = make([]round.Reason, 2)
		s, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		ps, err := s.ScheduleStaying(v, tc.stay)
		if err != nil {
			t.Fatal(err)
		}
		got := "a"
		if len(ps[0].Units) == 0 {
			got = "b"
		}
		if len(ps[0].Units)+len(ps[1].Units) != 1 || got != tc.want {
			t.Fatalf("stay %v: placed %v, want %s alone", tc.stay, ps, tc.want)
		}
		if named := strings.Contains(v.Reasons[0].Why, "x1.5 to stay"); named != (tc.want == "a") {
			t.Errorf("stay %v: a's reason %q", tc.stay, v.Reasons[0].Why)
		}
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := cluster(map[planner.GPUType]int{"k80": 1})
	for _, bad := range []float64{-0.5, math.NaN(), math.Inf(1)} {
		if _, err := s.ScheduleStaying(view(c, 0, []*round.JobView{job("a", 1)}, []tp{{"k80": 1}}), bad); err == nil || !strings.Contains(err.Error(), "want a finite number >= 0") {
			t.Errorf("stay %v: error %v, want it refused", bad, err)
		}
	}
}

// The fairness exponent changes the choice. One V100 and one K80 free,
// a P100 held by a pinned job. Normalized goodputs (each job's slowest
// type 1): a, slowest on the P100: v100 9, k80 3; b, slowest on the K80:
// v100 2, k80 1. With p = 1 the sums of e are 9 + 1 = 10 (a on the V100,
// b on the K80) against 3 + 2 = 5; with p = -0.5 the sums of e^p (Sia
// minimizes them) are 0.333 + 1 = 1.333 against 0.577 + 0.707 = 1.284:
// the even split wins. The pinned job keeps its P100 either way.
func TestSiaFairnessExponentChangesTheChoice(t *testing.T) {
	for _, tc := range []struct {
		p     float64
		wantA planner.GPUType
	}{{1, "v100"}, {-0.5, "k80"}} {
		c := cluster(map[planner.GPUType]int{"v100": 1, "k80": 1, "p100": 1})
		pin := job("pin", 1)
		pin.Placement, pin.Running, pin.Pinned = on("p100-0", "p100", 1), true, true
		jobs := []*round.JobView{job("a", 1), job("b", 1), pin}
		v := view(c, 0, jobs, []tp{{"v100": 9, "k80": 3, "p100": 1}, {"v100": 2, "k80": 1, "p100": 1.5}, {"v100": 1, "k80": 1, "p100": 1}})
		ps := schedule(t, Config{P: tc.p}, v)
		wantB := planner.GPUType("v100")
		if tc.wantA == "v100" {
			wantB = "k80"
		}
		if typeOf(t, ps[0]) != tc.wantA || typeOf(t, ps[1]) != wantB {
			t.Fatalf("p=%v: a on %q, b on %q; want %q and %q", tc.p, typeOf(t, ps[0]), typeOf(t, ps[1]), tc.wantA, wantB)
		}
		if len(ps[2].Units) != 1 || ps[2].Units[0].Slots[0].Node != "p100-0" {
			t.Fatalf("p=%v: the pinned job moved to %v", tc.p, ps[2])
		}
	}
}

// A pinned job's GPUs are capacity taken: a job that would rather have
// them waits, or takes another type, and never displaces it.
func TestSiaKeepsPinnedJobs(t *testing.T) {
	c := cluster(map[planner.GPUType]int{"v100": 2})
	pin := job("pin", 2)
	pin.Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v100-0", Type: "v100", Count: 1}, {Node: "v100-1", Type: "v100", Count: 1}}}}}
	pin.Running, pin.Pinned = true, true
	v := view(c, 0, []*round.JobView{job("new", 2), pin}, []tp{{"v100": 100}, {"v100": 1}})
	ps := schedule(t, Config{Backfill: true}, v)
	if len(ps[0].Units) != 0 {
		t.Fatalf("the new job took %v from a pinned job", ps[0])
	}
	if got := ps[1].Units[0].GPUs(); got != 2 {
		t.Fatalf("the pinned job has %d GPUs", got)
	}
}

// Many jobs on a small cluster (the LP path): no type is over-committed,
// and every GPU a waiting job could use is used.
func TestSiaRespectsCapacity(t *testing.T) {
	c := cluster(map[planner.GPUType]int{"v100": 4, "p100": 3, "k80": 5})
	rng := rand.New(rand.NewPCG(1, 2))
	var jobs []*round.JobView
	var speeds []tp
	for i := range 20 {
		jobs = append(jobs, job(fmt.Sprintf("j%02d", i), 1+rng.IntN(2)))
		speeds = append(speeds, tp{"v100": 1 + 9*rng.Float64(), "p100": 1 + 5*rng.Float64(), "k80": 1 + 2*rng.Float64()})
	}
	v := view(c, 0, jobs, speeds)
	ps := schedule(t, Config{}, v)
	used := map[planner.GPUType]int{}
	for _, p := range ps {
		for _, u := range p.Units {
			for _, sl := range u.Slots {
				used[sl.Type] += sl.Count
			}
		}
	}
	for _, ty := range v.Types {
		if used[ty] > c.Capacity(ty) {
			t.Fatalf("%s: %d GPUs used of %d", ty, used[ty], c.Capacity(ty))
		}
	}
	// 12 GPUs, 20 jobs of 1 or 2 GPUs: the count left idle must not fit
	// any waiting job of width 1.
	idle := 12 - used["v100"] - used["p100"] - used["k80"]
	for i, p := range ps {
		if len(p.Units) == 0 && jobs[i].ScaleFactor == 1 && idle > 0 {
			t.Fatalf("%d GPUs idle while %s (1 GPU) waits", idle, jobs[i].ID)
		}
	}
}

func TestSiaStateRoundTrip(t *testing.T) {
	s, _ := New(Config{})
	s.restarts["a"] = 3
	data, err := s.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	r, _ := New(Config{})
	if err := r.LoadState(data); err != nil {
		t.Fatal(err)
	}
	if r.restarts["a"] != 3 {
		t.Fatalf("restored %v", r.restarts)
	}
	if err := r.LoadState([]byte("nope")); err == nil || r.restarts["a"] != 3 {
		t.Fatalf("a corrupt state was loaded (err %v): %v", err, r.restarts)
	}
}

func TestSiaConfigValidation(t *testing.T) {
	for _, cfg := range []Config{{P: math.NaN()}, {NoAlloc: -1}, {NoAlloc: math.Inf(1)}, {RestartCost: math.Inf(1)}} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("config %+v accepted", cfg)
		}
	}
}

// The restart factor and a choice's gain, by hand: r = max(T - N R, 0) /
// (T + R), 1 below R; with p = -0.5 a gain of lambda_n - e^p, nothing
// when e^p reaches lambda_n (leaving the job out is as good).
func TestSiaRestartFactorAndGain(t *testing.T) {
	s, err := New(Config{RestartCost: 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		age  float64
		n    int
		want float64
	}{{10, 3, 1}, {100, 0, 100.0 / 120}, {100, 2, 60.0 / 120}, {100, 5, 0}, {100, 9, 0}} {
		if got := s.restartFactor(tc.age, tc.n); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("restart factor at %v s after %d restarts: %v, want %v", tc.age, tc.n, got, tc.want)
		}
	}
	for _, tc := range []struct{ e, want float64 }{{1, 0.1}, {4, 0.6}, {1 / 1.21, 0}, {0.5, 0}, {0, 0}} {
		if got := s.gain(tc.e); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("gain of normalized goodput %v: %v, want %v", tc.e, got, tc.want)
		}
	}
	up, err := New(Config{P: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := up.gain(2); math.Abs(got-3.1) > 1e-12 {
		t.Errorf("p = 1: gain of 2 is %v, want 3.1", got)
	}
}

// elastic is a waiting job of scale factor 1 that may run on 1, 2 or 4
// GPUs of the one type of the view, scaling perfectly: with a fixed global
// batch 10, 20 and 40 steps/s.
func elastic(id string) *round.JobView {
	jb := job(id, 1)
	jb.Widths = []int{1, 2, 4}
	jb.WidthThroughput = [][]float64{{10}, {20}, {40}}
	return jb
}

// oneServer is one node of four V100s.
func oneServer() planner.Cluster {
	return planner.Cluster{Nodes: []planner.Node{{ID: "n", GPUs: map[planner.GPUType]int{"v100": 4}}}}
}

func widthOf(p planner.Placement) int {
	if len(p.Units) != 1 {
		return 0
	}
	return p.Units[0].GPUs()
}

// Two elastic jobs on four GPUs, by hand. Each job's slowest
// configuration (1 GPU) is worth 1, so width w is worth w. With
// p = -0.5 a choice gains 1.1 - w^-0.5: 0.1 at 1, 0.393 at 2, 0.6 at 4.
// Splitting 2 + 2 gains 0.786, against 0.6 for 4 + 0 and 0.493 for
// 2 + 1: each job gets two GPUs. Alone, a job grows to four. In rigid
// mode both run at their scale factor, 1. (Without the growth limit,
// which TestSiaElasticGrowsByDoublings tests.)
func TestSiaElasticSplitsAndGrows(t *testing.T) {
	v := view(oneServer(), 0, []*round.JobView{elastic("a"), elastic("b")}, []tp{{"v100": 10}, {"v100": 10}})
	ps := schedule(t, Config{FreeGrowth: true}, v)
	if widthOf(ps[0]) != 2 || widthOf(ps[1]) != 2 {
		t.Fatalf("two elastic jobs: widths %d and %d, want 2 and 2 (%v)", widthOf(ps[0]), widthOf(ps[1]), ps)
	}
	v = view(oneServer(), 0, []*round.JobView{elastic("a")}, []tp{{"v100": 10}})
	if ps := schedule(t, Config{FreeGrowth: true}, v); widthOf(ps[0]) != 4 {
		t.Fatalf("one elastic job alone: width %d, want 4", widthOf(ps[0]))
	}
	v = view(oneServer(), 0, []*round.JobView{elastic("a"), elastic("b")}, []tp{{"v100": 10}, {"v100": 10}})
	ps = schedule(t, Config{Rigid: true}, v)
	if widthOf(ps[0]) != 1 || widthOf(ps[1]) != 1 {
		t.Fatalf("rigid mode: widths %d and %d, want 1 and 1", widthOf(ps[0]), widthOf(ps[1]))
	}
}

// An elastic job runs on 2 of 4 free GPUs. With R = 100 s, at 200 s old
// and one restart behind it, the restart factor is (200 - 100) / (200 +
// 100) = 1/3: width 4 is worth 4/3 and gains 1.1 - 0.866 = 0.234, below
// staying at 2 (0.393): it stays, on the same GPUs, and no restart is
// counted. At 400 s with none behind it the factor is 0.8: width 4 is
// worth 3.2 and gains 0.541: it grows, and one restart is counted.
func TestSiaElasticRestartFactor(t *testing.T) {
	for _, tc := range []struct {
		age      float64
		before   int
		want     int
		restarts int
	}{{200, 1, 2, 1}, {400, 0, 4, 1}} {
		a := elastic("a")
		a.Placement, a.Running = on("n", "v100", 2), true
		v := view(oneServer(), tc.age, []*round.JobView{a}, []tp{{"v100": 10}})
		s, err := New(Config{RestartCost: 100})
		if err != nil {
			t.Fatal(err)
		}
		s.restarts["a"] = tc.before
		ps, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := widthOf(ps[0]); got != tc.want {
			t.Fatalf("age %v s, %d restarts: width %d, want %d", tc.age, tc.before, got, tc.want)
		}
		if tc.want == 2 && !ps[0].Units[0].Equal(a.Placement.Units[0]) {
			t.Fatalf("kept its width but moved: %v", ps[0])
		}
		if s.restarts["a"] != tc.restarts {
			t.Fatalf("age %v s: %d restarts counted, want %d", tc.age, s.restarts["a"], tc.restarts)
		}
	}
}

// Sia's growth limit: a job alone on four GPUs, free to take them all,
// starts on one, then doubles each round to the widest it may run at
// (no restart cost, so nothing holds it back): 1, 2, 4. On a type it has
// not run on it is offered its smallest width only. The limit survives
// a save and load, and a state saved before the limit (restart counts
// alone) still loads.
func TestSiaElasticGrowsByDoublings(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	a := elastic("a")
	for r, want := range []int{1, 2, 4, 4} {
		v := view(oneServer(), float64(r)*360, []*round.JobView{a}, []tp{{"v100": 10}})
		ps, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := widthOf(ps[0]); got != want {
			t.Fatalf("round %d: width %d, want %d", r, got, want)
		}
		a.Placement, a.Running = ps[0], true
		if r == 1 {
			b, err := s.SaveState()
			if err != nil {
				t.Fatal(err)
			}
			if s, err = New(Config{}); err != nil {
				t.Fatal(err)
			}
			if err := s.LoadState(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := s.limit(a, a.Widths, "k80"); got != 1 {
		t.Fatalf("on a type it never ran on: up to %d GPUs, want its smallest width, 1", got)
	}
	if err := s.LoadState([]byte(`{"a":2}`)); err != nil || s.restarts["a"] != 2 || len(s.widest) != 0 {
		t.Fatalf("a state of restart counts alone: %v, restarts %v, widest %v", err, s.restarts, s.widest)
	}
	if err := s.LoadState([]byte(`{"restarts":{},"widest":{},"extra":1}`)); err == nil {
		t.Fatal("a state with an unknown field loaded")
	}
}
