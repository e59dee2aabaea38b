// Package lp is a dense two-phase simplex solver for small linear programs.
//
// hadar's allocation problems are large (thousands of jobs) but have only a
// handful of coupling constraints (one per GPU type); the policies solve
// them by column generation (ColumnGeneration), whose master problem has
// K+1 rows and tens to hundreds of columns. A dense tableau is exact and fast at that size. The
// same solver, run on the full problem of a small instance, is the
// independent check the policy tests compare against.
package lp

import (
	"errors"
	"fmt"
	"math"
)

// Kind is the sense of one constraint row.
type Kind int

// Constraint senses.
const (
	LE Kind = iota // a·x <= b
	GE             // a·x >= b
	EQ             // a·x == b
)

// Problem is: maximize C·x subject to A[i]·x (Kind[i]) B[i], x >= 0.
type Problem struct {
	C    []float64
	A    [][]float64
	B    []float64
	Kind []Kind // nil means every row is LE
}

// Solution of a Problem.
type Solution struct {
	X         []float64
	Objective float64
	// Duals holds one shadow price per row: the rate at which the optimum
	// grows as B[i] grows.
	Duals []float64
	// Pivots counts simplex iterations over both phases.
	Pivots int
}

// Errors a Problem can end in.
var (
	ErrInfeasible = errors.New("lp: infeasible")
	ErrUnbounded  = errors.New("lp: unbounded")
)

const eps = 1e-9

// maxPivots bounds the work on a problem; Bland's rule guarantees
// termination, this only turns a bug into an error instead of a hang.
const maxPivots = 1_000_000

// Solve solves p exactly up to floating-point tolerance.
func Solve(p Problem) (Solution, error) {
	n := len(p.C)
	m := len(p.A)
	if len(p.B) != m {
		return Solution{}, fmt.Errorf("lp: %d rows in A but %d in B", m, len(p.B))
	}
	if p.Kind != nil && len(p.Kind) != m {
		return Solution{}, fmt.Errorf("lp: %d rows in A but %d in Kind", m, len(p.Kind))
	}
	for i, row := range p.A {
		if len(row) != n {
			return Solution{}, fmt.Errorf("lp: row %d has %d columns, want %d", i, len(row), n)
		}
	}
	t := newTableau(p)
	if err := t.phase1(); err != nil {
		return Solution{Pivots: t.pivots}, err
	}
	if err := t.phase2(); err != nil {
		return Solution{Pivots: t.pivots}, err
	}
	return t.solution(), nil
}

// tableau columns: [0,n) structural, then one slack/surplus per
// inequality row, then one artificial per row that needs it; the last
// column is the right-hand side.
type tableau struct {
	m, n      int
	cols      int // structural + slack + artificial
	rows      [][]float64
	obj       []float64 // reduced costs row (z_j - c_j), last entry = objective value
	basis     []int
	c         []float64 // phase-2 costs of every column
	artStart  int
	rowSign   []float64 // -1 when the row was negated to make b >= 0
	dualCol   []int     // column whose reduced cost yields the row's dual
	dualSign  []float64
	pivots    int
	isArt     []bool
	blockArts bool
}

func newTableau(p Problem) *tableau {
	n, m := len(p.C), len(p.A)
	kind := func(i int) Kind {
		if p.Kind == nil {
			return LE
		}
		return p.Kind[i]
	}
	// Normalize rows to b >= 0.
	A := make([][]float64, m)
	B := make([]float64, m)
	K := make([]Kind, m)
	sign := make([]float64, m)
	for i := range m {
		A[i] = append([]float64(nil), p.A[i]...)
		B[i] = p.B[i]
		K[i] = kind(i)
		sign[i] = 1
		if B[i] < 0 {
			sign[i] = -1
			B[i] = -B[i]
			for j := range A[i] {
				A[i][j] = -A[i][j]
			}
			switch K[i] {
			case LE:
				K[i] = GE
			case GE:
				K[i] = LE
			}
		}
	}
	nSlack := 0
	nArt := 0
	for i := range m {
		if K[i] != EQ {
			nSlack++
		}
		if K[i] != LE {
			nArt++
		}
	}
	cols := n + nSlack + nArt
	t := &tableau{m: m, n: n, cols: cols, artStart: n + nSlack, rowSign: sign}
	t.rows = make([][]float64, m)
	t.basis = make([]int, m)
	t.dualCol = make([]int, m)
	t.dualSign = make([]float64, m)
	t.c = make([]float64, cols)
	copy(t.c, p.C)
	t.isArt = make([]bool, cols)
	s, a := n, t.artStart
	for i := range m {
		row := make([]float64, cols+1)
		copy(row, A[i])
		row[cols] = B[i]
		switch K[i] {
		case LE:
			row[s] = 1
			t.basis[i] = s
			t.dualCol[i], t.dualSign[i] = s, 1
			s++
		case GE:
			row[s] = -1
			t.dualCol[i], t.dualSign[i] = s, -1
			s++
			row[a] = 1
			t.basis[i] = a
			t.isArt[a] = true
			a++
		case EQ:
			row[a] = 1
			t.basis[i] = a
			t.isArt[a] = true
			t.dualCol[i], t.dualSign[i] = a, 1
			a++
		}
		t.rows[i] = row
	}
	return t
}

// setObjective loads costs c (maximize) as a reduced-cost row for the
// current basis.
func (t *tableau) setObjective(c []float64) {
	t.obj = make([]float64, t.cols+1)
	for j := 0; j < t.cols; j++ {
		t.obj[j] = -c[j]
	}
	for i, b := range t.basis {
		cb := c[b]
		if cb == 0 {
			continue
		}
		row := t.rows[i]
		for j := 0; j <= t.cols; j++ {
			t.obj[j] += cb * row[j]
		}
	}
}

func (t *tableau) phase1() error {
	if t.artStart == t.cols {
		return nil
	}
	c := make([]float64, t.cols)
	for j := t.artStart; j < t.cols; j++ {
		c[j] = -1 // maximize -sum(artificials)
	}
	t.setObjective(c)
	if err := t.iterate(); err != nil {
		return err
	}
	if t.obj[t.cols] < -1e-7*(1+t.rhsScale()) {
		return ErrInfeasible
	}
	// Drive remaining (zero-valued) artificials out of the basis.
	for i, b := range t.basis {
		if !t.isArt[b] {
			continue
		}
		for j := 0; j < t.artStart; j++ {
			if math.Abs(t.rows[i][j]) > eps {
				t.pivot(i, j)
				break
			}
		}
	}
	return nil
}

func (t *tableau) rhsScale() float64 {
	s := 0.0
	for _, r := range t.rows {
		s = math.Max(s, math.Abs(r[t.cols]))
	}
	return s
}

func (t *tableau) phase2() error {
	t.blockArts = true
	t.setObjective(t.c)
	return t.iterate()
}

// iterate runs primal simplex pivots until optimal. Dantzig's rule picks the
// entering column; after a run of degenerate pivots it switches to Bland's
// rule, which cannot cycle.
func (t *tableau) iterate() error {
	degenerate := 0
	for {
		if t.pivots > maxPivots {
			return fmt.Errorf("lp: no convergence after %d pivots", t.pivots)
		}
		bland := degenerate > 50
		enter := -1
		best := -eps
		for j := 0; j < t.cols; j++ {
			if t.blockArts && t.isArt[j] {
				continue
			}
			if t.obj[j] < best {
				enter = j
				if bland {
					break
				}
				best = t.obj[j]
			}
		}
		if enter < 0 {
			return nil
		}
		leave := -1
		ratio := math.Inf(1)
		for i, row := range t.rows {
			a := row[enter]
			if a <= eps {
				continue
			}
			r := row[t.cols] / a
			if r < ratio-eps || (r < ratio+eps && leave >= 0 && t.basis[i] < t.basis[leave]) {
				ratio, leave = r, i
			}
		}
		if leave < 0 {
			return ErrUnbounded
		}
		if ratio < eps {
			degenerate++
		} else {
			degenerate = 0
		}
		t.pivot(leave, enter)
	}
}

func (t *tableau) pivot(r, c int) {
	t.pivots++
	row := t.rows[r]
	inv := 1 / row[c]
	for j := range row {
		row[j] *= inv
	}
	row[c] = 1
	for i, other := range t.rows {
		if i == r {
			continue
		}
		f := other[c]
		if f == 0 {
			continue
		}
		for j, v := range row {
			if v != 0 {
				other[j] -= f * v
			}
		}
		other[c] = 0
	}
	if f := t.obj[c]; f != 0 {
		for j, v := range row {
			if v != 0 {
				t.obj[j] -= f * v
			}
		}
		t.obj[c] = 0
	}
	t.basis[r] = c
}

func (t *tableau) solution() Solution {
	x := make([]float64, t.n)
	for i, b := range t.basis {
		if b < t.n {
			x[b] = t.rows[i][t.cols]
		}
	}
	duals := make([]float64, t.m)
	for i := range t.m {
		duals[i] = t.dualSign[i] * t.obj[t.dualCol[i]] * t.rowSign[i]
	}
	obj := 0.0
	for j := 0; j < t.n; j++ {
		obj += t.c[j] * x[j]
	}
	return Solution{X: x, Objective: obj, Duals: duals, Pivots: t.pivots}
}
