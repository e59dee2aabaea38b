package placement

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/netmodel"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/policy"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
)

// A sensitive model (Gavel: 100 steps/s consolidated on 2 V100s, 35
// spread) and an insensitive one.
const (
	sensitive   = "ResNet-18 (batch size 16)"
	insensitive = "ResNet-50 (batch size 64)"
)

// testCluster: racks of nodes of 4 V100s, nodes "v100-<i>".
func testCluster(racks, perRack int) planner.Cluster {
	var c planner.Cluster
	for r := range racks {
		for k := range perRack {
			c.Nodes = append(c.Nodes, planner.Node{ID: "v100-" + itoa(r*perRack+k), Rack: "rack-" + itoa(r), GPUs: map[planner.GPUType]int{"v100": 4}})
		}
	}
	return c
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func model() speed.Model { return speed.Model{Profile: profile.Default()} }

func newPolicy(t testing.TB, name string, cfg Config) *Policy {
	t.Helper()
	if cfg.Speed.Profile == nil {
		cfg.Speed = model()
	}
	p, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// halfFull takes 2 GPUs on every node: no node can hold a 4-GPU job.
func halfFull(c planner.Cluster) *round.Pool {
	pool := round.NewPool(c)
	for _, n := range c.Nodes {
		pool.Take(planner.Unit{Slots: []planner.Slot{{Node: n.ID, Type: "v100", Count: 2}}})
	}
	return pool
}

func view(c planner.Cluster, pool *round.Pool, now float64, jobs ...*round.JobView) *round.View {
	return &round.View{Now: now, Round: 360, Types: []planner.GPUType{"v100"}, Capacity: []float64{float64(c.Capacity("v100"))}, Cluster: c, Pool: pool, Jobs: jobs}
}

func job(id, m string, sf int, remaining float64) *round.JobView {
	return &round.JobView{Job: planner.Job{ID: id, Model: m, ScaleFactor: sf, TotalSteps: remaining, Weight: 1}, Remaining: remaining,
		Throughput: []float64{1}, Received: []float64{0}}
}

func TestUnknownPlacementListsValidNames(t *testing.T) {
	_, err := New("tight", Config{Speed: model()})
	if err == nil {
		t.Fatal("want an error")
	}
	for _, n := range Names() {
		if !contains(err.Error(), n) {
			t.Errorf("error %q does not list %q", err, n)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// The delay timer is honoured: the job waits while its wait is shorter
// than the timer of the best looser placement, and takes that placement at
// the first decision at or after it.
func TestDelayWaitsExactlyUntilTimer(t *testing.T) {
	c := testCluster(2, 2)
	for _, scale := range []float64{0.05, 0.2} {
		p := newPolicy(t, Delay, Config{Scale: scale, MaxPreemptions: -1})
		jb := job("j", sensitive, 4, 2e6)
		// The timer the first decision computes.
		pool := halfFull(c)
		cand, ok := Candidate(pool, "v100", 4, SameRack)
		if !ok || LevelOf(pool, cand) != SameRack {
			t.Fatalf("want a same-rack candidate, got %v %v", cand, ok)
		}
		s := p.slowdown(jb.Job, cand, 0)
		w := p.Timer(jb, "v100", s)
		if !(s > 1.5) || !(w > 360) || !(w < DefaultMaxWait) {
			t.Fatalf("fixture: slowdown %v timer %v: want a sensitive job and a timer of several rounds", s, w)
		}
		placedAt := -1.0
		for now := 0.0; now < w+2*360; now += 360 {
			units := p.Place(view(c, halfFull(c), now, jb), "v100", []int{0})
			if len(units[0].Slots) > 0 {
				placedAt = now
				if lvl := LevelOf(halfFull(c), units[0]); lvl != SameRack {
					t.Errorf("scale %v: accepted level %v, want the next level (rack)", scale, lvl)
				}
				break
			}
		}
		want := math.Ceil(w/360) * 360
		if placedAt != want {
			t.Errorf("scale %v: timer %.0f s: placed at %v, want the first decision at or after it, %v", scale, w, placedAt, want)
		}
	}
}

// Without a looser level's timer expiring, a consolidated placement is
// taken at once, and a zero scale never waits.
func TestDelayTakesConsolidatedAtOnceAndZeroScaleNeverWaits(t *testing.T) {
	c := testCluster(2, 2)
	p := newPolicy(t, Delay, Config{})
	units := p.Place(view(c, round.NewPool(c), 0, job("j", sensitive, 4, 1e6)), "v100", []int{0})
	if len(units[0].Slots) != 1 {
		t.Fatalf("free node: got %v, want one node", units[0])
	}
	p = newPolicy(t, Delay, Config{Scale: -1})
	units = p.Place(view(c, halfFull(c), 0, job("j", sensitive, 4, 1e6)), "v100", []int{0})
	if len(units[0].Slots) == 0 {
		t.Fatal("scale 0: the job waited")
	}
}

// consolidate never spreads a job a node could hold, and waits instead;
// a job wider than any node gets one rack.
func TestConsolidateNeverSpreads(t *testing.T) {
	c := testCluster(3, 3)
	p := newPolicy(t, Consolidate, Config{Seed: 3})
	for trial := range 200 {
		pool := round.NewPool(c)
		// Random fragmentation from spread placements.
		fill := newPolicy(t, Spread, Config{Seed: int64(trial)})
		for range trial % 30 {
			if u, ok := fill.spread(pool, "v100", 1); ok {
				pool.Take(u)
			}
		}
		for _, sf := range []int{1, 2, 3, 4, 8} {
			fits := false
			for _, n := range pool.Nodes() {
				fits = fits || pool.Free(n, "v100") >= sf
			}
			units := p.Place(view(c, pool.Clone(), float64(trial), job("j"+itoa(sf), sensitive, sf, 1e5)), "v100", []int{0})
			u := units[0]
			switch {
			case sf <= 4 && fits && u.Nodes() != 1:
				t.Fatalf("trial %d sf %d: a node has room, got %v", trial, sf, u)
			case sf <= 4 && !fits && len(u.Slots) != 0:
				t.Fatalf("trial %d sf %d: no node has room, got %v, want to wait", trial, sf, u)
			case sf == 8 && len(u.Slots) > 0 && LevelOf(pool, u) != SameRack:
				t.Fatalf("trial %d sf 8: got %v, want one rack", trial, u)
			}
		}
	}
}

// pack is Pool.Pack; spread is random (seeded) and does spread.
func TestPackAndSpread(t *testing.T) {
	c := testCluster(3, 3)
	pool := halfFull(c)
	pool.Release(planner.Unit{Slots: []planner.Slot{{Node: "v100-4", Type: "v100", Count: 2}}})
	p := newPolicy(t, Pack, Config{})
	got := p.Place(view(c, pool.Clone(), 0, job("j", sensitive, 4, 1e5)), "v100", []int{0})[0]
	want, _ := pool.Pack("v100", 4)
	if !got.Equal(want) || got.Nodes() != 1 {
		t.Errorf("pack: got %v, want Pool.Pack's %v", got, want)
	}
	multi := 0
	for seed := range 20 {
		a := newPolicy(t, Spread, Config{Seed: int64(seed)}).Place(view(c, round.NewPool(c), 0, job("j", sensitive, 4, 1e5)), "v100", []int{0})[0]
		b := newPolicy(t, Spread, Config{Seed: int64(seed)}).Place(view(c, round.NewPool(c), 0, job("j", sensitive, 4, 1e5)), "v100", []int{0})[0]
		if !a.Equal(b) || a.GPUs() != 4 {
			t.Fatalf("seed %d: %v and %v: want the same 4 GPUs for the same seed", seed, a, b)
		}
		if a.Nodes() > 1 {
			multi++
		}
	}
	if multi < 18 {
		t.Errorf("spread put a 4-GPU job on several nodes %d times of 20 on an empty cluster, want nearly always", multi)
	}
}

// Assign with the pack placer gives exactly what it gives without one.
func TestPackPlacerMatchesDefaultAssign(t *testing.T) {
	c := testCluster(3, 3)
	var jobs []*round.JobView
	for i, sf := range []int{4, 2, 1, 2, 4, 1, 3, 8, 2} {
		jb := job("j"+itoa(i), sensitive, sf, 1e5)
		jb.Received = []float64{float64(i)}
		jb.Arrival = 0
		jobs = append(jobs, jb)
	}
	x := make([][]float64, len(jobs))
	for i := range x {
		x[i] = []float64{0.5}
	}
	v1 := view(c, round.NewPool(c), 100, jobs...)
	v2 := view(c, round.NewPool(c), 100, jobs...)
	a := round.Assign(v1, x, round.AssignOptions{Backfill: true})
	b := round.Assign(v2, x, round.AssignOptions{Backfill: true, Placer: newPolicy(t, Pack, Config{})})
	for i := range a {
		if a[i].GPUs() != b[i].GPUs() || (len(a[i].Units) > 0 && !a[i].Units[0].Equal(b[i].Units[0])) {
			t.Errorf("job %d: default %v, pack placer %v", i, a[i], b[i])
		}
	}
}

// Preemption is bounded: in a busy simulation with sensitive 4-GPU jobs
// and insensitive small ones, preemptions happen, never more than the
// maximum per job, and never before the victim ran the minimum time.
func TestPreemptionBounded(t *testing.T) {
	c := testCluster(2, 3)
	var jobs []planner.Job
	for i := range 48 {
		jb := planner.Job{ID: "j" + itoa(i), Weight: 1, Arrival: float64(i) * 200}
		if i%3 == 0 {
			jb.Model, jb.ScaleFactor, jb.TotalSteps = sensitive, 4, 5e5
		} else {
			jb.Model, jb.ScaleFactor, jb.TotalSteps = insensitive, 1+i%2, 5e4
		}
		jobs = append(jobs, jb)
	}
	for _, lim := range []struct {
		max int
		min float64
	}{{1, 1200}, {2, 3600}} {
		p := newPolicy(t, Delay, Config{MaxPreemptions: lim.max, MinRunTime: lim.min, RestartCost: 20})
		runSim(t, c, jobs, model(), p)
		ps := p.Preemptions()
		if len(ps) == 0 {
			t.Fatalf("max %d: no preemption happened; the fixture should trigger some", lim.max)
		}
		per := map[string]int{}
		for _, e := range ps {
			per[e.Victim]++
			if e.RanFor < lim.min-1e-6 {
				t.Errorf("max %d: %s preempted after %.0f s on its GPUs, want >= %.0f", lim.max, e.Victim, e.RanFor, lim.min)
			}
			if !(e.Gain > DefaultMargin*e.Loss) {
				t.Errorf("preemption of %s: gain %.0f, loss %.0f: want gain > margin x loss", e.Victim, e.Gain, e.Loss)
			}
		}
		for id, n := range per {
			if n > lim.max {
				t.Errorf("%s preempted %d times, want <= %d", id, n, lim.max)
			}
		}
	}
}

func runSim(t testing.TB, c planner.Cluster, jobs []planner.Job, m speed.Model, p *Policy) sim.Result {
	t.Helper()
	sched := &round.PolicyScheduler{Policy: policy.MaxMin{}, Backfill: true, Placer: p}
	res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: m, RestartCost: 20}, sched)
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != len(jobs) {
		t.Fatalf("%d of %d jobs completed", res.Completed, len(jobs))
	}
	return res
}

// The tuner converges toward the scale with the least cost on a synthetic
// cost curve (minimum at 1/16) from its start at 1/4, with noise.
func TestTunerConverges(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		tu, err := NewTuner(TunerConfig{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		cost := func(scale float64) float64 {
			d := math.Log2(math.Max(scale, 1.0/256)) + 4
			return 1 + 0.05*d*d
		}
		noise := 0.0
		for i := range 400 {
			arm := tu.Pick(1)
			noise = math.Mod(noise+0.37, 0.1) - 0.05 // deterministic, +-5 %
			tu.Observe(float64(i), 1, arm, cost(tu.Scale(arm))*(1+noise))
		}
		if got := tu.Current(1); got < 1.0/32 || got > 1.0/8 {
			t.Errorf("seed %d: ended at scale %v, want near 1/16", seed, got)
		}
		if got := tu.Current(0); got != DefaultScale {
			t.Errorf("class 0 moved to %v without observations", got)
		}
		if len(tu.Trajectory()) < 4 {
			t.Errorf("trajectory %v: want the start points and the moves", tu.Trajectory())
		}
	}
}

func loadExample(t testing.TB, name string) *netmodel.Topology {
	t.Helper()
	tp, err := netmodel.LoadTopologyFile("../../netmodel/examples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

func exampleNetwork(t testing.TB, name string, jobs []planner.Job) (*Network, planner.Cluster) {
	t.Helper()
	tp := loadExample(t, name)
	c, err := planner.ParseClusterSpec("v100=36,p100=36,k80=36", 4)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = ApplyTopology(c, tp, name); err != nil {
		t.Fatal(err)
	}
	rep, err := netmodel.DefaultCalibration()
	if err != nil {
		t.Fatal(err)
	}
	nw, err := NewNetwork(tp, rep, profile.Default(), jobs, c.Types())
	if err != nil {
		t.Fatal(err)
	}
	return nw, c
}

// The simulator's slowdown grows with spread and with congestion.
func TestNetworkSlowdownMonotone(t *testing.T) {
	j := planner.Job{ID: "j", Model: sensitive, ScaleFactor: 4, TotalSteps: 1, Weight: 1}
	unit := func(nodes ...string) planner.Unit {
		var u planner.Unit
		for _, n := range nodes {
			u.Slots = append(u.Slots, planner.Slot{Node: n, Type: "v100", Count: 4 / len(nodes)})
		}
		return u
	}
	node, rack, cross := unit("v100-0"), unit("v100-0", "v100-1"), unit("v100-0", "v100-3")
	prev := map[string]float64{}
	for _, name := range []string{"uncongested.json", "congested-core.json"} {
		nw, c := exampleNetwork(t, name, []planner.Job{j})
		pool := round.NewPool(c)
		if LevelOf(pool, rack) != SameRack || LevelOf(pool, cross) != Anywhere {
			t.Fatalf("fixture: levels of %v and %v", rack, cross)
		}
		s := map[string]float64{"node": nw.Slowdown(j, node, 0), "rack": nw.Slowdown(j, rack, 0), "cross": nw.Slowdown(j, cross, 0)}
		if !(s["node"] <= s["rack"] && s["rack"] <= s["cross"] && s["rack"] > 1) {
			t.Errorf("%s: slowdowns %v: want node <= rack <= cross, rack > 1", name, s)
		}
		for k, v := range prev {
			if s[k] < v-1e-9 {
				t.Errorf("%s: %s slowdown %v below the uncongested %v", name, k, s[k], v)
			}
		}
		if prev["cross"] > 0 && !(s["cross"] > prev["cross"]) {
			t.Errorf("congested core: cross-rack slowdown %v, want above the uncongested %v", s["cross"], prev["cross"])
		}
		if f := nw.CommFraction(j, cross, 0); !(f > 0 && f < 1) {
			t.Errorf("%s: comm fraction %v, want in (0, 1)", name, f)
		}
		prev = s
	}
}

// In the simulator a spread job finishes later and communicates longer
// than a consolidated one, more so under congestion.
func TestSimSpreadCostsTimeAndComm(t *testing.T) {
	jobs := []planner.Job{{ID: "a", Model: sensitive, ScaleFactor: 4, TotalSteps: 5e5, Weight: 1}}
	type out struct{ jct, comm float64 }
	got := map[string]out{}
	for _, topo := range []string{"uncongested.json", "congested-core.json"} {
		nw, c := exampleNetwork(t, topo, jobs)
		m := speed.Model{Profile: profile.Default(), Network: nw}
		for _, pl := range []string{Consolidate, Spread} {
			res := runSim(t, c, jobs, m, newPolicy(t, pl, Config{Speed: m, Seed: 1}))
			got[topo+"/"+pl] = out{res.AvgJCT, res.CommOverhead}
		}
	}
	for _, topo := range []string{"uncongested.json", "congested-core.json"} {
		cons, spr := got[topo+"/consolidate"], got[topo+"/spread"]
		if !(spr.jct > cons.jct && spr.comm > cons.comm) {
			t.Errorf("%s: consolidated %+v, spread %+v: want spread slower with more communication", topo, cons, spr)
		}
	}
	if !(got["congested-core.json/spread"].jct > got["uncongested.json/spread"].jct) {
		t.Errorf("spread: congested %+v, uncongested %+v: want congestion slower", got["congested-core.json/spread"], got["uncongested.json/spread"])
	}
}

func TestApplyTopologyNamesMissingNode(t *testing.T) {
	tp := loadExample(t, "uncongested.json")
	c, err := planner.ParseClusterSpec("v100=40", 4)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ApplyTopology(c, tp, "uncongested.json")
	if err == nil || !contains(err.Error(), `"v100-9"`) {
		t.Fatalf("got %v, want an error naming node v100-9", err)
	}
	c, _ = planner.ParseClusterSpec("v100=36,p100=36,k80=36", 4)
	c, err = ApplyTopology(c, tp, "uncongested.json")
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(c.Nodes, func(n planner.Node) bool { return n.ID == "v100-3" }); c.Nodes[i].Rack != "rack-v100-1" {
		t.Errorf("v100-3 in %q, want the topology's rack-v100-1", c.Nodes[i].Rack)
	}
}

// fixed places every job on one given unit (one job at a time).
type fixed struct{ u planner.Unit }

func (f fixed) Name() string { return "fixed" }
func (f fixed) Schedule(v *round.View) ([]planner.Placement, error) {
	out := make([]planner.Placement, len(v.Jobs))
	if len(v.Jobs) > 0 && (!v.MidRound || !v.Jobs[0].Running) {
		out[0] = planner.Placement{Units: []planner.Unit{f.u}}
	}
	return out, nil
}

// Time-varying congestion reaches a job that keeps its GPUs: its rate is
// recomputed every round, so the busy hours of time-varying.json slow a
// cross-rack job down against the same topology kept quiet.
func TestTimeVaryingCongestionReachesRunningJobs(t *testing.T) {
	jobs := []planner.Job{{ID: "a", Model: sensitive, ScaleFactor: 4, TotalSteps: 2e6, Weight: 1}}
	cross := planner.Unit{Slots: []planner.Slot{{Node: "v100-0", Type: "v100", Count: 2}, {Node: "v100-3", Type: "v100", Count: 2}}}
	tv := loadExample(t, "time-varying.json")
	quiet, err := tv.WithCongestion(netmodel.Congestion{})
	if err != nil {
		t.Fatal(err)
	}
	jct := map[string]float64{}
	for name, tp := range map[string]*netmodel.Topology{"varying": tv, "quiet": quiet} {
		c, _ := planner.ParseClusterSpec("v100=36,p100=36,k80=36", 4)
		c, err := ApplyTopology(c, tp, name)
		if err != nil {
			t.Fatal(err)
		}
		rep, _ := netmodel.DefaultCalibration()
		nw, err := NewNetwork(tp, rep, profile.Default(), jobs, c.Types())
		if err != nil {
			t.Fatal(err)
		}
		res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: speed.Model{Profile: profile.Default(), Network: nw}}, fixed{cross})
		if err != nil {
			t.Fatal(err)
		}
		if res.Jobs[0].Restarts != 0 || res.Jobs[0].JCT < 5*3600 {
			t.Fatalf("%s: %+v: want one uninterrupted run past the busy hours", name, res.Jobs[0])
		}
		jct[name] = res.AvgJCT
	}
	if !(jct["varying"] > 1.05*jct["quiet"]) {
		t.Errorf("JCT %v: want the busy core to slow the running job down", jct)
	}
}

func TestTunerStartsAtTheFixedScale(t *testing.T) {
	for _, tc := range []struct{ scale, want float64 }{{0, DefaultScale}, {1, 1}, {-1, 0}, {0.06, 1.0 / 16}, {100, 1}} {
		p := newPolicy(t, DelayAutotune, Config{Scale: tc.scale})
		for c := range 3 {
			if got := p.Tuner().Current(c); got != tc.want {
				t.Errorf("scale %v: class %d starts at %v, want %v", tc.scale, c, got, tc.want)
			}
		}
	}
}

// TestMinRunTimeNone: 0 is the placer's default (30 minutes) and a
// negative value none, as in registry.Options, so that an operator's
// min_run_time = "0s" holds no job to a minimum before a preemption.
func TestMinRunTimeNone(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{{0, DefaultMinRunTime}, {-1, 0}, {600, 600}} {
		if got := newPolicy(t, Delay, Config{MinRunTime: c.in}).cfg.MinRunTime; got != c.want {
			t.Errorf("MinRunTime %v: the placer holds jobs %v s, want %v", c.in, got, c.want)
		}
	}
}
