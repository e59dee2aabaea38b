package agent

import (
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// The status API speaks sidecar/wire's types, never the planner's: these
// convert what the engine decided and learned. Each enum maps constant to
// constant, so that a planner renaming a value does not rename it in the
// API (a value the wire does not know yet passes as it is).

var wireActions = map[engine.Action]wire.Action{
	engine.Start: wire.ActionStart, engine.Keep: wire.ActionKeep, engine.Stop: wire.ActionStop, engine.Move: wire.ActionMove,
	engine.Fork: wire.ActionFork, engine.Unfork: wire.ActionUnfork, engine.Wait: wire.ActionWait,
}

var wireKinds = map[engine.Kind]wire.Kind{engine.Boundary: wire.KindRound, engine.Fill: wire.KindFill, engine.None: wire.KindNone}

func wireAction(a engine.Action) wire.Action {
	if w, ok := wireActions[a]; ok {
		return w
	}
	return wire.Action(a)
}

func wireKind(k engine.Kind) wire.Kind {
	if w, ok := wireKinds[k]; ok {
		return w
	}
	return wire.Kind(k)
}

func wireReason(r round.Reason) wire.Reason {
	return wire.Reason{Share: r.Share, Priority: r.Priority, Price: r.Price, Utility: r.Utility, Timer: r.Timer, Waited: r.Waited, Why: r.Why}
}

func wireUnits(us []planner.Unit) []wire.Unit {
	if us == nil {
		return nil
	}
	out := make([]wire.Unit, 0, len(us))
	for _, u := range us {
		var wu wire.Unit
		for _, s := range u.Slots {
			wu.Slots = append(wu.Slots, wire.Slot{Node: s.Node, Type: string(s.Type), Count: s.Count})
		}
		out = append(out, wu)
	}
	return out
}

func wireFigures(ls []engine.Learned) []wire.LearnedFigure {
	out := make([]wire.LearnedFigure, 0, len(ls))
	for _, l := range ls {
		out = append(out, wire.LearnedFigure{Model: l.Model, SF: l.SF, Type: string(l.Type), Profile: l.Profile, Factor: l.Factor,
			Rate: l.Rate, Applied: l.Applied, Seconds: l.Seconds, Jobs: l.Jobs})
	}
	return out
}

// wireGaps keeps nil nil: the API has written no gaps as null.
func wireGaps(gs []engine.Gap) []wire.Gap {
	if gs == nil {
		return nil
	}
	out := make([]wire.Gap, 0, len(gs))
	for _, g := range gs {
		out = append(out, wire.Gap{Model: g.Model, Type: string(g.Type), Why: g.Why})
	}
	return out
}

func wireTypeSpeeds(m map[planner.GPUType]float64) map[string]float64 {
	if m == nil {
		return nil
	}
	out := make(map[string]float64, len(m))
	for t, v := range m {
		out[string(t)] = v
	}
	return out
}
