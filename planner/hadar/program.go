package hadar

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/assign"
	"github.com/hadar-sched/hadar/planner/round"
)

// widthsKnown reports whether job jb may run at several widths and the
// engine gave its throughput at each.
func widthsKnown(jb *round.JobView) bool {
	return jb.Elastic() && len(jb.WidthThroughput) == len(jb.Widths)
}

// anyElastic reports whether a job of v may run at several widths.
func anyElastic(v *round.View) bool { return slices.ContainsFunc(v.Jobs, widthsKnown) }

// configurations is what job jb may run at: its widths and their
// throughput per type when elastic, else its scale factor alone.
func configurations(jb *round.JobView) ([]int, [][]float64) {
	if !widthsKnown(jb) {
		return []int{jb.ScaleFactor}, [][]float64{jb.Throughput}
	}
	return jb.Widths, jb.WidthThroughput
}

// currentSlot is the configuration slot (wi*k + type) job jb runs in, or
// -1: one unit on one type at one of its widths.
func currentSlot(v *round.View, ws []int, jb *round.JobView) int {
	if len(jb.Placement.Units) != 1 {
		return -1
	}
	j := -1
	for _, sl := range jb.Placement.Units[0].Slots {
		k := slices.Index(v.Types, sl.Type)
		if k < 0 || j >= 0 && k != j {
			return -1
		}
		j = k
	}
	if j < 0 {
		return -1
	}
	wi := 0
	if len(ws) > 1 {
		wi = slices.Index(ws, jb.Placement.Units[0].GPUs())
	}
	if wi < 0 {
		return -1
	}
	return wi*len(v.Types) + j
}

// The configuration program's constants (docs/results.md, "A per-round
// configuration program for elastic rounds").
const (
	// tailJobs is how many jobs of a round are its tail, which a round
	// boundary remembers for tailHold: the longest projected JCTs (age
	// plus the remaining time at the best configuration). The p99 of 160
	// jobs is the second-longest JCT.
	tailJobs = 3
	// tailBoost multiplies the gain of the tail's first job, the longest
	// projected JCT (the makespan's): enough to run it ahead of all but
	// much shorter jobs, not so much that it takes its widest
	// configuration whatever that costs the others.
	tailBoost = 100.0
	// tailBoostRest is the most the other jobs' gains are multiplied by
	// for the p99, which for 160 jobs is the second-longest JCT: the
	// job with the second-longest projected JCT gets it, and a job whose
	// projection is a share q of that one's gets tailBoostRest *
	// q^tailCurve, none under 1. At tailBoost they took the fast GPUs
	// from jobs the average needs (docs/results.md, "The tail's boost for
	// the p99 jobs").
	tailBoostRest = 50.0
	// tailCurve is how fast the p99's boost falls with a job's projected
	// JCT: x14 at 90 % of the second-longest, x3.4 at 80 %, none under
	// about 72 %. Boosted by rank, the second and third jobs x50 and the
	// fourth nothing, a job that fell to fourth lost the GPUs at once and
	// waited until it rose again (philly-8h seed 13 all elastic: its p99
	// job 41 h, ending 26 h after Sia's); falling with the projection,
	// the boost loses a job its GPUs only as others pass it by a margin.
	// At 12, on 137 eight-hour rows, 17 rows short of 10 % under Sia's
	// average against 19, 11 cells above Sia's against 14, restarts -3 %;
	// at 6 and at 24 or more, short rows or p99 cells rise
	// (docs/results.md, "The p99's boost by projection").
	tailCurve = 12.0
	// tailStick lifts a running job's projection when the tail is
	// ranked: a tail job running at its best keeps its projection while
	// a waiting one's grows, and without it the tail jobs would take
	// turns, a restart each.
	tailStick = 0.2
	// tailHold lifts the projection of a job that was in the tail at the
	// previous round boundary: another job must pass it by this fraction
	// to take its place. Without it two long jobs whose projections are
	// close take turns at the fast GPUs every minimum run time (each
	// waiting job's projection grows while the one running at its best
	// holds): on philly-8h seed 18 all elastic 57 % of the restarts put a
	// job back in the configuration it had held two moves before, a
	// median 1.1 h later (docs/results.md, "The tail's turns").
	tailHold = 0.03
	// stayBonus is what a running job's present configuration gains over
	// a move at the same rate: a move for less is undone soon after.
	stayBonus = 0.1
	// moveRuns is the most of the job's minimum run times a move is
	// charged as time added to its remaining, as hadar's restartCharge
	// charges a preemption: the minimum run time pins the job where it
	// moved, and a move often brings a move back. At the default 30
	// minutes, 2 h; where an operator sets no minimum run time, a move
	// costs only the restart factor and the stay bonus.
	moveRuns = 4.0
	// moveShare caps a move's charge at this share of the hours the job
	// still needs where it moves (never under one minimum run time, the
	// pin a move brings): a job done there sooner leaves the pin by
	// finishing, and a short job charged 2 h stays where a fill put it,
	// a 40-minute Transformer on a K80 for 3.8 h while a V100 comes
	// free. Measured on 108 8-hour rows: 12 rows short of 10 % under
	// Sia's average against 16, 11 cells above Sia's against 13,
	// restarts +17 % (docs/results.md, "A move's charge capped by the
	// time it needs").
	moveShare = 0.5
	// backlogJobs is the most active jobs a round may have for the
	// program to plan it. The program's tail of three jobs turns the p99
	// while the p99 is among the few longest JCTs, as for the 160 jobs of
	// an 8-hour workload; with hundreds of jobs in play it is the tenth
	// longest or beyond, the tail jobs take turns and end together, and
	// the primal-dual, which starts the long jobs early on its makespan
	// pace, holds the p99 20-25 % lower (docs/results.md, "The
	// configuration program while the backlog is small").
	backlogJobs = 150
	// resumeJobs ends a backlog: the primal-dual that started its long
	// jobs keeps planning them until fewer than this many jobs are left.
	resumeJobs = 10
	// drainJobs is the most active jobs a round of a backlog may have to
	// be planned by Sia's program as Sia plans it (backlogWeights): the
	// backlog's last jobs, its longest, whose p99 a share for each holds
	// better than any weighting. At 60 the 48-hour rows' averages are
	// the primal-dual's or lower and four of their seven p99s under
	// Sia's; at 40 and at 120 less so (docs/results.md, "The backlog's
	// drain planned as Sia").
	drainJobs = 60
	// backlogBias is the exponent of the weight a backlog's round of more
	// than drainJobs jobs gives each job in Sia's program: (1 h / R)^b, R
	// the job's remaining time at its fastest configuration. At 0 the
	// round is Sia's, whose share for every job starts the long ones on
	// arrival and puts the average JCT where Sia's is, 2-3 times the
	// primal-dual's; at 1 it is Smith's rule, as the configuration
	// program, and the long jobs wait for the backlog to drain. At 0.1
	// the Philly trace's 48-hour p99s are within 1 % of Sia's (the
	// primal-dual's 0.3-9.9 % above) and every 48-hour makespan under
	// Sia's, for an average 40-63 % under Sia's instead of 57-70 %
	// (docs/results.md, "The backlog planned by Sia's program, weighted
	// toward short jobs").
	backlogBias = 0.1
	// backlogStay is what a running job's present configuration gains in
	// a weighted backlog round: its term in Sia's program times 1 +
	// backlogStay. The weights move every round as remaining times fall,
	// so two jobs whose terms are close trade the same GPUs, or a job its
	// widths, round after round (philly-48h seed 1 half elastic's 8- and
	// 16-GPU jobs 10-110 times each, Sia's 0-5); Sia's restart factor
	// hardly charges a job hundreds of hours old. At 2, on sixteen
	// 48-hour workloads, restarts are 4.7 times fewer (half Sia's), the
	// averages 9 % lower and the cells above Sia's 7 instead of 11; at
	// 0.5, 1 and 3 the restarts fall as far but 10-12 cells stay above,
	// sparing the critical job the stay lengthened the makespans, and a
	// stay in the drain as well holds the long jobs' turns and raised
	// every p99 10-33 % (docs/results.md, "A stay in the backlog's
	// weighted rounds").
	backlogStay = 2.0
)

// programRound reports whether the configuration program plans round v:
// it has an elastic job and no backlog holds. A round of more than
// backlogJobs jobs starts a backlog; one of fewer than resumeJobs ends it.
// HadarE's rounds stay the primal-dual's: its copies take the GPUs the
// primal-dual leaves, and the program plans no copies.
func (s *Scheduler) programRound(v *round.View) bool {
	switch n := len(v.Jobs); {
	case n > backlogJobs:
		s.backlog = true
	case n < resumeJobs:
		s.backlog = false
	}
	return !s.cfg.NoProgram && !s.cfg.Fork && !s.backlog && anyElastic(v)
}

// backlogRound reports whether round v is a backlog's with an elastic job
// (a backlog holds: programRound has seen to it). Such a round is Sia's
// program's (backlogPlan).
func (s *Scheduler) backlogRound(v *round.View) bool {
	return s.backlog && !s.cfg.NoProgram && !s.cfg.NoDrain && !s.cfg.Fork && anyElastic(v)
}

// backlogPlan plans a backlog's round with Sia's program (planner/sia,
// growth not limited: hadar knows each width's figures): every job's
// configuration chosen for the sum of weighted normalized goodputs under
// Sia's fairness exponent, so that the long jobs share the GPUs and the
// tenth-longest JCT (the p99 of a thousand jobs) is not made to wait for
// the backlog to drain. While more than drainJobs jobs are active each
// job's weight leans toward the short ones (backlogWeights), which keeps
// most of the average hadar's primal-dual gets, and a running job's
// present configuration gains backlogStay; in the drain, the last
// drainJobs jobs, it is Sia's own. Hadar's records follow the jobs as in
// the configuration program's rounds, whose commitments are not kept
// either.
func (s *Scheduler) backlogPlan(v *round.View) ([]planner.Placement, error) {
	s.followJobs(v)
	sv, factor, critical, stay := v, []float64(nil), []bool(nil), 0.0
	if len(v.Jobs) > drainJobs {
		cp := *v
		cp.Jobs = make([]*round.JobView, len(v.Jobs))
		factor, critical = s.backlogWeights(v)
		stay = backlogStay
		for i, jb := range v.Jobs {
			j := *jb
			j.Weight = j.WeightOr1() * factor[i]
			cp.Jobs[i] = &j
		}
		sv = &cp
	}
	out, err := s.sia.ScheduleStaying(sv, stay)
	if err != nil {
		return nil, fmt.Errorf("hadar, a backlog's round at t=%.0fs: %w", v.Now, err)
	}
	for i := range v.Reasons {
		// Sia's reasons name it ("sia: ..."); the prefix names it already.
		why := strings.TrimPrefix(v.Reasons[i].Why, "sia: ")
		switch {
		case factor == nil:
			v.Reasons[i].Why = "hadar, a backlog's drain planned by Sia's program: " + why
		case critical[i]:
			v.Reasons[i].Why = fmt.Sprintf("hadar, a backlog planned by Sia's program, its weight x%.3g as critical for the makespan (a job an hour from its end): %s", factor[i], why)
		default:
			v.Reasons[i].Why = fmt.Sprintf("hadar, a backlog planned by Sia's program, its weight x%.3g toward short jobs ((1 h / its remaining time at its fastest)^%g): %s", factor[i], backlogBias, why)
		}
	}
	return out, nil
}

// backlogWeights is what backlogPlan multiplies each job's weight by in a
// backlog's round of more than drainJobs jobs: (1 h / R)^backlogBias, R
// the job's remaining time at its fastest configuration, and 1 (as a job
// an hour from its end) for a job critical for the makespan (makespan
// utility): R at least Config.Critical of the round's makespan bound, the
// longest R or the jobs' work at their most GPU-efficient
// configurations over the GPUs, whichever is longer. Without that the
// longest job shares the GPUs with hundreds of shorter ones and ends
// weeks after Sia's (docs/results.md, "The backlog planned by Sia's
// program, weighted toward short jobs").
func (s *Scheduler) backlogWeights(v *round.View) (factor []float64, critical []bool) {
	n := len(v.Jobs)
	factor, critical = make([]float64, n), make([]bool, n)
	rem := make([]float64, n)
	gpus, work, longest := 0.0, 0.0, 0.0
	for _, c := range v.Capacity {
		gpus += c
	}
	for i, jb := range v.Jobs {
		ws, rows := configurations(jb)
		fastest, least := bestRates(jb.Remaining, ws, rows)
		factor[i] = 1
		if fastest > 0 && jb.Remaining > 0 {
			rem[i] = jb.Remaining / fastest
			longest = math.Max(longest, rem[i])
			work += least
			factor[i] = math.Pow(3600/rem[i], backlogBias)
		}
	}
	bound := math.Max(longest, work/math.Max(gpus, 1))
	for i := range v.Jobs {
		if s.cfg.Utility == Makespan && rem[i] > 0 && rem[i] >= s.cfg.Critical*bound {
			factor[i], critical[i] = 1, true
		}
	}
	return factor, critical
}

// program schedules a round with elastic jobs: one configuration (width,
// type) or none per job, chosen by planner/assign to maximize the sum of
// the jobs' gains, placed by round.Assign. A job's gain in a
// configuration is Smith's rule, its weight over the hours it would still
// need there (the average JCT), times tailBoost for the longest projected
// JCT (the makespan) and up to tailBoostRest for the others near the
// second-longest (the p99; see tail); a move adds
// its charge (moveCharge) to those hours and pays Sia's
// restart factor (age/(age+R), a first restart), and the present
// configuration gains stayBonus. Pinned jobs keep their GPUs;
// mid-round, running jobs keep theirs and the idle GPUs go to the waiting
// ones. A throughput that is not a positive number is no configuration.
func (s *Scheduler) program(v *round.View) ([]planner.Placement, error) {
	s.followJobs(v)
	cf := round.PoseConfigs(v, configurations, func(ws []int, jb *round.JobView) int { return currentSlot(v, ws, jb) })
	k, m, ws, rows, cur, fixed, capacity := cf.K, cf.M, cf.Widths, cf.Rows, cf.Cur, cf.Fixed, cf.Capacity
	best := make([]float64, len(v.Jobs))
	for i, jb := range v.Jobs {
		best[i], _ = bestRates(jb.Remaining, ws[i], rows[i])
	}
	boost, share := s.tail(v, best)
	p := assign.Slots(k, m, capacity)
	var idx []int // problem job -> view job
	for i, jb := range v.Jobs {
		if fixed[i] {
			continue
		}
		w := jb.WeightOr1()
		if boost[i] > 0 {
			w *= boost[i]
		}
		gain := make([]float64, len(rows[i])*k)
		width := make([]float64, len(rows[i])*k)
		for wi, row := range rows[i] {
			n := ws[i][wi]
			for j := range k {
				c := wi*k + j
				width[c] = float64(n)
				if j >= len(row) || !usable(row[j]) || float64(n) > capacity[j] {
					continue
				}
				need := jb.Remaining / row[j]
				hours := need / 3600
				switch {
				case cur[i] >= 0 && c != cur[i]:
					hours += s.moveCharge(jb, need) / 3600
					gain[c] = w / hours
					if age := v.Age(jb); age >= s.cfg.RestartCost {
						gain[c] *= age / (age + s.cfg.RestartCost)
					}
				case cur[i] >= 0:
					gain[c] = w * (1 + stayBonus) / hours
				default:
					gain[c] = w / hours
				}
			}
		}
		p.Add(gain, width, jb.ScaleFactor)
		idx = append(idx, i)
	}
	sol, err := assign.Solve(p)
	if err != nil {
		return nil, fmt.Errorf("hadar configuration program at t=%.0fs: %w", v.Now, err)
	}
	choice := sol.ByJob(idx, len(v.Jobs))
	out, x := cf.Assign(v, choice, round.AssignOptions{Backfill: !s.cfg.NoBackfill})
	for q, i := range idx {
		r := round.Reason{Share: x[i], Why: "hadar: left out by the configuration program: its GPUs gain more elsewhere"}
		if c := sol.Choice[q]; c >= 0 {
			r.Utility = p.G(q, c)
			jb := v.Jobs[i]
			charge := s.moveCharge(jb, jb.Remaining/rows[i][c/k][c%k])
			r.Why = programWhy(v, ws[i], rows[i], cur[i], c, jb.Remaining, charge, p.G(q, c), boost[i], share[i])
		}
		v.Explain(i, r)
	}
	return out, nil
}

// moveCharge is the seconds a move of job jb is charged where it would
// still need need seconds: moveRuns of its minimum run time (its own,
// else the configuration's), at most moveShare of need, at least one
// minimum run time.
func (s *Scheduler) moveCharge(jb *round.JobView, need float64) float64 {
	run := s.minRun(jb)
	return min(moveRuns*run, max(moveShare*need, run))
}

// bestRates is what a job's configurations (widths ws, rows of throughputs
// per type) offer its remaining steps: the fastest usable throughput (0:
// none) and the fewest GPU-seconds they need (+Inf: none).
func bestRates(remaining float64, ws []int, rows [][]float64) (fastest, gpuSeconds float64) {
	gpuSeconds = math.Inf(1)
	for wi, row := range rows {
		for _, tp := range row {
			if usable(tp) {
				fastest = math.Max(fastest, tp)
				gpuSeconds = math.Min(gpuSeconds, remaining/tp*float64(ws[wi]))
			}
		}
	}
	return fastest, gpuSeconds
}

// usable says a throughput is a configuration's: a positive finite
// number (anything else is no figure to weigh).
func usable(tp float64) bool { return tp > 0 && !math.IsInf(tp, 1) }

// programWhy is the reason of a job the program runs at slot c of its
// widths ws and rows (cur: the slot it ran in, or -1), with remaining
// steps left, the seconds a move is charged and the gain the program
// weighed, and the job's tail boost (0: none) and its projected JCT's
// share of the second-longest's, as tail gives them (only the longest
// gets tailBoost, the others at most tailBoostRest).
func programWhy(v *round.View, ws []int, rows [][]float64, cur, c int, left, charge, gain, boost, share float64) string {
	k := len(v.Types)
	why := fmt.Sprintf("hadar: %d GPUs of %s by the configuration program: %s of work left there", ws[c/k], v.Types[c%k], hours(left/rows[c/k][c%k]))
	if cur >= 0 && cur != c {
		if row := rows[cur/k]; cur%k < len(row) && usable(row[cur%k]) {
			why += fmt.Sprintf(" (%s on its %d GPUs of %s)", hours(left/row[cur%k]), ws[cur/k], v.Types[cur%k])
		}
		why += fmt.Sprintf(", the move charged %s", hours(charge))
	}
	why += fmt.Sprintf(", gain %.3g per hour", gain)
	switch {
	case boost == tailBoost:
		why += fmt.Sprintf(", the longest projected JCT (x%g)", boost)
	case boost > 0:
		why += fmt.Sprintf(", its projected JCT %.0f %% of the second-longest (x%.3g)", 100*share, boost)
	}
	return why
}

// tail is each job's boost and its projected JCT's share of the
// second-longest's: tailBoost for the job of v with the longest projected
// JCT (the makespan's), tailBoostRest * share^tailCurve for the others
// (the p99's) where that is over 1, else 0; a running job's projection is
// lifted by tailStick and one in the previous boundary's tail (its
// tailJobs longest) by tailHold; best[i] is job i's best steps/s. A round
// boundary remembers its tail for the next; a fill mid-round, where the
// running jobs keep their GPUs, does not change it.
func (s *Scheduler) tail(v *round.View, best []float64) (boost, share []float64) {
	proj := make([]float64, len(v.Jobs))
	var order []int
	for i, jb := range v.Jobs {
		if !(best[i] > 0) {
			continue
		}
		proj[i] = v.Age(jb) + jb.Remaining/best[i]
		if len(jb.Placement.Units) > 0 {
			proj[i] *= 1 + tailStick
		}
		if slices.Contains(s.held, jb.ID) {
			proj[i] *= 1 + tailHold
		}
		order = append(order, i)
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(proj[b], proj[a]) })
	boost, share = make([]float64, len(v.Jobs)), make([]float64, len(v.Jobs))
	if len(order) > 0 {
		boost[order[0]], share[order[0]] = tailBoost, 1
	}
	if len(order) > 1 && proj[order[1]] > 0 {
		p99 := proj[order[1]]
		for _, i := range order[1:] {
			share[i] = proj[i] / p99
			if b := tailBoostRest * math.Pow(share[i], tailCurve); b > 1 {
				boost[i] = b
			}
		}
	}
	if !v.MidRound {
		s.held = nil
		for _, i := range order[:min(tailJobs, len(order))] {
			s.held = append(s.held, v.Jobs[i].ID)
		}
	}
	return boost, share
}

// followJobs brings hadar's records to round v when another program plans
// it (the configuration program, the drain's Sia): the calendar advances,
// placements are tracked, and the commitments are dropped, since they are
// not kept in these rounds (a later round of the primal-dual plans afresh).
func (s *Scheduler) followJobs(v *round.View) {
	s.advance(v)
	s.track(v)
	for _, r := range s.jobs {
		r.Segs = nil
	}
}
