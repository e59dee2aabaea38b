package agent

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// An elastic job (hadar.workers = "1-2") under sia:free (Sia without its
// growth limit, which would start it at 1), alone on a node of two GPUs,
// takes both: the engine gets its widths from the jobspec, the
// decision's reason is sia's, and the job is written with two worker
// groups of WORLD_SIZE 2 that carry the widths (HADAR_WIDTHS).
func TestElasticJobStartsAtTheWidthSiaChooses(t *testing.T) {
	snap, rec := noteState(t, []noteCase{{name: "el", meta: map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "100000", "hadar.workers": "1-2"}}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 2)
	a := testAgent(t, rec, "sia:free")
	if err := a.cycleOn(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.core.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "el"}))
	if !ok {
		t.Fatal("not admitted")
	}
	if len(st.Job.Widths) != 2 || st.Job.ScaleFactor != 1 {
		t.Fatalf("engine job %+v: want widths [1 2], scale factor 1", st.Job)
	}
	if !st.Running || len(st.Placement.Units) != 1 || st.Placement.Units[0].GPUs() != 2 {
		t.Fatalf("running %v on %+v, want one unit of 2 GPUs", st.Running, st.Placement)
	}
	ranks := map[string]bool{}
	for _, g := range rec.jobs["el"].TaskGroups {
		if _, gen := groupname.Parse(*g.Name); !gen {
			continue
		}
		env := g.Tasks[0].Env
		if env[contract.EnvWorldSize] != "2" || env[contract.EnvWidths] != "1,2" {
			t.Fatalf("%s: WORLD_SIZE %q, %s %q (want 1,2)", *g.Name, env[contract.EnvWorldSize], contract.EnvWidths, env[contract.EnvWidths])
		}
		ranks[env[contract.EnvRank]] = true
	}
	if len(ranks) != 2 || !ranks["0"] || !ranks["1"] {
		t.Fatalf("ranks written %v, want 0 and 1", ranks)
	}
	found := false
	for _, ev := range a.record.history {
		found = found || strings.HasPrefix(ev.Why, "sia: 2 GPUs")
	}
	if !found {
		t.Fatalf("no decision says sia's reason for the width: %+v", a.record.history)
	}
}

// An elastic job sharing two GPUs with a rigid one runs at width 1; once
// the rigid job completes, sia grows it to 2: a move, whose stop of the
// old unit goes out first (its workers checkpoint and end), then the job
// is rewritten on a new unit of two worker groups, WORLD_SIZE 2, with the
// template (the checkpoint key) and total steps it had.
func TestElasticJobGrowsWhenAnotherLeaves(t *testing.T) {
	el := map[string]string{"hadar.model": "ResNet-50 (batch size 16)", "hadar.steps": "100000", "hadar.workers": "1-2"}
	other := map[string]string{"hadar.model": "ResNet-50 (batch size 16)", "hadar.steps": "100000"}
	snap, rec := noteState(t, []noteCase{{name: "el", meta: el}, {name: "other", meta: other}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 2)
	a := testAgent(t, rec, "sia")
	steps := int64(0)
	a.ahead.read = func(context.Context, *watch.Alloc) (*contract.Progress, error) {
		return &contract.Progress{StepsDone: steps}, nil
	}
	ctx := context.Background()
	elKey, otherKey := watch.JobKey{Namespace: "default", ID: "el"}, watch.JobKey{Namespace: "default", ID: "other"}
	// groups are el's worker groups as written: name -> task env.
	groups := func() map[string]map[string]string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		out := map[string]map[string]string{}
		for _, g := range rec.jobs["el"].TaskGroups {
			if _, gen := groupname.Parse(*g.Name); gen {
				out[*g.Name] = g.Tasks[0].Env
			}
		}
		return out
	}
	cycle := func(force bool) {
		t.Helper()
		if err := a.cycleOn(ctx, snap, force); err != nil {
			t.Fatal(err)
		}
		a.settleWrites()
	}
	cycle(true)
	a.mu.Lock()
	st, _ := a.core.eng.Job(engineID(elKey))
	a.mu.Unlock()
	if !st.Running || st.Placement.Units[0].GPUs() != 1 {
		t.Fatalf("el beside the rigid job: running %v on %+v, want 1 GPU", st.Running, st.Placement)
	}
	before := groups()
	if len(before) != 1 || before["train-hadar-u0-w0"][contract.EnvWorldSize] != "1" {
		t.Fatalf("el written at width 1: %v", before)
	}
	// Both run and train; then the rigid job completes.
	snap = observed(snap, rec)
	for _, al := range snap.Allocs {
		al.GPUs = map[string]int{"Tesla V100-SXM2-16GB": 1}
	}
	steps = 100
	cycle(false)
	// The progress read ahead (every few seconds) sees them train: the
	// minimum run time counts from the first step seen.
	sweepProgress(ctx, a)
	for _, al := range snap.Allocs {
		if al.JobID == "other" {
			oj := snap.Jobs[otherKey]
			al.ClientStatus, al.JobVersion, oj.Status = api.AllocClientStatusComplete, oj.Version, "dead"
		}
	}
	a.mu.Lock()
	a.mono.base += 6 * 3600 // well past the minimum run time
	a.mu.Unlock()
	steps = 5000
	cycle(true)
	a.mu.Lock()
	st, _ = a.core.eng.Job(engineID(elKey))
	var move *wire.Event
	for i, ev := range a.record.history {
		if ev.Job == engineID(elKey) && ev.Action == wire.ActionMove {
			move = &a.record.history[i]
		}
	}
	a.mu.Unlock()
	if !st.Running || st.Placement.Units[0].GPUs() != 2 {
		t.Fatalf("el alone: running %v on %+v, want 2 GPUs", st.Running, st.Placement)
	}
	if move == nil || !strings.HasPrefix(move.Why, "sia: 2 GPUs of v100") {
		t.Fatalf("no move of el with sia's reason: %+v", a.record.history)
	}
	// The stop goes out first: the old unit's groups are gone, the new
	// unit not yet written while its workers end.
	if g := groups(); len(g) != 0 {
		t.Fatalf("el's groups while its old unit stops: %v", g)
	}
	delete(snap.Jobs, otherKey)
	for range 2 {
		snap = observed(snap, rec)
		cycle(false)
	}
	after := groups()
	if len(after) != 2 {
		t.Fatalf("el after the resize: %v, want two worker groups", after)
	}
	old := before["train-hadar-u0-w0"]
	for r := range 2 {
		env := after[groupname.Format("train", 1, r)]
		if env == nil || env[contract.EnvWorldSize] != "2" || env[contract.EnvRank] != strconv.Itoa(r) {
			t.Fatalf("el rank %d after the resize: %v", r, after)
		}
		for _, k := range []string{contract.EnvTemplate, contract.EnvTotalSteps, contract.EnvJobRun, contract.EnvWidths} {
			if env[k] != old[k] {
				t.Fatalf("%s %q after the resize, %q before", k, env[k], old[k])
			}
		}
	}
}

// Sia (sia:free: no growth limit) resizes a young elastic job both ways (its restart factor is 1
// while the job is younger than the restart cost): alone it runs at 2;
// a rigid job arrives and it shrinks to 1; the rigid job leaves and it
// grows back to 2. Each resize is a move with sia's reason.
func TestElasticJobResizedTwice(t *testing.T) {
	el := map[string]string{"hadar.model": "ResNet-50 (batch size 16)", "hadar.steps": "100000", "hadar.workers": "1-2"}
	snap, rec := noteState(t, []noteCase{{name: "el", meta: el}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 2)
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Scheduling: config.Scheduling{Policy: "sia:free", Placement: "pack", Round: "1m"},
		RunLimits: config.RunLimits{MinRunTime: "1m", RestartCost: "1h"}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.settleWrites)
	steps := int64(0)
	a.ahead.read = func(context.Context, *watch.Alloc) (*contract.Progress, error) {
		steps += 10
		return &contract.Progress{StepsDone: steps}, nil
	}
	ctx := context.Background()
	elKey := watch.JobKey{Namespace: "default", ID: "el"}
	width := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		st, _ := a.core.eng.Job(engineID(elKey))
		if !st.Running {
			return 0
		}
		return st.Placement.Units[0].GPUs()
	}
	cycle := func(force bool) {
		t.Helper()
		if err := a.cycleOn(ctx, snap, force); err != nil {
			t.Fatal(err)
		}
		a.settleWrites()
		snap = observed(snap, rec)
		for _, al := range snap.Allocs {
			al.GPUs = map[string]int{"Tesla V100-SXM2-16GB": 1}
		}
	}
	later := func(d float64) {
		a.mu.Lock()
		a.mono.base += d
		a.mu.Unlock()
	}
	cycle(true)
	cycle(false)
	if w := width(); w != 2 {
		t.Fatalf("alone: width %d, want 2", w)
	}
	sweepProgress(ctx, a)
	// A rigid job arrives.
	other, orec := noteState(t, []noteCase{{name: "other", meta: map[string]string{"hadar.model": "ResNet-50 (batch size 16)", "hadar.steps": "100000"}}})
	otherKey := watch.JobKey{Namespace: "default", ID: "other"}
	snap.Jobs[otherKey] = other.Jobs[otherKey]
	rec.mu.Lock()
	rec.jobs["other"] = orec.jobs["other"]
	rec.mu.Unlock()
	later(120)
	cycle(true)
	for range 3 {
		cycle(false)
	}
	if w := width(); w != 1 {
		t.Fatalf("beside the rigid job: width %d, want 1", w)
	}
	sweepProgress(ctx, a)
	// It leaves.
	for _, al := range snap.Allocs {
		if al.JobID == "other" {
			oj := snap.Jobs[otherKey]
			al.ClientStatus, al.JobVersion, oj.Status = api.AllocClientStatusComplete, oj.Version, "dead"
		}
	}
	later(120)
	if err := a.cycleOn(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	delete(snap.Jobs, otherKey)
	snap = observed(snap, rec)
	for range 3 {
		cycle(false)
	}
	if w := width(); w != 2 {
		t.Fatalf("after the rigid job left: width %d, want 2", w)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var moves []string
	for _, ev := range a.record.history {
		if ev.Job == engineID(elKey) && ev.Action == wire.ActionMove {
			moves = append(moves, ev.Why)
		}
	}
	if len(moves) != 2 || !strings.HasPrefix(moves[0], "sia: 1 GPUs") || !strings.HasPrefix(moves[1], "sia: 2 GPUs") {
		t.Fatalf("el's moves: %q, want a shrink to 1 then a growth to 2, with sia's reasons", moves)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for _, g := range rec.jobs["el"].TaskGroups {
		if _, gen := groupname.Parse(*g.Name); gen {
			n++
			if g.Tasks[0].Env[contract.EnvWorldSize] != "2" {
				t.Fatalf("%s: WORLD_SIZE %s", *g.Name, g.Tasks[0].Env[contract.EnvWorldSize])
			}
		}
	}
	if n != 2 {
		t.Fatalf("el written with %d worker groups at the end, want 2", n)
	}
}

// sweepProgress is one of ReadAhead's sweeps: every running job's file
// read and applied.
func sweepProgress(ctx context.Context, a *Agent) {
	best := a.readSynced(ctx)
	a.mu.Lock()
	a.applyProgress(best)
	a.mu.Unlock()
}
