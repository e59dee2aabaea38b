package agent

import (
	"context"

	"github.com/hadar-sched/hadar/planner/engine"
)

// core is the round engine and the estimates its speed model reads. Both
// come from one build, afresh or from a snapshot, and are replaced
// together (a restored state), so the engine never plans on another
// engine's estimates. It has no lock of its own: it is used under the
// agent's mu, as the views that read the engine are.
type core struct {
	eng *engine.Engine
	est *engine.Estimates
	// build makes an engine and its estimates: from a snapshot, or afresh
	// when it is nil (Agent.buildEngine).
	build func(snapshot []byte) (*engine.Engine, *engine.Estimates, error)
}

// start builds a fresh engine and its estimates.
func (c *core) start() error {
	eng, est, err := c.build(nil)
	if err != nil {
		return err
	}
	c.adopt(eng, est)
	return nil
}

// adopt makes eng, over est, the engine (one restored from a snapshot and
// checked before it replaces the fresh one).
func (c *core) adopt(eng *engine.Engine, est *engine.Estimates) { c.eng, c.est = eng, est }

// now is the engine time given the process's monotonic clock's (mono),
// never before the engine's own clock: a time taken before a write that
// deferred a job must not make the engine refuse the round.
func (c *core) now(mono float64) float64 { return max(mono, c.eng.Now()) }

// plan plans on the engine when onEngine, else on a copy of it (a dry
// run, a follower: nothing is written then, so the engine must not
// believe the decisions ran). It returns the engine it planned on, nil
// when the copy could not be made, so its scheduler's state can be read.
func (c *core) plan(ctx context.Context, now float64, kind engine.Kind, onEngine bool) (engine.Decision, *engine.Engine, error) {
	if onEngine {
		d, err := c.eng.Plan(ctx, now, kind)
		return d, c.eng, err
	}
	data, err := c.eng.Snapshot()
	if err != nil {
		return engine.Decision{}, nil, err
	}
	scratch, _, err := c.build(data)
	if err != nil {
		return engine.Decision{}, nil, err
	}
	d, err := scratch.Plan(ctx, now, kind)
	return d, scratch, err
}
