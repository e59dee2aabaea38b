package assign

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner/lp"
)

// The LP relaxation bounds the exact optimum and its rounding comes close
// to it on random instances too large for the exact search to be chosen.
func TestRoundingIsNearTheExactOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	worst := 1.0
	for trial := range 40 {
		p := Problem{N: 9, K: 3, M: 3, Typ: []int{0, 1, 2}, Capacity: []float64{float64(2 + rng.IntN(4)), float64(2 + rng.IntN(4)), float64(2 + rng.IntN(4))}}
		for range p.N {
			w := float64(1 + rng.IntN(2))
			for range p.K {
				p.Width = append(p.Width, w)
				g := 0.0
				if rng.Float64() < 0.9 {
					g = 0.1 + rng.Float64()
				}
				p.Gain = append(p.Gain, g)
			}
		}
		exact := branchAndBound(p)
		got, err := lpRound(p)
		if err != nil {
			t.Fatal(err)
		}
		left := append([]float64(nil), p.Capacity...)
		for i, j := range got.Choice {
			if j >= 0 {
				if p.G(i, j) <= 0 {
					t.Fatalf("trial %d: job %d on type %d where it has no configuration", trial, i, j)
				}
				left[p.Typ[j]] -= p.W(i, j)
			}
		}
		for j, l := range left {
			if l < 0 {
				t.Fatalf("trial %d: type %d over-committed by %v", trial, j, -l)
			}
		}
		if got.Bound < exact.Value-1e-9 {
			t.Fatalf("trial %d: LP bound %v below the exact optimum %v", trial, got.Bound, exact.Value)
		}
		if got.Value > exact.Value+1e-9 {
			t.Fatalf("trial %d: rounding %v above the optimum %v", trial, got.Value, exact.Value)
		}
		if got.Value/exact.Value < 0.9 {
			x, b, _ := relax(p)
			t.Logf("trial %d: cap %v width %v gain %.2f\nx %.2f bound %v exact %v %v got %v %v", trial, p.Capacity, p.Width, p.Gain, x, b, exact.Value, exact.Choice, got.Value, got.Choice)
		}
		worst = math.Min(worst, got.Value/exact.Value)
	}
	if worst < 0.9 {
		t.Fatalf("rounding reached %.3f of the optimum at worst, want >= 0.9", worst)
	}
	t.Logf("rounding within %.1f%% of the optimum at worst", 100*(1-worst))
}

// With elastic configurations (two widths per type) the rounding stays
// feasible, below the exact optimum and near it, and the LP bounds it.
func TestElasticRoundingIsFeasible(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for trial := range 30 {
		p := Problem{N: 8, K: 3, M: 6, Typ: []int{0, 1, 2, 0, 1, 2}, Capacity: []float64{float64(2 + rng.IntN(5)), float64(2 + rng.IntN(5)), float64(2 + rng.IntN(5))}}
		for range p.N {
			w := float64(1 + rng.IntN(2))
			for c := range p.M {
				width := w
				if c >= p.K {
					width = 2 * w
				}
				p.Width = append(p.Width, width)
				g := 0.0
				if rng.Float64() < 0.9 {
					g = 0.1 + rng.Float64()*width
				}
				p.Gain = append(p.Gain, g)
			}
		}
		exact := branchAndBound(p)
		got, err := lpRound(p)
		if err != nil {
			t.Fatal(err)
		}
		left := append([]float64(nil), p.Capacity...)
		for i, c := range got.Choice {
			if c >= 0 {
				left[p.Typ[c]] -= p.W(i, c)
			}
		}
		for j, l := range left {
			if l < 0 {
				t.Fatalf("trial %d: type %d over-committed by %v", trial, j, -l)
			}
		}
		if got.Bound < exact.Value-1e-9 || got.Value > exact.Value+1e-9 || got.Value < 0.8*exact.Value {
			t.Fatalf("trial %d: rounding %v, bound %v, exact %v", trial, got.Value, got.Bound, exact.Value)
		}
	}
}

// Slots, Add and ByJob pose and read back a problem as Sia and hadar do:
// a rigid job (one width) beside an elastic one (two widths) over two
// types, the rigid job's slots past its own posed at its scale factor with
// no gain, and the choices spread back over the round's jobs.
func TestSlotsAddByJob(t *testing.T) {
	p := Slots(2, 4, []float64{4, 4})
	if want := []int{0, 1, 0, 1}; !slices.Equal(p.Typ, want) {
		t.Fatalf("types of the slots %v, want %v", p.Typ, want)
	}
	p.Add([]float64{1, 2}, []float64{2, 2}, 2)
	p.Add([]float64{1, 1, 3, 5}, []float64{1, 1, 4, 4}, 1)
	if p.N != 2 || !slices.Equal(p.Gain, []float64{1, 2, 0, 0, 1, 1, 3, 5}) || !slices.Equal(p.Width, []float64{2, 2, 2, 2, 1, 1, 4, 4}) {
		t.Fatalf("posed N=%d gains %v widths %v", p.N, p.Gain, p.Width)
	}
	sol, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	// Type 1 holds 4: the elastic job at 4 GPUs of it (5) and the rigid
	// one on type 0 (1) beat the rigid one on type 1 (2) beside the
	// elastic one at 4 on type 0 (3).
	if got := sol.ByJob([]int{3, 1}, 5); !slices.Equal(got, []int{-1, 3, -1, 0, -1}) {
		t.Fatalf("choices by job %v (solution %v), want [-1 3 -1 0 -1]", got, sol.Choice)
	}
}

// raise gives a wide job the GPUs narrow jobs of less gain hold: a job
// left at 8 of 16 GPUs (gain 0.333) beside eight 1-GPU jobs (0.001 each)
// grows to 16 (0.5); the narrow jobs go to another type where it has room
// (four GPUs there, 0.0005 each), the others out.
func TestRaiseGrowsAJobOverNarrowerOnes(t *testing.T) {
	// Slots: 0 = 8 (wide job) or 1 (narrow) GPUs of type 0, 1 = one GPU
	// of type 1 (narrow jobs only), 2 = 16 GPUs of type 0 (wide job only).
	p := Problem{N: 9, K: 2, M: 3, Typ: []int{0, 1, 0}, Capacity: []float64{16, 4}}
	p.Width = append(p.Width, 8, 1, 16)
	p.Gain = append(p.Gain, 0.333, 0, 0.5)
	for range 8 {
		p.Width = append(p.Width, 1, 1, 1)
		p.Gain = append(p.Gain, 0.001, 0.0005, 0)
	}
	choice := []int{0, 0, 0, 0, 0, 0, 0, 0, 0}
	left := []float64{0, 4}
	before := value(p, choice)
	raise(p, choice, left)
	if choice[0] != 2 {
		t.Fatalf("the wide job is in slot %d, want 2 (16 GPUs): %v", choice[0], choice)
	}
	moved, out := 0, 0
	for _, c := range choice[1:] {
		switch c {
		case 1:
			moved++
		case -1:
			out++
		default:
			t.Fatalf("a narrow job kept slot %d on the wide job's type: %v", c, choice)
		}
	}
	if moved != 4 || out != 4 {
		t.Fatalf("narrow jobs: %d moved to type 1, %d out, want 4 and 4: %v", moved, out, choice)
	}
	if got, want := value(p, choice), 0.5+4*0.0005; math.Abs(got-want) > 1e-12 || got <= before {
		t.Fatalf("objective %v (before %v), want %v", got, before, want)
	}
	if left[0] != 0 || left[1] != 0 {
		t.Fatalf("GPUs left %v, want none", left)
	}
	// Not for less: with the wide job's 16 GPUs worth 0.335 the narrow
	// jobs' 0.008 outweigh the 0.002 it would gain.
	p.Gain[2] = 0.335
	choice = []int{0, 0, 0, 0, 0, 0, 0, 0, 0}
	left = []float64{0, 4}
	raise(p, choice, left)
	if choice[0] != 0 {
		t.Fatalf("the wide job grew for less than the narrow jobs are worth: %v", choice)
	}
}

// value is the objective of a selection.
func value(p Problem, choice []int) float64 {
	v := 0.0
	for i, c := range choice {
		if c >= 0 {
			v += p.G(i, c)
		}
	}
	return v
}

// On random elastic selections raise never lowers the objective nor
// commits a GPU twice.
func TestRaiseNeverLowersTheObjective(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	for trial := range 200 {
		p := Problem{N: 12, K: 3, M: 9, Typ: []int{0, 1, 2, 0, 1, 2, 0, 1, 2}, Capacity: []float64{float64(4 + rng.IntN(8)), float64(4 + rng.IntN(8)), float64(4 + rng.IntN(8))}}
		for range p.N {
			for c := range p.M {
				w := float64(int(1) << (c / p.K))
				p.Width = append(p.Width, w)
				g := 0.0
				if rng.Float64() < 0.8 {
					g = rng.Float64() * math.Sqrt(w)
				}
				p.Gain = append(p.Gain, g)
			}
		}
		// A random feasible selection to start from.
		left := slices.Clone(p.Capacity)
		choice := make([]int, p.N)
		for i := range choice {
			choice[i] = -1
			c := rng.IntN(p.M)
			if p.G(i, c) > 0 && left[p.Typ[c]] >= p.W(i, c) {
				choice[i] = c
				left[p.Typ[c]] -= p.W(i, c)
			}
		}
		before := value(p, choice)
		raise(p, choice, left)
		use := make([]float64, p.K)
		for i, c := range choice {
			if c >= 0 {
				if p.G(i, c) <= 0 {
					t.Fatalf("trial %d: job %d in slot %d, no configuration of it", trial, i, c)
				}
				use[p.Typ[c]] += p.W(i, c)
			}
		}
		for j := range use {
			if use[j] > p.Capacity[j]+1e-9 || math.Abs(p.Capacity[j]-use[j]-left[j]) > 1e-9 {
				t.Fatalf("trial %d: type %d uses %v of %v, left says %v", trial, j, use[j], p.Capacity[j], left[j])
			}
		}
		if after := value(p, choice); after < before-1e-12 {
			t.Fatalf("trial %d: objective fell from %v to %v", trial, before, after)
		}
	}
}

// A column generation that ran out of columns serves when its certified
// gap is within looseTol of its objective (1e-3: 0.1 on 100, 1e-3 under
// 1); a wider gap, or any other error, fails the round.
func TestCloseEnough(t *testing.T) {
	stopped := fmt.Errorf("lp: column generation: %w after 2000 columns", lp.ErrNoConvergence)
	other := errors.New("lp: column generation master: infeasible")
	for _, c := range []struct {
		obj, gap float64
		err      error
		ok       bool
	}{
		{100, 0.0024, stopped, true},
		{100, 0.0363, stopped, true},
		{100, 0.1, stopped, true},
		{100, 0.11, stopped, false},
		{0.5, 1e-3, stopped, true},
		{0.5, 2e-3, stopped, false},
		{100, 0, other, false},
		{100, 0, nil, true},
	} {
		if got := closeEnough(c.obj, c.gap, c.err); (got == nil) != c.ok || got != nil && got != c.err {
			t.Errorf("objective %v, gap %v, %v: %v", c.obj, c.gap, c.err, got)
		}
	}
}
