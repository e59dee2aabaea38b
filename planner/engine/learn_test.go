package engine_test

import (
	"context"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

var updateFixtures = flag.Bool("update-fixtures", false, "rewrite testdata/snapshot-v<current>.json")

// withType returns p with a figure on type t of speed times ref's for
// every entry that has ref: a world where t exists.
func withType(t *testing.T, p *profile.Profile, typ, ref planner.GPUType, speed float64) *profile.Profile {
	t.Helper()
	var es []profile.Entry
	for _, e := range p.Entries() {
		if v, ok := e.Consolidated[ref]; ok {
			e.Consolidated[typ] = v * speed
			if s, ok := e.Spread[ref]; ok {
				e.Spread[typ] = s * speed
			}
		}
		es = append(es, e)
	}
	q, err := profile.New("test world", es)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// world reports, every step seconds from from to to, the progress each
// running job truly makes (truth's speed of its placement, after a 20 s
// restart), as a live cluster's progress files would.
type world struct {
	truth   speed.Model
	done    map[string]float64
	started map[string]float64
	where   map[string]string
}

func newWorld(truth speed.Profile) *world {
	return &world{truth: speed.Model{Profile: truth}, done: map[string]float64{}, started: map[string]float64{}, where: map[string]string{}}
}

func (w *world) run(t *testing.T, e *engine.Engine, from, to, step float64) {
	t.Helper()
	for now := from + step; now <= to+1e-9; now += step {
		for _, st := range e.Jobs() {
			id := st.Job.ID
			if !st.Running {
				delete(w.where, id)
				continue
			}
			key := placementKey(st.Placement)
			if w.where[id] != key {
				w.where[id], w.started[id] = key, now-step
			}
			r, err := w.truth.Rate(st.Job, st.Placement, now)
			if err != nil {
				t.Fatal(err)
			}
			w.done[id] += r * max(0, min(step, now-w.started[id]-20))
			if err := e.Progress(id, w.done[id], now); err != nil && !errors.Is(err, engine.ErrImplausible) {
				t.Fatal(err)
			}
		}
	}
}

func placementKey(p planner.Placement) string {
	var b strings.Builder
	for _, u := range p.Units {
		for _, s := range u.Slots {
			b.WriteString(s.Node + "/" + string(s.Type) + "/" + string(rune('0'+s.Count)) + ";")
		}
		b.WriteString("|")
	}
	return b.String()
}

func engineOn(t *testing.T, policy string, known speed.Profile, learn engine.LearnConfig, nodes []planner.Node) (*engine.Engine, *engine.Estimates) {
	t.Helper()
	est, err := engine.NewEstimates(known, learn)
	if err != nil {
		t.Fatal(err)
	}
	model := speed.Model{Profile: est}
	c := planner.Cluster{Nodes: nodes}
	sched, err := registry.New(policy, registry.Options{Types: c.Types(), Speed: model})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Round: 360, Speed: model}, sched)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetNodes(nodes, 0); err != nil {
		t.Fatal(err)
	}
	return e, est
}

func plan(t *testing.T, e *engine.Engine, now float64, kind engine.Kind) engine.Decision {
	t.Helper()
	d, err := e.Plan(context.Background(), now, kind)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Repairs) > 0 {
		t.Fatalf("t=%v: repairs %v", now, d.Repairs)
	}
	return d
}

func typeOf(st engine.JobState) planner.GPUType {
	if len(st.Placement.Units) == 0 {
		return ""
	}
	return st.Placement.Units[0].Slots[0].Type
}

// A model no profile names is planned, runs, and is learned: its figures
// come from its own reports, on every type it runs on.
func TestAnUnknownModelRunsAndIsLearned(t *testing.T) {
	nodes := []planner.Node{
		{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "k", Rack: "r", GPUs: map[planner.GPUType]int{"k80": 4}},
	}
	truthRate := map[planner.GPUType]float64{"v100": 40, "k80": 9}
	es := append(profile.Default().Entries(), profile.Entry{Model: "my-llm", ScaleFactor: 2, Consolidated: truthRate})
	truth, err := profile.New("truth", es)
	if err != nil {
		t.Fatal(err)
	}
	e, est := engineOn(t, "gavel-maxmin", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	if err := e.Admit(planner.Job{ID: "llm", Model: "my-llm", ScaleFactor: 2, TotalSteps: 1e8, Weight: 1}, 0); err != nil {
		t.Fatalf("a model no profile names is refused: %v", err)
	}
	d := plan(t, e, 0, engine.Boundary)
	if d.Jobs[0].Action != engine.Start {
		t.Fatalf("the unknown model does not start: %+v", d.Jobs[0])
	}
	st, _ := e.Job("llm")
	first := typeOf(st)
	if src := st.Estimates[string(first)].Source; src != "prior" {
		t.Fatalf("estimate before any report: %v, want prior", st.Estimates)
	}
	w := newWorld(truth)
	w.run(t, e, 0, 350, 10)
	// The job alone of its model: what it measured plans it.
	est.Refresh()
	ke, err := est.Estimate("my-llm", 2, first)
	if err != nil || ke.Source != "learned" || math.Abs(ke.Value-truthRate[first]) > 1e-6*truthRate[first] {
		t.Fatalf("after a round on %s: %+v, %v; want the true %v learned", first, ke, err, truthRate[first])
	}
	// The other type is estimated from what every other model shows.
	other := planner.GPUType("k80")
	if first == "k80" {
		other = "v100"
	}
	ke, _ = est.Estimate("my-llm", 2, other)
	if ke.Source != "completed" && ke.Source != "learned" {
		t.Fatalf("%s: %+v, want an estimate completed from the other models", other, ke)
	}
	if r := ke.Value / truthRate[other]; r < 0.5 || r > 2 {
		t.Fatalf("%s estimated at %v, the truth is %v", other, ke.Value, truthRate[other])
	}
	// A second job of the model, later, starts with what the first
	// measured: no figure says otherwise, and it is within MaxFactor of
	// what was estimated before (issue 31 bounds one job's influence).
	if err := e.Admit(planner.Job{ID: "llm2", Model: "my-llm", ScaleFactor: 2, TotalSteps: 1e5, Weight: 1, Arrival: 360}, 360); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 360, engine.Boundary)
	if st2, _ := e.Job("llm2"); st2.Throughput[string(first)] != truthRate[first] || st2.Estimates[string(first)].Source != "learned" {
		t.Fatalf("the second job's estimate on %s: %v (%v)", first, st2.Throughput, st2.Estimates)
	}
}

// One job alone of a model no figure names cannot move another job's
// estimate by more than MaxFactor from what was estimated before it
// reported, however plausible its claim per GPU (issue 31, item 2).
func TestALoneJobsClaimIsBoundedForOthers(t *testing.T) {
	nodes := []planner.Node{{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}}}
	// It claims 1000x what similar models make on a v100.
	truth, err := profile.New("truth", append(profile.Default().Entries(), profile.Entry{Model: "team-llm", ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"v100": 9000}}))
	if err != nil {
		t.Fatal(err)
	}
	e, est := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	if err := e.Admit(planner.Job{ID: "a", Model: "team-llm", ScaleFactor: 1, TotalSteps: 1e12, Weight: 1}, 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	before, _ := e.Job("a")
	prior := before.Throughput["v100"]
	if !(prior > 0) || prior*engine.MaxFactor > 9000 {
		t.Fatalf("estimate before any report %v: the test wants one far below the claim", prior)
	}
	w := newWorld(truth)
	w.run(t, e, 0, 400, 10)
	est.Refresh()
	if ke, _ := est.Estimate("team-llm", 1, "v100"); ke.Source != "learned" || ke.Value < 8999 {
		t.Fatalf("the job alone of its model: %+v, want its own 9000", ke)
	}
	if err := e.Admit(planner.Job{ID: "b", Model: "team-llm", ScaleFactor: 1, TotalSteps: 1e6, Weight: 1, Arrival: 400}, 400); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 400, engine.Boundary)
	st, _ := e.Job("b")
	if r := st.Throughput["v100"]; r > prior*engine.MaxFactor*(1+1e-9) {
		t.Fatalf("b planned at %v after a alone claimed 9000; the estimate was %v", r, prior)
	}
}

// A GPU type no figure covers is tried by a long job when it may well be
// faster, and once measured its speed is learned across models; a short
// job does not try it, and its reason names the type it has no estimate
// on.
func TestANewTypeIsExploredThenLearned(t *testing.T) {
	nodes := []planner.Node{
		{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "h", Rack: "r", GPUs: map[planner.GPUType]int{"h100": 4}},
	}
	truth := withType(t, profile.Default(), "h100", "v100", 3)
	e, est := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	short := planner.Job{ID: "short", Model: "ResNet-50 (batch size 64)", ScaleFactor: 1, TotalSteps: 200, Weight: 1}
	if err := e.Admit(short, 0); err != nil {
		t.Fatal(err)
	}
	d := plan(t, e, 0, engine.Boundary)
	st, _ := e.Job("short")
	if typeOf(st) != "v100" || !strings.Contains(d.Jobs[0].Reason.Why, "no figure of GPU type h100") {
		t.Fatalf("a short job: on %q, why %q; want v100 and the h100 gap named", typeOf(st), d.Jobs[0].Reason.Why)
	}
	if gs := est.Gaps(); len(gs) == 0 || gs[0].Type != "h100" {
		t.Fatalf("gaps %v", gs)
	}
	if err := e.Complete("short", 10); err != nil {
		t.Fatal(err)
	}
	long := planner.Job{ID: "long", Model: model, ScaleFactor: 1, TotalSteps: 1e8, Weight: 1, Arrival: 10}
	if err := e.Admit(long, 10); err != nil {
		t.Fatal(err)
	}
	d = plan(t, e, 10, engine.Fill)
	st, _ = e.Job("long")
	if typeOf(st) != "h100" || !strings.Contains(d.Jobs[0].Reason.Why, "trying h100") || !st.Estimates["h100"].Exploring {
		t.Fatalf("a long job: on %q, why %q, estimates %v; want it trying h100", typeOf(st), d.Jobs[0].Reason.Why, st.Estimates)
	}
	newWorld(truth).run(t, e, 10, 400, 10)
	v100, _ := profile.Default().Throughput(model, 1, "v100", false)
	ke, _ := est.Estimate(model, 1, "h100")
	if ke.Source != "learned" || ke.Exploring || math.Abs(ke.Value/v100-3) > 1e-6 {
		t.Fatalf("h100 after a round: %+v, want 3x v100 (%v) learned", ke, v100)
	}
	plan(t, e, 720, engine.Boundary)
	if st, _ := e.Job("long"); typeOf(st) != "h100" {
		t.Fatalf("the long job left the faster type: %v", st.Placement)
	}
	// Every other model now has an h100 estimate: the type's speed.
	other, _ := est.Estimate("Transformer (batch size 64)", 1, "h100")
	ref, _ := profile.Default().Throughput("Transformer (batch size 64)", 1, "v100", false)
	if other.Source != "completed" || other.Value/ref < 2 || other.Value/ref > 4.5 {
		t.Fatalf("another model on h100: %+v (its v100 figure %v)", other, ref)
	}
	if s, ok := est.TypeSpeeds("v100"); !ok || s["h100"] < 2 || s["h100"] > 4.5 {
		t.Fatalf("type speeds %v", s)
	}
}

// An operator's relative speed of a type gives it an estimate at once: no
// gap, and jobs use it as the oracle would when it says it is fastest.
func TestAnOperatorsRelativeSpeedGivesAnEstimate(t *testing.T) {
	bel := belief.NewProfile(profile.Default())
	if err := bel.SetRelativeSpeed("h100", "v100", 3); err != nil {
		t.Fatal(err)
	}
	nodes := []planner.Node{
		{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "h", Rack: "r", GPUs: map[planner.GPUType]int{"h100": 4}},
	}
	e, est := engineOn(t, "fifo", bel, engine.LearnConfig{On: true}, nodes)
	if err := e.Admit(planner.Job{ID: "x", Model: model, ScaleFactor: 1, TotalSteps: 300, Weight: 1}, 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	st, _ := e.Job("x")
	v100, _ := profile.Default().Throughput(model, 1, "v100", false)
	ke := st.Estimates["h100"]
	if typeOf(st) != "h100" || ke.Source != "operator" || ke.Value/v100 < 2 || ke.Value/v100 > 4 {
		t.Fatalf("on %q with h100 %+v (v100 %v)", typeOf(st), ke, v100)
	}
	if gs := est.Gaps(); len(gs) > 0 {
		t.Fatalf("gaps %v with an operator's speed", gs)
	}
}

// Every placement is learned from, through the speed model: a mixed unit
// teaches its slowest type, HadarE's narrower copies their own width.
func TestLearnsFromMixedUnitsAndCopies(t *testing.T) {
	prof := profile.Default()
	for _, tc := range []struct {
		name string
		job  planner.Job
		p    planner.Placement
		key  planner.GPUType
		sf   int
	}{
		{"mixed unit", job("m", 2, 1e9), place(unit(slot("a", "v100", 1), slot("c", "k80", 1))), "k80", 2},
		{"two copies", job("c", 2, 1e9), place(unit(slot("a", "v100", 1)), unit(slot("b", "v100", 1))), "v100", 1},
		{"spread unit", job("s", 2, 1e9), place(unit(slot("a", "v100", 1), slot("b", "v100", 1))), "v100", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			est, err := engine.NewEstimates(prof, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
			if err != nil {
				t.Fatal(err)
			}
			s := &scripted{next: map[string]planner.Placement{tc.job.ID: tc.p}}
			e := newEngine(t, s, engine.Config{Speed: speed.Model{Profile: est}})
			if err := e.Admit(tc.job, 0); err != nil {
				t.Fatal(err)
			}
			plan(t, e, 0, engine.Boundary)
			// The truth: 1.5 times what the profile says, everywhere.
			newWorld(scaled{prof, 1.5}).run(t, e, 0, 600, 10)
			if f := est.Factor(model, tc.sf, tc.key); math.Abs(f-1.5) > 1e-6 {
				t.Fatalf("factor of %s x%d: %v, want 1.5 (learned %+v)", tc.key, tc.sf, f, est.Learned())
			}
		})
	}
}

// A model no one measured has only guesses to bound its reports by:
// they are taken as written until its speed is measured.
func TestReportsOfAnUnmeasuredModelAreNotCutByAGuess(t *testing.T) {
	nodes := []planner.Node{{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}}}
	e, est := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	if err := e.Admit(planner.Job{ID: "x", Model: "fast-new-model", ScaleFactor: 1, TotalSteps: 1e12, Weight: 1}, 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	st, _ := e.Job("x")
	guess := st.Throughput["v100"]
	for now := 10.0; now <= 300; now += 10 {
		if err := e.Progress("x", 1000*guess*now, now); err != nil {
			t.Fatalf("t=%v: a report at 1000 times the guess: %v", now, err)
		}
	}
	ke, _ := est.Estimate("fast-new-model", 1, "v100")
	if ke.Source != "learned" || math.Abs(ke.Value/(1000*guess)-1) > 1e-6 {
		t.Fatalf("learned %+v, want %v", ke, 1000*guess)
	}
	// Measured now: a jump far past it is cut.
	plan(t, e, 360, engine.Boundary)
	if err := e.Progress("x", 1e11, 370); !errors.Is(err, engine.ErrImplausible) {
		t.Fatalf("a jump past the measured speed: %v", err)
	}
}

// The learned table exports as a profile that, loaded as an overlay,
// plans with the same figures.
func TestExportedTableLoadsAsAnOverlay(t *testing.T) {
	nodes := []planner.Node{
		{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "h", Rack: "r", GPUs: map[planner.GPUType]int{"h100": 4}},
	}
	truth := withType(t, profile.Default(), "h100", "v100", 2.5)
	bel := belief.NewProfile(profile.Default())
	e, est := engineOn(t, "fifo", bel, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	if _, err := est.Export("", "v100"); err == nil {
		t.Fatal("an export with nothing learned")
	}
	for i, id := range []string{"a", "b"} {
		if err := e.Admit(planner.Job{ID: id, Model: model, ScaleFactor: 1, TotalSteps: 1e9, Weight: 1}, float64(i)); err != nil {
			t.Fatal(err)
		}
	}
	plan(t, e, 1, engine.Boundary)
	newWorld(truth).run(t, e, 1, 800, 10)
	learned, _ := est.Estimate(model, 1, "h100")
	p, err := est.Export("learned by the test", "v100")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "learned.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	g := est.Generation()
	bel2 := belief.NewProfile(profile.Default())
	if err := bel2.LoadOverlay(path); err != nil {
		t.Fatal(err)
	}
	if got, err := bel2.Throughput(model, 1, "h100", false); err != nil || math.Abs(got-learned.Value) > 1e-9*learned.Value {
		t.Fatalf("the overlay says %v (%v), the estimates learned %+v", got, err, learned)
	}
	if r := bel2.RelativeSpeeds()["h100"]; r.Reference != "v100" || r.Speed < 2 || r.Speed > 3 {
		t.Fatalf("exported relative speed %+v", r)
	}
	// Reloading an overlay under live estimates changes their figures
	// (and their generation) without a restart.
	if err := bel.LoadOverlay(path); err != nil {
		t.Fatal(err)
	}
	if est.Generation() == g {
		t.Fatal("an overlay reload did not change the estimates' generation")
	}
	if ke, _ := est.Estimate(model, 1, "h100"); ke.Source != "profile" || math.Abs(ke.Value-learned.Value) > 1e-6*learned.Value {
		t.Fatalf("after the reload: %+v, want the profile's %v", ke, learned.Value)
	}
}

// Snapshots of every version restore: version 1 (before keys without a
// figure were learned) converts its ledgers exactly, and the current
// version's fixture restores to the same estimates.
func TestSnapshotFixturesRestore(t *testing.T) {
	if *updateFixtures {
		writeCurrentFixture(t)
	}
	for _, tc := range []struct {
		file  string
		check func(t *testing.T, e *engine.Engine, est *engine.Estimates)
	}{
		{"snapshot-v1.json", func(t *testing.T, e *engine.Engine, est *engine.Estimates) {
			if f := est.Factor("ResNet-18 (batch size 16)", 4, "k80"); math.Abs(f-1.5) > 1e-9 {
				t.Errorf("resnet's k80 factor %v, want 1.5", f)
			}
			if f := est.Factor("LM (batch size 20)", 4, "v100"); math.Abs(f-0.7) > 1e-9 {
				t.Errorf("lm's v100 factor %v, want 0.7", f)
			}
			if len(e.Jobs()) != 2 || e.Now() != 700 {
				t.Errorf("%d jobs at %v", len(e.Jobs()), e.Now())
			}
		}},
		{"snapshot-v2.json", func(t *testing.T, e *engine.Engine, est *engine.Estimates) {
			ke, err := est.Estimate("my-llm", 2, "v100")
			if err != nil || ke.Source != "learned" || math.Abs(ke.Value-40) > 1e-9 {
				t.Errorf("my-llm on v100: %+v, %v", ke, err)
			}
			if len(e.Jobs()) != 1 {
				t.Errorf("%d jobs", len(e.Jobs()))
			}
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			est, _ := engine.NewEstimates(profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
			model := speed.Model{Profile: est}
			sched, _ := registry.New("gavel-maxmin", registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: model})
			e, err := engine.Restore(data, engine.Config{Round: 360, Speed: model}, sched)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, e, est)
			// Written again in the current version, it restores the same.
			b, err := e.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			est2, _ := engine.NewEstimates(profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
			model2 := speed.Model{Profile: est2}
			sched2, _ := registry.New("gavel-maxmin", registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: model2})
			e2, err := engine.Restore(b, engine.Config{Round: 360, Speed: model2}, sched2)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, e2, est2)
			if a, b := est.Learned(), est2.Learned(); len(a) != len(b) {
				t.Fatalf("learned %v, then %v", a, b)
			}
		})
	}
}

// writeCurrentFixture writes the current version's fixture: an unknown
// model learned on v100, while k80 is explored.
func writeCurrentFixture(t *testing.T) {
	est, _ := engine.NewEstimates(profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	model := speed.Model{Profile: est}
	sched, _ := registry.New("gavel-maxmin", registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: model})
	e, _ := engine.New(engine.Config{Round: 360, Speed: model}, sched)
	e.SetNodes([]planner.Node{
		{ID: "node-1", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "node-2", Rack: "r2", GPUs: map[planner.GPUType]int{"k80": 4}},
	}, 0)
	if err := e.Admit(planner.Job{ID: "llm", Model: "my-llm", ScaleFactor: 2, TotalSteps: 1e9, Weight: 1}, 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	truth := map[planner.GPUType]float64{"v100": 40, "k80": 30}
	var es []profile.Entry
	es = append(es, profile.Entry{Model: "my-llm", ScaleFactor: 2, Consolidated: truth})
	tp, _ := profile.New("truth", append(es, profile.Default().Entries()...))
	newWorld(tp).run(t, e, 0, 350, 10)
	plan(t, e, 360, engine.Boundary)
	b, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "snapshot-v2.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Versions other than those this build reads are refused, naming them.
func TestSnapshotVersionsOutOfRangeAreRefused(t *testing.T) {
	for _, v := range []int{0, engine.SnapshotVersion + 1} {
		data, err := engine.Seal(engine.SnapshotFormat, v, map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = engine.Restore(data, engine.Config{Speed: speed.Model{Profile: profile.Default()}}, &scripted{})
		if err == nil || !strings.Contains(err.Error(), "reads versions 1 to") {
			t.Errorf("version %d: %v", v, err)
		}
	}
}

var _ round.Scheduler = (*scripted)(nil)

// A job that makes no progress (out of memory, a hung collective) is a
// fact about that job: it is counted, not learned as "cannot run here",
// and the model stays plannable there (issue 31: this test used to want a
// learned 0, which made every later job of the model unplannable).
func TestNoProgressIsAStallNotASpeed(t *testing.T) {
	var es []profile.Entry
	for _, e := range profile.Default().Entries() {
		if e.Model != "ResNet-50 (batch size 128)" {
			es = append(es, e)
		}
	}
	known, _ := profile.New("without ResNet-50 (batch size 128)", es)
	est, err := engine.NewEstimates(known, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if err != nil {
		t.Fatal(err)
	}
	m := "ResNet-50 (batch size 128)"
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("c", "k80", 2)))}}
	e := newEngine(t, s, engine.Config{Speed: speed.Model{Profile: est}})
	if err := e.Admit(planner.Job{ID: "x", Model: m, ScaleFactor: 2, TotalSteps: 1e6, Weight: 1}, 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	w := newWorld(profile.Default()) // the truth: 0 on k80
	w.run(t, e, 0, 400, 10)
	if err := e.Admit(planner.Job{ID: "y", Model: m, ScaleFactor: 2, TotalSteps: 1e6, Weight: 1, Arrival: 400}, 400); err != nil {
		t.Fatal(err)
	}
	s.next = map[string]planner.Placement{"x": place(unit(slot("a", "v100", 2))), "y": place(unit(slot("c", "k80", 2)))}
	plan(t, e, 400, engine.Boundary)
	for _, id := range []string{"x", "y"} {
		st, _ := e.Job(id)
		// x's own stall keeps x (only) off k80.
		if ke := st.Estimates["k80"]; ke.Source == "learned" || (st.Throughput["k80"] > 0) != (id == "y") {
			t.Fatalf("%s on k80 after a stall of 370 s: %+v, throughput %v", id, ke, st.Throughput)
		}
	}
	if n := est.Stalls()[m+" x2 on k80"]; n != 1 {
		t.Fatalf("stalls %v, want the one job counted", est.Stalls())
	}
}

// A job stalled for good makes no other job of its model unplannable:
// with no profile figure, a lone 0 used to be learned as the model's rate.
func TestAStalledJobLeavesItsModelPlannable(t *testing.T) {
	nodes := []planner.Node{{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}}}
	e, est := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	if err := e.Admit(planner.Job{ID: "hung", Model: "team-llm", ScaleFactor: 2, TotalSteps: 1e6, Weight: 1}, 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	for now := 10.0; now <= 1000; now += 10 {
		if err := e.Progress("hung", 0, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Admit(planner.Job{ID: "other", Model: "team-llm", ScaleFactor: 2, TotalSteps: 1e4, Weight: 1, Arrival: 1000}, 1000); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 1080, engine.Boundary)
	st, _ := e.Job("other")
	if !(st.Throughput["v100"] > 0) || !st.Running {
		t.Fatalf("another job of the stalled job's model: throughput %v, running %v (%v)", st.Throughput, st.Running, est.Learned())
	}
}

// A first report claiming all steps at once is cut and not learned: no
// rate a GPU cannot make becomes the model's, nor lifts the bound of
// other jobs' reports.
func TestALyingFirstReportIsNotLearned(t *testing.T) {
	nodes := []planner.Node{{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}}}
	e, est := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	if err := e.Admit(planner.Job{ID: "liar", Model: "team-llm", ScaleFactor: 1, TotalSteps: 1e12, Weight: 1}, 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	if err := e.Progress("liar", 1e12, 100); !errors.Is(err, engine.ErrImplausible) {
		t.Fatalf("all steps at once: %v, want it cut", err)
	}
	for now := 110.0; now <= 500; now += 10 {
		_ = e.Progress("liar", 1e12, now)
	}
	plan(t, e, 510, engine.Boundary)
	if ke, _ := est.Estimate("team-llm", 1, "v100"); ke.Value > engine.MaxRatePerGPU {
		t.Fatalf("learned %+v from a lie", ke)
	}
}

// One job alone cannot move another job's estimate: its measurement plans
// it, and only evidence from more than one job plans the others.
func TestOneJobAloneDoesNotMoveAnothersEstimate(t *testing.T) {
	prof := profile.Default()
	est, err := engine.NewEstimates(prof, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{next: map[string]planner.Placement{"a": place(unit(slot("a", "v100", 1)))}}
	e := newEngine(t, s, engine.Config{Speed: speed.Model{Profile: est}})
	if err := e.Admit(job("a", 1, 1e9), 0); err != nil {
		t.Fatal(err)
	}
	plan(t, e, 0, engine.Boundary)
	w := newWorld(scaled{prof, 1.5})
	w.run(t, e, 0, 600, 10)
	if f := est.Factor(model, 1, "v100"); math.Abs(f-1.5) > 1e-6 {
		t.Fatalf("the job alone: factor %v, want its own 1.5", f)
	}
	if err := e.Admit(job("b", 1, 1e9), 600); err != nil {
		t.Fatal(err)
	}
	s.next["b"] = place(unit(slot("b", "v100", 1)))
	plan(t, e, 600, engine.Boundary)
	fig, _ := prof.Throughput(model, 1, "v100", false)
	if st, _ := e.Job("b"); st.Throughput["v100"] != fig {
		t.Fatalf("b planned at %v on v100 after a alone reported; the profile says %v", st.Throughput["v100"], fig)
	}
	// Both measure the same: that is evidence for every job of the model.
	w.run(t, e, 600, 1200, 10)
	plan(t, e, 1200, engine.Boundary)
	if st, _ := e.Job("b"); math.Abs(st.Throughput["v100"]/fig-1.5) > 1e-6 {
		t.Fatalf("b after two jobs measured 1.5x: %v (figure %v)", st.Throughput["v100"], fig)
	}
}

// Two jobs of a model that both make no progress on a type (out of memory,
// say) teach that the model cannot run there: what one stall may not do,
// two agreeing do (without it, hadar sim --seed 2 --known-profile none
// --learn left a job on a type it cannot run on for 20 h).
func TestTwoStallsTeachCannotRun(t *testing.T) {
	nodes := []planner.Node{{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}}}
	e, est := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	for _, id := range []string{"a", "b"} {
		if err := e.Admit(planner.Job{ID: id, Model: "team-llm", ScaleFactor: 1, TotalSteps: 1e6, Weight: 1}, 0); err != nil {
			t.Fatal(err)
		}
	}
	plan(t, e, 0, engine.Boundary)
	for now := 10.0; now <= 200; now += 10 {
		_ = e.Progress("a", 0, now)
		_ = e.Progress("b", 0, now)
	}
	if ke, _ := est.Estimate("team-llm", 1, "v100"); ke.Source == "learned" {
		t.Fatalf("cannot-run learned before MinEvidence: %+v", ke)
	}
	for now := 210.0; now <= 500; now += 10 {
		_ = e.Progress("a", 0, now)
		_ = e.Progress("b", 0, now)
	}
	if ke, _ := est.Estimate("team-llm", 1, "v100"); ke.Source != "learned" || ke.Value != 0 {
		t.Fatalf("two jobs stalled 470 s: %+v, want cannot run (0) learned", ke)
	}
}

// A stall is shown on the job that stalled, from StallAfter without a
// step, and goes when it steps again; a job that steps never shows one.
func TestAStallIsShownOnItsJob(t *testing.T) {
	nodes := []planner.Node{{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}}}
	e, _ := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	for _, id := range []string{"hung", "fine"} {
		if err := e.Admit(planner.Job{ID: id, Model: "ResNet-50 (batch size 128)", ScaleFactor: 2, TotalSteps: 1e6, Weight: 1}, 0); err != nil {
			t.Fatal(err)
		}
	}
	plan(t, e, 0, engine.Boundary)
	stalled := func(id string) float64 {
		t.Helper()
		st, ok := e.Job(id)
		if !ok || !st.Running {
			t.Fatalf("%s: not running (%+v)", id, st)
		}
		return st.StalledS
	}
	for now := 10.0; now <= 290; now += 10 {
		if err := e.Progress("hung", 5, now); err != nil {
			t.Fatal(err)
		}
		if err := e.Progress("fine", now, now); err != nil {
			t.Fatal(err)
		}
	}
	if s := stalled("hung"); s != 0 {
		t.Fatalf("hung after 280 s without a step: stalled %v s, want none before %v s", s, engine.DefaultStallAfter)
	}
	for now := 300.0; now <= 400; now += 10 {
		if err := e.Progress("hung", 5, now); err != nil {
			t.Fatal(err)
		}
		if err := e.Progress("fine", now, now); err != nil {
			t.Fatal(err)
		}
	}
	if s := stalled("hung"); s != 390 {
		t.Fatalf("hung: stalled %v s, want 390 (its last step at 10 s)", s)
	}
	if s := stalled("fine"); s != 0 {
		t.Fatalf("fine: stalled %v s, want 0", s)
	}
	if err := e.Progress("hung", 6, 410); err != nil {
		t.Fatal(err)
	}
	if s := stalled("hung"); s != 0 {
		t.Fatalf("hung after a step: stalled %v s, want 0", s)
	}
}

// nothingKnown is a profile with no figure at all (hadar sim
// --known-profile none).
type nothingKnown struct{}

func (nothingKnown) Throughput(string, int, planner.GPUType, bool) (float64, error) {
	return 0, profile.ErrNoFigure
}

// Told nothing, a job spread over servers is planned slower than on one:
// assumed free, placement spread wide jobs where a server had room and
// learned the spread rate as the consolidated one (hadar's average JCT
// 6-8 % above full knowledge on 1,000 jobs, all of it on 2 to 8 GPUs).
func TestSpreadingIsNotFreeWhenNothingIsKnown(t *testing.T) {
	est, err := engine.NewEstimates(nothingKnown{}, engine.LearnConfig{On: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sf := range []int{2, 4, 8} {
		c, err := est.Throughput("team-llm", sf, "v100", false)
		if err != nil {
			t.Fatal(err)
		}
		s, err := est.Throughput("team-llm", sf, "v100", true)
		if err != nil {
			t.Fatal(err)
		}
		if !(s < c) || math.Abs(s/c-engine.UnknownSpread) > 1e-9 {
			t.Fatalf("x%d: spread %v, consolidated %v: want spread %v of consolidated", sf, s, c, engine.UnknownSpread)
		}
	}
}

// A job's own stall on a type keeps that job off the type while other
// jobs of its model run (and so the model's estimate there stands): the
// schedulers price a type through the model's estimates, so only its
// eligibility moves it. Before, b stayed on k80 making nothing (hadar
// sim --synthetic 1000 --seed 3 --known-profile none --learn: 20 h).
func TestAJobsOwnStallKeepsItOffTheType(t *testing.T) {
	const m = "ResNet-50 (batch size 128)"
	// Known: the model runs on k80 at 2 GPUs; truly it cannot.
	var es []profile.Entry
	for _, x := range profile.Default().Entries() {
		if x.Model == m && x.ScaleFactor == 2 {
			x.Consolidated["k80"] = x.Consolidated["v100"] / 4
		}
		es = append(es, x)
	}
	known, err := profile.New("k80 runs it", es)
	if err != nil {
		t.Fatal(err)
	}
	nodes := []planner.Node{
		{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 2}},
		{ID: "k", Rack: "r", GPUs: map[planner.GPUType]int{"k80": 2}},
	}
	learn := engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}
	e, est := engineOn(t, "fifo", known, learn, nodes)
	for _, id := range []string{"a", "b"} {
		if err := e.Admit(planner.Job{ID: id, Model: m, ScaleFactor: 2, TotalSteps: 1e9, Weight: 1}, 0); err != nil {
			t.Fatal(err)
		}
	}
	plan(t, e, 0, engine.Boundary)
	if st, _ := e.Job("b"); typeOf(st) != "k80" {
		t.Fatalf("b starts on %q, want k80 (the test's premise)", typeOf(st))
	}
	w := newWorld(profile.Default())
	w.run(t, e, 0, 360, 10)
	d := plan(t, e, 360, engine.Boundary)
	st, _ := e.Job("b")
	if typeOf(st) == "k80" || !slices.Equal(st.StalledOn, []planner.GPUType{"k80"}) {
		t.Fatalf("b after stalling 300 s on k80: on %q, stalled on %v (%s)", typeOf(st), st.StalledOn, st.Reason.Why)
	}
	for _, jd := range d.Jobs {
		if jd.Job == "b" && !strings.Contains(jd.Reason.Why, "stalled on k80: not planned there") {
			t.Fatalf("b's reason: %q", jd.Reason.Why)
		}
	}
	if st, _ := e.Job("a"); !(st.Throughput["k80"] > 0) || st.StalledOn != nil {
		t.Fatalf("a, which never stalled: throughput %v, stalled on %v", st.Throughput, st.StalledOn)
	}
	if ke, _ := est.Estimate(m, 2, "k80"); !(ke.Value > 0) {
		t.Fatalf("one job's stall moved the model's estimate: %+v", ke)
	}
	// Kept off for good, across a restart of the engine.
	b, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	est2, _ := engine.NewEstimates(known, learn)
	model := speed.Model{Profile: est2}
	sched, err := registry.New("fifo", registry.Options{Types: planner.Cluster{Nodes: nodes}.Types(), Speed: model})
	if err != nil {
		t.Fatal(err)
	}
	if e, err = engine.Restore(b, engine.Config{Round: 360, Speed: model}, sched); err != nil {
		t.Fatal(err)
	}
	// Kept by the snapshot itself, not found again in the ledgers at the
	// next plan (they may have been folded or expired by then).
	if st, _ := e.Job("b"); !slices.Equal(st.StalledOn, []planner.GPUType{"k80"}) || st.Throughput["k80"] != 0 {
		t.Fatalf("b restored: stalled on %v, throughput %v", st.StalledOn, st.Throughput)
	}
	for now := 720.0; now <= 3600; now += 360 {
		w.run(t, e, now-360, now, 10)
		plan(t, e, now, engine.Boundary)
		if st, _ := e.Job("b"); typeOf(st) == "k80" {
			t.Fatalf("t=%v: b placed on k80 again (%s)", now, st.Reason.Why)
		}
	}
}

// A job that stalls on every type it can run on still runs on one, and
// its reason says why; the sidecar's eligibility and the exclusion do
// not overwrite each other.
func TestStallsOnEveryTypeKeepTheLast(t *testing.T) {
	nodes := []planner.Node{
		{ID: "v", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 1}},
		{ID: "p", Rack: "r", GPUs: map[planner.GPUType]int{"p100": 1}},
		{ID: "k", Rack: "r", GPUs: map[planner.GPUType]int{"k80": 1}},
	}
	e, _ := engineOn(t, "fifo", profile.Default(), engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300}, nodes)
	for _, id := range []string{"hung", "other"} {
		if err := e.Admit(planner.Job{ID: id, Model: model, ScaleFactor: 1, TotalSteps: 1e9, Weight: 1}, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The sidecar's rules keep hung off p100.
	if err := e.SetEligible("hung", round.Eligible{"v": {"v100": true}, "k": {"k80": true}}, "", 0); err != nil {
		t.Fatal(err)
	}
	steps := 0.0
	seen := map[planner.GPUType]bool{}
	for now := 0.0; now <= 3600; now += 360 {
		plan(t, e, now, engine.Boundary)
		st, _ := e.Job("hung")
		if typ := typeOf(st); typ != "" {
			seen[typ] = true
		}
		for at := now + 10; at <= now+360; at += 10 {
			_ = e.Progress("hung", 0, at)
			steps += 10
			_ = e.Progress("other", steps, at)
		}
	}
	st, _ := e.Job("hung")
	if seen["p100"] || !seen["v100"] || !seen["k80"] {
		t.Fatalf("hung ran on %v, want v100 and k80 only", seen)
	}
	if !st.Running || len(st.StalledOn) != 1 || !strings.Contains(st.Reason.Why, "still planned there") {
		t.Fatalf("hung stalled everywhere it may run: running %v, stalled on %v, reason %q", st.Running, st.StalledOn, st.Reason.Why)
	}
}
