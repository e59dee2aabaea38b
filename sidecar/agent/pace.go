package agent

import (
	"time"

	"github.com/hadar-sched/hadar/planner/engine"
)

// warnTTL is how long a warning stays silenced; maxWarned how many keys
// are remembered at most (issue 31, item 11: the map only grew).
const (
	warnTTL   = time.Hour
	maxWarned = 1024
)

// pacer is the agent's timing: when the next round boundary is due, the
// warnings silenced for a while (so a condition seen every cycle is not
// logged every cycle), and who is told how long each cycle took. It has
// no lock of its own: it is used under the agent's mu, as the cycle and
// the views that read next are. The zero pacer plans a boundary at once
// and reports to nobody.
type pacer struct {
	next    time.Time // next round boundary
	warned  map[string]time.Time
	onCycle func(engine.Kind, time.Duration) // see Agent.OnCycle
}

// due reports whether a round boundary is due at now.
func (p *pacer) due(now time.Time) bool { return !now.Before(p.next) }

// nextRound is when the next round boundary is due.
func (p *pacer) nextRound() time.Time { return p.next }

// planAt makes the next boundary due at t: now (the sidecar starts, a
// replica takes the lead), or the time a saved state had.
func (p *pacer) planAt(t time.Time) { p.next = t }

// planned records a boundary planned at now: the next is one round on.
func (p *pacer) planned(now time.Time, round time.Duration) { p.next = now.Add(round) }

// report registers f to be told each cycle's kind and duration.
func (p *pacer) report(f func(engine.Kind, time.Duration)) { p.onCycle = f }

// reporting says whether anyone is told of cycles, so the cycle need not
// time itself otherwise.
func (p *pacer) reporting() bool { return p.onCycle != nil }

// cycled tells the registered function of a cycle of kind that took took.
func (p *pacer) cycled(kind engine.Kind, took time.Duration) {
	if p.onCycle != nil {
		p.onCycle(kind, took)
	}
}

// silenced reports whether the warning key was given less than warnTTL
// before now; when not, it remembers now as key's time, so the caller
// logs it this once. At most maxWarned keys are remembered: the expired
// go first, then the oldest.
func (p *pacer) silenced(key string, now time.Time) bool {
	if p.warned == nil {
		p.warned = map[string]time.Time{}
	}
	if at, ok := p.warned[key]; ok && now.Sub(at) < warnTTL && !at.After(now) {
		return true
	}
	if len(p.warned) >= maxWarned {
		oldest := ""
		for k, at := range p.warned {
			if now.Sub(at) >= warnTTL {
				delete(p.warned, k)
			} else if oldest == "" || at.Before(p.warned[oldest]) {
				oldest = k
			}
		}
		if len(p.warned) >= maxWarned {
			delete(p.warned, oldest)
		}
	}
	p.warned[key] = now
	return false
}
