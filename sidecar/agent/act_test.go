package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform"
)

func onGPUs(slots ...planner.Slot) planner.Placement {
	return planner.Placement{Units: []planner.Unit{{Slots: slots}}}
}

// A job is written after another only when its new workers sit on GPUs the
// other gives up in the same decision.
func TestStartsWaitOnlyForTheGPUsTheyTake(t *testing.T) {
	leaves := engine.JobDecision{Job: "x", Action: engine.Stop, From: onGPUs(planner.Slot{Node: "n1", Type: "p100", Count: 2})}
	shrinks := engine.JobDecision{Job: "z", Action: engine.Move,
		From: onGPUs(planner.Slot{Node: "n2", Type: "v100", Count: 2}),
		To:   onGPUs(planner.Slot{Node: "n2", Type: "v100", Count: 1}, planner.Slot{Node: "n3", Type: "k80", Count: 1})}
	fresh := func(node string, typ planner.GPUType) []jobform.Unit {
		return []jobform.Unit{{ID: 0, Workers: []jobform.Worker{{Node: "n9", Type: "k80"}, {Node: node, Type: typ}}}}
	}
	tests := []struct {
		name  string
		jd    engine.JobDecision
		fresh []jobform.Unit
		want  bool
	}{
		{"the GPUs a stopped job leaves", leaves, fresh("n1", "p100"), true},
		{"another type on the same node", leaves, fresh("n1", "v100"), false},
		{"the same type on another node", leaves, fresh("n4", "p100"), false},
		{"the GPU a move gives up", shrinks, fresh("n2", "v100"), true},
		{"where a move goes, not what it leaves", shrinks, fresh("n3", "k80"), false},
	}
	for _, tc := range tests {
		if got := takesFrom(tc.fresh, released(tc.jd)); got != tc.want {
			t.Errorf("%s: waits %v, want %v (released %v)", tc.name, got, tc.want, released(tc.jd))
		}
	}
}

// gatedNomad holds every registration until released.
type gatedNomad struct {
	*recordedNomad
	gate    chan struct{}
	arrived chan struct{}
}

func (g gatedNomad) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPut && r.URL.Path == "/v1/jobs" {
		g.arrived <- struct{}{}
		<-g.gate
	}
	g.recordedNomad.ServeHTTP(w, r)
}

// A round hands its writes to the background and returns: with the
// registrations held by Nomad, the round still ends; its jobs show in
// flight (Nomad's stale view of them is not taken for the truth); once the
// writes return, the next cycle records them.
func TestRoundDoesNotWaitForItsWrites(t *testing.T) {
	snap, rec := benchState(t, 10)
	g := gatedNomad{rec, make(chan struct{}), make(chan struct{}, 100)}
	srv := httptest.NewServer(g)
	defer srv.Close()
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "1m"}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- a.cycleOn(ctx, snap, true) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		close(g.gate)
		t.Fatal("the round waited for Nomad to answer its writes")
	}
	<-g.arrived // at least one write is out, held
	a.mu.Lock()
	inFlight := len(a.applier.Ops())
	a.mu.Unlock()
	if inFlight != 10 {
		t.Fatalf("%d jobs in flight while their writes go out, want 10", inFlight)
	}
	// A fill on the same (stale) view of Nomad keeps the engine's plan.
	if err := a.cycleOn(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	running := 0
	for _, st := range a.core.eng.Jobs() {
		if st.Running {
			running++
		}
	}
	a.mu.Unlock()
	if running != 10 {
		t.Fatalf("%d jobs running in the engine after a cycle on a view without the writes, want 10", running)
	}
	close(g.gate)
	a.settleWrites()
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec.registers != 10 || a.out.pending() != 0 {
		t.Fatalf("%d registrations, %d writes pending, want 10 and 0", rec.registers, a.out.pending())
	}
	decided := 0
	for _, ev := range a.record.history {
		if ev.Result == "" && ev.Action != "" {
			decided++
		}
	}
	if decided != 10 {
		t.Fatalf("%d decisions recorded as applied, want 10: %+v", decided, a.record.history)
	}
}
