package lp

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func TestSolveHandWorked(t *testing.T) {
	tests := []struct {
		name string
		p    Problem
		obj  float64
		x    []float64
		err  error
	}{
		{
			// max 3x+5y, x<=4, 2y<=12, 3x+2y<=18 -> (2,6), 36 (textbook).
			name: "wyndor",
			p:    Problem{C: []float64{3, 5}, A: [][]float64{{1, 0}, {0, 2}, {3, 2}}, B: []float64{4, 12, 18}},
			obj:  36, x: []float64{2, 6},
		},
		{
			// max x+y, x+y>=2, x<=1, y<=3, x-y==0 -> x=y=1, 2.
			name: "mixed senses",
			p: Problem{C: []float64{1, 1}, A: [][]float64{{1, 1}, {1, 0}, {0, 1}, {1, -1}}, B: []float64{2, 1, 3, 0},
				Kind: []Kind{GE, LE, LE, EQ}},
			obj: 2, x: []float64{1, 1},
		},
		{
			// negative right-hand side: -x <= -1 means x >= 1; max -x -> x=1.
			name: "negative rhs",
			p:    Problem{C: []float64{-1}, A: [][]float64{{-1}}, B: []float64{-1}},
			obj:  -1, x: []float64{1},
		},
		{
			name: "infeasible",
			p:    Problem{C: []float64{1}, A: [][]float64{{1}, {1}}, B: []float64{1, 2}, Kind: []Kind{LE, GE}},
			err:  ErrInfeasible,
		},
		{
			name: "unbounded",
			p:    Problem{C: []float64{1, 0}, A: [][]float64{{-1, 1}}, B: []float64{1}},
			err:  ErrUnbounded,
		},
		{
			// Degenerate vertex (Beale's cycling example); Bland's fallback must finish.
			name: "beale",
			p: Problem{
				C: []float64{0.75, -150, 0.02, -6},
				A: [][]float64{{0.25, -60, -0.04, 9}, {0.5, -90, -0.02, 3}, {0, 0, 1, 0}},
				B: []float64{0, 0, 1},
			},
			obj: 0.05, x: []float64{0.04, 0, 1, 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Solve(tc.p)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(s.Objective-tc.obj) > 1e-7 {
				t.Fatalf("objective %v, want %v", s.Objective, tc.obj)
			}
			for j := range tc.x {
				if math.Abs(s.X[j]-tc.x[j]) > 1e-7 {
					t.Fatalf("x = %v, want %v", s.X, tc.x)
				}
			}
			checkDuals(t, tc.p, s)
		})
	}
}

// checkDuals verifies strong duality and dual feasibility, which together
// certify optimality independently of how the solver got there.
func checkDuals(t *testing.T, p Problem, s Solution) {
	t.Helper()
	by := 0.0
	for i, y := range s.Duals {
		by += p.B[i] * y
		k := LE
		if p.Kind != nil {
			k = p.Kind[i]
		}
		if (k == LE && y < -1e-7) || (k == GE && y > 1e-7) {
			t.Fatalf("dual %d = %v has the wrong sign for kind %v", i, y, k)
		}
	}
	if math.Abs(by-s.Objective) > 1e-6*(1+math.Abs(s.Objective)) {
		t.Fatalf("b·y = %v but objective = %v", by, s.Objective)
	}
	for j := range p.C {
		ay := 0.0
		for i := range p.A {
			ay += p.A[i][j] * s.Duals[i]
		}
		if ay < p.C[j]-1e-6 {
			t.Fatalf("dual infeasible at column %d: A^T y = %v < c = %v", j, ay, p.C[j])
		}
	}
}

func checkFeasible(t *testing.T, p Problem, x []float64) {
	t.Helper()
	for j, v := range x {
		if v < -1e-9 {
			t.Fatalf("x[%d] = %v < 0", j, v)
		}
	}
	for i, row := range p.A {
		ax := 0.0
		for j, a := range row {
			ax += a * x[j]
		}
		if ax > p.B[i]+1e-7 {
			t.Fatalf("row %d: %v > %v", i, ax, p.B[i])
		}
	}
}

// bruteForce enumerates every basic solution of {Ax<=b, x>=0} (n=2 or 3)
// and returns the best objective over the feasible ones.
func bruteForce(p Problem) float64 {
	n := len(p.C)
	// Hyperplanes: rows of A (as equalities) and x_j = 0.
	var planes [][]float64
	var rhs []float64
	for i, row := range p.A {
		planes = append(planes, row)
		rhs = append(rhs, p.B[i])
	}
	for j := range n {
		e := make([]float64, n)
		e[j] = 1
		planes = append(planes, e)
		rhs = append(rhs, 0)
	}
	best := math.Inf(-1)
	var choose func(start int, picked []int)
	choose = func(start int, picked []int) {
		if len(picked) == n {
			x, ok := solveSquare(planes, rhs, picked)
			if !ok {
				return
			}
			for _, v := range x {
				if v < -1e-9 {
					return
				}
			}
			for i, row := range p.A {
				ax := 0.0
				for j := range row {
					ax += row[j] * x[j]
				}
				if ax > p.B[i]+1e-9 {
					return
				}
			}
			v := 0.0
			for j := range x {
				v += p.C[j] * x[j]
			}
			best = math.Max(best, v)
			return
		}
		for k := start; k < len(planes); k++ {
			choose(k+1, append(picked, k))
		}
	}
	choose(0, nil)
	return best
}

func solveSquare(planes [][]float64, rhs []float64, idx []int) ([]float64, bool) {
	n := len(idx)
	m := make([][]float64, n)
	for r, k := range idx {
		m[r] = append(append([]float64(nil), planes[k]...), rhs[k])
	}
	for c := range n {
		p := -1
		for r := c; r < n; r++ {
			if math.Abs(m[r][c]) > 1e-12 && (p < 0 || math.Abs(m[r][c]) > math.Abs(m[p][c])) {
				p = r
			}
		}
		if p < 0 {
			return nil, false
		}
		m[c], m[p] = m[p], m[c]
		for r := range n {
			if r == c {
				continue
			}
			f := m[r][c] / m[c][c]
			for k := c; k <= n; k++ {
				m[r][k] -= f * m[c][k]
			}
		}
	}
	x := make([]float64, n)
	for r := range n {
		x[r] = m[r][n] / m[r][r]
	}
	return x, true
}

func TestSolveMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 2 + rng.IntN(2)
		m := 1 + rng.IntN(5)
		p := Problem{C: make([]float64, n)}
		for j := range n {
			p.C[j] = rng.Float64()*4 - 1
		}
		for range m {
			row := make([]float64, n)
			for j := range n {
				row[j] = rng.Float64()*4 - 1
			}
			p.A = append(p.A, row)
			p.B = append(p.B, rng.Float64()*5)
		}
		// A box keeps every instance bounded.
		for j := range n {
			row := make([]float64, n)
			row[j] = 1
			p.A = append(p.A, row)
			p.B = append(p.B, 3)
		}
		s, err := Solve(p)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		want := bruteForce(p)
		if math.Abs(s.Objective-want) > 1e-7 {
			t.Fatalf("trial %d: objective %v, brute force %v", trial, s.Objective, want)
		}
		checkFeasible(t, p, s.X)
		checkDuals(t, p, s)
	}
}

func TestSolveRejectsRaggedInput(t *testing.T) {
	_, err := Solve(Problem{C: []float64{1, 2}, A: [][]float64{{1}}, B: []float64{1}})
	if err == nil {
		t.Fatal("want an error for a short row")
	}
}
