// Package assign solves a round's selection of one configuration (a GPU
// type and width) or none per job, under each type's GPU count, to
// maximize the sum of the chosen configurations' gains: Sia's program
// (planner/sia), apart from Sia's gains so that another scheduler can
// pose it with its own (docs/results.md, "A per-round configuration
// program for elastic rounds").
package assign

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner/lp"
)

// Sia's paper solves its selection as an integer program with an external
// MILP solver. hadar has its own simplex (planner/lp) and no MILP solver,
// so the selection is solved in two ways, both deterministic:
//
//   - small instances (few jobs, few types: at most exactLimit
//     combinations) exactly, by depth-first branch and bound whose bound
//     is each remaining job's best gain;
//   - larger ones by the LP relaxation, solved exactly by Dantzig-Wolfe
//     column generation (lp.ColumnGeneration, which planner/policy
//     uses for Gavel's allocations: K capacity rows and a convexity row;
//     the per-job "at most one configuration" rows decompose into a
//     pricing step),
//     then rounded: the jobs the LP assigns whole keep their type, the
//     fractional ones are taken by decreasing fraction while they fit,
//     and GPUs still free go to the jobs left out by gain per GPU. A
//     basic optimum of the relaxation splits at most K jobs (K + n rows,
//     n of them per job), so with many small jobs the rounding loses
//     little; the tests compare it with the exact optimum. Two local
//     searches follow: a job left out takes one job's place (improve),
//     and a job takes a configuration of more gain by sending the jobs
//     in its way elsewhere or out (raise).

// exactLimit bounds the combinations the exact search may face.
const exactLimit = 1 << 14

// Problem is one round's selection: N jobs, K GPU types, M configuration
// slots per job, slot c on GPU type Typ[c]; Gain[i*M+c] > 0 is what job i
// in its configuration c adds to the objective (0: not a configuration of
// the job), on Width[i*M+c] GPUs of that type; Capacity[j] GPUs of type j.
// Rigid jobs have one slot per type (m = k, typ[c] = c); elastic ones one
// per (width, type).
type Problem struct {
	N, K, M  int
	Typ      []int
	Width    []float64
	Gain     []float64
	Capacity []float64
}

// Slots is a problem over k types with m slots per job, slot c on type
// c % k: a job's slots are wi*k + type over its widths, as Sia and hadar's
// elastic rounds pose them. Jobs are added with Add.
func Slots(k, m int, capacity []float64) Problem {
	p := Problem{K: k, M: m, Capacity: capacity, Typ: make([]int, m)}
	for c := range m {
		p.Typ[c] = c % k
	}
	return p
}

// Add appends a job whose slots up to len(gain) are its configurations,
// gain and width per slot; the slots after them, none of its, are posed
// at its scale factor sf (their gain is 0).
func (p *Problem) Add(gain, width []float64, sf int) {
	for len(width) < p.M {
		width = append(width, float64(sf))
	}
	p.Gain = append(p.Gain, gain...)
	p.Gain = append(p.Gain, make([]float64, p.M-len(gain))...)
	p.Width = append(p.Width, width...)
	p.N++
}

// ByJob spreads a solution's choices over n jobs, problem job q being job
// idx[q]; a job not in the problem gets -1.
func (s Solution) ByJob(idx []int, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = -1
	}
	for q, i := range idx {
		out[i] = s.Choice[q]
	}
	return out
}

// W is the GPUs job i takes in configuration c.
func (p *Problem) W(i, c int) float64 { return p.Width[i*p.M+c] }

// G is what job i in configuration c gains.
func (p *Problem) G(i, c int) float64 { return p.Gain[i*p.M+c] }

// Solution picks Choice[i], a configuration slot or -1 (not scheduled),
// worth Value; Bound is an upper bound on the optimum (Value when Exact).
type Solution struct {
	Choice []int
	Value  float64
	Bound  float64
	Exact  bool
}

// Solve selects exactly on small instances, else by rounding the LP
// relaxation (see the comment above exactLimit).
func Solve(p Problem) (Solution, error) {
	if p.N == 0 {
		return Solution{Exact: true}, nil
	}
	all := make([]int, p.N)
	for i := range all {
		all[i] = i
	}
	if combos(p, all) <= exactLimit {
		return branchAndBound(p), nil
	}
	return lpRound(p)
}

// combos is the number of ways the jobs of p listed in jobs can be
// configured (each on one of its types or none).
func combos(p Problem, jobs []int) float64 {
	n := 1.0
	for _, i := range jobs {
		opts := 1.0
		for c := range p.M {
			if p.G(i, c) > 0 {
				opts++
			}
		}
		n *= opts
	}
	return n
}

// settle configures the jobs of p listed in jobs (all unconfigured in
// choice) exactly on the GPUs left, and takes those GPUs.
func settle(p Problem, jobs []int, left []float64, choice []int) {
	sub := Problem{N: len(jobs), K: p.K, M: p.M, Typ: p.Typ, Capacity: slices.Clone(left)}
	for _, i := range jobs {
		sub.Width = append(sub.Width, p.Width[i*p.M:i*p.M+p.M]...)
		sub.Gain = append(sub.Gain, p.Gain[i*p.M:i*p.M+p.M]...)
	}
	for q, c := range branchAndBound(sub).Choice {
		if i := jobs[q]; c >= 0 {
			choice[i] = c
			left[p.Typ[c]] -= p.W(i, c)
		}
	}
}

// branchAndBound is the exact optimum by depth-first search over the
// jobs in order, each tried on its types by decreasing gain, then
// without; a branch is cut when even every remaining job at its best gain
// could not beat the best found. Ties keep the first found.
func branchAndBound(p Problem) Solution {
	suffix := make([]float64, p.N+1)
	order := make([][]int, p.N)
	for i := p.N - 1; i >= 0; i-- {
		row := p.Gain[i*p.M : i*p.M+p.M]
		for j, g := range row {
			if g > 0 {
				order[i] = append(order[i], j)
			}
		}
		slices.SortStableFunc(order[i], func(a, b int) int { return cmp.Compare(row[b], row[a]) })
		best := 0.0
		if len(order[i]) > 0 {
			best = row[order[i][0]]
		}
		suffix[i] = suffix[i+1] + best
	}
	left := slices.Clone(p.Capacity)
	choice := make([]int, p.N)
	best := Solution{Value: -1, Exact: true}
	var dfs func(i int, val float64)
	dfs = func(i int, val float64) {
		if val+suffix[i] <= best.Value+1e-12 {
			return
		}
		if i == p.N {
			best.Value, best.Choice = val, slices.Clone(choice)
			return
		}
		for _, c := range order[i] {
			j, w := p.Typ[c], p.W(i, c)
			if left[j] < w {
				continue
			}
			left[j] -= w
			choice[i] = c
			dfs(i+1, val+p.G(i, c))
			left[j] += w
		}
		choice[i] = -1
		dfs(i+1, val)
	}
	dfs(0, 0)
	best.Bound = best.Value
	return best
}

// lpRound solves the LP relaxation and rounds it (see the file comment).
func lpRound(p Problem) (Solution, error) {
	x, bound, err := relax(p)
	if err != nil {
		return Solution{}, err
	}
	left := slices.Clone(p.Capacity)
	choice := make([]int, p.N)
	for i := range choice {
		choice[i] = -1
	}
	take := func(i, c int) {
		if j := p.Typ[c]; choice[i] < 0 && p.G(i, c) > 0 && left[j] >= p.W(i, c) {
			choice[i] = c
			left[j] -= p.W(i, c)
		}
	}
	type pair struct {
		i, j int
		x    float64
	}
	var frac []pair
	var split, out []int // jobs the LP splits; jobs it leaves out or splits
	for i := range p.N {
		whole, parts := false, false
		for j := range p.M {
			switch v := x[i*p.M+j]; {
			case v >= 1-1e-6:
				take(i, j)
				whole = true
			case v > 1e-9:
				frac = append(frac, pair{i, j, v})
				parts = true
			}
		}
		if parts && !whole {
			split = append(split, i)
		}
		if !whole {
			out = append(out, i)
		}
	}
	// The jobs the LP does not place whole are settled exactly on the
	// GPUs left when they are few (a small instance, or a handful of
	// split jobs); else the split ones by decreasing fraction.
	switch {
	case combos(p, out) <= exactLimit:
		settle(p, out, left, choice)
	case combos(p, split) <= exactLimit:
		settle(p, split, left, choice)
	default:
		slices.SortFunc(frac, func(a, b pair) int {
			return cmp.Or(cmp.Compare(b.x, a.x), cmp.Compare(p.G(b.i, b.j), p.G(a.i, a.j)), cmp.Compare(a.i, b.i), cmp.Compare(a.j, b.j))
		})
		for _, q := range frac {
			take(q.i, q.j)
		}
	}
	// Work conservation: what the rounding left free goes to the jobs
	// still out.
	fill(p, choice, left)
	improve(p, choice, left)
	raise(p, choice, left)
	sol := Solution{Choice: choice, Bound: bound}
	for i, c := range choice {
		if c >= 0 {
			sol.Value += p.G(i, c)
		}
	}
	return sol, nil
}

// improvePasses bounds the local search after the rounding.
const improvePasses = 4

// improve is a local search on a rounded selection: a job left out takes
// the place of one job of a type when that gains (the job it displaces
// moving to a configuration of another type with room, if it has one),
// until no exchange gains or improvePasses passes are done. Fixing the
// jobs the LP places whole can strand a GPU or two of a small, tightly
// packed type, which an exchange recovers; each exchange raises the
// objective, so it ends.
func improve(p Problem, choice []int, left []float64) {
	for range improvePasses {
		changed := false
		for i := range p.N {
			if choice[i] >= 0 {
				continue
			}
			bestGain, bestC, bestQ, bestTo := 1e-12, -1, -1, -1
			for c := range p.M {
				g, j, w := p.G(i, c), p.Typ[c], p.W(i, c)
				if g <= 0 {
					continue
				}
				if left[j] >= w {
					if g > bestGain {
						bestGain, bestC, bestQ, bestTo = g, c, -1, -1
					}
					continue
				}
				for q := range p.N {
					cq := choice[q]
					if cq < 0 || p.Typ[cq] != j || left[j]+p.W(q, cq) < w {
						continue
					}
					// q leaves type j: elsewhere if it has room, else out.
					to, rest := -1, 0.0
					for o := range p.M {
						if p.Typ[o] != j && left[p.Typ[o]] >= p.W(q, o) && p.G(q, o) > rest {
							to, rest = o, p.G(q, o)
						}
					}
					if d := g - p.G(q, cq) + rest; d > bestGain {
						bestGain, bestC, bestQ, bestTo = d, c, q, to
					}
				}
			}
			if bestC < 0 {
				continue
			}
			if bestQ >= 0 {
				cq := choice[bestQ]
				left[p.Typ[cq]] += p.W(bestQ, cq)
				choice[bestQ] = bestTo
				if bestTo >= 0 {
					left[p.Typ[bestTo]] -= p.W(bestQ, bestTo)
				}
			}
			choice[i] = bestC
			left[p.Typ[bestC]] -= p.W(i, bestC)
			changed = true
		}
		if !changed {
			return
		}
	}
}

// relax solves the LP relaxation of p by lp.ColumnGeneration: a column is
// a whole-round plan (each job on at most one type); pricing a plan at
// capacity prices lambda picks, per job, the type of largest gain less
// width times price, if positive. It returns x (n*m, the fraction of each
// job in each configuration) and the optimum.
func relax(p Problem) ([]float64, float64, error) {
	res, err := lp.ColumnGeneration(p.Capacity, func(lambda []float64) (lp.Column[[]int], float64) {
		plan := make([]int, p.N)
		usage := make([]float64, p.K)
		value, priced := 0.0, 0.0
		for i := range p.N {
			plan[i] = -1
			best := 0.0
			for c := range p.M {
				g := p.G(i, c)
				if g <= 0 {
					continue
				}
				if r := g - p.W(i, c)*lambda[p.Typ[c]]; r > best+1e-12 {
					best, plan[i] = r, c
				}
			}
			if c := plan[i]; c >= 0 {
				value += p.G(i, c)
				usage[p.Typ[c]] += p.W(i, c)
				priced += best
			}
		}
		return lp.Column[[]int]{Value: value, Usage: usage, Plan: plan}, priced
	}, lp.ColGenOptions{RelTol: 1e-9, MaxIter: 2000})
	if err = closeEnough(res.Objective, res.Gap, err); err != nil {
		return nil, 0, fmt.Errorf("assign: LP relaxation: %w", err)
	}
	x := make([]float64, p.N*p.M)
	for c, w := range res.Weights {
		if w <= 0 {
			continue
		}
		for i, j := range res.Columns[c].Plan {
			if j >= 0 {
				x[i*p.M+j] += w
			}
		}
	}
	return x, res.Objective + res.Gap, nil
}

// looseTol is the gap, relative to the relaxation's objective, at which a
// column generation that ran out of columns still serves: the rounding
// loses 3-5 % of the bound, and a round refused for it falls back to
// first come, first served (Sia's program with a stay of 3 on philly-48h
// seeds 1 and 3 stopped 2.4e-5 and 3.6e-4 short after 2,000 columns,
// docs/results.md "A stay in the backlog's weighted rounds").
const looseTol = 1e-3

// closeEnough is err, or nil where err is only that the column generation
// stopped with its objective within looseTol of the optimum.
func closeEnough(objective, gap float64, err error) error {
	if errors.Is(err, lp.ErrNoConvergence) && gap <= looseTol*math.Max(1, math.Abs(objective)) {
		return nil
	}
	return err
}

// raise is a second local search on a rounded selection: a job, placed
// or not, takes a configuration of more gain when the GPUs it needs
// there can be freed by sending jobs of that type, the least gain per GPU
// first, to their best configuration of another type with room or out,
// and the selection gains by it. The rounding fixes the jobs the LP
// places whole before the ones it splits, so a wide job the LP split
// between two widths can be left at the narrow one while narrow jobs
// worth less hold the GPUs it needs (hadar's configuration program: a
// long job moved from 16 GPUs to 8 and back every half hour, the
// rounding 3-5 % under the LP's bound each time; docs/results.md, "The
// rounding's wide jobs"). Each move raises the objective, so it ends;
// what the moves leave free then goes to the jobs still out (fill).
func raise(p Problem, choice []int, left []float64) {
	// on[j] is the jobs placed on type j, the least gain per GPU first.
	on := make([][]int, p.K)
	index := func() {
		for j := range on {
			on[j] = on[j][:0]
		}
		for q, c := range choice {
			if c >= 0 {
				on[p.Typ[c]] = append(on[p.Typ[c]], q)
			}
		}
		for j := range on {
			slices.SortFunc(on[j], func(a, b int) int {
				return cmp.Or(cmp.Compare(p.G(a, choice[a])/p.W(a, choice[a]), p.G(b, choice[b])/p.W(b, choice[b])), cmp.Compare(a, b))
			})
		}
	}
	type move struct{ q, to int }
	free := make([]float64, p.K)
	var moves, best []move
	index()
	for range improvePasses {
		changed := false
		for i := range p.N {
			g0 := 0.0
			if c0 := choice[i]; c0 >= 0 {
				g0 = p.G(i, c0)
			}
			most, bestC := 1e-9*(1+g0), -1
			for c := range p.M {
				g, j, w := p.G(i, c), p.Typ[c], p.W(i, c)
				if g <= g0 || c == choice[i] {
					continue
				}
				copy(free, left)
				if c0 := choice[i]; c0 >= 0 {
					free[p.Typ[c0]] += p.W(i, c0)
				}
				gain := g - g0
				moves = moves[:0]
				for _, q := range on[j] {
					if free[j] >= w {
						break
					}
					if q == i {
						continue
					}
					free[j] += p.W(q, choice[q])
					gain -= p.G(q, choice[q])
					moves = append(moves, move{q, -1})
				}
				if free[j] < w {
					continue
				}
				free[j] -= w
				for n := range moves {
					q, rest := moves[n].q, 0.0
					for o := range p.M {
						if p.Typ[o] != j && free[p.Typ[o]] >= p.W(q, o) && p.G(q, o) > rest {
							moves[n].to, rest = o, p.G(q, o)
						}
					}
					if to := moves[n].to; to >= 0 {
						free[p.Typ[to]] -= p.W(q, to)
						gain += rest
					}
				}
				if gain > most {
					most, bestC = gain, c
					best = append(best[:0], moves...)
				}
			}
			if bestC < 0 {
				continue
			}
			if c0 := choice[i]; c0 >= 0 {
				left[p.Typ[c0]] += p.W(i, c0)
			}
			for _, m := range best {
				left[p.Typ[choice[m.q]]] += p.W(m.q, choice[m.q])
				choice[m.q] = -1
			}
			choice[i] = bestC
			left[p.Typ[bestC]] -= p.W(i, bestC)
			for _, m := range best {
				if m.to >= 0 {
					choice[m.q] = m.to
					left[p.Typ[m.to]] -= p.W(m.q, m.to)
				}
			}
			changed = true
			index()
		}
		if !changed {
			break
		}
	}
	fill(p, choice, left)
}

// fill gives the GPUs left to the jobs still out, the most gain per GPU
// first.
func fill(p Problem, choice []int, left []float64) {
	type cand struct {
		i, c int
		x    float64
	}
	var rest []cand
	for i := range p.N {
		if choice[i] >= 0 {
			continue
		}
		for c := range p.M {
			if g := p.G(i, c); g > 0 {
				rest = append(rest, cand{i, c, g / p.W(i, c)})
			}
		}
	}
	slices.SortFunc(rest, func(a, b cand) int {
		return cmp.Or(cmp.Compare(b.x, a.x), cmp.Compare(a.i, b.i), cmp.Compare(a.c, b.c))
	})
	for _, q := range rest {
		if j := p.Typ[q.c]; choice[q.i] < 0 && left[j] >= p.W(q.i, q.c) {
			choice[q.i] = q.c
			left[j] -= p.W(q.i, q.c)
		}
	}
}
