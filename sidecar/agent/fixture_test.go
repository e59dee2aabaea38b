package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/leader"
	"github.com/hadar-sched/hadar/sidecar/state"
)

// Every release's saved state (sidecar/state/testdata/v<N>, written by a
// real sidecar: e2e TestWriteStateFixtures) restores into this release's
// agent: its jobs with their placements, in the engine as in the
// bookkeeping, and its history; and what this agent saves from it
// restores the same. The state package proves both stores read each
// fixture alike; this proves the agent makes sense of what they read.
func TestRestoresEveryReleasesState(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "state", "testdata", "v*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no state fixtures in ../state/testdata (%v)", err)
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			var fx struct {
				Policy    string  `json:"policy"`
				Placement string  `json:"placement"`
				RoundS    float64 `json:"round_s"`
				// Generation is the lock generation it was saved under (0:
				// without an election).
				Generation uint64 `json:"generation"`
			}
			b, err := os.ReadFile(filepath.Join(dir, "fixture.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &fx); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "sidecar.db")
			copyFile(t, filepath.Join(dir, "sidecar.db"), path)
			s, err := config.Config{
				Scheduling: config.Scheduling{Policy: fx.Policy, Placement: fx.Placement, Round: config.Duration(fmt.Sprintf("%gs", fx.RoundS))},
				Service:    config.Service{State: &config.StateConfig{Store: "file", Path: path}},
			}.Resolve()
			if err != nil {
				t.Fatal(err)
			}
			client, _ := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
			a, err := New(s, client, nil)
			if err != nil {
				t.Fatalf("the agent does not restore %s: %v", dir, err)
			}
			states := func(a *Agent) map[string]engine.JobState {
				out := map[string]engine.JobState{}
				for _, j := range a.core.eng.Jobs() {
					out[j.Job.ID] = j
				}
				return out
			}
			before := states(a)
			placed := 0
			for k, mj := range a.roster.jobs {
				st, ok := before[mj.id]
				if !ok {
					t.Errorf("job %s is in the bookkeeping but not in the engine", k)
				}
				if st.Running && len(st.Placement.Units) > 0 {
					placed++
				}
			}
			if placed == 0 || len(a.record.history) == 0 || a.record.rounds == 0 {
				t.Fatalf("restored %d jobs (%d placed), %d decisions, %d rounds: the fixture's sidecar placed jobs over several rounds", a.roster.count(), placed, len(a.record.history), a.record.rounds)
			}
			jobs, history, rounds := a.roster.jobs, a.record.history, a.record.rounds
			save := func() error {
				a.mu.Lock()
				defer a.mu.Unlock()
				return a.save(context.Background(), 1)
			}
			// The fixture's sidecar ran under an election: one without an
			// election may not overwrite it; the next leader (a newer
			// generation) saves over it.
			if fx.Generation > 0 {
				if err := save(); !errors.Is(err, state.ErrFenced) {
					t.Fatalf("a sidecar without an election saved over a state written under one: %v", err)
				}
				srv := httptest.NewServer(&recordedNomad{lockBase: fx.Generation})
				defer srv.Close()
				lc, _ := api.NewClient(&api.Config{Address: srv.URL})
				lock, err := leader.NewNomad(lc, "default", "hadar/fixture", leader.Config{TTL: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				l, err := lock.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(context.Background())
				a.lock = lock
				a.lease.Store(l)
			}
			if err := save(); err != nil {
				t.Fatalf("saving the restored state: %v", err)
			}
			if err := a.ledger.store.Close(); err != nil {
				t.Fatal(err)
			}
			again, err := New(s, client, nil)
			if err != nil {
				t.Fatalf("the state saved from %s does not restore: %v", dir, err)
			}
			defer again.ledger.store.Close()
			if again.roster.count() != len(jobs) || len(again.record.history) != len(history) || again.record.rounds != rounds {
				t.Fatalf("saved and restored: %d jobs, %d decisions, %d rounds; before: %d, %d, %d", again.roster.count(), len(again.record.history), again.record.rounds, len(jobs), len(history), rounds)
			}
			after := states(again)
			for k, mj := range jobs {
				if got := again.roster.job(k); got == nil || got.units != mj.units || got.version != mj.version {
					t.Fatalf("job %s: restored %+v, saved %+v", k, got, mj)
				}
				if b, g := before[mj.id], after[mj.id]; !reflect.DeepEqual(b.Placement, g.Placement) || b.Done != g.Done || b.Running != g.Running {
					t.Fatalf("job %s in the engine: restored %+v, saved %+v", k, g, b)
				}
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
