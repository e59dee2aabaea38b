package lp

import (
	"errors"
	"fmt"
	"math"
)

// ErrNoConvergence is what ColumnGeneration's error wraps when MaxIter
// columns did not close the gap: its result is then the last master's
// combination, feasible, with Gap the certified distance from the
// optimum, for a caller to judge.
var ErrNoConvergence = errors.New("no convergence")

// Column generation for the allocation problems of hadar's policies.
//
// Gavel's allocations (planner/policy) and Sia's LP relaxation
// (planner/sia) share one shape: each job's fractions sum to at most 1,
// K coupling capacity rows (one per GPU type) weigh each fraction by the
// job's width, and the objective is linear in whole-round plans. With K
// small and jobs many, Dantzig-Wolfe decomposition is exact and fast: a
// column is a whole-cluster plan (each job's fractions, within its own
// rows), the master LP chooses a convex combination of the plans found
// so far under the K capacity rows and a convexity row (its slack is the
// empty plan, worth 0), and the master's duals are the capacity prices
// under which the caller's pricer finds the next plan. Pricing decomposes
// per job. When no plan's reduced cost beats the convexity row's dual, the
// master is optimal for the whole problem; the reduced cost is the
// Lagrangian gap that certifies it.

// Column is one plan of a column generation: its value in the objective,
// its use of each capacity row, and Plan, the caller's own description of
// it (returned with the column's weight in the optimum).
type Column[P any] struct {
	Value float64
	Usage []float64 // one entry per capacity row
	Plan  P
}

// Pricer returns, for capacity prices lambda (one per capacity row, each
// >= 0), a plan of largest reduced cost Value - lambda·Usage, and that
// reduced cost as the pricer computes it. When no plan has a positive
// one, the empty plan (Value 0, reduced cost 0) is the best. lambda is
// only valid during the call.
type Pricer[P any] func(lambda []float64) (Column[P], float64)

// ColGenOptions bound a column generation.
type ColGenOptions struct {
	// RelTol stops when the best plan's reduced cost, less the convexity
	// row's dual, is within RelTol of max(1, |objective|).
	RelTol float64
	// MaxIter bounds the number of columns generated.
	MaxIter int
}

// ColGenResult is the optimal convex combination of the generated plans.
type ColGenResult[P any] struct {
	Objective float64
	// Columns are the plans generated, in order; Weights[c] is the weight
	// of Columns[c] in the optimum (they sum to at most 1).
	Columns []Column[P]
	Weights []float64
	// Iters is the number of master problems solved.
	Iters int
	// Gap is the last pricing's reduced cost less the convexity dual
	// (>= 0): the objective is within Gap of the true optimum. Set on
	// convergence and with ErrNoConvergence.
	Gap float64
}

// ColumnGeneration maximizes sum_c Value_c w_c over the combinations w >=
// 0 of the plans price generates, subject to sum_c Usage_c[j] w_c <=
// capacity[j] for every capacity row j and sum_c w_c <= 1 (convexity).
// It prices first at prices 0 and always adds that plan; after each
// master it prices at the master's capacity duals (clamped at 0), and
// stops when the plan found has a reduced cost, less the convexity row's
// dual, within opt.RelTol of max(1, |objective|). That plan is not added.
// After opt.MaxIter columns it returns an error wrapping
// ErrNoConvergence with the last master's combination and its Gap; when a
// master fails, an error with the combination before it. Deterministic: the same pricer
// gives the same columns, weights and objective, bit for bit.
func ColumnGeneration[P any](capacity []float64, price Pricer[P], opt ColGenOptions) (ColGenResult[P], error) {
	k := len(capacity)
	lambda := make([]float64, k)
	sigma := 0.0
	var res ColGenResult[P]
	for iter := 0; ; iter++ {
		col, reduced := price(lambda)
		reduced -= sigma
		if iter > 0 && reduced <= opt.RelTol*math.Max(1, math.Abs(res.Objective)) {
			res.Gap = math.Max(0, reduced)
			res.Iters = iter
			return res, nil
		}
		if iter >= opt.MaxIter {
			res.Iters, res.Gap = iter, math.Max(0, reduced)
			return res, fmt.Errorf("lp: column generation: %w after %d columns (gap %.3g)", ErrNoConvergence, iter, reduced)
		}
		if len(col.Usage) != k {
			return res, fmt.Errorf("lp: column generation: a plan uses %d rows, want %d", len(col.Usage), k)
		}
		res.Columns = append(res.Columns, col)

		m := Problem{C: make([]float64, len(res.Columns)), A: make([][]float64, k+1), B: make([]float64, k+1)}
		for j := range k + 1 {
			m.A[j] = make([]float64, len(res.Columns))
		}
		for c, col := range res.Columns {
			m.C[c] = col.Value
			for j := range k {
				m.A[j][c] = col.Usage[j]
			}
			m.A[k][c] = 1
		}
		copy(m.B, capacity)
		m.B[k] = 1
		sol, err := Solve(m)
		if err != nil {
			res.Columns = res.Columns[:len(res.Weights)]
			return res, fmt.Errorf("lp: column generation master: %w", err)
		}
		for j := range lambda {
			lambda[j] = math.Max(0, sol.Duals[j])
		}
		sigma = math.Max(0, sol.Duals[k])
		res.Objective, res.Weights = sol.Objective, sol.X
	}
}
