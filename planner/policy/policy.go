// Package policy computes heterogeneity-aware allocations: for every active
// job, the fraction of wall time it should spend on each GPU type. These are
// Gavel's policies (OSDI 2020) and their heterogeneity-agnostic baselines,
// solved exactly by column generation over a small simplex master.
package policy

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// JobState is what a policy knows of one active job.
type JobState struct {
	ID          string
	ScaleFactor int
	Weight      float64
	// Throughput is steps/s of the whole job on each GPU type of
	// Input.Types (consolidated placement); 0 means it cannot run there.
	Throughput []float64
	TotalSteps float64
	Remaining  float64
	// Age is the time since the job arrived, in seconds.
	Age float64
}

// Input is one allocation problem.
type Input struct {
	Types    []planner.GPUType
	Capacity []float64 // GPUs per type
	Jobs     []JobState
	// PricePerHour is the cost of one GPU-hour per type (cost policy only).
	PricePerHour []float64
}

// Allocation holds X[i][j]: the fraction of wall time job i should run on
// type j. Rows sum to at most 1; sum_i sf_i X[i][j] <= Capacity[j].
type Allocation struct {
	X [][]float64
}

// Policy turns active jobs into an allocation.
type Policy interface {
	Name() string
	Allocate(in Input) (Allocation, error)
}

// Validate checks the shape and values of an Input.
func (in Input) Validate() error {
	k := len(in.Types)
	if k == 0 {
		return fmt.Errorf("policy input: no GPU types")
	}
	if len(in.Capacity) != k {
		return fmt.Errorf("policy input: %d capacities for %d GPU types", len(in.Capacity), k)
	}
	for j, c := range in.Capacity {
		if !(c >= 0) {
			return fmt.Errorf("policy input: capacity of %s is %v: want >= 0", in.Types[j], c)
		}
	}
	for _, jb := range in.Jobs {
		if len(jb.Throughput) != k {
			return fmt.Errorf("policy input: job %s has %d throughputs for %d GPU types", jb.ID, len(jb.Throughput), k)
		}
		if jb.ScaleFactor <= 0 {
			return fmt.Errorf("policy input: job %s: scale factor %d: want > 0", jb.ID, jb.ScaleFactor)
		}
		for j, v := range jb.Throughput {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("policy input: job %s: throughput on %s is %v: want a finite number >= 0", jb.ID, in.Types[j], v)
			}
		}
		// Finish-time fairness and min makespan divide by what is left; a
		// job with nothing left is done and must not be in the input.
		if !(jb.Remaining > 0) || math.IsInf(jb.Remaining, 0) {
			return fmt.Errorf("policy input: job %s: remaining steps %v: want a finite number > 0 (remove finished jobs from the input)", jb.ID, jb.Remaining)
		}
		if !(jb.Age >= 0) || math.IsInf(jb.Age, 0) {
			return fmt.Errorf("policy input: job %s: age %v s: want a finite number of seconds >= 0", jb.ID, jb.Age)
		}
	}
	return nil
}

// Names lists the policies New knows, in a stable order.
func Names() []string {
	names := make([]string, 0, len(constructors))
	for n := range constructors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

var constructors = map[string]func() Policy{
	"fifo":                    func() Policy { return FIFO{} },
	"gavel-maxmin":            func() Policy { return MaxMin{} },
	"gavel-maxmin-agnostic":   func() Policy { return MaxMin{Agnostic: true} },
	"gavel-makespan":          func() Policy { return Makespan{} },
	"gavel-makespan-agnostic": func() Policy { return Makespan{Agnostic: true} },
	"gavel-ftf":               func() Policy { return FinishTimeFairness{} },
	"gavel-ftf-agnostic":      func() Policy { return FinishTimeFairness{Agnostic: true} },
	"gavel-maxthroughput":     func() Policy { return MaxThroughput{} },
	"gavel-cost":              func() Policy { return MaxThroughput{PerDollar: true} },
}

// New returns the policy of the given name.
func New(name string) (Policy, error) {
	c, ok := constructors[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q: want one of %s", name, strings.Join(Names(), ", "))
	}
	return c(), nil
}

// runnable splits jobs into those that can run on some type (with enough
// GPUs of it) and those that cannot; effective throughput is zeroed where a
// job's scale factor exceeds the type's capacity.
func effective(in Input) (tp [][]float64, ok []bool) {
	tp = make([][]float64, len(in.Jobs))
	ok = make([]bool, len(in.Jobs))
	for i, jb := range in.Jobs {
		row := make([]float64, len(in.Types))
		for j, v := range jb.Throughput {
			if planner.Runnable(v, jb.ScaleFactor, in.Capacity[j]) {
				row[j] = v
				ok[i] = true
			}
		}
		tp[i] = row
	}
	return tp, ok
}

// agnostic replaces every runnable throughput of a job by one type-blind
// estimate: its best throughput. A heterogeneity-agnostic scheduler still
// knows where a job cannot run (memory), but not how fast it runs where.
func agnostic(tp [][]float64, useOnes bool) [][]float64 {
	out := make([][]float64, len(tp))
	for i, row := range tp {
		best := 0.0
		for _, v := range row {
			best = math.Max(best, v)
		}
		if useOnes {
			best = 1
		}
		out[i] = make([]float64, len(row))
		for j, v := range row {
			if v > 0 {
				out[i][j] = best
			}
		}
	}
	return out
}

// solveGains runs the max-min solver over the runnable jobs; gains[i] is
// the per-type gain of job i. Jobs that cannot run get a zero row.
func solveGains(in Input, gains [][]float64, ok []bool) (float64, Allocation, error) {
	k := len(in.Types)
	var idx []int
	for i := range in.Jobs {
		if ok[i] {
			idx = append(idx, i)
		}
	}
	a := make([]float64, 0, len(idx)*k)
	sf := make([]float64, 0, len(idx))
	for _, i := range idx {
		a = append(a, gains[i]...)
		sf = append(sf, float64(in.Jobs[i].ScaleFactor))
	}
	t, x, err := solveMaxMin(len(idx), k, a, sf, in.Capacity)
	if err != nil {
		return 0, Allocation{}, err
	}
	return t, expand(len(in.Jobs), k, idx, x), nil
}

func expand(n, k int, idx []int, x []float64) Allocation {
	out := Allocation{X: make([][]float64, n)}
	for i := range out.X {
		out.X[i] = make([]float64, k)
	}
	for q, i := range idx {
		copy(out.X[i], x[q*k:q*k+k])
	}
	return out
}

// Throughputs returns each job's effective throughput under an allocation.
func Throughputs(in Input, a Allocation) []float64 {
	out := make([]float64, len(in.Jobs))
	for i, jb := range in.Jobs {
		for j, x := range a.X[i] {
			out[i] += jb.Throughput[j] * x
		}
	}
	return out
}

// typeBlind spreads each job's total time share over the types it can run
// on in proportion to their GPU counts. An agnostic LP has many optima
// (every runnable type looks alike); its vertex solution pins jobs to
// arbitrary types for their whole life, which makes the baseline worse
// than any real type-blind scheduler. The proportional split is the
// symmetric optimum, and rows are scaled down where a type would overflow.
func typeBlind(in Input, a Allocation) Allocation {
	k := len(in.Types)
	out := expand(len(a.X), k, nil, nil)
	used := make([]float64, k)
	for i, row := range a.X {
		share := 0.0
		for _, x := range row {
			share += x
		}
		if share <= 0 {
			continue
		}
		total := 0.0
		for j, v := range in.Jobs[i].Throughput {
			if planner.Runnable(v, in.Jobs[i].ScaleFactor, in.Capacity[j]) {
				total += in.Capacity[j]
			}
		}
		for j, v := range in.Jobs[i].Throughput {
			if planner.Runnable(v, in.Jobs[i].ScaleFactor, in.Capacity[j]) {
				out.X[i][j] = share * in.Capacity[j] / total
				used[j] += float64(in.Jobs[i].ScaleFactor) * out.X[i][j]
			}
		}
	}
	for j := range used {
		if used[j] <= in.Capacity[j] {
			continue
		}
		f := in.Capacity[j] / used[j]
		for i := range out.X {
			out.X[i][j] *= f
		}
	}
	return out
}
