package policy

import (
	"fmt"
	"math"
)

// MaxMin is Gavel's max-min fairness ("LAS"): maximize the minimum over jobs
// of sf_i * throughput_i / (w_i * prop_i), where prop_i is the throughput
// the job would get from an equal, type-proportional share of every GPU
// (Gavel's normalizer). The agnostic variant sees every runnable type as
// equal (throughput 1), so it allocates time, not speed.
type MaxMin struct{ Agnostic bool }

// Name implements Policy.
func (p MaxMin) Name() string {
	if p.Agnostic {
		return "gavel-maxmin-agnostic"
	}
	return "gavel-maxmin"
}

// Allocate implements Policy.
func (p MaxMin) Allocate(in Input) (Allocation, error) {
	if err := in.Validate(); err != nil {
		return Allocation{}, err
	}
	tp, ok := effective(in)
	if p.Agnostic {
		tp = agnostic(tp, true)
	}
	total := 0.0
	for _, c := range in.Capacity {
		total += c
	}
	gains := make([][]float64, len(tp))
	for i, row := range tp {
		prop := 0.0
		for j, v := range row {
			prop += v * in.Capacity[j] / total
		}
		gains[i] = make([]float64, len(row))
		if prop == 0 {
			continue
		}
		w := in.Jobs[i].Weight
		if w <= 0 {
			w = 1
		}
		for j, v := range row {
			gains[i][j] = float64(in.Jobs[i].ScaleFactor) * v / (w * prop)
		}
	}
	_, a, err := solveGains(in, gains, ok)
	if err != nil {
		return Allocation{}, fmt.Errorf("%s: %w", p.Name(), err)
	}
	if p.Agnostic {
		a = typeBlind(in, a)
	}
	return a, nil
}

// Makespan is Gavel's min total duration: minimize M such that every job
// can finish its remaining steps within M. Since throughput_i >=
// remaining_i / M is the same as maximizing min_i throughput_i /
// remaining_i, one max-min solve replaces Gavel's binary search over M.
// The agnostic variant plans with one type-blind throughput per job (its
// best), while the simulator applies the real throughput of the type used.
type Makespan struct{ Agnostic bool }

// Name implements Policy.
func (p Makespan) Name() string {
	if p.Agnostic {
		return "gavel-makespan-agnostic"
	}
	return "gavel-makespan"
}

// Allocate implements Policy.
func (p Makespan) Allocate(in Input) (Allocation, error) {
	a, _, err := p.solve(in)
	if err == nil && p.Agnostic {
		a = typeBlind(in, a)
	}
	return a, err
}

// solve also returns the planned makespan in seconds.
func (p Makespan) solve(in Input) (Allocation, float64, error) {
	if err := in.Validate(); err != nil {
		return Allocation{}, 0, err
	}
	tp, ok := effective(in)
	if p.Agnostic {
		tp = agnostic(tp, false)
	}
	gains := make([][]float64, len(tp))
	for i, row := range tp {
		rem := math.Max(in.Jobs[i].Remaining, 1e-9)
		gains[i] = make([]float64, len(row))
		for j, v := range row {
			gains[i][j] = v / rem
		}
	}
	theta, a, err := solveGains(in, gains, ok)
	if err != nil {
		return Allocation{}, 0, fmt.Errorf("%s: %w", p.Name(), err)
	}
	if theta <= 0 {
		return a, math.Inf(1), nil
	}
	return a, 1 / theta, nil
}

// FinishTimeFairness is Themis-style finish-time fairness as Gavel states
// it: minimize max_i rho_i, rho_i = (age_i + remaining_i/throughput_i) /
// isolated_i, where isolated_i is the job's completion time on a 1/n share
// of the cluster (n active jobs), split over types in proportion to their
// GPU counts. A bisection over rho, each step one max-min feasibility solve.
type FinishTimeFairness struct{ Agnostic bool }

// Name implements Policy.
func (p FinishTimeFairness) Name() string {
	if p.Agnostic {
		return "gavel-ftf-agnostic"
	}
	return "gavel-ftf"
}

// Allocate implements Policy.
func (p FinishTimeFairness) Allocate(in Input) (Allocation, error) {
	if err := in.Validate(); err != nil {
		return Allocation{}, err
	}
	tp, ok := effective(in)
	if p.Agnostic {
		tp = agnostic(tp, false)
	}
	n := 0
	for _, o := range ok {
		if o {
			n++
		}
	}
	if n == 0 {
		return expand(len(in.Jobs), len(in.Types), nil, nil), nil
	}
	total := 0.0
	for _, c := range in.Capacity {
		total += c
	}
	iso := make([]float64, len(tp))
	lo := 0.0
	for i, row := range tp {
		if !ok[i] {
			continue
		}
		jb := in.Jobs[i]
		share := math.Min(1, total/(float64(n)*float64(jb.ScaleFactor)))
		thr, best := 0.0, 0.0
		for j, v := range row {
			thr += v * in.Capacity[j] / total * share
			best = math.Max(best, v)
		}
		iso[i] = jb.TotalSteps / thr
		// No allocation beats running alone on the best type.
		lo = math.Max(lo, (jb.Age+jb.Remaining/best)/iso[i])
	}
	gainsAt := func(rho float64) ([][]float64, bool) {
		g := make([][]float64, len(tp))
		for i, row := range tp {
			g[i] = make([]float64, len(row))
			if !ok[i] {
				continue
			}
			slack := rho*iso[i] - in.Jobs[i].Age
			if slack <= 0 {
				return nil, false
			}
			need := in.Jobs[i].Remaining / slack
			for j, v := range row {
				g[i][j] = v / need
			}
		}
		return g, true
	}
	feasible := func(rho float64) (bool, Allocation, error) {
		g, fine := gainsAt(rho)
		if !fine {
			return false, Allocation{}, nil
		}
		t, a, err := solveGains(in, g, ok)
		if err != nil {
			return false, Allocation{}, err
		}
		return t >= 1-1e-9, a, nil
	}
	hi := math.Max(lo, 1e-9) * 2
	var bestA Allocation
	for range 200 {
		f, a, err := feasible(hi)
		if err != nil {
			return Allocation{}, fmt.Errorf("%s: %w", p.Name(), err)
		}
		if f {
			bestA = a
			break
		}
		lo, hi = hi, hi*2
	}
	if bestA.X == nil {
		return Allocation{}, fmt.Errorf("%s: no feasible finish-time ratio found", p.Name())
	}

	// 0.1 % on the worst finish-time ratio: finer costs solves, not fairness.
	for hi-lo > 1e-3*hi {
		mid := (lo + hi) / 2
		f, a, err := feasible(mid)
		if err != nil {
			return Allocation{}, fmt.Errorf("%s: %w", p.Name(), err)
		}
		if f {
			hi, bestA = mid, a
		} else {
			lo = mid
		}
	}
	if p.Agnostic {
		bestA = typeBlind(in, bestA)
	}
	return bestA, nil
}

// MaxThroughput maximizes the sum over jobs of normalized throughput
// (throughput_i / best throughput of job i, so jobs with different step
// sizes weigh alike). PerDollar divides each type's contribution by the
// type's price per GPU-hour: "gavel-cost", throughput per dollar.
type MaxThroughput struct{ PerDollar bool }

// Name implements Policy.
func (p MaxThroughput) Name() string {
	if p.PerDollar {
		return "gavel-cost"
	}
	return "gavel-maxthroughput"
}

// Allocate implements Policy.
func (p MaxThroughput) Allocate(in Input) (Allocation, error) {
	if err := in.Validate(); err != nil {
		return Allocation{}, err
	}
	if p.PerDollar {
		if len(in.PricePerHour) != len(in.Types) {
			return Allocation{}, fmt.Errorf("%s: %d prices for %d GPU types: give a price per GPU-hour for every type", p.Name(), len(in.PricePerHour), len(in.Types))
		}
		for j, c := range in.PricePerHour {
			if !(c > 0) {
				return Allocation{}, fmt.Errorf("%s: price of %s is %v: want a positive cost per GPU-hour", p.Name(), in.Types[j], c)
			}
		}
	}
	tp, ok := effective(in)
	k := len(in.Types)
	var idx []int
	var v, sf []float64
	for i, row := range tp {
		if !ok[i] {
			continue
		}
		idx = append(idx, i)
		best := 0.0
		for _, x := range row {
			best = math.Max(best, x)
		}
		for j, x := range row {
			val := x / best
			if p.PerDollar {
				val /= in.PricePerHour[j] * float64(in.Jobs[i].ScaleFactor)
			}
			v = append(v, val)
		}
		sf = append(sf, float64(in.Jobs[i].ScaleFactor))
	}
	_, x, err := solveSeparable(len(idx), k, v, sf, in.Capacity)
	if err != nil {
		return Allocation{}, fmt.Errorf("%s: %w", p.Name(), err)
	}
	return expand(len(in.Jobs), k, idx, x), nil
}

// FIFO gives whole GPUs to jobs in arrival order (the order of in.Jobs):
// each job takes the fastest type that still has room for all its workers;
// a job that fits nowhere waits, and later jobs may still start
// (no head-of-line blocking, as in Gavel's FIFO).
type FIFO struct{}

// Name implements Policy.
func (FIFO) Name() string { return "fifo" }

// Allocate implements Policy.
func (FIFO) Allocate(in Input) (Allocation, error) {
	if err := in.Validate(); err != nil {
		return Allocation{}, err
	}
	k := len(in.Types)
	free := append([]float64(nil), in.Capacity...)
	out := expand(len(in.Jobs), k, nil, nil)
	for i, jb := range in.Jobs {
		sf := float64(jb.ScaleFactor)
		best := -1
		for j, v := range jb.Throughput {
			if v > 0 && free[j] >= sf && (best < 0 || v > jb.Throughput[best]) {
				best = j
			}
		}
		if best >= 0 {
			out.X[i][best] = 1
			free[best] -= sf
		}
	}
	return out, nil
}
