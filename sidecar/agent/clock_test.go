package agent

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/state"
)

// fakeTime drives an agent's wall clock and its monotonic clock apart.
type fakeTime struct {
	wall    time.Time
	elapsed time.Duration
}

func (f *fakeTime) install(a *Agent) {
	a.clock = func() time.Time { return f.wall }
	a.mono = &monoClock{base: float64(f.wall.UnixNano()) / 1e9, elapsed: func() time.Duration { return f.elapsed }}
}

func (f *fakeTime) tick(d time.Duration) { f.wall, f.elapsed = f.wall.Add(d), f.elapsed+d }

func newBareAgent(t *testing.T) *Agent {
	t.Helper()
	s, err := config.Config{Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	client, _ := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A wall clock stepped 30 days forward and corrected at once neither
// jumps the engine's time nor freezes it: it runs with the monotonic
// clock.
func TestEngineClockIgnoresWallSteps(t *testing.T) {
	a := newBareAgent(t)
	ft := &fakeTime{wall: time.Unix(1_800_000_000, 0)}
	ft.install(a)
	a.mu.Lock()
	defer a.mu.Unlock()
	plan := func() float64 {
		t.Helper()
		now := a.now()
		if _, err := a.core.eng.Plan(context.Background(), now, engine.Fill); err != nil {
			t.Fatal(err)
		}
		return now
	}
	t0 := plan()
	ft.tick(time.Second)
	ft.wall = ft.wall.Add(30 * 24 * time.Hour) // stepped forward
	t1 := plan()
	ft.tick(time.Second)
	ft.wall = ft.wall.Add(-30 * 24 * time.Hour) // corrected
	t2 := plan()
	ft.tick(time.Minute)
	t3 := plan()
	for _, c := range []struct{ got, want float64 }{{t1 - t0, 1}, {t2 - t0, 2}, {t3 - t0, 62}} {
		if math.Abs(c.got-c.want) > 1e-3 {
			t.Fatalf("engine time went %v s, %v s, %v s after the start; want 1, 2, 62 s", t1-t0, t2-t0, t3-t0)
		}
	}
}

// A state saved with an engine time ahead of this host's wall clock (30
// days) is restored, and the engine's time runs on from it at once
// instead of standing still until the wall clock reaches it.
func TestRestoreAheadOfTheWallClock(t *testing.T) {
	wall := time.Unix(1_800_000_000, 0)
	ahead := float64(wall.Add(30*24*time.Hour).UnixNano()) / 1e9
	src := newBareAgent(t)
	if _, err := src.core.eng.Plan(context.Background(), ahead, engine.Fill); err != nil {
		t.Fatal(err)
	}
	snap, err := src.core.eng.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	a := newBareAgent(t)
	ft := &fakeTime{wall: wall}
	ft.install(a)
	a.mu.Lock()
	defer a.mu.Unlock()
	saved := &state.Saved{Agent: []byte(`{"jobs":[],"history":[],"rounds":1,"next_round":"2027-01-01T00:00:00Z"}`), Engine: snap}
	if err := a.openState(context.Background(), &memStore{saved: saved}); err != nil {
		t.Fatal(err)
	}
	t0 := a.now()
	ft.tick(10 * time.Second)
	if got := a.now() - t0; math.Abs(got-10) > 1e-3 || t0 < ahead {
		t.Fatalf("restored at %v (saved %v); 10 s later engine time moved %v s, want 10", t0, ahead, got)
	}
}
