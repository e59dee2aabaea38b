package hadar

import (
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// fork is HadarE's step: GPUs still idle after Hadar's plan take copies of
// jobs, in the same dual-value order, each copy on nodes the job does not
// use yet. A copy has the job's scale factor or, where fewer GPUs are
// free, the largest profiled smaller width. A copy is made only when its
// progress over the round, net of merging, beats the merge time it adds to
// the copies already running, and never for a job that finishes within
// the round anyway. Elastic jobs (planner.Job.Widths) are never forked.
func (s *Scheduler) fork(v *round.View, g *grid, infos []*jobInfo, out []planner.Placement) {
	for changed := true; changed && g.freeTotal(0) > 0; {
		changed = false
		for _, ji := range infos {
			if g.freeTotal(0) == 0 {
				return
			}
			p := out[ji.idx]
			limit := s.cfg.MaxCopies
			if m := ji.view.MaxCopies; m > 0 {
				limit = min(limit, m)
			}
			if len(p.Units) == 0 || len(p.Units) >= limit {
				continue
			}
			if len(ji.view.Widths) > 0 {
				// Elastic jobs are not forked (issue 35): their steps
				// hold a fixed global batch, which copies training
				// their own batches would not keep.
				continue
			}
			current := 0.0
			for _, u := range p.Units {
				current += s.rate(v, ji, u)
			}
			if ji.view.Remaining <= current*v.Round {
				continue
			}
			o := s.copyOption(v, g, ji, p)
			if o == nil {
				continue
			}
			useful := v.Round - s.cfg.MergeCost - s.cfg.RestartCost
			added := o.rate * useful
			// Going from one unit to two makes every unit merge.
			lost := 0.0
			if len(p.Units) == 1 {
				lost = current * s.cfg.MergeCost
			}
			if added <= lost {
				continue
			}
			g.commit(0, 1, o.take)
			out[ji.idx].Units = append(out[ji.idx].Units, o.unit)
			changed = true
		}
	}
}

// copyOption is the fastest copy of the job that fits on free GPUs of
// nodes the job does not use.
func (s *Scheduler) copyOption(v *round.View, g *grid, ji *jobInfo, p planner.Placement) *option {
	used := map[string]bool{}
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			used[sl.Node] = true
		}
	}
	var best *option
	for width := ji.view.ScaleFactor; width >= 1; width /= 2 {
		for n, name := range g.nodes {
			if used[name] {
				continue
			}
			for k, t := range g.types {
				if ji.tp[k] <= 0 || g.free(0, n, k) < width || !ji.view.Eligible.Allows(name, t) {
					continue
				}
				u := planner.Unit{Slots: []planner.Slot{{Node: name, Type: t, Count: width}}}
				r := s.rate(v, ji, u)
				if r > 0 && (best == nil || r > best.rate) {
					best = &option{unit: u, take: []slotIdx{{n, k, width}}, rate: r}
				}
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}
