package agent

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// With ReadAhead running, a round boundary plans without waiting on the
// progress reads (at 500 nodes the larger part of a round's time), and
// the steps read ahead reach the engine before the next boundary. Without
// it, a boundary reads every running job's progress itself.
func TestBoundaryPlansOnProgressReadAhead(t *testing.T) {
	snap, rec := benchState(t, 20)
	srv := httptest.NewServer(rec)
	defer srv.Close()
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "2s"}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Progress reads block until released, and say when they are asked.
	var mu sync.Mutex
	gate, asked := make(chan struct{}), make(chan struct{}, 1000)
	steps := int64(0)
	a.ahead.read = func(ctx context.Context, _ *watch.Alloc) (*contract.Progress, error) {
		asked <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		mu.Lock()
		defer mu.Unlock()
		return &contract.Progress{StepsDone: steps}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The first boundary places the jobs; nothing runs yet, so nothing is
	// read.
	if err := a.cycleOn(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	// Nomad runs them; a fill cycle sees it.
	snap = observed(snap, rec)
	if err := a.cycleOn(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	running := func() []string {
		a.mu.Lock()
		defer a.mu.Unlock()
		var ids []string
		for _, st := range a.core.eng.Jobs() {
			if st.Running {
				ids = append(ids, st.Job.ID)
			}
		}
		return ids
	}
	if len(running()) == 0 {
		t.Fatal("the first boundary started no job")
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); a.ReadAhead(ctx) }()
	for !a.ahead.running() {
		time.Sleep(time.Millisecond)
	}
	// ReadAhead sweeps before the boundary, and the sweep hangs.
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("ReadAhead read nothing ahead of the boundary")
	}
	// The boundary must not wait for the hung reads (each has 5 s).
	start := time.Now()
	if err := a.cycleOn(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the boundary waited %v on progress reads ReadAhead was making", took)
	}
	// Released, the sweep's steps reach the engine.
	mu.Lock()
	steps = 42
	mu.Unlock()
	close(gate)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.mu.Lock()
		got := 0
		for _, st := range a.core.eng.Jobs() {
			if st.Running && st.Done == 42 {
				got++
			}
		}
		want := 0
		for _, st := range a.core.eng.Jobs() {
			if st.Running {
				want++
			}
		}
		a.mu.Unlock()
		if got > 0 && got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d running jobs have the steps read ahead", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Without ReadAhead, the boundary reads itself.
	cancel()
	wg.Wait()
	if a.ahead.running() {
		t.Fatal("ReadAhead still marked as running after it returned")
	}
	mu.Lock()
	steps = 50
	mu.Unlock()
	if err := a.cycleOn(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, st := range a.core.eng.Jobs() {
		if st.Running && st.Done != 50 {
			t.Fatalf("job %s: %v steps done after a boundary with no ReadAhead, want the 50 it read", st.Job.ID, st.Done)
		}
	}
}

// TestProgressReadBetweenBoundaries: issue 33 item 8. With a round longer
// than a job's life, progress read only before boundaries left views at
// 0% for the job's whole life; ReadAhead reads it every progressEvery
// between boundaries too, and the plan view says how old it is.
func TestProgressReadBetweenBoundaries(t *testing.T) {
	snap, rec := benchState(t, 4)
	srv := httptest.NewServer(rec)
	defer srv.Close()
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "1h"}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.ahead.every = 100 * time.Millisecond
	var mu sync.Mutex
	steps := int64(0)
	a.ahead.read = func(context.Context, *watch.Alloc) (*contract.Progress, error) {
		mu.Lock()
		defer mu.Unlock()
		return &contract.Progress{StepsDone: steps}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.cycleOn(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	snap = observed(snap, rec)
	if err := a.cycleOn(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); a.ReadAhead(ctx) }()
	// The next boundary is an hour away: only the reads between
	// boundaries can bring the new steps.
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	steps = 77
	mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fresh := 0
		jobs := a.Plan().Jobs
		for _, jv := range jobs {
			if len(jv.Units) > 0 && jv.StepsDone == 77 && jv.ProgressAgeS != nil && *jv.ProgressAgeS < 5 {
				fresh++
			}
		}
		if fresh > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running job shows the steps read between boundaries with their age: %+v", jobs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
