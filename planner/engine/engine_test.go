package engine_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

const model = "ResNet-18 (batch size 16)"

// scripted returns, per plan, the placements it is told to, by job ID.
type scripted struct {
	next  map[string]planner.Placement
	views []*round.View
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Schedule(v *round.View) ([]planner.Placement, error) {
	s.views = append(s.views, v)
	out := make([]planner.Placement, len(v.Jobs))
	for i, j := range v.Jobs {
		out[i] = s.next[j.ID]
	}
	return out, nil
}

func unit(slots ...planner.Slot) planner.Unit { return planner.Unit{Slots: slots} }
func place(us ...planner.Unit) planner.Placement {
	return planner.Placement{Units: us}
}
func slot(node string, t planner.GPUType, n int) planner.Slot {
	return planner.Slot{Node: node, Type: t, Count: n}
}

func nodes() []planner.Node {
	return []planner.Node{
		{ID: "a", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "b", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "c", Rack: "r2", GPUs: map[planner.GPUType]int{"k80": 4}},
	}
}

func newEngine(t *testing.T, s round.Scheduler, cfg engine.Config) *engine.Engine {
	t.Helper()
	if cfg.Speed.Profile == nil {
		cfg.Speed = speed.Model{Profile: profile.Default()}
	}
	e, err := engine.New(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetNodes(nodes(), 0); err != nil {
		t.Fatal(err)
	}
	return e
}

func job(id string, sf int, steps float64) planner.Job {
	return planner.Job{ID: id, Model: model, ScaleFactor: sf, TotalSteps: steps, Weight: 1}
}

func actions(d engine.Decision) map[string]engine.Action {
	out := map[string]engine.Action{}
	for _, jd := range d.Jobs {
		out[jd.Job] = jd.Action
	}
	return out
}

func TestDecisionActions(t *testing.T) {
	s := &scripted{}
	e := newEngine(t, s, engine.Config{})
	ctx := context.Background()
	for _, id := range []string{"start", "keep", "move", "fork", "unfork", "stop", "wait"} {
		if err := e.Admit(job(id, 1, 1e6), 0); err != nil {
			t.Fatal(err)
		}
	}
	// Round 1: everything but "wait" starts; unfork starts forked.
	s.next = map[string]planner.Placement{
		"keep":   place(unit(slot("a", "v100", 1))),
		"move":   place(unit(slot("a", "v100", 1))),
		"fork":   place(unit(slot("a", "v100", 1))),
		"unfork": place(unit(slot("b", "v100", 1)), unit(slot("c", "k80", 1))),
		"stop":   place(unit(slot("b", "v100", 1))),
	}
	d, err := e.Plan(ctx, 0, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]engine.Action{"keep": engine.Start, "unfork": engine.Start, "start": engine.Wait, "wait": engine.Wait} {
		if got := actions(d)[id]; got != want {
			t.Fatalf("round 1: %s: %s, want %s", id, got, want)
		}
	}
	// Round 2.
	s.next = map[string]planner.Placement{
		"start":  place(unit(slot("c", "k80", 1))),
		"keep":   place(unit(slot("a", "v100", 1))),
		"move":   place(unit(slot("b", "v100", 1))),
		"fork":   place(unit(slot("a", "v100", 1)), unit(slot("c", "k80", 1))),
		"unfork": place(unit(slot("b", "v100", 1))),
	}
	d, err = e.Plan(ctx, 360, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]engine.Action{"start": engine.Start, "keep": engine.Keep, "move": engine.Move, "fork": engine.Fork,
		"unfork": engine.Unfork, "stop": engine.Stop, "wait": engine.Wait}
	if got := actions(d); !reflect.DeepEqual(got, want) {
		t.Fatalf("round 2 actions %v, want %v", got, want)
	}
	for _, jd := range d.Jobs {
		switch jd.Job {
		case "fork":
			if !slices.Equal(jd.KeptFrom, []int{0, -1}) {
				t.Fatalf("fork: kept from %v, want [0 -1]", jd.KeptFrom)
			}
		case "move":
			if !slices.Equal(jd.KeptFrom, []int{-1}) {
				t.Fatalf("move: kept from %v, want [-1]", jd.KeptFrom)
			}
		case "unfork":
			if !slices.Equal(jd.KeptFrom, []int{0}) {
				t.Fatalf("unfork: kept from %v, want [0]", jd.KeptFrom)
			}
		}
	}
	if got := len(d.Changes()); got != 5 {
		t.Fatalf("%d changes, want 5 (all but keep and wait)", got)
	}
	// Received time: "keep" ran 360 s on one V100 in round 1.
	st, _ := e.Job("keep")
	if got := st.Received["v100"]; got != 360 {
		t.Fatalf("keep received %v s on v100, want 360", got)
	}
	// "unfork" ran two units (v100, k80) for 360 s: half the time each.
	st, _ = e.Job("unfork")
	if st.Received["v100"] != 180 || st.Received["k80"] != 180 {
		t.Fatalf("unfork received %v, want 180 s on each type", st.Received)
	}
}

func TestFillRunsOnlyWhenSomethingChanged(t *testing.T) {
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}}
	e := newEngine(t, s, engine.Config{})
	ctx := context.Background()
	if err := e.Admit(job("x", 1, 1e6), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	d, err := e.Plan(ctx, 10, engine.Fill)
	if err != nil || d.Kind != engine.None {
		t.Fatalf("fill with nothing new: kind %s, err %v; want none", d.Kind, err)
	}
	if err := e.Admit(job("y", 1, 1e6), 20); err != nil {
		t.Fatal(err)
	}
	s.next["y"] = place(unit(slot("a", "v100", 1)))
	d, err = e.Plan(ctx, 20, engine.Fill)
	if err != nil || d.Kind != engine.Fill {
		t.Fatalf("fill after an arrival: kind %s, err %v", d.Kind, err)
	}
	// Mid-round, running jobs keep their GPUs whatever the scheduler says,
	// and the pool it saw had x's GPU taken.
	v := s.views[len(s.views)-1]
	if !v.MidRound || v.Pool.Free("a", "v100") != 3 {
		t.Fatalf("fill view: mid-round %v, free on a %d; want true, 3", v.MidRound, v.Pool.Free("a", "v100"))
	}
	if a := actions(d); a["x"] != engine.Keep || a["y"] != engine.Start {
		t.Fatalf("fill actions %v", a)
	}
	// Fills off (Gavel's simulator): never.
	e2 := newEngine(t, s, engine.Config{NoFills: true})
	if err := e2.Admit(job("z", 1, 1e6), 0); err != nil {
		t.Fatal(err)
	}
	if d, err := e2.Plan(ctx, 0, engine.Fill); err != nil || d.Kind != engine.None {
		t.Fatalf("fills off: kind %s, err %v", d.Kind, err)
	}
}

func TestInvalidPlacementsAreRepairedNotFatal(t *testing.T) {
	ctx := context.Background()
	big := planner.Job{ID: "z", Model: "ResNet-50 (batch size 128)", ScaleFactor: 2, TotalSteps: 1e6, Weight: 1}
	for _, tc := range []struct {
		name string
		next map[string]planner.Placement
		bad  string // the job repaired
		want string // in its reason
		act  engine.Action
	}{
		{"double booking", map[string]planner.Placement{"x": place(unit(slot("a", "v100", 2))), "y": place(unit(slot("a", "v100", 4)))}, "y", "not free", engine.Wait},
		{"unknown node", map[string]planner.Placement{"x": place(unit(slot("a", "v100", 2))), "y": place(unit(slot("zz", "v100", 4)))}, "y", "not a schedulable node", engine.Wait},
		{"wrong width", map[string]planner.Placement{"x": place(unit(slot("a", "v100", 2))), "y": place(unit(slot("b", "v100", 2)))}, "y", "want its scale factor", engine.Wait},
		{"too wide a copy", map[string]planner.Placement{"x": place(unit(slot("a", "v100", 2))), "y": place(unit(slot("b", "v100", 4)), unit(slot("c", "k80", 5)))}, "y", "exceeds its scale factor", engine.Wait},
		{"where it cannot run", map[string]planner.Placement{"x": place(unit(slot("a", "v100", 2))), "z": place(unit(slot("c", "k80", 2)))}, "z", "cannot run", engine.Wait},
		{"a running job moved nowhere keeps its own", map[string]planner.Placement{"y": place(unit(slot("b", "v100", 4))), "x": place(unit(slot("zz", "v100", 2)))}, "x", "keeps its GPUs", engine.Keep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{}
			e := newEngine(t, s, engine.Config{})
			for _, jb := range []planner.Job{job("x", 2, 1e6), job("y", 4, 1e6), big} {
				if err := e.Admit(jb, 0); err != nil {
					t.Fatal(err)
				}
			}
			s.next = map[string]planner.Placement{"x": place(unit(slot("a", "v100", 2)))}
			if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
				t.Fatal(err)
			}
			s.next = tc.next
			d, err := e.Plan(ctx, 100, engine.Boundary)
			if err != nil {
				t.Fatalf("a bad placement failed the whole plan: %v", err)
			}
			if len(d.Repairs) != 1 || d.Repairs[0].Job != tc.bad || !strings.Contains(d.Repairs[0].Why, tc.want) {
				t.Fatalf("repairs %+v, want one for %s saying %q", d.Repairs, tc.bad, tc.want)
			}
			got := actions(d)
			if got[tc.bad] != tc.act {
				t.Fatalf("%s: %s, want %s", tc.bad, got[tc.bad], tc.act)
			}
			for id, p := range tc.next {
				if id == tc.bad {
					continue
				}
				js, _ := e.Job(id)
				if !reflect.DeepEqual(js.Placement, p) {
					t.Fatalf("%s runs on %v, want the scheduler's %v: one bad answer changed another job's", id, js.Placement, p)
				}
			}
			for _, jd := range d.Jobs {
				if jd.Job == tc.bad && !strings.Contains(jd.Reason.Why, "plan repaired") {
					t.Fatalf("reason of %s: %q", tc.bad, jd.Reason.Why)
				}
			}
		})
	}
}

// failing is a scheduler whose solve fails.
type failing struct{}

func (failing) Name() string { return "failing" }
func (failing) Schedule(*round.View) ([]planner.Placement, error) {
	return nil, errors.New("solver diverged")
}

func TestAFailingSchedulerFallsBackInsteadOfStalling(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, failing{}, engine.Config{})
	for _, jb := range []planner.Job{job("x", 4, 1e6), job("y", 4, 1e6), job("w", 8, 1e6)} {
		if err := e.Admit(jb, 0); err != nil {
			t.Fatal(err)
		}
	}
	d, err := e.Plan(ctx, 0, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Repairs) != 1 || d.Repairs[0].Job != "" || !strings.Contains(d.Repairs[0].Why, "solver diverged") {
		t.Fatalf("repairs %+v", d.Repairs)
	}
	a := actions(d)
	if a["x"] != engine.Start || a["y"] != engine.Start || a["w"] != engine.Wait {
		t.Fatalf("fallback: %v (want x and y started on the free GPUs first come first served)", a)
	}
	d, err = e.Plan(ctx, 360, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	if a := actions(d); a["x"] != engine.Keep || a["y"] != engine.Keep {
		t.Fatalf("a second fallback moved running jobs: %v", a)
	}
}

func TestHadarNeverPlansOnHeldGPUs(t *testing.T) {
	// A job hadar does not manage holds GPUs: at every boundary and fill,
	// Hadar's answer must fit what the engine offers, on every node the
	// held GPUs could sit on (the bug: its calendar took each node's
	// capacity from the whole cluster and the engine refused every plan).
	ctx := context.Background()
	for _, n := range []string{"a", "b"} {
		for _, policy := range []string{"hadar", "hadare", "hadar-jct"} {
			t.Run(policy+"/held on "+n, func(t *testing.T) {
				sched, err := registry.New(policy, registry.Options{Speed: speed.Model{Profile: profile.Default()}})
				if err != nil {
					t.Fatal(err)
				}
				e := newEngine(t, sched, engine.Config{})
				if err := e.SetHeld(map[string]map[planner.GPUType]int{n: {"v100": 1}}, 0); err != nil {
					t.Fatal(err)
				}
				jobs := []planner.Job{job("x", 2, 1e6), job("y", 4, 1e6), job("z", 1, 1e5)}
				for k, jb := range jobs {
					if err := e.Admit(jb, float64(k)); err != nil {
						t.Fatal(err)
					}
					if _, err := e.Plan(ctx, float64(k), engine.Fill); err != nil {
						t.Fatal(err)
					}
				}
				for r := 1; r <= 4; r++ {
					d, err := e.Plan(ctx, float64(360*r), engine.Boundary)
					if err != nil {
						t.Fatal(err)
					}
					if len(d.Repairs) > 0 {
						t.Fatalf("round %d: the engine had to repair the plan: %+v", r, d.Repairs)
					}
				}
				for _, js := range e.Jobs() {
					for _, u := range js.Placement.Units {
						for _, sl := range u.Slots {
							if sl.Node == n && sl.Type == "v100" && sl.Count > 3 {
								t.Fatalf("%s placed on %v: more than the 3 GPUs not held", js.Job.ID, sl)
							}
						}
					}
				}
			})
		}
	}
}

func TestNodeLossStopsItsJobsAndProgressGoesBack(t *testing.T) {
	s := &scripted{next: map[string]planner.Placement{
		"lost": place(unit(slot("a", "v100", 2), slot("b", "v100", 2))),
		"safe": place(unit(slot("c", "k80", 1))),
	}}
	e := newEngine(t, s, engine.Config{})
	ctx := context.Background()
	for _, jb := range []planner.Job{job("lost", 4, 1e6), job("safe", 1, 1e6)} {
		if err := e.Admit(jb, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	if err := e.Progress("lost", 5000, 300); err != nil {
		t.Fatal(err)
	}
	hit, err := e.RemoveNode("b", 400)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(hit, []string{"lost"}) {
		t.Fatalf("interrupted %v, want [lost]", hit)
	}
	// The caller reports where the job went back to: its checkpoint.
	if err := e.Progress("lost", 2000, 400); err != nil {
		t.Fatal(err)
	}
	st, _ := e.Job("lost")
	if st.Running || st.Done != 2000 || st.Remaining != 1e6-2000 {
		t.Fatalf("lost job: running %v, done %v, remaining %v", st.Running, st.Done, st.Remaining)
	}
	// A fill re-places it on what is left (4 GPUs needed, one 4-GPU V100
	// node left).
	s.next["lost"] = place(unit(slot("a", "v100", 4)))
	d, err := e.Plan(ctx, 400, engine.Fill)
	if err != nil {
		t.Fatal(err)
	}
	if a := actions(d); a["lost"] != engine.Start || a["safe"] != engine.Keep {
		t.Fatalf("after the loss: %v", a)
	}
	if got := e.Cluster().Capacity("v100"); got != 4 {
		t.Fatalf("v100 capacity %d after losing b, want 4", got)
	}
}

func TestDrainMovesJobsAtTheNextBoundary(t *testing.T) {
	reg, err := registry.New("gavel-maxmin", registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: speed.Model{Profile: profile.Default()}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, reg, engine.Config{})
	ctx := context.Background()
	if err := e.Admit(job("x", 4, 1e7), 0); err != nil {
		t.Fatal(err)
	}
	d, err := e.Plan(ctx, 0, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	node := d.Jobs[0].To.Units[0].Slots[0].Node
	if err := e.Drain(node, true, 100); err != nil {
		t.Fatal(err)
	}
	// Between boundaries it keeps running on the draining node.
	if d, err = e.Plan(ctx, 100, engine.Fill); err != nil || actions(d)["x"] != engine.Keep {
		t.Fatalf("fill after drain: %v, %v", actions(d), err)
	}
	d, err = e.Plan(ctx, 360, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	if jd := d.Jobs[0]; jd.Action != engine.Move || onNode(jd.To, node) {
		t.Fatalf("at the boundary: %s to %v, want a move off %s", jd.Action, jd.To, node)
	}
}

func onNode(p planner.Placement, n string) bool {
	for _, u := range p.Units {
		for _, s := range u.Slots {
			if s.Node == n {
				return true
			}
		}
	}
	return false
}

func TestLosingAGPUInterruptsTheLastJobOnIt(t *testing.T) {
	s := &scripted{next: map[string]planner.Placement{
		"first":  place(unit(slot("a", "v100", 2))),
		"second": place(unit(slot("a", "v100", 2))),
	}}
	e := newEngine(t, s, engine.Config{})
	for _, id := range []string{"first", "second"} {
		if err := e.Admit(job(id, 2, 1e6), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	hit, err := e.SetNode(planner.Node{ID: "a", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 3}}, 50)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(hit, []string{"second"}) {
		t.Fatalf("interrupted %v, want [second]", hit)
	}
}

func TestInputsAreNotMutatedAndOutputsAreCopies(t *testing.T) {
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}}
	e := newEngine(t, s, engine.Config{})
	n := planner.Node{ID: "d", Rack: "r3", GPUs: map[planner.GPUType]int{"v100": 2}}
	if _, err := e.SetNode(n, 0); err != nil {
		t.Fatal(err)
	}
	n.GPUs["v100"] = 100 // the caller's map is the caller's
	if got := e.Cluster().Capacity("v100"); got != 10 {
		t.Fatalf("v100 capacity %d, want 10: the engine kept the caller's map", got)
	}
	jb := job("x", 1, 1e6)
	if err := e.Admit(jb, 0); err != nil {
		t.Fatal(err)
	}
	d, err := e.Plan(context.Background(), 0, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	d.Jobs[0].To.Units[0].Slots[0].Node = "zz" // the decision is the caller's
	st, _ := e.Job("x")
	if st.Placement.Units[0].Slots[0].Node != "a" {
		t.Fatal("editing a decision changed the engine's placement")
	}
	st.Placement.Units[0].Slots[0].Count = 9
	if again, _ := e.Job("x"); again.Placement.Units[0].Slots[0].Count != 1 {
		t.Fatal("editing a job state changed the engine's placement")
	}
}

func TestRemainingIsNeverZeroForAnActiveJob(t *testing.T) {
	// Finish-time fairness divides by remaining steps: a job that ran past
	// its declared steps must not reach it with nothing left.
	reg, err := registry.New("gavel-ftf", registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: speed.Model{Profile: profile.Default()}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, reg, engine.Config{})
	ctx := context.Background()
	for _, id := range []string{"x", "y"} {
		if err := e.Admit(job(id, 1, 1000), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	if err := e.Progress("x", 1500, 100); err != nil { // ran past its declared steps
		t.Fatal(err)
	}
	if _, err := e.Plan(ctx, 360, engine.Boundary); err != nil {
		t.Fatalf("plan with an overrunning job: %v", err)
	}
}

func TestLearningFindsTheTrueSpeed(t *testing.T) {
	prof := profile.Default()
	truth, _ := prof.Throughput(model, 1, "v100", false)
	// The declared profile says 40 % less than the truth.
	declared := scaled{prof, 0.6}
	est, err := engine.NewEstimates(declared, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}}
	e := newEngine(t, s, engine.Config{Speed: speed.Model{Profile: est}})
	if err := e.Admit(job("x", 1, 1e9), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	// Progress at the true speed, after a 20 s restart delay.
	for now := 10.0; now <= 600; now += 10 {
		if err := e.Progress("x", truth*math.Max(0, now-20), now); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := est.Throughput(model, 1, "v100", false)
	if math.Abs(got-truth) > 1e-9*truth {
		t.Fatalf("learned %v steps/s, want the true %v (declared %v)", got, truth, 0.6*truth)
	}
	// Another width of the model has learned nothing.
	if f := est.Factor(model, 2, "v100"); f != 1 {
		t.Fatalf("factor of an unobserved key %v, want 1", f)
	}
	// A snapshot keeps what was learned.
	b, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	est2, _ := engine.NewEstimates(declared, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if _, err := engine.Restore(b, engine.Config{Speed: speed.Model{Profile: est2}}, s); err != nil {
		t.Fatal(err)
	}
	if got2, _ := est2.Throughput(model, 1, "v100", false); got2 != got {
		t.Fatalf("restored estimate %v, want %v", got2, got)
	}
}

// A job's progress file is its own: the engine takes its count only as
// far as it is plausible.
func TestProgressReportsAreBoundedAndMonotone(t *testing.T) {
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}}
	e := newEngine(t, s, engine.Config{})
	if err := e.Admit(job("x", 1, 1e6), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	rate := e.Jobs()[0].Throughput["v100"]
	if err := e.Progress("x", 100, 10); err != nil {
		t.Fatal(err)
	}
	// Back, while it ran on the same GPUs throughout: ignored.
	if err := e.Progress("x", 50, 20); !errors.Is(err, engine.ErrImplausible) {
		t.Fatalf("a count going back without a restart: %v", err)
	}
	if st, _ := e.Job("x"); st.Done != 100 {
		t.Fatalf("done %v after an ignored report, want 100", st.Done)
	}
	// Far faster than any GPU it could run on: cut to the bound.
	err := e.Progress("x", 1e6, 30)
	st, _ := e.Job("x")
	if !errors.Is(err, engine.ErrImplausible) || st.Done >= 1e6 || st.Done > 100+2*engine.MaxFactor*rate*(20+60)+1e-6 {
		t.Fatalf("a jump to the end in 10 s: err %v, done %v (speed %v steps/s)", err, st.Done, rate)
	}
	// After a stop, back to the checkpoint is the truth.
	s.next = map[string]planner.Placement{}
	if _, err := e.Plan(context.Background(), 360, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	if err := e.Progress("x", 80, 370); err != nil {
		t.Fatalf("back to the checkpoint after a stop: %v", err)
	}
	if st, _ := e.Job("x"); st.Done != 80 {
		t.Fatalf("done %v, want 80", st.Done)
	}
	// A job that really is far ahead (reports lost for a while) catches up
	// as time passes: the bound grows from the last report taken as is.
	s.next = map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}
	if _, err := e.Plan(context.Background(), 720, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	far := 80 + 2*engine.MaxFactor*rate*500
	if err := e.Progress("x", far, 730); !errors.Is(err, engine.ErrImplausible) {
		t.Fatalf("%v steps 360 s after the last report: %v", far, err)
	}
	if err := e.Progress("x", far+rate*10, 3730); err != nil {
		t.Fatalf("the same count, later: %v", err)
	}
}

// One job's reports (a bug, or a file written to skew the estimates) move
// the estimate of its model by a bounded amount, and not at all once other
// jobs of the model have shown otherwise.
func TestOneJobMovesItsModelsEstimateBoundedly(t *testing.T) {
	prof := profile.Default()
	truth, _ := prof.Throughput(model, 1, "v100", false)
	est, err := engine.NewEstimates(prof, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{next: map[string]planner.Placement{}}
	e := newEngine(t, s, engine.Config{Speed: speed.Model{Profile: est}})
	ids := []string{"liar", "a", "b"}
	for _, id := range ids {
		if err := e.Admit(job(id, 1, 1e9), 0); err != nil {
			t.Fatal(err)
		}
	}
	s.next = map[string]planner.Placement{"liar": place(unit(slot("a", "v100", 1))), "a": place(unit(slot("b", "v100", 1))), "b": place(unit(slot("a", "v100", 1)))}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	// The liar alone first: it claims 100 times the true speed.
	for now := 10.0; now <= 600; now += 10 {
		_ = e.Progress("liar", 100*truth*now, now)
	}
	if f := est.Factor(model, 1, "v100"); f > engine.MaxFactor {
		t.Fatalf("one job alone set the factor to %v, above the bound %v", f, engine.MaxFactor)
	}
	// Two honest jobs of the model: the liar no longer moves it.
	for now := 610.0; now <= 1500; now += 10 {
		for _, id := range []string{"a", "b"} {
			if err := e.Progress(id, truth*(now-40), now); err != nil && !errors.Is(err, engine.ErrImplausible) {
				t.Fatal(err)
			}
		}
		_ = e.Progress("liar", 100*truth*now, now)
	}
	if f := est.Factor(model, 1, "v100"); math.Abs(f-1) > 0.05 {
		t.Fatalf("factor %v with two honest jobs against one liar, want about 1", f)
	}
}

// The minimum run time holds for every preemption, whatever the policy
// asks: a stop, a move or losing copies waits until the job ran it; a job's
// own minimum overrides the engine's.
func TestMinRunTimeHoldsForEveryPreemption(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		jobMin float64
		next   planner.Placement // x's placement asked at t=360
		want   engine.Action     // what x does at 360 under a 1800 s minimum
	}{
		{"stop", 0, planner.Placement{}, engine.Keep},
		{"move", 0, place(unit(slot("b", "v100", 1))), engine.Keep},
		{"unfork", 0, place(unit(slot("c", "k80", 1))), engine.Keep},
		{"the job's own shorter minimum", 100, planner.Placement{}, engine.Stop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{}
			e := newEngine(t, s, engine.Config{MinRunTime: 1800})
			x := job("x", 1, 1e9)
			x.MinRunTime, x.MaxCopies = tc.jobMin, 0
			for _, jb := range []planner.Job{x, job("y", 4, 1e9)} {
				if err := e.Admit(jb, 0); err != nil {
					t.Fatal(err)
				}
			}
			first := place(unit(slot("a", "v100", 1)))
			if tc.name == "unfork" {
				first = place(unit(slot("a", "v100", 1)), unit(slot("c", "k80", 1)))
			}
			s.next = map[string]planner.Placement{"x": first}
			if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
				t.Fatal(err)
			}
			// The policy gives node a's four V100s, x's among them, to y
			// and does tc.next with x.
			s.next = map[string]planner.Placement{"x": tc.next, "y": place(unit(slot("a", "v100", 4)))}
			d, err := e.Plan(ctx, 360, engine.Boundary)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Repairs) != 0 {
				t.Fatalf("the minimum run time showed as a repair: %+v", d.Repairs)
			}
			a := actions(d)
			if a["x"] != tc.want {
				t.Fatalf("x: %s at 360 s, want %s", a["x"], tc.want)
			}
			if tc.want == engine.Keep && a["y"] != engine.Wait {
				t.Fatalf("y: %s, want it to wait for x's GPU", a["y"])
			}
			if tc.want == engine.Keep {
				// Past the minimum, the policy's answer goes.
				d, err = e.Plan(ctx, 1800, engine.Boundary)
				if err != nil || actions(d)["x"] == engine.Keep || actions(d)["y"] != engine.Start {
					t.Fatalf("at 1800 s: %v, %v", actions(d), err)
				}
			}
		})
	}
}

// The minimum run time counts from when every worker runs (Started), not
// from the decision: a job still in task setup is not preempted as if it
// had run (issue 32, item 5).
func TestMinRunTimeCountsFromTheStart(t *testing.T) {
	ctx := context.Background()
	s := &scripted{}
	e := newEngine(t, s, engine.Config{MinRunTime: 300})
	for _, jb := range []planner.Job{job("x", 1, 1e9), job("y", 4, 1e9)} {
		if err := e.Admit(jb, 0); err != nil {
			t.Fatal(err)
		}
	}
	s.next = map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}
	if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	// Its workers ran only 200 s after the decision (a slow task setup).
	if err := e.Started("x", 200); err != nil {
		t.Fatal(err)
	}
	s.next = map[string]planner.Placement{"x": {}, "y": place(unit(slot("a", "v100", 4)))}
	for _, tc := range []struct {
		at   float64
		want engine.Action
	}{{360, engine.Keep}, {499, engine.Keep}, {500, engine.Stop}} {
		d, err := e.Plan(ctx, tc.at, engine.Boundary)
		if err != nil {
			t.Fatal(err)
		}
		if a := actions(d)["x"]; a != tc.want {
			t.Fatalf("x at %v s, running since 200 s with a 300 s minimum: %s, want %s", tc.at, a, tc.want)
		}
	}
	if err := e.Started("nope", 600); err == nil {
		t.Fatal("Started of an unknown job: no error")
	}
}

// Where starts are reported, the minimum run time counts from the job's
// first step on its GPUs: a job whose workers run but are still starting
// up (importing torch, the unit gathering; minutes on a loaded node) is
// not stopped as if it had trained, else a policy time-slicing the GPUs
// stops every job before its first step, round after round. Task setup
// is held the same way. A job that never steps is held only until it is
// stalled. The first step's time survives a snapshot.
func TestMinRunTimeCountsFromTheFirstStep(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{MinRunTime: 300, StallAfter: 600, StartsReported: true}
	setup := func(t *testing.T) (*engine.Engine, *scripted) {
		s := &scripted{}
		e := newEngine(t, s, cfg)
		for _, jb := range []planner.Job{job("x", 1, 1e9), job("y", 4, 1e9)} {
			if err := e.Admit(jb, 0); err != nil {
				t.Fatal(err)
			}
		}
		s.next = map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}
		if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
			t.Fatal(err)
		}
		if err := e.Started("x", 200); err != nil {
			t.Fatal(err)
		}
		// From here on the policy gives x's node to y.
		s.next = map[string]planner.Placement{"x": {}, "y": place(unit(slot("a", "v100", 4)))}
		return e, s
	}
	expect := func(t *testing.T, e *engine.Engine, at float64, want engine.Action) {
		t.Helper()
		d, err := e.Plan(ctx, at, engine.Boundary)
		if err != nil {
			t.Fatal(err)
		}
		if a := actions(d)["x"]; a != want {
			t.Fatalf("x at %v s (workers running since 200 s; 300 s minimum): %s, want %s", at, a, want)
		}
	}
	t.Run("first step late", func(t *testing.T) {
		e, s := setup(t)
		// 350 s after its workers started, no step yet: still held.
		expect(t, e, 550, engine.Keep)
		if js, _ := e.Job("x"); !strings.Contains(js.Reason.Why, "no step yet 5m50s after its workers started") {
			t.Errorf("x held before its first step says %q", js.Reason.Why)
		}
		if err := e.Progress("x", 10, 560); err != nil {
			t.Fatal(err)
		}
		b, err := e.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		r, err := engine.Restore(b, engine.Config{MinRunTime: 300, StallAfter: 600, StartsReported: true, Speed: speed.Model{Profile: profile.Default()}}, s)
		if err != nil {
			t.Fatal(err)
		}
		for name, e := range map[string]*engine.Engine{"engine": e, "restored": r} {
			t.Run(name, func(t *testing.T) {
				// 240 s of training: held; 300 s: the policy's answer goes.
				expect(t, e, 800, engine.Keep)
				expect(t, e, 860, engine.Stop)
			})
		}
	})
	t.Run("setup", func(t *testing.T) {
		s := &scripted{}
		e := newEngine(t, s, cfg)
		for _, jb := range []planner.Job{job("x", 1, 1e9), job("y", 4, 1e9)} {
			if err := e.Admit(jb, 0); err != nil {
				t.Fatal(err)
			}
		}
		s.next = map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}
		if _, err := e.Plan(ctx, 0, engine.Boundary); err != nil {
			t.Fatal(err)
		}
		// Its workers never all run (Started is not called): held in
		// task setup, until stalled there.
		s.next = map[string]planner.Placement{"x": {}, "y": place(unit(slot("a", "v100", 4)))}
		expect(t, e, 590, engine.Keep)
		if js, _ := e.Job("x"); !strings.Contains(js.Reason.Why, "its workers are not all running 9m50s after they were placed") {
			t.Errorf("x held in setup says %q", js.Reason.Why)
		}
		expect(t, e, 600, engine.Stop)
	})
	t.Run("never steps", func(t *testing.T) {
		e, _ := setup(t)
		expect(t, e, 790, engine.Keep)
		// Stalled (600 s with no step): not held.
		expect(t, e, 800, engine.Stop)
	})
}

// TestStoppedBeforeItStartedSaysSo (issue 32, item 5): a job stopped
// while its workers were still in task setup (Started not called since
// the decision) says it was stopped before it started; one whose workers
// ran but made no step since says it was stopped before it trained; one
// that trained, and any job when the caller reports no starts (the
// simulator), says neither.
func TestStoppedBeforeItStartedSaysSo(t *testing.T) {
	ctx := context.Background()
	reason := func(d engine.Decision, id string) string {
		for _, jd := range d.Jobs {
			if jd.Job == id {
				return jd.Reason.Why
			}
		}
		t.Fatalf("no decision for %s in %+v", id, d)
		return ""
	}
	for _, reported := range []bool{true, false} {
		s := &scripted{}
		e := newEngine(t, s, engine.Config{StartsReported: reported})
		if err := e.Admit(job("x", 1, 1e9), 0); err != nil {
			t.Fatal(err)
		}
		on := map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}
		off := map[string]planner.Placement{"x": {}}
		at := 0.0
		for _, tc := range []struct {
			name    string
			started bool
			step    bool
			want    string
		}{
			{"in setup", false, false, "stopped before it started: its workers were not all running 30s after they were placed"},
			{"started, no step", true, false, "stopped before it trained: no step in the 20s since its workers started"},
			{"trained", true, true, ""},
		} {
			s.next = on
			if d, err := e.Plan(ctx, at, engine.Boundary); err != nil || actions(d)["x"] != engine.Start {
				t.Fatalf("%s: %v, %v", tc.name, actions(d), err)
			}
			if tc.started {
				if err := e.Started("x", at+10); err != nil {
					t.Fatal(err)
				}
			}
			if tc.step {
				if err := e.Progress("x", at+5, at+20); err != nil {
					t.Fatal(err)
				}
			}
			s.next = off
			d, err := e.Plan(ctx, at+30, engine.Boundary)
			if err != nil || actions(d)["x"] != engine.Stop {
				t.Fatalf("%s: %v, %v", tc.name, actions(d), err)
			}
			why := reason(d, "x")
			for _, note := range []string{"stopped before it started", "stopped before it trained"} {
				if has := strings.Contains(why, note); has != (reported && strings.HasPrefix(tc.want, note)) {
					t.Errorf("starts reported %v, %s: reason %q", reported, tc.name, why)
				}
			}
			if reported && tc.want != "" && !strings.HasSuffix(why, "; "+tc.want) {
				t.Errorf("%s: reason %q, want it to end %q", tc.name, why, tc.want)
			}
			if js, _ := e.Job("x"); js.Reason.Why != why {
				t.Errorf("%s: the job's view says %q, the decision %q", tc.name, js.Reason.Why, why)
			}
			at += 60
		}
	}
}

type scaled struct {
	p speed.Profile
	f float64
}

func (s scaled) Throughput(m string, sf int, t planner.GPUType, spread bool) (float64, error) {
	v, err := s.p.Throughput(m, sf, t, spread)
	return v * s.f, err
}

func TestBadInputsAreRefused(t *testing.T) {
	e := newEngine(t, &scripted{}, engine.Config{})
	if err := e.Admit(job("x", 1, 10), 100); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"time goes back": e.Admit(job("y", 1, 10), 50),
		"duplicate":      e.Admit(job("x", 1, 10), 100),
		"bad job":        e.Admit(job("z", 0, 10), 100),
		"future arrival": e.Admit(planner.Job{ID: "f", Model: model, ScaleFactor: 1, TotalSteps: 1, Weight: 1, Arrival: 500}, 100),
		"unknown job":    e.Progress("nope", 1, 100),
		"negative steps": e.Progress("x", -1, 100),
		"unknown node":   e.Drain("nope", true, 100),
		"bad plan kind":  func() error { _, err := e.Plan(context.Background(), 100, "later"); return err }(),
		"cancelled": func() error {
			ctx, c := context.WithCancel(context.Background())
			c()
			_, err := e.Plan(ctx, 100, engine.Boundary)
			return err
		}(),
		"empty node ID":   func() error { _, err := e.SetNode(planner.Node{}, 100); return err }(),
		"unknown profile": e.Admit(planner.Job{ID: "m", Model: "no such model", ScaleFactor: 1, TotalSteps: 1, Weight: 1}, 100),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestDeferKeepsAJobOutOfPlansUntilItsTime(t *testing.T) {
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1))), "y": place(unit(slot("b", "v100", 1)))}}
	e := newEngine(t, s, engine.Config{})
	ctx := context.Background()
	for _, id := range []string{"x", "y"} {
		if err := e.Admit(job(id, 1, 1e6), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Defer("x", 100, "Nomad refused its placement", 0); err != nil {
		t.Fatal(err)
	}
	d, err := e.Plan(ctx, 10, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	if a := actions(d); a["x"] != engine.Wait || a["y"] != engine.Start {
		t.Fatalf("while deferred: %v", a)
	}
	if v := s.views[len(s.views)-1]; len(v.Jobs) != 1 || v.Jobs[0].ID != "y" {
		t.Fatal("the scheduler saw the deferred job")
	}
	if st, _ := e.Job("x"); !strings.Contains(st.Reason.Why, "Nomad refused its placement") {
		t.Fatalf("reason %q", st.Reason.Why)
	}
	// A snapshot keeps the deferral.
	b, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	e2, err := engine.Restore(b, engine.Config{Speed: speed.Model{Profile: profile.Default()}}, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, eng := range []*engine.Engine{e, e2} {
		d, err = eng.Plan(ctx, 100, engine.Boundary)
		if err != nil {
			t.Fatal(err)
		}
		if a := actions(d); a["x"] != engine.Start {
			t.Fatalf("after the deferral: %v", a)
		}
	}
}

func TestHeldGPUsAreNeverOfferedButStayCapacity(t *testing.T) {
	s := &scripted{next: map[string]planner.Placement{}}
	e := newEngine(t, s, engine.Config{})
	if err := e.Admit(job("x", 4, 1e6), 0); err != nil {
		t.Fatal(err)
	}
	if err := e.SetHeld(map[string]map[planner.GPUType]int{"a": {"v100": 3}}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	v := s.views[len(s.views)-1]
	if v.Pool.Free("a", "v100") != 1 || v.Capacity[1] != 8 {
		t.Fatalf("free on a %d (want 1), v100 capacity %v (want 8: held GPUs stay capacity)", v.Pool.Free("a", "v100"), v.Capacity)
	}
	s.next["x"] = place(unit(slot("a", "v100", 4)))
	if d, err := e.Plan(context.Background(), 10, engine.Boundary); err != nil || len(d.Repairs) != 1 || !strings.Contains(d.Repairs[0].Why, "not free") || actions(d)["x"] != engine.Wait {
		t.Fatalf("placing on held GPUs: repairs %+v, actions %v, err %v", d.Repairs, actions(d), err)
	}
	// Freed: a fill is due and the GPUs are offered again.
	if err := e.SetHeld(nil, 20); err != nil {
		t.Fatal(err)
	}
	d, err := e.Plan(context.Background(), 20, engine.Fill)
	if err != nil || actions(d)["x"] != engine.Start {
		t.Fatalf("after the release: %v, %v", actions(d), err)
	}
}

// Every policy honours a job's eligibility (Nomad's own placement rules, as
// the sidecar evaluates them): a restricted job runs only where it may, no
// answer needs repair, and a job no node may run waits saying why.
func TestEveryPolicyHonoursEligibility(t *testing.T) {
	ctx := context.Background()
	for _, name := range registry.Names() {
		for _, pl := range []string{"", "delay", "spread"} {
			t.Run(name+"/"+pl, func(t *testing.T) {
				model := speed.Model{Profile: profile.Default()}
				opts := registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: model}
				if pl != "" {
					p, err := placement.New(pl, placement.Config{Speed: model})
					if err != nil {
						t.Fatal(err)
					}
					opts.Placer = p
				}
				sched, err := registry.New(name, opts)
				if err != nil {
					t.Fatal(err)
				}
				e := newEngine(t, sched, engine.Config{Speed: model})
				for k, jb := range []planner.Job{job("only-b", 2, 1e6), job("free", 4, 1e6), job("nowhere", 1, 1e6), job("k80s", 2, 1e6)} {
					if err := e.Admit(jb, float64(k)); err != nil {
						t.Fatal(err)
					}
				}
				if err := e.SetEligible("only-b", round.Eligible{"b": {"v100": true}}, "", 4); err != nil {
					t.Fatal(err)
				}
				if err := e.SetEligible("nowhere", round.Eligible{}, "node pool \"gpu\": no node of the cluster is in it", 4); err != nil {
					t.Fatal(err)
				}
				if err := e.SetEligible("k80s", round.Eligible{"c": {"k80": true}}, "", 4); err != nil {
					t.Fatal(err)
				}
				for r := 1; r <= 4; r++ {
					d, err := e.Plan(ctx, float64(360*r), engine.Boundary)
					if err != nil {
						t.Fatal(err)
					}
					if len(d.Repairs) > 0 {
						t.Fatalf("round %d: repaired: %+v", r, d.Repairs)
					}
					for _, jd := range d.Jobs {
						if jd.Job == "nowhere" && (len(jd.To.Units) > 0 || !strings.Contains(jd.Reason.Why, "node pool")) {
							t.Fatalf("a job no node may run: %s on %v, why %q", jd.Action, jd.To, jd.Reason.Why)
						}
					}
					for _, js := range e.Jobs() {
						for _, u := range js.Placement.Units {
							for _, sl := range u.Slots {
								if js.Job.ID == "only-b" && sl.Node != "b" || js.Job.ID == "k80s" && sl.Node != "c" {
									t.Fatalf("round %d: %s placed on %v", r, js.Job.ID, sl)
								}
							}
						}
					}
				}
				if st, _ := e.Job("only-b"); !st.Running && name != "fifo" {
					t.Logf("only-b waits under %s: %s", name, st.Reason.Why)
				}
			})
		}
	}
}
