package hadar

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// widthRates is a profile of one type (v100) whose figures depend on the
// width: model -> width -> steps/s summed over the workers.
type widthRates map[string]map[int]float64

func (r widthRates) Throughput(model string, w int, t planner.GPUType, _ bool) (float64, error) {
	if t != "v100" {
		return 0, nil
	}
	x, ok := r[model][w]
	if !ok {
		return 0, fmt.Errorf("no width %d of %q", w, model)
	}
	return x, nil
}

// elasticView is a view of elastic jobs of widths 2, 4 and 8 (scale
// factor 2) on one node of eight V100s, each with the placement it had in
// prev, at a round boundary.
func elasticView(prof widthRates, now float64, prev map[string]planner.Placement, rem map[string]float64) *round.View {
	c := planner.Cluster{Nodes: []planner.Node{node("v0", "v100", 8)}}
	v := &round.View{Now: now, Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c), Capacity: []float64{8}}
	for _, id := range []string{"a", "b"} {
		r, ok := rem[id]
		if !ok {
			continue
		}
		jv := &round.JobView{Job: planner.Job{ID: id, Model: id, ScaleFactor: 2, Widths: []int{2, 4, 8}, TotalSteps: r, Weight: 1},
			Remaining: r, Received: []float64{0}, Placement: prev[id], Throughput: []float64{prof[id][2]}}
		for _, w := range jv.Widths {
			jv.WidthThroughput = append(jv.WidthThroughput, []float64{prof[id][w]})
		}
		v.Jobs = append(v.Jobs, jv)
	}
	v.Reasons = make([]round.Reason, len(v.Jobs))
	return v
}

func elasticSched(t *testing.T, prof widthRates, cfg Config) *Scheduler {
	t.Helper()
	cfg.Speed = speed.Model{Profile: prof}
	cfg.NoFluidGuide, cfg.Utility, cfg.Horizon = true, AvgJCT, 4
	// These tests are of the primal-dual's elastic widths, which the
	// configuration program replaces by default (program_test.go).
	cfg.NoProgram = true
	if cfg.MinRunTime == 0 {
		cfg.MinRunTime = -1
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func planned(t *testing.T, s *Scheduler, v *round.View) map[string]int {
	t.Helper()
	ps, err := s.Schedule(v)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for i, p := range ps {
		if len(p.Units) > 1 {
			t.Fatalf("%s placed on %d units: %v", v.Jobs[i].ID, len(p.Units), p)
		}
		if len(p.Units) == 1 {
			out[v.Jobs[i].ID] = p.Units[0].GPUs()
		}
	}
	return out
}

// By hand, in units of the job's value per step times a round: a job
// makes T(w) of value per round at width w, and on an idle type every GPU
// costs L, the lowest density seen over FloorRatio 4: at its scale factor
// 2, T(2)/2 = 5, so L = 1.25. One job alone, T = 10, 19, 36 at 2, 4, 8:
// it pays 10 - 2.5 = 7.5, 19 - 5 = 14 or 36 - 10 = 26 per round, and
// grows to 8. Two jobs with T = 10, 18, 22: the first pays 7.5, 13 or
// 12 and takes 4; the second then sees half the type committed, a price of
// L * (U/L)^(1/2) = 2.5 (U = 5, both jobs' density), and pays 10 - 5 = 5
// at 2 or 18 - 10 = 8 at 4 (8 GPUs no longer fit): they share, 4 and 4.
// HadarE plans the width as Hadar does, on one unit (never forked).
func TestElasticWidthChoice(t *testing.T) {
	for _, fork := range []bool{false, true} {
		alone := widthRates{"a": {2: 10, 4: 19, 8: 36}}
		got := planned(t, elasticSched(t, alone, Config{Fork: fork}), elasticView(alone, 0, nil, map[string]float64{"a": 10 * 360 * 1000}))
		if got["a"] != 8 {
			t.Fatalf("fork=%v: one elastic job alone runs on %d GPUs, want 8", fork, got["a"])
		}
		shared := widthRates{"a": {2: 10, 4: 18, 8: 22}, "b": {2: 10, 4: 18, 8: 22}}
		rem := map[string]float64{"a": 10 * 360 * 1000, "b": 10 * 360 * 1000}
		got = planned(t, elasticSched(t, shared, Config{Fork: fork}), elasticView(shared, 0, nil, rem))
		if got["a"] != 4 || got["b"] != 4 {
			t.Fatalf("fork=%v: two elastic jobs run on %d and %d GPUs, want 4 and 4", fork, got["a"], got["b"])
		}
	}
}

// A job running on 4 of the 8 GPUs, T = 19 at 4 and 36 at 8, with a 60 s
// restart. Nearly done (72 s left at 4, 38 s at 8 plus the restart: 98 s)
// it stays at 4; with 50 rounds left (5 h at 4; 2.64 h at 8, plus the
// restart, 2.66 h) it grows to 8, a gain of 2.34 h, and its reason
// carries the arithmetic.
func TestElasticResizeOnlyWhenItSavesMoreThanTheRestart(t *testing.T) {
	prof := widthRates{"a": {2: 10, 4: 19, 8: 36}}
	prev := map[string]planner.Placement{"a": {Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 4}}}}}}
	for _, tc := range []struct {
		name string
		rem  float64
		want int
	}{
		{"nearly done", 19 * 72, 4},
		{"long", 19 * 360 * 50, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := elasticView(prof, 360, prev, map[string]float64{"a": tc.rem})
			got := planned(t, elasticSched(t, prof, Config{RestartCost: 60}), v)
			if got["a"] != tc.want {
				t.Fatalf("runs on %d GPUs, want %d: %s", got["a"], tc.want, why(v, "a"))
			}
			w := why(v, "a")
			if tc.want == 8 {
				want := "grows to 8 workers (8 v100 on v0): done in about 2.7 h instead of 5.0 h at 4, a gain of 2.3 h over its 60 s restart"
				if !strings.Contains(w, want) {
					t.Fatalf("reason %q lacks %q", w, want)
				}
			} else if strings.Contains(w, "grows") {
				t.Fatalf("reason %q", w)
			}
		})
	}
}

// The makespan utility on one node of eight V100s, first call: elastic a
// (widths 2, 4, 8; T = 10, 19, 36) has 360,000 steps left, 36,000 s at
// its scale factor 2; rigid b (2 GPUs, T = 10) has 340,000, 34,000 s.
// The remaining makespan's bound is the longest job, 36,000 s (the work
// over the GPUs is (2*36,000 + 2*34,000)/8 = 17,500 s), so a job is
// critical from 0.9 * 36,000 = 32,400 s on: both are at the width they
// are planned at. But a at 8 is done in 360,000/36 = 10,000 s, well
// within the target: it is protected (no job preempts or shrinks it) but
// not critical (its value is its own, not twice the highest), while b,
// which has no other width, is both. With T(8) = 11, a at 8 still needs
// 32,727 s: critical, unless a narrower width is fast enough (T(4) = 36:
// 10,000 s; the fastest width counts, not the widest). Run as a rigid job
// (no widths), a is critical as before. Values per GPU-round below, by
// hand.
func TestElasticCriticalOnlyWhenFastestMissesTheTarget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		a        map[int]float64
		rigid    bool
		critical bool
	}{
		{"widening makes it", map[int]float64{2: 10, 4: 19, 8: 36}, false, false},
		{"widest misses it", map[int]float64{2: 10, 4: 10.5, 8: 11}, false, true},
		{"a narrower width makes it", map[int]float64{2: 10, 4: 36, 8: 11}, false, false},
		{"rigid", map[int]float64{2: 10, 4: 19, 8: 36}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := widthRates{"a": tc.a, "b": {2: 10}}
			v := elasticView(prof, 0, nil, map[string]float64{"a": 360000, "b": 340000})
			v.Jobs[1].Widths, v.Jobs[1].WidthThroughput = nil, nil
			if tc.rigid {
				v.Jobs[0].Widths, v.Jobs[0].WidthThroughput = nil, nil
			}
			s := elasticSched(t, prof, Config{})
			s.cfg.Utility = Makespan
			infos := s.jobInfos(v)
			s.value(v, infos)
			a, b := infos[0], infos[1]
			if !a.protected || a.critical != tc.critical {
				t.Fatalf("a: protected %v, critical %v; want protected, critical %v", a.protected, a.critical, tc.critical)
			}
			if !b.protected || !b.critical {
				t.Fatalf("b: protected %v, critical %v; want both", b.protected, b.critical)
			}
			// a's own value per GPU-round at its scale factor: 1/360,000
			// per step, 10 steps/s, a 360 s round, over 2 GPUs, 0.005. A
			// critical job is worth twice the highest value of the others
			// (here a's, 0.01), or, all critical on the first call, twice
			// the highest of theirs (b's 10*360/2/340,000: 0.01059 each).
			want := map[bool][2]float64{false: {0.005, 0.01}, true: {2 * 1800 / 340000.0, 2 * 1800 / 340000.0}}[tc.critical]
			if math.Abs(a.density-want[0]) > 1e-9 || math.Abs(b.density-want[1]) > 1e-9 {
				t.Fatalf("values per GPU-round a %g, b %g; want %g and %g", a.density, b.density, want[0], want[1])
			}
		})
	}
}

// typeWidthRates is a profile of one model whose figures depend on the
// GPU type and the width (steps/s summed over the workers).
type typeWidthRates map[planner.GPUType]map[int]float64

func (r typeWidthRates) Throughput(_ string, w int, t planner.GPUType, _ bool) (float64, error) {
	return r[t][w], nil
}

// Elastic a (widths 1, 2, 4) runs on the one K80 of node k0, the type
// the fluid guide gives it; node v0's four V100s are idle. Makespan
// utility: a alone, 36,000 steps at 1 step/s on its K80 take 10 h, the
// whole remaining makespan, so it is protected; at 4 on K80s (3.6/s)
// 2.8 h would do, so it is not critical, and the dual keeps it on its
// K80 (the guide's type; no second K80 to widen on). upgrade then lets a
// protected job that is not critical grow onto idle GPUs of any type: 4
// V100s at 16/s, done in 20 s + 36,000/16 s = 0.6 h instead of 10 h.
// upgrade otherwise looks only on the guide's types, and a stayed on its
// one K80.
func TestElasticProtectedJobGrowsOffTheGuidesTypes(t *testing.T) {
	prof := typeWidthRates{"k80": {1: 1, 2: 1.9, 4: 3.6}, "v100": {1: 4, 2: 8, 4: 16}}
	c := planner.Cluster{Nodes: []planner.Node{node("k0", "k80", 1), node("v0", "v100", 4)}}
	v := &round.View{Now: 360, Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c)}
	for _, ty := range v.Types {
		v.Capacity = append(v.Capacity, float64(c.Capacity(ty)))
	}
	jv := &round.JobView{Job: planner.Job{ID: "a", Model: "a", ScaleFactor: 1, Widths: []int{1, 2, 4}, TotalSteps: 36000, Weight: 1},
		Remaining: 36000, Received: make([]float64, len(v.Types)),
		Placement: planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "k0", Type: "k80", Count: 1}}}}}}
	guide := make([]bool, len(v.Types))
	for k, ty := range v.Types {
		jv.Throughput = append(jv.Throughput, prof[ty][1])
		guide[k] = ty == "k80"
	}
	for _, w := range jv.Widths {
		row := []float64{}
		for _, ty := range v.Types {
			row = append(row, prof[ty][w])
		}
		jv.WidthThroughput = append(jv.WidthThroughput, row)
	}
	v.Jobs = []*round.JobView{jv}
	v.Reasons = make([]round.Reason, 1)
	s := elasticSched(t, widthRates{}, Config{RestartCost: 20})
	s.cfg.Speed = speed.Model{Profile: prof}
	s.cfg.NoFluidGuide, s.cfg.Utility = false, Makespan
	s.fluid, s.fluidKey = map[string][]bool{"a": guide}, round.JobSetKey(v)
	got := planned(t, s, v)
	if got["a"] != 4 {
		t.Fatalf("a on %d GPUs, want 4 V100s: %s", got["a"], why(v, "a"))
	}
	if w := why(v, "a"); !strings.Contains(w, "grows to 4 workers (idle 4 v100 on v0)") {
		t.Fatalf("a's reason %q", w)
	}
}

// The tail guard: elastic a (scale factor 2, 10 steps/s; 19 at 4 and 20
// at 8 GPUs) has 1,000,000 steps left, rigid b 1,200,000 at 10/s. The
// makespan target is b's 120,000 s; a, 100,000 s at its scale factor, is
// not critical (under 0.9 of it), and at its fastest width, 50,000 s, it
// is long (at least tailLong, 0.4, of the time left). Once it has been in
// the system tailWait (0.1) of that, 5,000 s, it is protected and no
// longer held to the fluid guide's types; before, or when it is short, it
// is left as it was.
func TestElasticTailGuardProtectsLongWaitingJob(t *testing.T) {
	for _, tc := range []struct {
		name      string
		arrival   float64
		steps     float64
		protected bool
	}{
		{"long, in the system 6,000 s", 0, 1000000, true},
		{"long, in the system 4,000 s", 2000, 1000000, false},
		{"short, in the system 6,000 s", 0, 300000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := widthRates{"a": {2: 10, 4: 19, 8: 20}, "b": {2: 10}}
			v := elasticView(prof, 6000, nil, map[string]float64{"a": tc.steps, "b": 1200000})
			v.Jobs[0].Arrival = tc.arrival
			v.Jobs[1].Widths, v.Jobs[1].WidthThroughput = nil, nil
			s := elasticSched(t, prof, Config{})
			s.cfg.Utility = Makespan
			infos := s.jobInfos(v)
			infos[0].allowed = []bool{true}
			s.value(v, infos)
			a := infos[0]
			if a.critical || a.protected != tc.protected {
				t.Fatalf("a: critical %v, protected %v; want not critical, protected %v", a.critical, a.protected, tc.protected)
			}
			if (a.allowed == nil) != tc.protected {
				t.Fatalf("a's guide types %v; want them cleared only when protected", a.allowed)
			}
		})
	}
}

// The fluid guide poses an elastic job that sets the fluid makespan at its
// fastest width. Four P100s and two V100s; elastic a (scale factor 4,
// widths 1, 2, 4) runs 30, 35, 50 steps/s on P100s and 40, 80, 20 on
// V100s (at 4 it is spread, slow on V100s), 3,600,000 steps left; rigid b
// (1 GPU) runs 10 on either. At the scale factors the relaxation's
// makespan is a's on all four P100s, 3,600,000/50 = 72,000 s, and a's
// remaining time at its scale factor on its fastest type, 72,000 s,
// reaches 0.9 of it: a is posed again at 2, where the V100s run it at 80,
// and the relaxation gives it the two V100s (45,000 s; any P100 share
// runs it slower), b a P100. Before, the guide kept a on the P100s at 50.
// With b 1,000,000 steps long (100,000 s), a does not bound the makespan
// and stays at its scale factor; run rigid it is posed as it is.
func TestElasticFluidGuidePosesTheMakespansJobAtItsFastestWidth(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bRem  float64
		rigid bool
		width int
	}{
		{"sets the makespan", 36000, false, 2},
		{"does not", 1000000, false, 4},
		{"rigid", 36000, true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := planner.Cluster{Nodes: []planner.Node{node("p0", "p100", 4), node("v0", "v100", 2)}}
			v := &round.View{Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c), Capacity: []float64{4, 2}}
			if v.Types[0] != "p100" || v.Types[1] != "v100" {
				t.Fatalf("types %v", v.Types)
			}
			a := &round.JobView{Job: planner.Job{ID: "a", Model: "a", ScaleFactor: 4, Widths: []int{1, 2, 4}, TotalSteps: 3.6e6, Weight: 1},
				Remaining: 3.6e6, Received: []float64{0, 0}, Throughput: []float64{50, 20},
				WidthThroughput: [][]float64{{30, 40}, {35, 80}, {50, 20}}}
			if tc.rigid {
				a.Widths, a.WidthThroughput = nil, nil
			}
			b := &round.JobView{Job: planner.Job{ID: "b", Model: "b", ScaleFactor: 1, TotalSteps: tc.bRem, Weight: 1},
				Remaining: tc.bRem, Received: []float64{0, 0}, Throughput: []float64{10, 10}}
			v.Jobs = []*round.JobView{a, b}
			v.Reasons = make([]round.Reason, len(v.Jobs))
			s, err := New(Config{Speed: speed.Model{Profile: widthRates{}}, Utility: Makespan, Horizon: 4, MinRunTime: -1})
			if err != nil {
				t.Fatal(err)
			}
			in, _, err := s.fluidInput(v)
			if err != nil {
				t.Fatal(err)
			}
			if got := in.Jobs[0].ScaleFactor; got != tc.width {
				t.Fatalf("a posed at %d; want %d", got, tc.width)
			}
			if in.Jobs[1].ScaleFactor != 1 || in.Jobs[1].Throughput[0] != 10 {
				t.Fatalf("b posed as %+v; want as it is", in.Jobs[1])
			}
			if tc.width != 2 {
				return
			}
			if err := s.guide(v, s.jobInfos(v)); err != nil {
				t.Fatal(err)
			}
			if row := s.fluid["a"]; row[0] || !row[1] {
				t.Fatalf("a guided to %v (p100, v100); want the V100s only", row)
			}
			if r := s.fluidRate["a"]; math.Abs(r-80) > 1e-6 {
				t.Fatalf("a's fluid rate %g; want 80", r)
			}
		})
	}
}

// typedJob is a job of the given widths (nil: rigid at sf) on the view's
// types, its figures from prof (a type absent from the job's rates map is
// one it cannot run on), at the placement u (none when nil).
func typedJob(v *round.View, prof typeWidthRates, id string, sf int, widths []int, rem float64, runs map[planner.GPUType]bool, u *planner.Unit) *round.JobView {
	jv := &round.JobView{Job: planner.Job{ID: id, Model: id, ScaleFactor: sf, Widths: widths, TotalSteps: rem, Weight: 1},
		Remaining: rem, Received: make([]float64, len(v.Types))}
	if u != nil {
		jv.Placement = planner.Placement{Units: []planner.Unit{*u}}
	}
	rate := func(ty planner.GPUType, w int) float64 {
		if !runs[ty] {
			return 0
		}
		return prof[ty][w]
	}
	for _, ty := range v.Types {
		jv.Throughput = append(jv.Throughput, rate(ty, sf))
	}
	for _, w := range widths {
		row := []float64{}
		for _, ty := range v.Types {
			row = append(row, rate(ty, w))
		}
		jv.WidthThroughput = append(jv.WidthThroughput, row)
	}
	return jv
}

// Elastic a (widths 1, 2, 4) runs on K80 node k0, the type the fluid
// guide gives it; node v0's four V100s are idle. Rigid b (K80s only,
// 100 h left) sets the makespan, so a (10 h) is neither protected nor
// critical and upgrade looks for it on the guide's types only, where
// there is nothing to grow onto. With no job waiting and the fluid
// solution leaving the V100s idle, a grows onto them (4 V100s, 16
// steps/s); with the V100s busy in the fluid solution, or a job waiting
// (c, 8 GPUs, fits nowhere), it stays on its K80.
func TestElasticGrowsOntoTypesTheFluidSolutionLeavesIdle(t *testing.T) {
	for _, tc := range []struct {
		name      string
		v100Use   float64
		waiting   bool
		wantWidth int
	}{
		{"idle in the fluid solution", 0, false, 4},
		{"busy in the fluid solution", 4, false, 1},
		{"a job waits", 0, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := typeWidthRates{"k80": {1: 1, 2: 1.9, 4: 3.6, 8: 7}, "v100": {1: 4, 2: 8, 4: 16, 8: 30}}
			c := planner.Cluster{Nodes: []planner.Node{node("k0", "k80", 1), node("k1", "k80", 1), node("v0", "v100", 4)}}
			v := &round.View{Now: 360, Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c)}
			for _, ty := range v.Types {
				v.Capacity = append(v.Capacity, float64(c.Capacity(ty)))
			}
			both := map[planner.GPUType]bool{"k80": true, "v100": true}
			onK80 := func(n string) *planner.Unit {
				return &planner.Unit{Slots: []planner.Slot{{Node: n, Type: "k80", Count: 1}}}
			}
			v.Jobs = []*round.JobView{
				typedJob(v, prof, "a", 1, []int{1, 2, 4}, 36000, both, onK80("k0")),
				typedJob(v, prof, "b", 1, nil, 360000, map[planner.GPUType]bool{"k80": true}, onK80("k1")),
			}
			if tc.waiting {
				v.Jobs = append(v.Jobs, typedJob(v, prof, "c", 8, nil, 36000, both, nil))
			}
			v.Reasons = make([]round.Reason, len(v.Jobs))
			guide := map[string][]bool{}
			use := make([]float64, len(v.Types))
			for _, jb := range v.Jobs {
				row := make([]bool, len(v.Types))
				for k, ty := range v.Types {
					row[k] = ty == "k80"
					if ty == "v100" {
						use[k] = tc.v100Use
					} else {
						use[k] = 2
					}
				}
				guide[jb.ID] = row
			}
			s := elasticSched(t, widthRates{}, Config{RestartCost: 20})
			s.cfg.Speed = speed.Model{Profile: prof}
			s.cfg.NoFluidGuide, s.cfg.Utility = false, Makespan
			s.fluid, s.fluidKey, s.fluidUse = guide, round.JobSetKey(v), use
			got := planned(t, s, v)
			if got["a"] != tc.wantWidth {
				t.Fatalf("a on %d GPUs, want %d: %s", got["a"], tc.wantWidth, why(v, "a"))
			}
			if got["b"] != 1 {
				t.Fatalf("b on %d GPUs, want its K80: %s", got["b"], why(v, "b"))
			}
		})
	}
}

// A critical elastic job is planned no wider than a server. Elastic a
// (widths 2, 4, 8; V100s only) runs 10, 19 and 30 steps/s; 8 workers
// spread over the two nodes of four V100s. Rigid b (a K80, 100 h) sets
// the target; a at its fastest, 8, takes 95 h, over 0.9 of it: a is
// critical and the dual plans it at 4 on one node, not at 8 over both.
// Run with servers of eight V100s, 8 is one server and it takes it.
func TestElasticCriticalJobNoWiderThanAServer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		perNode   int
		wantWidth int
	}{
		{"servers of four", 4, 4},
		{"servers of eight", 8, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := typeWidthRates{"k80": {1: 1}, "v100": {2: 10, 4: 19, 8: 30}}
			nodes := []planner.Node{node("k0", "k80", 1)}
			for i := 0; i < 8/tc.perNode; i++ {
				nodes = append(nodes, node(fmt.Sprintf("v%d", i), "v100", tc.perNode))
			}
			c := planner.Cluster{Nodes: nodes}
			v := &round.View{Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c)}
			for _, ty := range v.Types {
				v.Capacity = append(v.Capacity, float64(c.Capacity(ty)))
			}
			v.Jobs = []*round.JobView{
				typedJob(v, prof, "a", 8, []int{2, 4, 8}, 30*3600*95, map[planner.GPUType]bool{"v100": true}, nil),
				typedJob(v, prof, "b", 1, nil, 360000, map[planner.GPUType]bool{"k80": true}, nil),
			}
			v.Reasons = make([]round.Reason, len(v.Jobs))
			s := elasticSched(t, widthRates{}, Config{RestartCost: 20})
			s.cfg.Speed = speed.Model{Profile: prof}
			s.cfg.Utility = Makespan
			infos := s.jobInfos(v)
			s.value(v, infos)
			if !infos[0].critical {
				t.Fatalf("a not critical")
			}
			got := planned(t, s, v)
			if got["a"] != tc.wantWidth {
				t.Fatalf("a on %d GPUs, want %d: %s", got["a"], tc.wantWidth, why(v, "a"))
			}
		})
	}
}
