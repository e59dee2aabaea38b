package hadar

import (
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// The engine holds every job to a minimum run time: a job that started on
// GPUs keeps them that long whatever a policy answers (docs/engine.md). A
// plan that ignores it is repaired, and the job it gave those GPUs to
// waits, so Hadar plans with it: a job within its minimum run time keeps
// its GPUs (its pin), and every start is evaluated as held that long.

// holding reports whether the job holds GPUs now: mid-round the running
// ones; at a boundary those that ran in the round that ended (the engine
// clears the placement of a job it stops).
func holding(v *round.View, jb *round.JobView) bool {
	return len(jb.Placement.Units) > 0 && (jb.Running || !v.MidRound)
}

// track mirrors the engine's start time of each job's placement: a
// placement with a unit the job did not hold at the previous plan started
// at that plan, the only moment placements change.
func (s *Scheduler) track(v *round.View) {
	for _, jb := range v.Jobs {
		r := s.jobs[jb.ID]
		if r == nil {
			continue
		}
		var cur []planner.Unit
		if holding(v, jb) {
			cur = jb.Placement.Units
		}
		for _, u := range cur {
			if !slices.ContainsFunc(r.Seen, u.Equal) {
				// Unknown start (no previous plan): assume it just
				// started, so no plan takes GPUs the engine protects.
				r.Since = v.Now
				if s.hasLast {
					r.Since = s.lastCall
				}
				break
			}
		}
		r.Seen = slices.Clone(cur)
	}
	s.lastCall, s.hasLast = v.Now, true
}

// restartAware reports whether preemptions and moves must pay for
// themselves: they cost something (a restart, or a minimum run time that
// locks the GPUs a job starts on) and the Eager ablation is off.
func (s *Scheduler) restartAware() bool {
	return !s.cfg.Eager && (s.cfg.RestartCost > 0 || s.cfg.MinRunTime > 0)
}

// minRun is the job's minimum run time in seconds (0: none).
func (s *Scheduler) minRun(jb *round.JobView) float64 {
	if jb.MinRunTime > 0 {
		return jb.MinRunTime
	}
	return s.cfg.MinRunTime
}

// slotStart is the time slot t (relative to the current one) begins.
func (s *Scheduler) slotStart(v *round.View, t int) float64 {
	base := s.base
	if !s.started || v.Now < base {
		base = v.Now
	}
	return base + float64(t)*v.Round
}

// lockSlots is the number of slots, from slot start on, that a placement
// starting at time at holds its GPUs for: the start slot and every later
// boundary within its minimum run time (as the engine counts it).
func (s *Scheduler) lockSlots(v *round.View, jb *round.JobView, start int, at float64) int {
	m := s.minRun(jb)
	n := 1
	for t := start + 1; s.slotStart(v, t)-at < m-1e-6; t++ {
		n++
	}
	return n
}

// startAt is when a placement chosen now for slot t starts: now for the
// current slot, else at that slot's boundary.
func (s *Scheduler) startAt(v *round.View, t int) float64 {
	if t == 0 {
		return v.Now
	}
	return s.slotStart(v, t)
}

// pin is the number of slots from the current one in which the job, which
// holds GPUs now, may not lose them (0 when it may be moved or stopped at
// this boundary). Mid-round a running job keeps its GPUs in slot 0 anyway.
func (s *Scheduler) pin(v *round.View, jb *round.JobView, r *record) int {
	if !holding(v, jb) {
		return 0
	}
	m := s.minRun(jb)
	n := 0
	if v.MidRound || v.Now-r.Since < m-1e-6 {
		n = 1
		for t := 1; s.slotStart(v, t)-r.Since < m-1e-6; t++ {
			n++
		}
	}
	return n
}

// setPins finds the jobs within their minimum run time and rewrites the
// start of their committed schedule to the GPUs they hold (the engine
// keeps them there whatever Hadar planned): their first unit over the
// pinned slots, then whatever they had committed after. Copies (HadarE)
// are kept beside it.
func (s *Scheduler) setPins(v *round.View) {
	s.pins, s.copies = map[string]int{}, map[string][]planner.Unit{}
	for _, jb := range v.Jobs {
		r := s.jobs[jb.ID]
		if r == nil {
			continue
		}
		n := s.pin(v, jb, r)
		if n == 0 {
			continue
		}
		s.pins[jb.ID] = n
		r.clip(s.cur+int64(n), s.cur+1<<40)
		r.Segs = append([]segment{{From: s.cur, To: s.cur + int64(n), Unit: jb.Placement.Units[0]}}, r.Segs...)
		if len(r.Segs) > 1 && r.Segs[1].From == r.Segs[0].To && r.Segs[1].Unit.Equal(r.Segs[0].Unit) {
			r.Segs[0].To = r.Segs[1].To
			r.Segs = append(r.Segs[:1], r.Segs[2:]...)
		}
		if len(jb.Placement.Units) > 1 {
			s.copies[jb.ID] = jb.Placement.Units[1:]
		}
	}
}

// tenancy is the GPUs a running job holds beyond its commitments: in the
// slots [from, to) it still needs after its committed schedule ends (or
// from now, for a job running without one: backfilled, or its commitment
// over). They stay its own: no other job's schedule takes them unless a
// preemption pays (preempt), so a running job is never stopped or moved
// as a side effect of another job's plan.
type tenancy struct {
	take     []slotIdx
	from, to int
}

// reserveTenants reserves the GPUs of every running job beyond its
// commitments, up to the slots its remaining work needs where it runs.
func (s *Scheduler) reserveTenants(v *round.View, g *grid, infos []*jobInfo) {
	s.tenants = map[string]*tenancy{}
	for _, ji := range infos {
		if !holding(v, ji.view) {
			continue
		}
		r := s.jobs[ji.view.ID]
		u := ji.view.Placement.Units[0]
		from := 0
		if v.MidRound {
			from = 1 // slot 0 is busy in the pool already
		}
		steps := ji.view.Remaining
		if _, ok := r.holds(s.cur); ok {
			// Its commitment continues from now: the tenancy follows it,
			// on the GPUs it ends on.
			from = max(from, int(r.end()-s.cur))
			steps -= s.committedSteps(v, ji, r)
			u = r.Segs[len(r.Segs)-1].Unit
		}
		take, ok := g.resolve(u)
		if !ok || !ji.view.Eligible.AllowsUnit(u) || steps <= 0 {
			continue
		}
		rate := s.rate(v, ji, u)
		if rate <= 0 {
			continue
		}
		to := min(g.horizon(), from+int(math.Ceil(steps/(rate*v.Round))))
		for t := from; t < to; t++ {
			if !g.fitsAt(t, take) {
				to = t
			}
		}
		if to <= from {
			continue
		}
		g.commit(from, to, take)
		s.tenants[ji.view.ID] = &tenancy{take: take, from: from, to: to}
	}
}

// vacate gives a tenant's GPUs back to the grid (its own plan, or a
// preemption); it returns the tenancy, nil when the job has none.
func (s *Scheduler) vacate(g *grid, id string) *tenancy {
	ten := s.tenants[id]
	if ten != nil {
		g.uncommit(ten.from, ten.to, ten.take)
		delete(s.tenants, id)
	}
	return ten
}

// reoccupy reserves a vacated tenancy again (its job found nothing better
// and goes on where it is).
func (s *Scheduler) reoccupy(g *grid, id string, ten *tenancy) {
	for t := ten.from; t < ten.to; t++ {
		if !g.fitsAt(t, ten.take) {
			return
		}
	}
	g.commit(ten.from, ten.to, ten.take)
	s.tenants[id] = ten
}

// moveGain is the seconds a running job saves by moving from GPUs where it
// makes from steps/s to GPUs where it makes to: its remaining time where
// it is, less the restart and its remaining time there.
func (s *Scheduler) moveGain(ji *jobInfo, from, to float64) float64 {
	if !(from > 0) {
		return math.Inf(1)
	}
	if !(to > 0) {
		return math.Inf(-1)
	}
	rem := ji.view.Remaining
	return rem/from - (s.cfg.RestartCost + rem/to)
}

// stayOrMove is for a running job whose commitment for the current slot
// is on other GPUs than it runs on (it started early, or the engine kept
// it where it was): it moves only when that saves more than the restart
// costs; otherwise its commitment moves onto its GPUs when they are free
// for as long. It returns the unit the job runs on this slot.
func (s *Scheduler) stayOrMove(v *round.View, g *grid, ji *jobInfo, r *record, committed planner.Unit) planner.Unit {
	here := s.keepNow(v, g, ji)
	if here == nil || r.Segs[0].From != s.cur {
		return committed
	}
	take, ok := g.resolve(committed)
	if !ok {
		return committed
	}
	gain := s.moveGain(ji, here.rate, s.rate(v, ji, committed))
	if gain > 0 {
		return committed
	}
	seg := &r.Segs[0]
	to := int(seg.To - s.cur)
	g.uncommit(0, to, take)
	for t := range to {
		if !g.fitsAt(t, here.take) {
			g.commit(0, to, take)
			return committed
		}
	}
	g.commit(0, to, here.take)
	seg.Unit = here.unit
	v.Explain(ji.idx, round.Reason{Why: fmt.Sprintf("stays on its GPUs rather than move to those committed to it: moving would save %.0f s less than the %.0f s restart", -gain, s.cfg.RestartCost)})
	return here.unit
}

// upgrade moves running jobs onto faster GPUs left idle after every other
// decision, largest gain first, where the move saves a job more than its
// restart (moveGain): a job placed when only slow GPUs were free does not
// stay there for the rest of its run while faster ones idle.
func (s *Scheduler) upgrade(v *round.View, g *grid, infos []*jobInfo, out []planner.Placement) {
	if v.MidRound {
		return
	}
	type cand struct {
		ji   *jobInfo
		o    *option
		gain float64
		w    int
	}
	waiting := slices.ContainsFunc(infos, func(ji *jobInfo) bool { return len(out[ji.idx].Units) == 0 })
	for {
		var best *cand
		for _, ji := range infos {
			p := out[ji.idx]
			if !holding(v, ji.view) || s.pins[ji.view.ID] > 0 || len(p.Units) != 1 || !p.Units[0].Equal(ji.view.Placement.Units[0]) {
				continue
			}
			rate := s.rate(v, ji, p.Units[0])
			held := ji.sf()
			// An elastic job may grow in place: its own GPUs are weighed
			// as free while it looks.
			var ownSegs []segment
			var ownTen *tenancy
			if ji.at != nil {
				r := s.jobs[ji.view.ID]
				ownSegs = slices.Clone(r.Segs)
				if len(r.Segs) > 0 {
					s.release(v, g, ji, r)
				}
				ownTen = s.vacate(g, ji.view.ID)
			}
			// An elastic job weighs its every width (width.go).
			for _, wd := range ji.widths() {
				// While a job waits, no growth past the job's cap
				// (effCap): the GPUs are worth more to a waiting job.
				if waiting && ji.wmax > 0 && wd > ji.wmax && wd > held {
					continue
				}
				if !s.setWidth(v, ji, wd) {
					continue
				}
				w := s.startWindow(v, g, ji, 0)
				// Onto the fluid guide's types only: the guide is what keeps
				// each type for the jobs with the advantage there. An
				// elastic job protected and not critical (value: too long
				// at the width it holds, on time if it widens) grows onto
				// any type, as a critical job plans off the guide's types
				// rather than wait: without it, one of scale factor 8 ran
				// 95 h on 2 P100s on philly-8h seed 1, all elastic, with
				// a third of the GPUs idle over the run.
				o := s.bestOption(v, g, ji, g.window(0, w), true, ji.protected && !ji.critical)
				// With no job waiting, an elastic job also grows or moves
				// onto GPUs of other types that the fluid solution leaves
				// idle: the guide keeps them for no job, and it poses the
				// job at its scale factor, where (spread) the guide's type
				// may not be where the job runs fastest at any width.
				// Measured: docs/results.md, "Idle fast GPUs in the drain,
				// and critical jobs no wider than a server".
				if !waiting && ji.at != nil && !ji.protected {
					if alt := s.bestOption(v, g, ji, g.window(0, w), true, true); alt != nil && (o == nil || alt.rate > o.rate) && s.fluidSpare(v, ji, alt) {
						o = alt
					}
				}
				if o == nil || !fastEnough(ji, rate, o.rate) {
					continue
				}
				if gain := jobWeight(ji) * s.moveGain(ji, rate, o.rate); gain > 0 && (best == nil || gain > best.gain) {
					best = &cand{ji, o, gain, w}
				}
			}
			s.setWidth(v, ji, held)
			if ji.at != nil {
				if len(ownSegs) > 0 {
					s.recommit(g, s.jobs[ji.view.ID], ownSegs)
				}
				if ownTen != nil {
					s.reoccupy(g, ji.view.ID, ownTen)
				}
			}
		}
		if best == nil {
			return
		}
		ji, o := best.ji, best.o
		r := s.jobs[ji.view.ID]
		committed := len(r.Segs) > 0
		if committed {
			s.release(v, g, ji, r)
		}
		if ten := s.vacate(g, ji.view.ID); ten == nil && !committed {
			// Kept by backfill, for slot 0 only.
			if old, ok := g.resolve(out[ji.idx].Units[0]); ok {
				g.uncommit(0, 1, old)
			}
		}
		s.finish(g, o)
		g.commit(0, best.w, o.take)
		r.add(s.cur, s.cur+int64(best.w), o.unit)
		out[ji.idx] = planner.Placement{Units: []planner.Unit{o.unit}}
		s.setWidth(v, ji, o.unit.GPUs())
		if resize := s.resizeWhy(v, ji, o.unit, o.rate, best.gain, "idle "); resize != "" {
			v.Explain(ji.idx, round.Reason{Why: resize})
			continue
		}
		v.Explain(ji.idx, round.Reason{Why: fmt.Sprintf("moves to idle GPUs (%s): done in about %s instead of %s where it ran, a gain of %s over its %s restart",
			unitString(o.unit), hours(s.cfg.RestartCost+ji.view.Remaining/o.rate), hours(ji.view.Remaining/s.rate(v, ji, ji.view.Placement.Units[0])), hours(best.gain), hours(s.cfg.RestartCost))})
	}
}

// fastEnough reports whether a running job making from steps/s may move
// to idle GPUs where it makes to: faster, and for a rigid job at least
// upgradeSpeedup times (an elastic job's moves are resizes, weighed in
// width.go).
func fastEnough(ji *jobInfo, from, to float64) bool {
	return to > from && (ji.at != nil || to >= from*upgradeSpeedup)
}

// fluidSpare reports whether the GPUs of o off the job's guided types are
// all GPUs the fluid solution leaves idle (capacity less its use of the
// type).
func (s *Scheduler) fluidSpare(v *round.View, ji *jobInfo, o *option) bool {
	if len(s.fluidUse) != len(v.Types) {
		return false
	}
	need := make([]float64, len(v.Types))
	for _, sl := range o.take {
		if ji.allowed != nil && !ji.allowed[sl.k] {
			need[sl.k] += float64(sl.count)
		}
	}
	for k, n := range need {
		if n > 0 && v.Capacity[k]-s.fluidUse[k] < n-1e-9 {
			return false
		}
	}
	return true
}
