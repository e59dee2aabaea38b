package sia

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner/lp"
)

// The paper solves its selection as an integer program with an external
// MILP solver. hadar has its own simplex (planner/lp) and no MILP solver,
// so the selection is solved in two ways, both deterministic:
//
//   - small instances (few jobs, few types: at most exactLimit
//     combinations) exactly, by depth-first branch and bound whose bound
//     is each remaining job's best gain;
//   - larger ones by the LP relaxation, solved exactly by Dantzig-Wolfe
//     column generation on planner/lp (K capacity rows and a convexity
//     row, as planner/policy solves Gavel's allocations: the per-job
//     "at most one configuration" rows decompose into a pricing step),
//     then rounded: the jobs the LP assigns whole keep their type, the
//     fractional ones are taken by decreasing fraction while they fit,
//     and GPUs still free go to the jobs left out by gain per GPU. A
//     basic optimum of the relaxation splits at most K jobs (K + n rows,
//     n of them per job), so with many small jobs the rounding loses
//     little; the tests compare it with the exact optimum.

// exactLimit bounds the combinations the exact search may face.
const exactLimit = 1 << 14

// problem is one round's selection: n jobs, k GPU types; gain[i*k+j] > 0
// is what job i on type j adds to the objective (0: not a configuration
// of the job); width[i] GPUs per job; capacity[j] GPUs of type j.
type problem struct {
	n, k     int
	width    []float64
	gain     []float64
	capacity []float64
}

// solution picks choice[i], a type index or -1 (not scheduled), worth
// value; bound is an upper bound on the optimum (value when exact).
type solution struct {
	choice []int
	value  float64
	bound  float64
	exact  bool
}

func solve(p problem) (solution, error) {
	if p.n == 0 {
		return solution{exact: true}, nil
	}
	all := make([]int, p.n)
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
func combos(p problem, jobs []int) float64 {
	n := 1.0
	for _, i := range jobs {
		opts := 1.0
		for j := range p.k {
			if p.gain[i*p.k+j] > 0 {
				opts++
			}
		}
		n *= opts
	}
	return n
}

// settle configures the jobs of p listed in jobs (all unconfigured in
// choice) exactly on the GPUs left, and takes those GPUs.
func settle(p problem, jobs []int, left []float64, choice []int) {
	sub := problem{n: len(jobs), k: p.k, capacity: slices.Clone(left)}
	for _, i := range jobs {
		sub.width = append(sub.width, p.width[i])
		sub.gain = append(sub.gain, p.gain[i*p.k:i*p.k+p.k]...)
	}
	for q, j := range branchAndBound(sub).choice {
		if i := jobs[q]; j >= 0 {
			choice[i] = j
			left[j] -= p.width[i]
		}
	}
}

// branchAndBound is the exact optimum by depth-first search over the
// jobs in order, each tried on its types by decreasing gain, then
// without; a branch is cut when even every remaining job at its best gain
// could not beat the best found. Ties keep the first found.
func branchAndBound(p problem) solution {
	suffix := make([]float64, p.n+1)
	order := make([][]int, p.n)
	for i := p.n - 1; i >= 0; i-- {
		row := p.gain[i*p.k : i*p.k+p.k]
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
	left := slices.Clone(p.capacity)
	choice := make([]int, p.n)
	best := solution{value: -1, exact: true}
	var dfs func(i int, val float64)
	dfs = func(i int, val float64) {
		if val+suffix[i] <= best.value+1e-12 {
			return
		}
		if i == p.n {
			best.value, best.choice = val, slices.Clone(choice)
			return
		}
		for _, j := range order[i] {
			if left[j] < p.width[i] {
				continue
			}
			left[j] -= p.width[i]
			choice[i] = j
			dfs(i+1, val+p.gain[i*p.k+j])
			left[j] += p.width[i]
		}
		choice[i] = -1
		dfs(i+1, val)
	}
	dfs(0, 0)
	best.bound = best.value
	return best
}

// lpRound solves the LP relaxation and rounds it (see the file comment).
func lpRound(p problem) (solution, error) {
	x, bound, err := relax(p)
	if err != nil {
		return solution{}, err
	}
	left := slices.Clone(p.capacity)
	choice := make([]int, p.n)
	for i := range choice {
		choice[i] = -1
	}
	take := func(i, j int) {
		if choice[i] < 0 && p.gain[i*p.k+j] > 0 && left[j] >= p.width[i] {
			choice[i] = j
			left[j] -= p.width[i]
		}
	}
	type pair struct {
		i, j int
		x    float64
	}
	var frac []pair
	var split, out []int // jobs the LP splits; jobs it leaves out or splits
	for i := range p.n {
		whole, parts := false, false
		for j := range p.k {
			switch v := x[i*p.k+j]; {
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
			return cmp.Or(cmp.Compare(b.x, a.x), cmp.Compare(p.gain[b.i*p.k+b.j], p.gain[a.i*p.k+a.j]), cmp.Compare(a.i, b.i), cmp.Compare(a.j, b.j))
		})
		for _, q := range frac {
			take(q.i, q.j)
		}
	}
	// Work conservation: what the rounding left free goes to the jobs
	// still out, the most gain per GPU first.
	var rest []pair
	for i := range p.n {
		if choice[i] >= 0 {
			continue
		}
		for j := range p.k {
			if g := p.gain[i*p.k+j]; g > 0 {
				rest = append(rest, pair{i, j, g / p.width[i]})
			}
		}
	}
	slices.SortFunc(rest, func(a, b pair) int {
		return cmp.Or(cmp.Compare(b.x, a.x), cmp.Compare(a.i, b.i), cmp.Compare(a.j, b.j))
	})
	for _, q := range rest {
		take(q.i, q.j)
	}
	improve(p, choice, left)
	sol := solution{choice: choice, bound: bound}
	for i, j := range choice {
		if j >= 0 {
			sol.value += p.gain[i*p.k+j]
		}
	}
	return sol, nil
}

// improvePasses bounds the local search after the rounding.
const improvePasses = 4

// improve is a local search on a rounded selection: a job left out takes
// the place of one job of a type when that gains (the job it displaces
// moving to another type with room, if it has one), until no exchange
// gains or improvePasses passes are done. Fixing the jobs the LP places
// whole can strand a GPU or two of a small, tightly packed type, which an
// exchange recovers; each exchange raises the objective, so it ends.
func improve(p problem, choice []int, left []float64) {
	for range improvePasses {
		changed := false
		for i := range p.n {
			if choice[i] >= 0 {
				continue
			}
			bestGain, bestJ, bestQ, bestTo := 1e-12, -1, -1, -1
			for j := range p.k {
				g := p.gain[i*p.k+j]
				if g <= 0 {
					continue
				}
				if left[j] >= p.width[i] {
					if g > bestGain {
						bestGain, bestJ, bestQ, bestTo = g, j, -1, -1
					}
					continue
				}
				for q := range p.n {
					if choice[q] != j || left[j]+p.width[q] < p.width[i] {
						continue
					}
					// q leaves type j: elsewhere if it has room, else out.
					to, rest := -1, 0.0
					for o := range p.k {
						if o != j && left[o] >= p.width[q] && p.gain[q*p.k+o] > rest {
							to, rest = o, p.gain[q*p.k+o]
						}
					}
					if d := g - p.gain[q*p.k+j] + rest; d > bestGain {
						bestGain, bestJ, bestQ, bestTo = d, j, q, to
					}
				}
			}
			if bestJ < 0 {
				continue
			}
			if bestQ >= 0 {
				left[bestJ] += p.width[bestQ]
				choice[bestQ] = bestTo
				if bestTo >= 0 {
					left[bestTo] -= p.width[bestQ]
				}
			}
			choice[i] = bestJ
			left[bestJ] -= p.width[i]
			changed = true
		}
		if !changed {
			return
		}
	}
}

// relax solves the LP relaxation of p by column generation: a column is
// a whole-round plan (each job on at most one type); pricing a plan at
// capacity prices lambda picks, per job, the type of largest gain less
// width times price, if positive. The master, over convex combinations
// of the plans generated, has K capacity rows and one convexity row; its
// duals are the next prices. It stops when no plan prices out, which
// makes the master optimal for the relaxation. It returns x (n*k, the
// fraction of each job on each type) and the optimum.
func relax(p problem) ([]float64, float64, error) {
	const maxIter = 2000
	type column struct {
		value float64
		usage []float64
		plan  []int
	}
	var cols []column
	lambda := make([]float64, p.k)
	sigma := 0.0
	var x []float64
	objective := 0.0
	for iter := 0; ; iter++ {
		plan := make([]int, p.n)
		usage := make([]float64, p.k)
		value, priced := 0.0, 0.0
		for i := range p.n {
			plan[i] = -1
			best := 0.0
			for j := range p.k {
				g := p.gain[i*p.k+j]
				if g <= 0 {
					continue
				}
				if r := g - p.width[i]*lambda[j]; r > best+1e-12 {
					best, plan[i] = r, j
				}
			}
			if plan[i] >= 0 {
				value += p.gain[i*p.k+plan[i]]
				usage[plan[i]] += p.width[i]
				priced += best
			}
		}
		if iter > 0 && priced-sigma <= 1e-9*math.Max(1, math.Abs(objective)) {
			return x, objective, nil
		}
		if iter >= maxIter {
			return nil, 0, fmt.Errorf("sia LP relaxation: no convergence after %d columns", iter)
		}
		cols = append(cols, column{value: value, usage: usage, plan: plan})
		m := lp.Problem{C: make([]float64, len(cols)), A: make([][]float64, p.k+1), B: make([]float64, p.k+1)}
		for j := range p.k + 1 {
			m.A[j] = make([]float64, len(cols))
		}
		for c, col := range cols {
			m.C[c] = col.value
			for j := range p.k {
				m.A[j][c] = col.usage[j]
			}
			m.A[p.k][c] = 1
		}
		copy(m.B, p.capacity)
		m.B[p.k] = 1
		sol, err := lp.Solve(m)
		if err != nil {
			return nil, 0, fmt.Errorf("sia LP relaxation master: %w", err)
		}
		for j := range lambda {
			lambda[j] = math.Max(0, sol.Duals[j])
		}
		sigma = math.Max(0, sol.Duals[p.k])
		x = make([]float64, p.n*p.k)
		for c, w := range sol.X {
			if w <= 0 {
				continue
			}
			for i, j := range cols[c].plan {
				if j >= 0 {
					x[i*p.k+j] += w
				}
			}
		}
		objective = sol.Objective
	}
}
