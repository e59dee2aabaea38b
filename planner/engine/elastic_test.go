package engine_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/speed"
)

// An elastic job (issue 35) runs on one unit of any of its widths, at the
// profiled figure of that width (planner/speed, "Elastic jobs"); a change
// of width is a move, as a change of GPUs is; a snapshot keeps its width.
func TestElasticJobWidths(t *testing.T) {
	x := job("x", 2, 1e9)
	x.Widths = []int{1, 2, 4}
	if err := engine.ValidPlacement(x, place(unit(slot("a", "v100", 4)))); err != nil {
		t.Fatalf("width 4 of widths %v: %v", x.Widths, err)
	}
	if err := engine.ValidPlacement(x, place(unit(slot("a", "v100", 3)))); err == nil {
		t.Fatal("width 3, not among its widths, accepted")
	}
	if err := engine.ValidPlacement(job("r", 2, 1), place(unit(slot("a", "v100", 4)))); err == nil {
		t.Fatal("a rigid job accepted a width other than its scale factor")
	}

	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 4)))}}
	e := newEngine(t, s, engine.Config{})
	if err := e.Admit(x, 0); err != nil {
		t.Fatal(err)
	}
	d, err := e.Plan(context.Background(), 0, engine.Boundary)
	if err != nil {
		t.Fatal(err)
	}
	if a := actions(d)["x"]; a != engine.Start {
		t.Fatalf("first plan: %s, want start", a)
	}
	prof := profile.Default()
	t2, _ := prof.Throughput(model, 2, "v100", false)
	t4, _ := prof.Throughput(model, 4, "v100", false)
	st, _ := e.Job("x")
	if math.Abs(st.Rate-t4) > 1e-9*t4 {
		t.Fatalf("rate on 4 GPUs %v, want the profile's T(4) = %v", st.Rate, t4)
	}
	// What a scheduler sees: each width's estimate, its scale factor's
	// the rigid figure.
	v := s.views[0].Jobs[0]
	if len(v.WidthThroughput) != 3 || v.WidthThroughput[1][1] != v.Throughput[1] || v.WidthThroughput[1][1] != t2 || v.WidthThroughput[2][1] != t4 {
		t.Fatalf("width throughputs %v, throughput %v (types %v)", v.WidthThroughput, v.Throughput, s.views[0].Types)
	}
	// The same GPUs again: kept; two of them: a move.
	if d, err = e.Plan(context.Background(), 360, engine.Boundary); err != nil || actions(d)["x"] != engine.Keep {
		t.Fatalf("same width and GPUs: %v, %v", actions(d), err)
	}
	s.next["x"] = place(unit(slot("a", "v100", 2)))
	if d, err = e.Plan(context.Background(), 720, engine.Boundary); err != nil || actions(d)["x"] != engine.Move {
		t.Fatalf("narrower: %v, %v; want a move", actions(d), err)
	}
	if st, _ = e.Job("x"); st.Rate != t2 {
		t.Fatalf("rate at its scale factor %v, want the profile's %v", st.Rate, t2)
	}
	b, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	e2, err := engine.Restore(b, engine.Config{Speed: speed.Model{Profile: prof}}, s)
	if err != nil {
		t.Fatal(err)
	}
	st2, ok := e2.Job("x")
	if !ok || st2.Placement.GPUs() != 2 || st2.Rate != t2 {
		t.Fatalf("restored: %+v, %v", st2, ok)
	}
	s.next["x"] = place(unit(slot("b", "v100", 4)))
	if d, err = e2.Plan(context.Background(), 2880, engine.Boundary); err != nil || actions(d)["x"] != engine.Move {
		t.Fatalf("restored engine, wider: %v, %v; want a move", actions(d), err)
	}
}

// An elastic job's progress reports are bounded by its fastest width,
// not its scale factor's speed: a 1-16 job on 16 GPUs honestly reports
// 16 times its width-1 speed, past the bound of 2 MaxFactor (8) times
// that speed, and was cut as implausible.
func TestElasticJobsProgressBoundedByItsWidestWidth(t *testing.T) {
	const m = "linear"
	prof, err := profile.New("linear scaling", []profile.Entry{
		{Model: m, ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"v100": 10}},
		{Model: m, ScaleFactor: 16, Consolidated: map[planner.GPUType]float64{"v100": 160}},
	})
	if err != nil {
		t.Fatal(err)
	}
	est, err := engine.NewEstimates(prof, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    speed.Profile
	}{{"figures", prof}, {"learning", est}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("w", "v100", 16)))}}
			e, err := engine.New(engine.Config{Speed: speed.Model{Profile: tc.p}}, s)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.SetNodes([]planner.Node{{ID: "w", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 16}}}, 0); err != nil {
				t.Fatal(err)
			}
			x := planner.Job{ID: "x", Model: m, ScaleFactor: 1, Widths: []int{1, 16}, TotalSteps: 1e9, Weight: 1}
			if err := e.Admit(x, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
				t.Fatal(err)
			}
			if err := e.Progress("x", 160*600, 600); err != nil {
				t.Fatalf("16 GPUs at their profiled 160 steps/s for 600 s: %v", err)
			}
			if st, _ := e.Job("x"); st.Done != 160*600 {
				t.Fatalf("done %v, want %v", st.Done, 160*600)
			}
			// Still bounded: far past 2 MaxFactor times its widest speed.
			if err := e.Progress("x", 160*600+2*engine.MaxFactor*160*1000, 700); !errors.Is(err, engine.ErrImplausible) {
				t.Fatalf("a report past its widest speed's bound: %v", err)
			}
		})
	}
}

// An elastic job teaches the estimate of the width it runs at (issue 35,
// "from what is learned"): a 1-4 job profiled at 40 steps/s on four V100s
// that runs at 20 is planned at 20 at width 4, its width-1 figure left as
// the profile's.
func TestElasticJobLearnsTheWidthItRunsAt(t *testing.T) {
	const m = "halved"
	prof, err := profile.New("profiled at widths 1 and 4", []profile.Entry{
		{Model: m, ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"v100": 10}},
		{Model: m, ScaleFactor: 4, Consolidated: map[planner.GPUType]float64{"v100": 40}},
	})
	if err != nil {
		t.Fatal(err)
	}
	est, err := engine.NewEstimates(prof, engine.LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 4)))}}
	e := newEngine(t, s, engine.Config{Speed: speed.Model{Profile: est}})
	x := planner.Job{ID: "x", Model: m, ScaleFactor: 1, Widths: []int{1, 4}, TotalSteps: 1e9, Weight: 1}
	if err := e.Admit(x, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	for now := 60.0; now <= 1200; now += 60 {
		if err := e.Progress("x", 20*now, now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Plan(context.Background(), 1200, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	v := s.views[len(s.views)-1]
	k := slices.Index(v.Types, "v100")
	j := v.Jobs[0]
	if w1, w4 := j.WidthThroughput[0][k], j.WidthThroughput[1][k]; math.Abs(w4-20) > 0.5 || w1 != 10 {
		t.Fatalf("v100 at widths 1 and 4: %v and %v steps/s, want the profile's 10 and the learned 20", w1, w4)
	}
	if st, _ := e.Job("x"); math.Abs(st.Rate-20) > 0.5 {
		t.Fatalf("rate on four V100s %v, want the learned 20", st.Rate)
	}
}
