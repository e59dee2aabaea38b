package agent

import (
	"context"
	"errors"
	"testing"

	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/speed"
)

// testCore is a core whose build makes a FIFO engine over the default
// profile, counting its builds.
func testCore(t *testing.T, builds *int) *core {
	t.Helper()
	prof := belief.NewProfile(profile.Default())
	net, err := belief.NewNetwork(prof, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &core{build: func(snapshot []byte) (*engine.Engine, *engine.Estimates, error) {
		*builds++
		est, err := engine.NewEstimates(prof, engine.LearnConfig{})
		if err != nil {
			return nil, nil, err
		}
		model := speed.Model{Profile: est, Network: net}
		sched, _, err := registry.Build("fifo", placement.Pack, registry.Options{Speed: model}, placement.Config{})
		if err != nil {
			return nil, nil, err
		}
		cfg := engine.Config{Round: 60, Speed: model}
		if snapshot != nil {
			e, err := engine.Restore(snapshot, cfg, sched)
			return e, est, err
		}
		e, err := engine.New(cfg, sched)
		return e, est, err
	}}
}

// A core that cannot build has no engine, and says why.
func TestCoreStartFails(t *testing.T) {
	boom := errors.New("boom")
	c := core{build: func([]byte) (*engine.Engine, *engine.Estimates, error) { return nil, nil, boom }}
	if err := c.start(); !errors.Is(err, boom) || c.eng != nil || c.est != nil {
		t.Fatalf("start: %v, engine %v", err, c.eng)
	}
}

// Planning on a copy leaves the engine as it was (its clock included);
// planning on the engine moves it on. The engine time never goes back
// behind the engine's own clock.
func TestCorePlansOnACopyOrTheEngine(t *testing.T) {
	builds := 0
	c := testCore(t, &builds)
	if err := c.start(); err != nil || c.eng == nil || c.est == nil {
		t.Fatalf("start: %v", err)
	}
	eng := c.eng
	ctx := context.Background()
	_, on, err := c.plan(ctx, 100, engine.Boundary, false)
	if err != nil || on == nil || on == eng || builds != 2 {
		t.Fatalf("plan on a copy: %v, planned on the engine %v, %d builds", err, on == eng, builds)
	}
	if eng.Now() == 100 || c.eng != eng {
		t.Fatal("planning on a copy moved the engine on")
	}
	_, on, err = c.plan(ctx, 100, engine.Boundary, true)
	if err != nil || on != eng || eng.Now() != 100 {
		t.Fatalf("plan on the engine: %v, engine time %v", err, eng.Now())
	}
	if got := c.now(50); got != 100 {
		t.Fatalf("now behind the engine's clock: %v, want 100", got)
	}
	if got := c.now(150); got != 150 {
		t.Fatalf("now: %v, want 150", got)
	}
	other := testCore(t, &builds)
	if err := other.start(); err != nil {
		t.Fatal(err)
	}
	c.adopt(other.eng, other.est)
	if c.eng != other.eng || c.est != other.est {
		t.Fatal("adopt did not replace the engine and its estimates together")
	}
}
