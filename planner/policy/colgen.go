package policy

import (
	"fmt"
	"math"
	"sort"

	"github.com/hadar-sched/hadar/planner/lp"
)

// The allocation problems of Gavel's family share one shape: per-job
// constraints (each job's time fractions sum to at most 1) and K coupling
// capacity constraints, one per GPU type:
//
//	sum_i sf_i * X[i][j] <= N_j
//
// They are solved by lp.ColumnGeneration: a column is a whole-cluster plan
// X, and pricing a plan under capacity prices lambda decomposes per job
// and costs O(n K log(n K)).

// defaultColGen bounds the column generation.
var defaultColGen = lp.ColGenOptions{RelTol: 1e-6, MaxIter: 2000}

// pricer fills x (n*K, row-major) with the plan that maximizes
// value(x) - lambda·usage(x) and returns value(x).
type pricer func(lambda []float64, x []float64) float64

// columnGeneration solves the problem whose plans price generates, and
// returns the optimum and its X (n*K), the optimal combination of plans.
func columnGeneration(n, k int, sf, capacity []float64, price pricer) (float64, []float64, error) {
	res, err := lp.ColumnGeneration(capacity, func(lambda []float64) (lp.Column[[]float64], float64) {
		x := make([]float64, n*k)
		value := price(lambda, x)
		used := 0.0
		usage := make([]float64, k)
		for i := range n {
			for j, v := range x[i*k : i*k+k] {
				used += lambda[j] * sf[i] * v
				usage[j] += sf[i] * v
			}
		}
		return lp.Column[[]float64]{Value: value, Usage: usage, Plan: x}, value - used
	}, defaultColGen)
	if err != nil {
		return 0, nil, err
	}
	xs := make([]float64, n*k)
	for c, w := range res.Weights {
		if w <= 0 {
			continue
		}
		for q, v := range res.Columns[c].Plan {
			xs[q] += w * v
		}
	}
	return res.Objective, xs, nil
}

// maxMinPricer prices the problem: maximize t subject to, for every job i,
// sum_j a[i][j] X[i][j] >= t and sum_j X[i][j] <= 1. For fixed prices each
// job's cheapest way to reach t is the lower convex hull of the points
// (a_ij, sf_i*lambda_j) and the origin; t itself is then chosen by a sweep
// over the hulls' breakpoints, where the concave objective's slope
// 1 - sum_i hull_i'(t) turns non-positive.
type maxMinPricer struct {
	n, k  int
	a     []float64 // n*k
	sf    []float64
	order [][]int // per job: types with a>0, ascending a
	tmax  float64
	// scratch: per job, the hull's points and the type of each (-1 for
	// the origin)
	hx, hy [][]float64
	hj     [][]int
	events []event
}

type event struct {
	at    float64
	delta float64
}

func newMaxMinPricer(n, k int, a, sf []float64) (*maxMinPricer, error) {
	p := &maxMinPricer{n: n, k: k, a: a, sf: sf, order: make([][]int, n), hx: make([][]float64, n), hy: make([][]float64, n), hj: make([][]int, n), tmax: math.Inf(1)}
	for i := range n {
		row := a[i*k : i*k+k]
		var ord []int
		amax := 0.0
		for j, v := range row {
			if v > 0 {
				ord = append(ord, j)
				amax = math.Max(amax, v)
			}
		}
		if len(ord) == 0 {
			return nil, fmt.Errorf("job %d cannot run on any GPU type", i)
		}
		sort.Slice(ord, func(x, y int) bool { return row[ord[x]] < row[ord[y]] })
		p.order[i] = ord
		p.tmax = math.Min(p.tmax, amax)
		p.hx[i] = make([]float64, 0, k+1)
		p.hy[i] = make([]float64, 0, k+1)
		p.hj[i] = make([]int, 0, k+1)
	}
	return p, nil
}

// hull builds job i's lower convex hull for prices lambda into p.hx/p.hy,
// starting at the origin.
// Each hull point remembers its GPU type: with equal gains on two types
// the cheaper one stays, and the allocation must name that one, not the
// first type with that gain.
func (p *maxMinPricer) hull(i int, lambda []float64) {
	hx, hy, hj := p.hx[i][:0], p.hy[i][:0], p.hj[i][:0]
	hx, hy, hj = append(hx, 0), append(hy, 0), append(hj, -1)
	row := p.a[i*p.k : i*p.k+p.k]
	for _, j := range p.order[i] {
		x, y := row[j], p.sf[i]*lambda[j]
		if x == hx[len(hx)-1] {
			// Same gain: keep the cheaper point.
			if y < hy[len(hy)-1] {
				hx, hy, hj = hx[:len(hx)-1], hy[:len(hy)-1], hj[:len(hj)-1]
			} else {
				continue
			}
		}
		for len(hx) >= 2 {
			x1, y1 := hx[len(hx)-2], hy[len(hy)-2]
			x2, y2 := hx[len(hx)-1], hy[len(hy)-1]
			// Drop the middle point when it lies on or above the chord.
			if (y2-y1)*(x-x1) >= (y-y1)*(x2-x1) {
				hx, hy, hj = hx[:len(hx)-1], hy[:len(hy)-1], hj[:len(hj)-1]
				continue
			}
			break
		}
		hx, hy, hj = append(hx, x), append(hy, y), append(hj, j)
	}
	p.hx[i], p.hy[i], p.hj[i] = hx, hy, hj
}

func (p *maxMinPricer) price(lambda []float64, x []float64) float64 {
	slope := 1.0
	p.events = p.events[:0]
	for i := range p.n {
		p.hull(i, lambda)
		hx, hy := p.hx[i], p.hy[i]
		s0 := (hy[1] - hy[0]) / (hx[1] - hx[0])
		slope -= s0
		prev := s0
		for q := 1; q+1 < len(hx); q++ {
			s := (hy[q+1] - hy[q]) / (hx[q+1] - hx[q])
			if hx[q] < p.tmax {
				p.events = append(p.events, event{at: hx[q], delta: s - prev})
			}
			prev = s
		}
	}
	t := 0.0
	if slope > 0 {
		sort.Slice(p.events, func(a, b int) bool { return p.events[a].at < p.events[b].at })
		t = p.tmax
		for _, e := range p.events {
			slope -= e.delta
			if slope <= 0 {
				t = e.at
				break
			}
		}
	}
	for i := range p.n {
		hx := p.hx[i]
		row := x[i*p.k : i*p.k+p.k]
		if t <= 0 {
			continue
		}
		// Segment q..q+1 holding t (the left one at a breakpoint).
		q := sort.SearchFloat64s(hx, t) - 1
		if q < 0 {
			q = 0
		}
		if q+1 >= len(hx) {
			q = len(hx) - 2
		}
		x0, x1 := hx[q], hx[q+1]
		theta := (t - x0) / (x1 - x0) // weight on the right vertex
		j1 := p.hj[i][q+1]
		if q == 0 {
			row[j1] = theta
		} else {
			row[p.hj[i][q]] = 1 - theta
			row[j1] = theta
		}
	}
	return t
}

// solveMaxMin maximizes t such that every job i reaches sum_j a[i][j]
// X[i][j] >= t, subject to time and capacity constraints. It returns t and
// X (n*k). Each job must be able to run on at least one type (a > 0).
func solveMaxMin(n, k int, a, sf, capacity []float64) (float64, []float64, error) {
	if n == 0 {
		return 0, nil, nil
	}
	// Scale gains so the optimum lies in [0, 1]: the tolerances are relative.
	p, err := newMaxMinPricer(n, k, a, sf)
	if err != nil {
		return 0, nil, err
	}
	scale := p.tmax
	scaled := make([]float64, len(a))
	for q, v := range a {
		scaled[q] = v / scale
	}
	p.a = scaled
	p.tmax = 1
	value, x, err := columnGeneration(n, k, sf, capacity, p.price)
	if err != nil {
		return 0, nil, err
	}
	return value * scale, x, nil
}

// solveSeparable maximizes sum_i sum_j v[i][j] X[i][j] under the time and
// capacity constraints.
func solveSeparable(n, k int, v, sf, capacity []float64) (float64, []float64, error) {
	if n == 0 {
		return 0, nil, nil
	}
	scale := 0.0
	for _, x := range v {
		scale = math.Max(scale, x)
	}
	if scale <= 0 {
		return 0, make([]float64, n*k), nil
	}
	price := func(lambda []float64, x []float64) float64 {
		total := 0.0
		for i := range n {
			best, bj := 0.0, -1
			for j := range k {
				if v[i*k+j] <= 0 {
					continue
				}
				if m := v[i*k+j]/scale - sf[i]*lambda[j]; m > best {
					best, bj = m, j
				}
			}
			if bj >= 0 {
				x[i*k+bj] = 1
				total += v[i*k+bj] / scale
			}
		}
		return total
	}
	value, x, err := columnGeneration(n, k, sf, capacity, price)
	if err != nil {
		return 0, nil, err
	}
	return value * scale, x, nil
}
