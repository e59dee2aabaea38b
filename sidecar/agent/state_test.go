package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/state"
)

// TestCorruptStateStopsTheSidecar: a state file the sidecar cannot read
// stops it at start with the file named and the way out, before it
// contacts Nomad or plans anything.
func TestCorruptStateStopsTheSidecar(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sidecar.db")
	if err := os.WriteFile(path, []byte(strings.Repeat("garbage", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Service: config.Service{State: &config.StateConfig{Path: path}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	client, _ := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
	_, err = New(s, client, nil)
	if !errors.Is(err, state.ErrUnreadable) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("err = %v", err)
	}
}

// memStore is a state.Store in memory holding one saved state.
type memStore struct{ saved *state.Saved }

func (m *memStore) Load(context.Context) (*state.Saved, error)          { return m.saved, nil }
func (m *memStore) Save(_ context.Context, s *state.Saved) error        { m.saved = s; return nil }
func (m *memStore) Append(context.Context, state.Entry) (uint64, error) { return 1, nil }
func (m *memStore) Journal(context.Context, uint64) ([]state.Entry, error) {
	return nil, nil
}
func (m *memStore) Where() string { return "memory" }
func (m *memStore) Close() error  { return nil }

// FuzzSavedState: whatever a store hands back, the agent restores it or
// refuses it as unreadable; never a panic, never a half-restored agent.
func FuzzSavedState(f *testing.F) {
	f.Add([]byte(`{"jobs":[],"history":[],"rounds":1,"next_round":"2026-01-01T00:00:00Z"}`), []byte("{}"))
	f.Add([]byte(`{"jobs":[{"spec":{"JobID":"j","Namespace":"default","Throughput":{"v100":3},"Workers":1},"version":1}]}`), []byte(""))
	f.Fuzz(func(t *testing.T, agentState, engineSnap []byte) {
		s, err := config.Config{Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
		if err != nil {
			t.Fatal(err)
		}
		client, _ := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
		a, err := New(s, client, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = a.openState(context.Background(), &memStore{saved: &state.Saved{Agent: agentState, Engine: engineSnap}})
		if err != nil {
			if !errors.Is(err, state.ErrUnreadable) {
				t.Fatalf("not an unreadable-state error: %v", err)
			}
			if a.roster.count() != 0 {
				t.Fatal("a refused state left jobs behind")
			}
		}
	})
}
