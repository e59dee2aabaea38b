package agent

import (
	"maps"

	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// maxHistory bounds the decisions kept for the status API.
const maxHistory = 500

// record is what the agent decided, for the status API and the saved
// state: the last decision that changed anything, the recent events
// (bounded), the rounds and cycles run, and the plans the engine had to
// mend, by kind (placement: a job's placement replaced; fallback: a failed
// solve replaced). It has no lock of its own: it is written by the cycle
// and read by the HTTP handlers under the agent's mu, together with the
// engine state those views also read. The zero record is empty.
type record struct {
	last    engine.Decision
	history []wire.Event
	rounds  int
	cycles  int // wire.Health.Cycles
	repairs map[string]int
}

// cycle counts a cycle run.
func (r *record) cycle() { r.cycles++ }

// round counts a round boundary planned.
func (r *record) round() { r.rounds++ }

// decided keeps d as the last decision.
func (r *record) decided(d engine.Decision) { r.last = d }

// repaired counts a plan the engine mended, of kind (wire.Repair*).
func (r *record) repaired(kind string) {
	if r.repairs == nil {
		r.repairs = map[string]int{}
	}
	r.repairs[kind]++
}

// note keeps ev, forgetting the oldest beyond maxHistory.
func (r *record) note(ev wire.Event) {
	r.history = append(r.history, ev)
	if len(r.history) > maxHistory {
		r.history = r.history[len(r.history)-maxHistory:]
	}
}

// events returns a copy of the recent events, newest last.
func (r *record) events() []wire.Event { return append([]wire.Event(nil), r.history...) }

// eventsOf returns the recent events of engine job id, newest last.
func (r *record) eventsOf(id string) []wire.Event {
	var evs []wire.Event
	for _, ev := range r.history {
		if ev.Job == id {
			evs = append(evs, ev)
		}
	}
	return evs
}

// repairCounts returns a copy of the repairs by kind (nil when none).
func (r *record) repairCounts() map[string]int { return maps.Clone(r.repairs) }

// restore takes the history and rounds of a saved state; the cycles,
// repairs and last decision are this process's own.
func (r *record) restore(history []wire.Event, rounds int) {
	r.history, r.rounds = history, rounds
}
