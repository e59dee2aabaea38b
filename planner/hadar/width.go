package hadar

import (
	"fmt"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/policy"
	"github.com/hadar-sched/hadar/planner/round"
)

// Elastic jobs (planner.Job.Widths, issue 35): the width of an elastic
// job is one more choice of the dual subroutine. For each declared width w
// it finds the job's best schedule on units of w GPUs, at the speeds the
// engine gives for that width (JobView.WidthThroughput: the profiled
// figure T(w), so the job's work is the same at every width), priced as
// any job's; the schedule with the largest value minus price wins. Its
// utility per step does not depend on the width, so a wider unit is worth
// its added progress and costs the prices of its added GPUs.
//
// A running job that changes width restarts, and the same restart-aware
// rule as a move decides it: the new width is taken only where the
// job's remaining time there plus the restart is less than its remaining
// time where it runs (moveGain), and never within its minimum run time
// (its pin keeps its GPUs). upgrade grows running elastic jobs onto GPUs
// left idle after every other decision by the same rule, and backfill
// starts a job at a narrower width where its own does not fit.
//
// HadarE does not fork elastic jobs (fork.go): its width is chosen as
// Hadar chooses it, for its single unit.

// widthFigures are an elastic job's per-type speeds at one width.
type widthFigures struct {
	tp, spread []float64
}

// initWidth makes ji elastic when its job is: planned first at the width
// it holds (one unit of a declared width), else at its scale factor.
func (s *Scheduler) initWidth(v *round.View, ji *jobInfo) {
	jb := ji.view
	if !jb.Elastic() || len(jb.WidthThroughput) != len(jb.Widths) {
		return
	}
	ji.at = map[int]*widthFigures{}
	w := jb.ScaleFactor
	if holding(v, jb) && len(jb.Placement.Units) == 1 && jb.AllowsWidth(jb.Placement.Units[0].GPUs()) {
		w = jb.Placement.Units[0].GPUs()
	}
	if !s.setWidth(v, ji, w) {
		s.setWidth(v, ji, jb.ScaleFactor)
	}
}

// setWidth plans an elastic job at w GPUs: its per-type speeds and best
// speed (on the fluid guide's types where it has any) at that width. It
// reports false, changing nothing, where the job has no figures for w.
func (s *Scheduler) setWidth(v *round.View, ji *jobInfo, w int) bool {
	if ji.at == nil {
		return w == ji.sf()
	}
	f := s.figuresAt(v, ji, w)
	if f == nil {
		return false
	}
	best, guided := 0.0, 0.0
	for k, x := range f.tp {
		best = max(best, x)
		if ji.allowed != nil && ji.allowed[k] {
			guided = max(guided, x)
		}
	}
	if best <= 0 {
		return false
	}
	if guided > 0 {
		best = guided
	}
	ji.width, ji.tp, ji.spread, ji.best = w, f.tp, f.spread, best
	return true
}

// figuresAt is an elastic job's figures at width w, cached in ji.at:
// nil when w is not one of its declared widths with a figure per type.
func (s *Scheduler) figuresAt(v *round.View, ji *jobInfo, w int) *widthFigures {
	if f := ji.at[w]; f != nil {
		return f
	}
	wi := slices.Index(ji.view.Widths, w)
	if wi < 0 || wi >= len(ji.view.WidthThroughput) || len(ji.view.WidthThroughput[wi]) != len(v.Types) {
		return nil
	}
	f := &widthFigures{tp: ji.view.WidthThroughput[wi], spread: make([]float64, len(v.Types))}
	for k, t := range v.Types {
		if f.tp[k] > 0 {
			f.spread[k], _ = s.cfg.Speed.Profile.Throughput(ji.view.Model, w, t, true)
		}
	}
	ji.at[w] = f
	return f
}

// widths is the widths to weigh for the job: its declared ones when it is
// elastic, else only the one it is planned at.
func (ji *jobInfo) widths() []int {
	if ji.at == nil {
		return []int{ji.sf()}
	}
	return ji.view.Widths
}

// dualWidths is the dual subroutine for an elastic job: the best schedule
// over its widths (value minus price), the job left planned at the width
// of the one chosen (or where it was, when none pays).
//
// A critical job is worth more than any price, so prices do not weigh its
// width: it would take the width that runs it fastest whatever that costs
// the others. It is planned no wider than a server (or at its narrowest
// width), since spread over servers an added GPU gains it least; it may
// keep a wider unit it holds, and upgrade may still grow it onto idle
// GPUs. Measured: docs/results.md, "Idle fast GPUs in the drain, and
// critical jobs no wider than a server".
func (s *Scheduler) dualWidths(v *round.View, g *grid, ji *jobInfo, from int, keep *option, need float64) *schedule {
	w0 := ji.sf()
	server := g.server()
	var best *schedule
	for _, w := range ji.view.Widths {
		if ji.critical && w > server && w != ji.view.Widths[0] {
			continue
		}
		// While the cluster is contested, no wider than the job's cap
		// (effCap), bar the width it holds: a shrink is shrink.go's.
		if ji.wmax > 0 && w > ji.wmax && !(holding(v, ji.view) && w == ji.view.Placement.Units[0].GPUs()) {
			continue
		}
		if !s.setWidth(v, ji, w) {
			continue
		}
		if sc := s.dualAt(v, g, ji, from, keep, need); sc != nil && (best == nil || sc.pay > best.pay) {
			best = sc
		}
	}
	if best == nil || !s.setWidth(v, ji, best.opt.unit.GPUs()) {
		s.setWidth(v, ji, w0)
	}
	return best
}

// remainingFastest is an elastic job's remaining time at its fastest
// declared width, at its best speed there (on the fluid guide's types
// where it has any): the least over its widths, and never more than at
// the width it is planned at.
//
// The makespan utility (value) makes a job critical when its remaining
// time reaches Config.Critical of the time left to the makespan target;
// a critical job is worth twice any other, preempts others without
// weighing their loss, and plans first. Measured at the width it holds,
// an elastic job shrunk to make room, or started narrow, looked critical
// although widening would still bring it in on time, and one that grew
// stopped being critical. An elastic job is therefore critical only when
// even its fastest width would not bring it in on time; measured at the
// width it holds it stays protected (jobInfo.protected): no other job
// preempts it or shrinks it. Rigid jobs are planned as before (their
// fastest width is the one they have). The fastest width is not always
// the widest: a job wider than a server runs spread, and LM (batch size
// 10) runs 163 steps/s on 2 V100s and 66 on 8 spread over servers.
// Measured: docs/results.md, "Hadar's critical elastic jobs".
func (s *Scheduler) remainingFastest(v *round.View, ji *jobInfo) float64 {
	w0 := ji.sf()
	defer s.setWidth(v, ji, w0)
	r := ji.remTime
	for _, w := range ji.view.Widths {
		if s.setWidth(v, ji, w) {
			r = min(r, ji.view.Remaining/ji.best)
		}
	}
	return r
}

// Tail guard (issue 35, p99 JCT against Sia): an elastic job whose
// remaining time at its fastest width on any type is at least tailLong
// of the time left to the makespan target, and which has been in the
// system at least tailWait of that remaining time, is protected (no other job
// preempts or shrinks it) and planned, grown and backfilled on any GPU
// type, not only the fluid guide's. The guide solves for the makespan
// alone: it posed such a job at its scale factor, where LM (batch size
// 20) at 8 GPUs spread over servers runs faster on P100s than on V100s,
// and kept it on 4 P100s (94 steps/s) where 2 V100s run it at 132; a job
// worth little per GPU-round (long and wide) was also the first victim of
// every preemption. Such a job finishes far behind its best case and
// sets the p99 JCT (philly-8h seed 2, all elastic: job-0057 waited 23.7 h
// and finished 226.8 h after arrival, 128.7 h at its best). Measured:
// docs/results.md, "A tail guard for long elastic jobs".
const (
	tailLong = 0.4
	tailWait = 0.1
)

// guardTail applies the tail guard to the jobs of a planning pass, left
// the seconds to the makespan target. Critical jobs are left as they are.
func (s *Scheduler) guardTail(v *round.View, infos []*jobInfo, left float64) {
	for _, ji := range infos {
		if ji.at == nil || ji.critical {
			continue
		}
		fastest := 0.0
		for _, row := range ji.view.WidthThroughput {
			if len(row) > 0 {
				fastest = max(fastest, slices.Max(row))
			}
		}
		if fastest <= 0 {
			continue
		}
		rem := ji.view.Remaining / fastest
		if rem < tailLong*left || v.Age(ji.view) < tailWait*rem {
			continue
		}
		ji.protected = true
		if ji.allowed != nil {
			ji.allowed = nil
			s.setWidth(v, ji, ji.sf())
			ji.remTime = ji.view.Remaining / ji.best
			ji.density = ji.valueSec * ji.best * v.Round / float64(ji.sf())
			ji.base = ji.density
		}
	}
}

// fluidInput is the fluid guide's allocation problem (guide), solved: every job
// at its scale factor, except an elastic job that sets the fluid
// makespan, which is posed at the width where some type runs it fastest.
// Posed at its scale factor such a job can be far slower than it can run
// (a scale factor wider than a server runs spread) and the guide keeps it
// on slow types, where it sets the makespan; posing every elastic job at
// its fastest width instead takes the fast types from the short jobs.
// Measured: docs/results.md, "The fluid guide at the makespan job's
// fastest width". With no elastic job the problem is the same as before.
func (s *Scheduler) fluidInput(v *round.View) (policy.Input, policy.Allocation, error) {
	in := round.PolicyInput(v, nil)
	if !slices.ContainsFunc(v.Jobs, func(j *round.JobView) bool { return j.Elastic() }) {
		a, err := policy.Makespan{}.Allocate(in)
		return in, a, err
	}
	a, err := policy.Makespan{}.Allocate(in)
	if err != nil {
		return in, a, err
	}
	reposed := false
	makespan := 0.0
	for i, j := range v.Jobs {
		thr := 0.0
		for k, x := range a.X[i] {
			thr += x * j.Throughput[k]
		}
		if thr > 0 {
			makespan = max(makespan, j.Remaining/thr)
		}
	}
	for i, j := range v.Jobs {
		if !j.Elastic() || len(j.WidthThroughput) != len(j.Widths) {
			continue
		}
		if t := slices.Max(j.Throughput); t <= 0 || j.Remaining/t < s.cfg.Critical*makespan {
			continue
		}
		bw, bt := -1, 0.0
		for wi, row := range j.WidthThroughput {
			if len(row) != len(v.Types) {
				continue
			}
			if m := slices.Max(row); m > bt {
				bw, bt = wi, m
			}
		}
		if bw >= 0 && j.Widths[bw] != j.ScaleFactor {
			in.Jobs[i].ScaleFactor, in.Jobs[i].Throughput = j.Widths[bw], j.WidthThroughput[bw]
			reposed = true
		}
	}
	if !reposed {
		return in, a, nil // the same problem: no second solve
	}
	a, err = policy.Makespan{}.Allocate(in)
	return in, a, err
}

// resizeWhy is the reason a running job gives for changing width (or
// moving, at the same width): its remaining time at the new placement
// plus the restart against its remaining time where it runs.
func (s *Scheduler) resizeWhy(v *round.View, ji *jobInfo, to planner.Unit, toRate float64, gain float64, where string) string {
	here := ji.view.Placement.Units[0]
	from := s.rate(v, ji, here)
	verb := "a gain of"
	if gain <= 0 {
		verb, gain = "a loss of", -gain
	}
	done := fmt.Sprintf("done in about %s instead of %s", hours(s.cfg.RestartCost+ji.view.Remaining/toRate), hours(ji.view.Remaining/from))
	n, m := to.GPUs(), here.GPUs()
	if n == m {
		return ""
	}
	change := "grows"
	if n < m {
		change = "shrinks"
	}
	return fmt.Sprintf("%s to %d workers (%s%s): %s at %d, %s %s over its %s restart", change, n, where, unitString(to), done, m, verb, hours(gain), hours(s.cfg.RestartCost))
}

// fitWidth plans an elastic job that does not fit slot 0's free GPUs at
// its width at the widest narrower width that fits (backfill), if any.
func (s *Scheduler) fitWidth(v *round.View, g *grid, ji *jobInfo) {
	if ji.at == nil || g.fits(0, ji) {
		return
	}
	w0 := ji.sf()
	for i := len(ji.view.Widths) - 1; i >= 0; i-- {
		if w := ji.view.Widths[i]; w < w0 && s.setWidth(v, ji, w) && g.fits(0, ji) {
			return
		}
	}
	s.setWidth(v, ji, w0)
}

// Contested widths (issue 35, philly-48h all elastic): while jobs wait, a
// GPU an elastic job adds by growing is one a waiting job does not get.
// Hadar spent 14 % more GPU-hours per job than Sia there, much of it on
// widths whose added GPUs made a fraction of a GPU's progress at the
// job's narrowest width (scale factors 8 and 16 spread over servers,
// started at their scale factor by backfill, or grown onto idle GPUs).
// A waiting job started on them makes about all of it, so while the
// cluster is contested an elastic job is planned, started and grown no
// wider than the widest width each of whose steps up adds at least
// effMarginal of that progress per added GPU. With room for every job
// growth costs no one, and the cap is off. Measured: docs/results.md,
// "Contested widths on the 48-hour workload".
const effMarginal = 0.75

// contested reports whether the GPUs the running jobs hold and the
// waiting jobs need (an elastic one at its narrowest width) exceed the
// cluster's.
func contested(v *round.View, infos []*jobInfo) bool {
	gpus := 0.0
	for _, c := range v.Capacity {
		gpus += c
	}
	need := 0
	for _, ji := range infos {
		switch {
		case holding(v, ji.view):
			need += ji.view.Placement.Units[0].GPUs()
		case ji.at != nil:
			need += ji.view.Widths[0]
		default:
			need += ji.sf()
		}
	}
	return float64(need) > gpus
}

// effCap sets ji.wmax, the widest width an elastic job is planned or
// grown at while the cluster is contested (0: no cap), from its best
// figure at each declared width on the types it may use (spread over
// servers where the width is wider than one), against its per-GPU
// figure at its narrowest width. A waiting job wider than its cap is
// planned at the cap. A protected job (critical, or the tail guard's) is
// not capped: its remaining time is the makespan's or the tail's.
func (s *Scheduler) effCap(v *round.View, g *grid, infos []*jobInfo) {
	busy := contested(v, infos)
	server := g.server()
	for _, ji := range infos {
		ji.wmax = 0
		if !busy || ji.at == nil || ji.protected || len(ji.view.Widths) < 2 {
			continue
		}
		fig := func(wi int) float64 {
			w, best := ji.view.Widths[wi], 0.0
			f := s.figuresAt(v, ji, w)
			if f == nil {
				return 0
			}
			for k, x := range f.tp {
				if x <= 0 || ji.allowed != nil && !ji.allowed[k] {
					continue
				}
				if w > server {
					x = f.spread[k]
				}
				best = max(best, x)
			}
			return best
		}
		prev := fig(0)
		per := prev / float64(ji.view.Widths[0])
		if per <= 0 {
			continue
		}
		ji.wmax = ji.view.Widths[0]
		for wi := 1; wi < len(ji.view.Widths); wi++ {
			x := fig(wi)
			if (x-prev)/float64(ji.view.Widths[wi]-ji.view.Widths[wi-1]) < effMarginal*per {
				break
			}
			ji.wmax, prev = ji.view.Widths[wi], x
		}
		if ji.sf() > ji.wmax && !holding(v, ji.view) {
			s.setWidth(v, ji, ji.wmax)
		}
	}
}
