package agent

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/state"
)

// TestLearningTimingOnRestore: the learning timing reaches the engine, and
// a state saved under one timing restores under the same (the defaults
// written out included) and is refused under another with the config
// fields named and the way out.
func TestLearningTimingOnRestore(t *testing.T) {
	agentWith := func(t *testing.T, warmup, evidence config.Duration) *Agent {
		t.Helper()
		s, err := config.Config{Service: config.Service{State: &config.StateConfig{Store: "none"}}, Learning: config.Learning{LearnWarmup: warmup, LearnEvidence: evidence}}.Resolve()
		if err != nil {
			t.Fatal(err)
		}
		client, _ := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
		a, err := New(s, client, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	short := agentWith(t, "5s", "20s")
	if l := short.core.est.Learning(); l.Warmup != 5 || l.MinEvidence != 20 || l.FirstEvidence != 20 {
		t.Fatalf("learning %+v; want warm-up 5 s, evidence 20 s, first evidence 20 s", l)
	}
	saveFrom := func(t *testing.T, a *Agent) *memStore {
		t.Helper()
		m := &memStore{}
		a.ledger.store = m
		if err := a.save(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		a.ledger.store = nil
		return m
	}
	shortState := saveFrom(t, short)
	defaultState := saveFrom(t, agentWith(t, "", ""))
	for _, tc := range []struct {
		name             string
		saved            *memStore
		warmup, evidence config.Duration
		wantErr          bool
	}{
		{"same timing", shortState, "5s", "20s", false},
		{"defaults written out", defaultState, "60s", "5m", false},
		{"warm-up changed", shortState, "10s", "20s", true},
		{"evidence changed", shortState, "5s", "30s", true},
		{"defaults to short", defaultState, "5s", "20s", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := agentWith(t, tc.warmup, tc.evidence)
			err := a.openState(context.Background(), &memStore{saved: tc.saved.saved})
			switch {
			case !tc.wantErr && err != nil:
				t.Fatalf("restore: %v", err)
			case tc.wantErr && (err == nil || !errors.Is(err, state.ErrUnreadable) || !strings.Contains(err.Error(), "learn_warmup") ||
				!strings.Contains(err.Error(), "learn_evidence") || !strings.Contains(err.Error(), "set them back")):
				t.Fatalf("restore under other timing: err = %v; want a refusal naming learn_warmup, learn_evidence and the fix", err)
			}
			if tc.wantErr && a.roster.count() != 0 {
				t.Fatal("a refused state left jobs behind")
			}
		})
	}
}
