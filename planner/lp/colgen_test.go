package lp

import (
	"errors"
	"math"
	"testing"
)

// twoJobs prices plans of two jobs on one GPU type: job a gains 3, job b
// gains 2, each on one GPU; a plan takes every job whose gain beats its
// price.
func twoJobs(calls *int) Pricer[[]bool] {
	gain := []float64{3, 2}
	return func(lambda []float64) (Column[[]bool], float64) {
		*calls++
		col := Column[[]bool]{Usage: make([]float64, 1), Plan: make([]bool, len(gain))}
		reduced := 0.0
		for i, g := range gain {
			if r := g - lambda[0]; r > 0 {
				col.Plan[i] = true
				col.Value += g
				col.Usage[0]++
				reduced += r
			}
		}
		return col, reduced
	}
}

// TestColumnGenerationHandSolved: max 3a + 2b, a <= 1, b <= 1, a + b <=
// 1.5 has its optimum 4 at a = 1, b = 0.5. By hand: at prices 0 the plan
// is {a, b} (value 5, usage 2); the master max 5w, 2w <= 1.5, w <= 1 has
// w = 0.75, objective 3.75, capacity dual 2.5. At 2.5 the plan is {a}
// (value 3, usage 1, reduced cost 0.5); the master over both has w =
// (0.5, 0.5), objective 4, duals lambda = 2 and sigma = 1 (2 lambda +
// sigma = 5, lambda + sigma = 3). At 2 the plan is {a} again, reduced cost
// 1 = sigma: optimal after two masters.
func TestColumnGenerationHandSolved(t *testing.T) {
	calls := 0
	res, err := ColumnGeneration([]float64{1.5}, twoJobs(&calls), ColGenOptions{RelTol: 1e-9, MaxIter: 100})
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9 }
	if !near(res.Objective, 4) || res.Iters != 2 || calls != 3 || !near(res.Gap, 0) {
		t.Fatalf("objective %v iters %d calls %d gap %v, want 4, 2, 3, 0", res.Objective, res.Iters, calls, res.Gap)
	}
	if len(res.Columns) != 2 || len(res.Weights) != 2 {
		t.Fatalf("%d columns, %d weights, want 2, 2", len(res.Columns), len(res.Weights))
	}
	if c := res.Columns[0]; c.Value != 5 || c.Usage[0] != 2 || !c.Plan[0] || !c.Plan[1] {
		t.Errorf("first column %+v, want {a, b}", c)
	}
	if c := res.Columns[1]; c.Value != 3 || c.Usage[0] != 1 || !c.Plan[0] || c.Plan[1] {
		t.Errorf("second column %+v, want {a}", c)
	}
	// The jobs' fractions: a = 0.5 + 0.5, b = 0.5.
	x := make([]float64, 2)
	for c, w := range res.Weights {
		if !near(w, 0.5) {
			t.Errorf("weight %d = %v, want 0.5", c, w)
		}
		for i, on := range res.Columns[c].Plan {
			if on {
				x[i] += w
			}
		}
	}
	if !near(x[0], 1) || !near(x[1], 0.5) {
		t.Errorf("fractions %v, want [1 0.5]", x)
	}
	// The same problem solved whole.
	whole, err := Solve(Problem{C: []float64{3, 2}, A: [][]float64{{1, 0}, {0, 1}, {1, 1}}, B: []float64{1, 1, 1.5}})
	if err != nil || !near(whole.Objective, res.Objective) {
		t.Errorf("whole LP: %v, %v; column generation %v", whole.Objective, err, res.Objective)
	}
}

// With room to spare for every job, the first plan is optimal: the
// capacity's dual is 0, the convexity row's 5, and the plan at price 0
// prices out to 0 after one master.
func TestColumnGenerationRoomForAll(t *testing.T) {
	calls := 0
	res, err := ColumnGeneration([]float64{3}, twoJobs(&calls), ColGenOptions{RelTol: 1e-9, MaxIter: 100})
	if err != nil || res.Objective != 5 || res.Iters != 1 || len(res.Weights) != 1 || res.Weights[0] != 1 {
		t.Fatalf("%+v, %v; want objective 5 after one master, weight 1", res, err)
	}
}

func TestColumnGenerationLimits(t *testing.T) {
	calls := 0
	res, err := ColumnGeneration([]float64{1.5}, twoJobs(&calls), ColGenOptions{RelTol: 1e-9, MaxIter: 1})
	if err == nil || res.Iters != 1 || res.Objective != 3.75 || len(res.Columns) != 1 {
		t.Fatalf("after one column: %+v, %v; want an error and the first master's 3.75", res, err)
	}
	// Its gap, by hand (TestColumnGenerationHandSolved): at the first
	// master's price 2.5 the plan {a} has reduced cost 0.5, sigma 0; the
	// optimum, 4, is within it of 3.75.
	if !errors.Is(err, ErrNoConvergence) || res.Gap != 0.5 {
		t.Fatalf("after one column: gap %v, error %v; want 0.5 and ErrNoConvergence", res.Gap, err)
	}
	bad := func([]float64) (Column[int], float64) { return Column[int]{Value: 1, Usage: []float64{1}}, 1 }
	if _, err := ColumnGeneration([]float64{1, 1}, bad, ColGenOptions{RelTol: 1e-9, MaxIter: 10}); err == nil || errors.Is(err, ErrNoConvergence) {
		t.Fatalf("a plan with the wrong number of rows: %v, want an error of its own", err)
	}
	// A negative capacity makes the master infeasible: the error wraps
	// ErrInfeasible.
	neg := func([]float64) (Column[int], float64) { return Column[int]{Value: 1, Usage: []float64{1}}, 1 }
	if _, err := ColumnGeneration([]float64{-1}, neg, ColGenOptions{RelTol: 1e-9, MaxIter: 10}); !errors.Is(err, ErrInfeasible) {
		t.Fatalf("negative capacity: %v, want ErrInfeasible", err)
	}
}
