package placement

import (
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// preempt tries to give the waiting job jobs[k] a node of its own by
// moving or evicting jobs placed on that node this round (network-
// sensitive preemption). It acts only when the waiting job is sensitive
// (its best placement now has slowdown >= Sensitive), only on victims
// that have run MinRunTime on their GPUs and been preempted fewer than
// MaxPreemptions times, and only when the waiting job's gain (the time a
// spread placement would lose it) exceeds Margin times the victims' loss
// (restart, plus the slowdown of where they move, or a round if evicted).
// It picks the node with the largest net gain.
func (p *Policy) preempt(v *round.View, t planner.GPUType, jobs []int, units []planner.Unit, k int) {
	jb := v.Jobs[jobs[k]]
	n := jb.ScaleFactor
	if p.tightest(v, t, n) != SameNode {
		return // only single-node consolidation is worth a preemption
	}
	alt, ok := Candidate(v.Pool, t, n, Anywhere)
	gain := 0.0
	if ok {
		s := p.slowdown(jb.Job, alt, v.Now)
		if s < p.cfg.Sensitive {
			return
		}
		gain = (s - 1) * p.remaining(jb, t)
	} else {
		gain = math.Min(v.Round, p.remaining(jb, t)) // it would wait a round
	}
	type plan struct {
		node    string
		victims []int // indices into jobs
		moved   []planner.Unit
		loss    float64
	}
	var best *plan
	for _, node := range v.Pool.Nodes() {
		free := v.Pool.Free(node, t)
		if free+p.busyOn(units, node) < n || free >= n {
			continue
		}
		// Victims: eligible jobs holding GPUs on node, most GPUs there
		// first, until the node has room.
		var cands []int
		for q, u := range units {
			if q == k || on(u, node) == 0 || !p.eligible(v, v.Jobs[jobs[q]]) {
				continue
			}
			cands = append(cands, q)
		}
		slices.SortStableFunc(cands, func(a, b int) int { return on(units[b], node) - on(units[a], node) })
		var victims []int
		room := free
		for _, q := range cands {
			if room >= n {
				break
			}
			victims = append(victims, q)
			room += on(units[q], node)
		}
		if room < n {
			continue
		}
		pl := p.try(v, t, jobs, units, victims, node, n)
		if pl.loss*p.cfg.Margin < gain && (best == nil || pl.loss < best.loss) {
			best = &plan{node: node, victims: victims, moved: pl.moved, loss: pl.loss}
		}
	}
	if best == nil {
		return
	}
	// Apply the chosen plan for real.
	for _, q := range best.victims {
		v.Pool.Release(units[q])
	}
	mine := planner.Unit{Slots: []planner.Slot{{Node: best.node, Type: t, Count: n}}}
	v.Pool.Take(mine)
	for x, q := range best.victims {
		vj := v.Jobs[jobs[q]]
		st := p.state(vj.ID)
		st.preemptions++
		p.preempts = append(p.preempts, Preemption{Time: v.Now, Victim: vj.ID, For: jb.ID, Evicted: len(best.moved[x].Slots) == 0,
			Count: st.preemptions, RanFor: v.Now - st.lastStart, Gain: gain, Loss: best.loss})
		if len(best.moved[x].Slots) > 0 {
			v.Pool.Take(best.moved[x])
		}
		units[q] = best.moved[x]
	}
	units[k] = mine
}

type trial struct {
	moved []planner.Unit
	loss  float64
}

// try prices a plan on the pool and undoes it: the victims release their
// GPUs, the waiting job takes n on node, each victim is re-placed at the
// tightest level the rest of the pool offers (or evicted).
func (p *Policy) try(v *round.View, t planner.GPUType, jobs []int, units []planner.Unit, victims []int, node string, n int) trial {
	for _, q := range victims {
		v.Pool.Release(units[q])
	}
	mine := planner.Unit{Slots: []planner.Slot{{Node: node, Type: t, Count: n}}}
	v.Pool.Take(mine)
	tr := trial{moved: make([]planner.Unit, len(victims))}
	for x, q := range victims {
		vj := v.Jobs[jobs[q]]
		before := p.slowdown(vj.Job, units[q], v.Now)
		var u planner.Unit
		found := false
		for lvl := p.tightest(v, t, vj.ScaleFactor); lvl <= Anywhere && !found; lvl++ {
			u, found = Candidate(v.Pool, t, vj.ScaleFactor, lvl)
		}
		if found {
			v.Pool.Take(u)
			tr.moved[x] = u
			tr.loss += p.cfg.RestartCost + math.Max(0, p.slowdown(vj.Job, u, v.Now)-before)*p.remaining(vj, t)
		} else {
			tr.loss += p.cfg.RestartCost + math.Min(v.Round, p.remaining(vj, t))
		}
	}
	for _, u := range tr.moved {
		if len(u.Slots) > 0 {
			v.Pool.Release(u)
		}
	}
	v.Pool.Release(mine)
	for _, q := range victims {
		v.Pool.Take(units[q])
	}
	return tr
}

// eligible: the job may be preempted now (bounded, and not before it has
// run MinRunTime on its GPUs).
func (p *Policy) eligible(v *round.View, jb *round.JobView) bool {
	st := p.jobs[jb.ID]
	if st == nil || !jb.Running {
		return false
	}
	return st.preemptions < p.cfg.MaxPreemptions && v.Now-st.lastStart >= p.cfg.MinRunTime-1e-6
}

func (p *Policy) busyOn(units []planner.Unit, node string) int {
	total := 0
	for _, u := range units {
		total += on(u, node)
	}
	return total
}

// on is how many GPUs of u sit on node.
func on(u planner.Unit, node string) int {
	c := 0
	for _, s := range u.Slots {
		if s.Node == node {
			c += s.Count
		}
	}
	return c
}
