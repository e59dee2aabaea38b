package hadar

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// Preemptions are explicit. A running job holds its GPUs (its commitment,
// or its tenancy beyond it), and another job takes them only through
// displace, when the seconds of completion time it gains exceed those the
// running jobs lose, weighted by the jobs' priority weights:
//
//   - the job K, run now at rate r, is done in restart + rem/r; as its
//     plan stands it is done later: on slower GPUs, at its committed
//     schedule's start, or when running jobs' expected finishes free
//     enough GPUs of its types for it and the waiting jobs before it in
//     the dual order (a lower bound: later arrivals are ignored);
//   - each running job J whose GPUs K takes loses its restart, and then
//     runs slower elsewhere until K is done and moves back (or stays
//     there, whichever costs less), or waits until K is done or GPUs free
//     anyway.
//
// Sia (SOSP'23) scales each job's utility by a restart factor for the
// same reason: a preemption that does not pay back its restart is not
// made. A job critical for the makespan (Makespan utility) counts only
// the victims' restarts against its gain: any delay of it is the
// makespan's.

// releases lists when the GPUs busy this round are expected to free: each
// running job's GPUs at its expected finish where it runs (ignoring later
// preemptions), per GPU type.
type releases struct {
	at    [][]release // per type, by time
	types int
}

type release struct {
	t     float64
	count int
}

func (s *Scheduler) releases(v *round.View, g *grid, infos []*jobInfo, out []planner.Placement) *releases {
	rs := &releases{at: make([][]release, len(g.types)), types: len(g.types)}
	for _, ji := range infos {
		p := ji.view.Placement
		if out != nil && !(v.MidRound && ji.view.Running) {
			p = out[ji.idx]
		}
		if !holding(v, ji.view) && out == nil {
			continue
		}
		if len(p.Units) == 0 {
			continue
		}
		rate := 0.0
		for _, u := range p.Units {
			rate += s.rate(v, ji, u)
		}
		t := math.Inf(1)
		if rate > 0 {
			t = ji.view.Remaining / rate
		}
		for _, u := range p.Units {
			for _, sl := range u.Slots {
				if k, ok := g.typeIdx[sl.Type]; ok {
					rs.at[k] = append(rs.at[k], release{t, sl.Count})
				}
			}
		}
	}
	for k := range rs.at {
		slices.SortFunc(rs.at[k], func(a, b release) int { return cmp.Compare(a.t, b.t) })
	}
	return rs
}

// wait is the least time until the job's width of GPUs of its types is
// free, after the ahead GPUs the waiting jobs before it in the dual order
// need: those free now in every slot of window w, then the releases.
func (rs *releases) wait(g *grid, ji *jobInfo, w *window, ahead int) float64 {
	have := -ahead
	idx := make([]int, rs.types)
	for k := range g.types {
		if ji.tp[k] > 0 {
			have += w.typeFree[k]
		}
	}
	if have >= ji.sf() {
		return 0
	}
	for {
		next, nk := math.Inf(1), -1
		for k := range g.types {
			if ji.tp[k] > 0 && idx[k] < len(rs.at[k]) && rs.at[k][idx[k]].t < next {
				next, nk = rs.at[k][idx[k]].t, k
			}
		}
		if nk < 0 {
			return math.Inf(1)
		}
		have += rs.at[nk][idx[nk]].count
		idx[nk]++
		if have >= ji.sf() {
			return next
		}
	}
}

// waitAtLeast is the least time until the job's width of GPUs of types
// on which it runs at least rate is free (free now, or released).
func (rs *releases) waitAtLeast(g *grid, ji *jobInfo, rate float64) float64 {
	fast := &jobInfo{view: ji.view, width: ji.width, tp: make([]float64, len(ji.tp))}
	for k, x := range ji.tp {
		if x >= rate*(1-1e-9) {
			fast.tp[k] = x
		}
	}
	return rs.wait(g, fast, g.window(0, 1), 0)
}

// victim is a running job a preemption may stop: past its minimum run
// time, neither critical nor worth as much per GPU-round as the job that
// would take its GPUs. Its commitments and tenancy are vacated while a
// preemption is tried, and restored when it is not made.
type victim struct {
	ji   *jobInfo
	ten  *tenancy
	segs []segment
	take []slotIdx // the GPUs it holds this round
}

func (s *Scheduler) vacateVictim(v *round.View, g *grid, c *victim) {
	c.ten = s.vacate(g, c.ji.view.ID)
	r := s.jobs[c.ji.view.ID]
	c.segs = slices.Clone(r.Segs)
	if len(r.Segs) > 0 {
		s.release(v, g, c.ji, r)
	}
}

func (s *Scheduler) restoreVictim(g *grid, c *victim) {
	s.recommit(g, s.jobs[c.ji.view.ID], c.segs)
	if c.ten != nil {
		s.reoccupy(g, c.ji.view.ID, c.ten)
	}
}

// heldNow is the GPUs a running job holds in the current slot of the
// grid: its commitment for it, else its tenancy.
func (s *Scheduler) heldNow(g *grid, ji *jobInfo) ([]slotIdx, bool) {
	if u, ok := s.jobs[ji.view.ID].holds(s.cur); ok {
		return g.resolve(u)
	}
	if ten := s.tenants[ji.view.ID]; ten != nil && ten.from == 0 {
		return ten.take, true
	}
	return nil, false
}

// outlook is when the job is expected to be done, in seconds from now,
// under its plan as it stands; the rate it runs at now (0 when it waits)
// and, when it waits, what for.
func (s *Scheduler) outlook(v *round.View, g *grid, k *jobInfo, rs *releases, ahead int) (float64, float64, string) {
	r := s.jobs[k.view.ID]
	rem, restart := k.view.Remaining, s.cfg.RestartCost
	here := planner.Unit{}
	if holding(v, k.view) {
		here = k.view.Placement.Units[0]
	}
	if u, ok := r.holds(s.cur); ok {
		rate := s.rate(v, k, u)
		if u.Equal(here) {
			restart = 0
		}
		return restart + rem/rate, rate, ""
	}
	if len(r.Segs) > 0 {
		wait := s.slotStart(v, int(r.Segs[0].From-s.cur)) - v.Now
		rate := s.rate(v, k, r.Segs[0].Unit)
		return wait + restart + rem/rate, 0, fmt.Sprintf("its committed GPUs (%s) in %s", unitString(r.Segs[0].Unit), hours(wait))
	}
	if ten := s.tenants[k.view.ID]; ten != nil && ten.from == 0 {
		rate := s.rate(v, k, here)
		return rem / rate, rate, ""
	}
	w := s.startWindow(v, g, k, 0)
	if o := s.startOption(v, g, k, w); o != nil {
		return restart + rem/o.rate, o.rate, ""
	}
	wait := rs.wait(g, k, g.window(0, w), ahead)
	return wait + restart + rem/k.best, 0, fmt.Sprintf("GPUs to free, at least %s", hours(wait))
}

// displace is the explicit preemption: job k, just planned, takes GPUs
// that running jobs of lower value hold (each then waits, or runs
// elsewhere) when the seconds of completion time it gains exceed those
// they lose. Two kinds of placement are tried: one node whose GPUs of a
// type k runs faster on are partly held by such jobs (which also
// consolidates a job spread over servers), and the fastest placement on
// the GPUs of the cheapest victims. It reports whether it displaced.
func (s *Scheduler) displace(v *round.View, g *grid, k *jobInfo, infos []*jobInfo, rs *releases, ahead int) bool {
	if s.pins[k.view.ID] > 0 {
		return false // it keeps its GPUs for its minimum run time
	}
	rem, restart := k.view.Remaining, s.cfg.RestartCost
	before, beforeRate, what := s.outlook(v, g, k, rs, ahead)
	// A running rigid job can move to idle GPUs faster than its own
	// (upgrade, later this round) without stopping anyone: the gain of a
	// preemption is over that, not over staying where it runs.
	if beforeRate > 0 && holding(v, k.view) && k.at == nil {
		if o := s.startOption(v, g, k, s.startWindow(v, g, k, 0)); o != nil && o.rate > beforeRate {
			before = math.Min(before, restart+rem/o.rate)
		}
	}
	bestNow := restart + rem/k.best
	// A job critical for the makespan counts only the victims' restarts
	// against its gain: any delay of it is the makespan's.
	crit := k.critical
	// Every victim loses at least a restart.
	if before-bestNow <= 1e-9*before || !crit && jobWeight(k)*(before-bestNow) <= s.minWeight*restart {
		return false
	}
	var cands []*victim
	for _, ji := range infos {
		if ji == k || !holding(v, ji.view) || s.pins[ji.view.ID] > 0 || ji.protected || ji.density >= k.density && !crit {
			continue
		}
		take, ok := s.heldNow(g, ji)
		if !ok {
			continue
		}
		useful := false
		for _, sl := range take {
			useful = useful || k.tp[sl.k] > beforeRate
		}
		if useful {
			cands = append(cands, &victim{ji: ji, take: take})
		}
	}
	if len(cands) == 0 {
		return false
	}
	slices.SortFunc(cands, func(a, b *victim) int {
		return cmp.Or(cmp.Compare(jobWeight(a.ji), jobWeight(b.ji)), cmp.Compare(b.ji.remTime, a.ji.remTime), cmp.Compare(a.ji.idx, b.ji.idx))
	})
	// Take the job's own plan off the grid while it looks.
	r := s.jobs[k.view.ID]
	own := slices.Clone(r.Segs)
	if len(r.Segs) > 0 {
		s.release(v, g, k, r)
	}
	ownTen := s.vacate(g, k.view.ID)
	w := s.startWindow(v, g, k, 0)
	best := s.displaceOnNode(v, g, k, cands, w, before, beforeRate, crit)
	if best == nil {
		best = s.displaceGreedy(v, g, k, cands, w, before, crit)
	}
	if best == nil {
		s.recommit(g, r, own)
		if ownTen != nil {
			s.reoccupy(g, k.view.ID, ownTen)
		}
		return false
	}
	// Made: the victims leave their GPUs, and k holds them from now for
	// its minimum run time.
	var names []string
	for _, c := range best.victims {
		s.vacateVictim(v, g, c)
		names = append(names, c.ji.view.ID)
	}
	r.Segs = nil
	s.finish(g, best.o)
	g.commit(0, w, best.o.take)
	r.add(s.cur, s.cur+int64(w), best.o.unit)
	list := strings.Join(names, ", ")
	how := fmt.Sprintf("done in about %s instead of %s", hours(best.after), hours(before))
	if what != "" {
		how += " waiting for " + what
	}
	why := fmt.Sprintf("preempts %s: %s, a gain of %s against the %s it costs them (a %s restart each, and running slower or waiting while it runs)", list, how, hours(best.gain), hours(best.cost), hours(restart))
	if crit {
		why = fmt.Sprintf("preempts %s: critical for the makespan, %s; they lose a %s restart each", list, how, hours(restart))
	}
	v.Explain(k.idx, round.Reason{Why: why})
	for _, c := range best.victims {
		s.displaced[c.ji.view.ID] = fmt.Sprintf("preempted for %s, which gains %s of completion time against %s lost here", k.view.ID, hours(best.gain), hours(best.cost))
	}
	return true
}

// displacement is one way for a job to take running jobs' GPUs.
type displacement struct {
	o                 *option
	victims           []*victim
	after, gain, cost float64
}

// weigh prices option o for job k (done in restart + rem/o.rate instead
// of before) against what the victims lose, with the victims' GPUs
// vacated, and for a rigid k not critical restartCharge per restart it
// causes: nil when it does not pay.
func (s *Scheduler) weigh(v *round.View, g *grid, k *jobInfo, o *option, victims []*victim, w int, before float64, crit bool) *displacement {
	restart := s.cfg.RestartCost
	after := restart + k.view.Remaining/o.rate
	if after >= before {
		return nil
	}
	d := &displacement{o: o, victims: victims, after: after, gain: jobWeight(k) * (before - after)}
	s.finish(g, o)
	g.commit(0, w, o.take)
	rs := s.rs
	for _, c := range victims {
		j := c.ji
		rj := s.rate(v, j, j.view.Placement.Units[0])
		alt := 0.0
		if a := s.startOption(v, g, j, s.startWindow(v, g, j, 0)); a != nil {
			alt = a.rate
		}
		// Waiting: until k is done or GPUs as fast free anyway. Slower
		// GPUs: for the rest of its run, since faster ones that free go
		// to the jobs before it in the dual order first.
		loss := math.Min(after, rs.waitAtLeast(g, j, rj))
		if alt > 0 && rj > 0 {
			loss = math.Max(0, j.view.Remaining/alt-j.view.Remaining/rj)
		}
		if crit {
			loss = 0 // the makespan waits for k, not for them
		}
		d.cost += jobWeight(j) * (restart + loss)
	}
	g.uncommit(0, w, o.take)
	charge := 0.0
	if !crit && k.at == nil {
		n := len(victims)
		if holding(v, k.view) {
			n++ // k moves too
		}
		charge = float64(n) * restartCharge
	}
	if d.gain <= d.cost+charge {
		return nil
	}
	return d
}

// displaceOnNode tries, for every node and type k runs faster on than
// where it runs now, the cheapest victims there whose GPUs complete a
// consolidated placement; it returns the one that pays most, or nil.
func (s *Scheduler) displaceOnNode(v *round.View, g *grid, k *jobInfo, cands []*victim, w int, before, beforeRate float64, crit bool) *displacement {
	sf := k.sf()
	at := map[[2]int][]*victim{}
	var cells [][2]int
	for _, c := range cands {
		for _, sl := range c.take {
			key := [2]int{sl.n, sl.k}
			if at[key] == nil {
				cells = append(cells, key)
			}
			at[key] = append(at[key], c)
		}
	}
	// In cell order, so that plans are deterministic (snapshots resume
	// exactly).
	slices.SortFunc(cells, func(a, b [2]int) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	mask := k.cells(g)
	var best *displacement
	for _, cell := range cells {
		vs := at[cell]
		n, t := cell[0], cell[1]
		if k.tp[t] <= beforeRate || g.capacity[n][t] < sf || mask != nil && !mask[n*len(g.types)+t] || k.allowed != nil && !k.allowed[t] && !crit {
			continue
		}
		free := g.capacity[n][t]
		for tt := range w {
			free = min(free, g.free(tt, n, t))
		}
		need := sf - free
		if need <= 0 {
			continue // free already: not a displacement
		}
		var pick []*victim
		for _, c := range vs {
			if need <= 0 {
				break
			}
			for _, sl := range c.take {
				if sl.n == n && sl.k == t {
					need -= sl.count
				}
			}
			pick = append(pick, c)
		}
		if need > 0 {
			continue
		}
		for _, c := range pick {
			s.vacateVictim(v, g, c)
		}
		take := []slotIdx{{n, t, sf}}
		if s.fitsWindow(g, take, w) {
			o := &option{take: take, rate: s.takeRate(v, g, k, take)}
			if o.rate > 0 && s.allowed(v, g, k, o) {
				if d := s.weigh(v, g, k, o, pick, w, before, crit); d != nil && (best == nil || d.gain-d.cost > best.gain-best.cost) {
					best = d
				}
			}
		}
		for _, c := range pick {
			s.restoreVictim(g, c)
		}
	}
	return best
}

// displaceGreedy vacates the cheapest victims one by one until the job
// has a placement faster than its plan, and weighs that one.
func (s *Scheduler) displaceGreedy(v *round.View, g *grid, k *jobInfo, cands []*victim, w int, before float64, crit bool) *displacement {
	var vacated []*victim
	var d *displacement
	for _, c := range cands {
		s.vacateVictim(v, g, c)
		vacated = append(vacated, c)
		if !g.fits(0, k) {
			continue
		}
		o := s.startOption(v, g, k, w)
		if o == nil || s.cfg.RestartCost+k.view.Remaining/o.rate >= before {
			continue
		}
		used := map[[2]int]bool{}
		for _, sl := range o.take {
			used[[2]int{sl.n, sl.k}] = true
		}
		var victims []*victim
		for _, c := range vacated {
			for _, sl := range c.take {
				if used[[2]int{sl.n, sl.k}] {
					victims = append(victims, c)
					break
				}
			}
		}
		d = s.weigh(v, g, k, o, victims, w, before, crit)
		break
	}
	for _, c := range vacated {
		s.restoreVictim(g, c)
	}
	return d
}

// fitsWindow reports whether take is free in the slots [0, w).
func (s *Scheduler) fitsWindow(g *grid, take []slotIdx, w int) bool {
	for t := range w {
		if !g.fitsAt(t, take) {
			return false
		}
	}
	return true
}

func jobWeight(ji *jobInfo) float64 { return ji.view.WeightOr1() }

// startWaiting gives idle GPUs to postponed jobs (their schedule starts
// later, on GPUs busy until then): a job starts now when it is done
// sooner that way, counting the restart should it move to its committed
// GPUs once its minimum run time is over; otherwise its reason says what
// it waits for and what starting now would give.
func (s *Scheduler) startWaiting(v *round.View, g *grid, infos []*jobInfo, out []planner.Placement) {
	for _, k := range infos {
		if len(out[k.idx].Units) > 0 || v.MidRound && k.view.Running {
			continue
		}
		r := s.jobs[k.view.ID]
		if len(r.Segs) == 0 || r.Segs[0].From == s.cur {
			continue
		}
		saved := slices.Clone(r.Segs)
		wait := s.slotStart(v, int(r.Segs[0].From-s.cur)) - v.Now
		rate := s.rate(v, k, r.Segs[0].Unit)
		what := fmt.Sprintf("its committed GPUs (%s) in %s", unitString(r.Segs[0].Unit), hours(wait))
		rem, restart := k.view.Remaining, s.cfg.RestartCost
		later := wait + restart + rem/rate
		s.release(v, g, k, r)
		w := s.startWindow(v, g, k, 0)
		o := s.startOption(v, g, k, w)
		if o == nil {
			s.recommit(g, r, saved)
			s.explainWait(v, k, what, later, math.NaN(), "")
			continue
		}
		now := restart + rem/o.rate
		// Where it runs slower, it moves to its committed GPUs once its
		// minimum run time is over, if that pays.
		held := s.slotStart(v, w) - v.Now
		if done := o.rate * math.Max(0, held-restart); o.rate < rate && done < rem {
			now = math.Min(now, held+restart+(rem-done)/rate)
		}
		if now >= later {
			s.recommit(g, r, saved)
			s.explainWait(v, k, what, later, now, "on the idle "+unitString(o.unit))
			continue
		}
		s.finish(g, o)
		g.commit(0, w, o.take)
		out[k.idx] = planner.Placement{Units: []planner.Unit{o.unit}}
		// It keeps its committed schedule after the slots it now holds
		// the idle GPUs for.
		for _, sg := range saved {
			if sg.To > s.cur+int64(w) {
				sg.From = max(sg.From, s.cur+int64(w))
				s.recommit(g, r, []segment{sg})
			}
		}
		v.Explain(k.idx, round.Reason{Why: fmt.Sprintf("starts now on idle GPUs (%s): done in about %s, against %s waiting for %s", unitString(o.unit), hours(now), hours(later), what)})
	}
}

// startOption is the fastest placement of the job on GPUs free over the
// slots [0, w) (its minimum run time), the fluid guide's types first.
func (s *Scheduler) startOption(v *round.View, g *grid, ji *jobInfo, w int) *option {
	if !g.fits(0, ji) {
		return nil
	}
	win := g.window(0, w)
	o := s.bestOption(v, g, ji, win, true, false)
	if o == nil && ji.allowed != nil {
		o = s.bestOption(v, g, ji, win, true, true)
	}
	return o
}

// explainWait says what a waiting job waits for and what starting now
// would give (now is NaN when nothing is free for it).
func (s *Scheduler) explainWait(v *round.View, ji *jobInfo, what string, later, now float64, how string) {
	if v.Reasons == nil {
		return
	}
	why := fmt.Sprintf("waits for %s: done in about %s", what, hours(later))
	if !math.IsNaN(now) {
		why += fmt.Sprintf(", against %s starting now %s", hours(now), how)
	}
	prev := v.Reasons[ji.idx]
	if prev.Why != "" {
		why = prev.Why + "; " + why
	}
	prev.Why = why
	v.Explain(ji.idx, prev)
}

func hours(sec float64) string {
	switch {
	case math.IsInf(sec, 0):
		return "never"
	case sec < 120:
		return fmt.Sprintf("%.0f s", sec)
	case sec < 2*3600:
		return fmt.Sprintf("%.0f min", sec/60)
	}
	return fmt.Sprintf("%.1f h", sec/3600)
}

func unitString(u planner.Unit) string {
	var parts []string
	for _, sl := range u.Slots {
		parts = append(parts, fmt.Sprintf("%d %s on %s", sl.Count, sl.Type, sl.Node))
	}
	return strings.Join(parts, " + ")
}
