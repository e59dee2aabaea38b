package hadar

import (
	"fmt"

	"github.com/hadar-sched/hadar/planner/round"
)

// shrink is the elastic counterpart of displace: job k, just planned and
// not running now, takes GPUs that a running elastic job of lower value
// gives up by narrowing to one of its declared widths on the GPUs it
// holds, when the seconds of completion time k gains exceed those the
// narrowed job loses: its restart and its slower remaining run
// (remaining/rate at the narrow width less remaining/rate where it runs),
// weighted by the jobs' priority weights as displace weighs its victims.
// A job within its minimum run time (pinned) neither shrinks nor takes.
// It reports whether a job shrank.
func (s *Scheduler) shrink(v *round.View, g *grid, k *jobInfo, infos []*jobInfo, rs *releases, ahead int) bool {
	if s.pins[k.view.ID] > 0 {
		return false
	}
	if _, now := s.jobs[k.view.ID].holds(s.cur); now || holding(v, k.view) {
		return false
	}
	rem, restart := k.view.Remaining, s.cfg.RestartCost
	before, _, what := s.outlook(v, g, k, rs, ahead)
	// The most k could gain: a start now at its best speed.
	most := before - (restart + rem/k.best)
	if most <= 1e-9*before || jobWeight(k)*most <= s.minWeight*restart {
		return false
	}
	type pick struct {
		c          *victim
		narrow     []slotIdx
		w, wj      int
		o          *option
		after      float64
		gain, cost float64
		rj, rn     float64
	}
	var best *pick
	r := s.jobs[k.view.ID]
	for _, ji := range infos {
		if ji == k || ji.at == nil || !holding(v, ji.view) || len(ji.view.Placement.Units) != 1 || s.pins[ji.view.ID] > 0 || ji.protected || ji.density >= k.density {
			continue
		}
		take, ok := s.heldNow(g, ji)
		if !ok || len(take) != 1 {
			continue
		}
		held := ji.sf()
		rj := s.rate(v, ji, ji.view.Placement.Units[0])
		if rj <= 0 {
			continue
		}
		c := &victim{ji: ji, take: take}
		for _, wd := range ji.view.Widths {
			if wd >= held || wd >= take[0].count {
				continue
			}
			if !s.setWidth(v, ji, wd) {
				continue
			}
			narrow := []slotIdx{{take[0].n, take[0].k, wd}}
			rn := s.takeRate(v, g, ji, narrow)
			if rn <= 0 {
				continue
			}
			cost := jobWeight(ji) * (restart + ji.view.Remaining/rn - ji.view.Remaining/rj)
			if cost >= jobWeight(k)*most {
				continue
			}
			s.vacateVictim(v, g, c)
			wj := s.startWindow(v, g, ji, 0)
			if s.fitsWindow(g, narrow, wj) {
				g.commit(0, wj, narrow)
				own := append([]segment(nil), r.Segs...)
				if len(r.Segs) > 0 {
					s.release(v, g, k, r)
				}
				w := s.startWindow(v, g, k, 0)
				if o := s.startOption(v, g, k, w); o != nil {
					after := restart + rem/o.rate
					gain := jobWeight(k) * (before - after)
					if gain > cost && (best == nil || gain-cost > best.gain-best.cost) {
						best = &pick{c, narrow, w, wj, o, after, gain, cost, rj, rn}
					}
				}
				if len(own) > 0 {
					s.recommit(g, r, own)
				}
				g.uncommit(0, wj, narrow)
			}
			s.restoreVictim(g, c)
		}
		s.setWidth(v, ji, held)
	}
	if best == nil {
		return false
	}
	ji := best.c.ji
	s.vacateVictim(v, g, best.c)
	s.setWidth(v, ji, best.narrow[0].count)
	g.commit(0, best.wj, best.narrow)
	rj := s.jobs[ji.view.ID]
	rj.Segs = nil
	nu := g.unit(best.narrow)
	rj.add(s.cur, s.cur+int64(best.wj), nu)
	if len(r.Segs) > 0 {
		s.release(v, g, k, r)
	}
	s.vacate(g, k.view.ID)
	r.Segs = nil
	s.finish(g, best.o)
	g.commit(0, best.w, best.o.take)
	r.add(s.cur, s.cur+int64(best.w), best.o.unit)
	how := fmt.Sprintf("done in about %s instead of %s", hours(best.after), hours(before))
	if what != "" {
		how += " waiting for " + what
	}
	v.Explain(k.idx, round.Reason{Why: fmt.Sprintf("starts on GPUs %s gives up (%s): %s, a gain of %s against the %s it costs it", ji.view.ID, unitString(best.o.unit), how, hours(best.gain), hours(best.cost))})
	s.displaced[ji.view.ID] = fmt.Sprintf("shrinks to %d workers for %s: done in about %s instead of %s at %d, a loss of %s (its %s restart included) against %s gained",
		best.narrow[0].count, k.view.ID, hours(restart+ji.view.Remaining/best.rn), hours(ji.view.Remaining/best.rj), best.c.take[0].count, hours(best.cost), hours(restart), hours(best.gain))
	return true
}
