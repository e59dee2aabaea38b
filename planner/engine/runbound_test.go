package engine_test

import (
	"context"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// stopper runs every job on the first node's GPUs at its first plan and
// stops them all at every later one, bounding their minimum run time as
// bound says (none when nil): the contract of engine.MinRunBounder.
type stopper struct {
	plans int
	bound map[string]float64
}

func (s *stopper) Name() string { return "stopper" }

func (s *stopper) Schedule(v *round.View) ([]planner.Placement, error) {
	s.plans++
	out := make([]planner.Placement, len(v.Jobs))
	if s.plans == 1 {
		for i, j := range v.Jobs {
			u, _ := v.Pool.Pack(v.Types[0], j.ScaleFactor)
			v.Pool.Take(u)
			out[i] = planner.Placement{Units: []planner.Unit{u}}
		}
	}
	return out, nil
}

type boundedStopper struct{ stopper }

func (s *boundedStopper) MinRunBound(id string) (float64, bool) {
	b, ok := s.bound[id]
	return b, ok
}

func TestMinRunBoundShortensTheMinimumRunTime(t *testing.T) {
	for _, c := range []struct {
		name  string
		sched round.Scheduler
		// stopAt is the first boundary at which the job is let go.
		stopAt float64
	}{
		{"no bound: the minimum run time", &stopper{}, 1800},
		{"bound 0", &boundedStopper{stopper{bound: map[string]float64{"x": 0}}}, 360},
		{"bound 700", &boundedStopper{stopper{bound: map[string]float64{"x": 700}}}, 720},
		{"a bound above the minimum run time changes nothing", &boundedStopper{stopper{bound: map[string]float64{"x": 7200}}}, 1800},
		{"a bound on another job", &boundedStopper{stopper{bound: map[string]float64{"y": 0}}}, 1800},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := engine.New(engine.Config{Round: 360, Speed: speed.Model{Profile: profile.Default()}, MinRunTime: 1800}, c.sched)
			if err != nil {
				t.Fatal(err)
			}
			e.SetNodes([]planner.Node{{ID: "n", GPUs: map[planner.GPUType]int{"v100": 4}}}, 0)
			if err := e.Admit(planner.Job{ID: "x", Model: "ResNet-18 (batch size 16)", ScaleFactor: 1, TotalSteps: 1e9, Weight: 1}, 0); err != nil {
				t.Fatal(err)
			}
			for now := 0.0; now <= 1800; now += 360 {
				d, err := e.Plan(context.Background(), now, engine.Boundary)
				if err != nil {
					t.Fatal(err)
				}
				want := engine.Keep
				switch {
				case now == 0:
					want = engine.Start
				case now == c.stopAt:
					want = engine.Stop
				case now > c.stopAt:
					want = engine.Wait
				}
				if got := d.Jobs[0].Action; got != want {
					t.Fatalf("t=%.0f: %s (%s), want %s", now, got, d.Jobs[0].Reason.Why, want)
				}
			}
		})
	}
}

// A job's own minimum run time (its author's hadar.min_run_time, 720h at
// most) is capped by the operator's MaxMinRunTime: the job is let go at
// the first boundary after the cap, not held for a month. The cap holds
// for a job restored from a snapshot taken without it too.
func TestMaxMinRunTimeCapsAJobsOwn(t *testing.T) {
	cfg := engine.Config{Round: 360, Speed: speed.Model{Profile: profile.Default()}, MinRunTime: 1800, MaxMinRunTime: 3600}
	for _, restored := range []bool{false, true} {
		s := &stopper{}
		c := cfg
		if restored {
			c.MaxMinRunTime = 0
		}
		e, err := engine.New(c, s)
		if err != nil {
			t.Fatal(err)
		}
		e.SetNodes([]planner.Node{{ID: "n", GPUs: map[planner.GPUType]int{"v100": 4}}}, 0)
		if err := e.Admit(planner.Job{ID: "x", Model: "ResNet-18 (batch size 16)", ScaleFactor: 1, TotalSteps: 1e9, Weight: 1, MinRunTime: 720 * 3600}, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
			t.Fatal(err)
		}
		if restored {
			snap, err := e.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if e, err = engine.Restore(snap, cfg, s); err != nil {
				t.Fatal(err)
			}
		}
		if st, _ := e.Job("x"); st.Job.MinRunTime != 3600 {
			t.Errorf("restored %v: the job's minimum run time is %v s, want the cap 3600", restored, st.Job.MinRunTime)
		}
		for now := 360.0; now <= 3600; now += 360 {
			d, err := e.Plan(context.Background(), now, engine.Boundary)
			if err != nil {
				t.Fatal(err)
			}
			want := engine.Keep
			if now == 3600 {
				want = engine.Stop
			}
			if got := d.Jobs[0].Action; got != want {
				t.Fatalf("restored %v, t=%.0f: %s (%s), want %s", restored, now, got, d.Jobs[0].Reason.Why, want)
			}
		}
	}
}
