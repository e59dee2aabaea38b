package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/lp"
)

// randomInput draws n jobs on k types with Gavel-like spreads of speed.
func randomInput(rng *rand.Rand, n, k int) Input {
	in := Input{Capacity: make([]float64, k), PricePerHour: make([]float64, k)}
	for j := range k {
		in.Types = append(in.Types, planner.GPUType(fmt.Sprintf("t%d", j)))
		in.Capacity[j] = float64(4 + rng.IntN(30))
		in.PricePerHour[j] = 0.1 + rng.Float64()
	}
	sfs := []int{1, 1, 1, 2, 4, 8}
	for i := range n {
		jb := JobState{ID: fmt.Sprintf("j%d", i), ScaleFactor: sfs[rng.IntN(len(sfs))], Weight: 1, Throughput: make([]float64, k)}
		base := 1 + rng.Float64()*100
		for j := range k {
			if rng.IntN(10) == 0 && j > 0 {
				continue // cannot run on this type
			}
			jb.Throughput[j] = base * (0.2 + rng.Float64())
		}
		if jb.Throughput[0] == 0 {
			jb.Throughput[0] = base
		}
		jb.TotalSteps = 1000 + rng.Float64()*1e5
		jb.Remaining = jb.TotalSteps * (0.1 + 0.9*rng.Float64())
		jb.Age = rng.Float64() * 3600
		in.Jobs = append(in.Jobs, jb)
	}
	return in
}

func checkAllocation(t *testing.T, in Input, a Allocation) {
	t.Helper()
	used := make([]float64, len(in.Types))
	for i, row := range a.X {
		sum := 0.0
		for j, x := range row {
			if x < -1e-9 {
				t.Fatalf("job %d type %d: X = %v < 0", i, j, x)
			}
			if x > 1e-9 && in.Jobs[i].Throughput[j] == 0 {
				t.Fatalf("job %d is given type %d where it cannot run", i, j)
			}
			sum += x
			used[j] += float64(in.Jobs[i].ScaleFactor) * x
		}
		if sum > 1+1e-7 {
			t.Fatalf("job %d: time fractions sum to %v > 1", i, sum)
		}
	}
	for j, u := range used {
		if u > in.Capacity[j]+1e-6 {
			t.Fatalf("type %d: %v GPUs used of %v", j, u, in.Capacity[j])
		}
	}
}

// fullMaxMin solves max t s.t. a_i·X_i >= t directly with the dense
// simplex: the independent reference for the column generation.
func fullMaxMin(n, k int, a, sf, capacity []float64) (float64, error) {
	nv := n*k + 1
	p := lp.Problem{C: make([]float64, nv)}
	p.C[n*k] = 1
	for i := range n {
		row := make([]float64, nv)
		for j := range k {
			row[i*k+j] = -a[i*k+j]
		}
		row[n*k] = 1
		p.A, p.B = append(p.A, row), append(p.B, 0)
		row = make([]float64, nv)
		for j := range k {
			row[i*k+j] = 1
		}
		p.A, p.B = append(p.A, row), append(p.B, 1)
	}
	for j := range k {
		row := make([]float64, nv)
		for i := range n {
			row[i*k+j] = sf[i]
		}
		p.A, p.B = append(p.A, row), append(p.B, capacity[j])
	}
	s, err := lp.Solve(p)
	return s.Objective, err
}

func TestMaxMinMatchesFullLP(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := range 40 {
		n, k := 2+rng.IntN(25), 1+rng.IntN(4)
		in := randomInput(rng, n, k)
		tp, ok := effective(in)
		var a, sf []float64
		var idx []int
		for i := range in.Jobs {
			if !ok[i] {
				continue
			}
			idx = append(idx, i)
			a = append(a, tp[i]...)
			sf = append(sf, float64(in.Jobs[i].ScaleFactor))
		}
		got, x, err := solveMaxMin(len(idx), k, a, sf, in.Capacity)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		want, err := fullMaxMin(len(idx), k, a, sf, in.Capacity)
		if err != nil {
			t.Fatalf("trial %d: reference: %v", trial, err)
		}
		if math.Abs(got-want) > 1e-5*math.Max(1, want) {
			t.Fatalf("trial %d (n=%d k=%d): column generation %v, full LP %v", trial, len(idx), k, got, want)
		}
		// The returned X must achieve t for every job.
		alloc := expand(n, k, idx, x)
		checkAllocation(t, in, alloc)
		for q, i := range idx {
			thr := 0.0
			for j := range k {
				thr += a[q*k+j] * alloc.X[i][j]
			}
			if thr < got*(1-1e-6)-1e-9 {
				t.Fatalf("trial %d: job %d reaches %v < t = %v", trial, i, thr, got)
			}
		}
	}
}

func TestMaxMinHandSolved(t *testing.T) {
	// Two single-GPU jobs, one fast and one slow GPU. Job A runs at 4 on
	// fast and 1 on slow, job B at 2 and 1. Both GPUs and both jobs' time
	// are fully used at the optimum: A = (fa, 1-fa), B = (1-fa, fa), so A
	// reaches 1+3fa and B 2-fa; they meet at fa = 1/4, t = 7/4.
	a := []float64{4, 1, 2, 1}
	got, x, err := solveMaxMin(2, 2, a, []float64{1, 1}, []float64{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(got-1.75) > 1e-7 {
		t.Fatalf("t = %v, want 1.75 (x = %v)", got, x)
	}
}

// TestPoliciesReachTheirOptimum: every policy's allocation is feasible
// and reaches the optimum of its own objective, computed independently
// with the full LP (an all-zero or merely feasible allocation fails).
// The agnostic baselines optimise a type-blind objective and then split
// shares over types; they must give every runnable job time.
func TestPoliciesReachTheirOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p, err := New(name)
			if err != nil {
				t.Fatal(err)
			}
			for trial := range 5 {
				in := randomInput(rng, 30, 3)
				a, err := p.Allocate(in)
				if err != nil {
					t.Fatal(err)
				}
				checkAllocation(t, in, a)
				if name == "fifo" {
					continue // no objective: TestFIFOOrder pins its allocation
				}
				if strings.HasSuffix(name, "-agnostic") {
					_, ok := effective(in)
					for i, row := range a.X {
						sum := 0.0
						for _, x := range row {
							sum += x
						}
						if ok[i] && !(sum > 1e-9) {
							t.Fatalf("trial %d: runnable job %d gets no time", trial, i)
						}
					}
					continue
				}
				got, want, maximize := objective(t, name, in, a)
				if maximize && got < want*(1-1e-5)-1e-12 || !maximize && got > want*(1+2e-3)+1e-12 {
					t.Fatalf("trial %d: objective %v, optimum %v (maximize=%v)", trial, got, want, maximize)
				}
			}
		})
	}
}

// objective returns the policy's objective at allocation a and its
// optimum from the full LP.
func objective(t *testing.T, name string, in Input, a Allocation) (got, want float64, maximize bool) {
	t.Helper()
	tp, ok := effective(in)
	k := len(in.Types)
	var idx []int
	for i := range in.Jobs {
		if ok[i] {
			idx = append(idx, i)
		}
	}
	sf := make([]float64, len(idx))
	for q, i := range idx {
		sf[q] = float64(in.Jobs[i].ScaleFactor)
	}
	// minOver is min_i sum_j g[i][j] X[i][j] and the full LP's optimum of it.
	minOver := func(g func(i, j int) float64) (float64, float64) {
		got := math.Inf(1)
		a2 := make([]float64, 0, len(idx)*k)
		for _, i := range idx {
			v := 0.0
			for j := range k {
				v += g(i, j) * a.X[i][j]
				a2 = append(a2, g(i, j))
			}
			got = math.Min(got, v)
		}
		want, err := fullMaxMin(len(idx), k, a2, sf, in.Capacity)
		if err != nil {
			t.Fatal(err)
		}
		return got, want
	}
	total := 0.0
	for _, c := range in.Capacity {
		total += c
	}
	switch name {
	case "gavel-maxmin":
		got, want = minOver(func(i, j int) float64 {
			prop := 0.0
			for q, v := range tp[i] {
				prop += v * in.Capacity[q] / total
			}
			return float64(in.Jobs[i].ScaleFactor) * tp[i][j] / (in.Jobs[i].Weight * prop)
		})
		return got, want, true
	case "gavel-makespan":
		got, want = minOver(func(i, j int) float64 { return tp[i][j] / in.Jobs[i].Remaining })
		return got, want, true
	case "gavel-maxthroughput", "gavel-cost":
		nv := len(idx) * k
		p := lp.Problem{C: make([]float64, nv)}
		for q, i := range idx {
			best := 0.0
			for _, v := range tp[i] {
				best = math.Max(best, v)
			}
			row := make([]float64, nv)
			for j := range k {
				val := tp[i][j] / best
				if name == "gavel-cost" {
					val /= in.PricePerHour[j] * sf[q]
				}
				p.C[q*k+j] = val
				got += val * a.X[i][j]
				row[q*k+j] = 1
			}
			p.A, p.B = append(p.A, row), append(p.B, 1)
		}
		for j := range k {
			row := make([]float64, nv)
			for q := range idx {
				row[q*k+j] = sf[q]
			}
			p.A, p.B = append(p.A, row), append(p.B, in.Capacity[j])
		}
		sol, err := lp.Solve(p)
		if err != nil {
			t.Fatal(err)
		}
		return got, sol.Objective, true
	case "gavel-ftf":
		// rho_i = (age_i + rem_i/thr_i) / iso_i; the optimum by bisection
		// over rho with the full LP deciding feasibility.
		n := float64(len(idx))
		iso := map[int]float64{}
		for _, i := range idx {
			share := math.Min(1, total/(n*float64(in.Jobs[i].ScaleFactor)))
			thr := 0.0
			for j, v := range tp[i] {
				thr += v * in.Capacity[j] / total * share
			}
			iso[i] = in.Jobs[i].TotalSteps / thr
			v := 0.0
			for j := range k {
				v += tp[i][j] * a.X[i][j]
			}
			got = math.Max(got, (in.Jobs[i].Age+in.Jobs[i].Remaining/v)/iso[i])
		}
		feasible := func(rho float64) bool {
			for _, i := range idx {
				if rho*iso[i] <= in.Jobs[i].Age {
					return false
				}
			}
			_, w := minOver(func(i, j int) float64 { return tp[i][j] * (rho*iso[i] - in.Jobs[i].Age) / in.Jobs[i].Remaining })
			return w >= 1
		}
		lo, hi := 0.0, 1.0
		for !feasible(hi) {
			lo, hi = hi, hi*2
		}
		for hi-lo > 1e-6*hi {
			if mid := (lo + hi) / 2; feasible(mid) {
				hi = mid
			} else {
				lo = mid
			}
		}
		return got, hi, false
	}
	t.Fatalf("no reference objective for %s", name)
	return 0, 0, false
}

func TestMakespanMatchesBinarySearch(t *testing.T) {
	// Gavel searches M with a feasibility LP; the single max-min solve
	// must find the same M.
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := range 10 {
		in := randomInput(rng, 12, 3)
		_, m, err := Makespan{}.solve(in)
		if err != nil {
			t.Fatal(err)
		}
		tp, ok := effective(in)
		feasible := func(M float64) bool {
			// Feasibility of throughput_i >= rem_i/M as a full LP: minimize nothing.
			var idx []int
			for i := range in.Jobs {
				if ok[i] {
					idx = append(idx, i)
				}
			}
			k := len(in.Types)
			nv := len(idx) * k
			p := lp.Problem{C: make([]float64, nv)}
			var kinds []lp.Kind
			for q, i := range idx {
				row := make([]float64, nv)
				copy(row[q*k:], tp[i])
				p.A, p.B, kinds = append(p.A, row), append(p.B, in.Jobs[i].Remaining/M), append(kinds, lp.GE)
				row = make([]float64, nv)
				for j := range k {
					row[q*k+j] = 1
				}
				p.A, p.B, kinds = append(p.A, row), append(p.B, 1), append(kinds, lp.LE)
			}
			for j := range k {
				row := make([]float64, nv)
				for q, i := range idx {
					row[q*k+j] = float64(in.Jobs[i].ScaleFactor)
				}
				p.A, p.B, kinds = append(p.A, row), append(p.B, in.Capacity[j]), append(kinds, lp.LE)
			}
			p.Kind = kinds
			_, err := lp.Solve(p)
			return err == nil
		}
		if !feasible(m * (1 + 1e-5)) {
			t.Fatalf("trial %d: makespan %v is not feasible", trial, m)
		}
		if feasible(m * (1 - 1e-3)) {
			t.Fatalf("trial %d: makespan %v is not minimal", trial, m)
		}
	}
}

func TestFTFMinimisesTheWorstRatio(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 5 {
		in := randomInput(rng, 20, 3)
		a, err := FinishTimeFairness{}.Allocate(in)
		if err != nil {
			t.Fatal(err)
		}
		checkAllocation(t, in, a)
		got, want, _ := objective(t, "gavel-ftf", in, a)
		// The policy stops its bisection at 0.1 %.
		if got > want*(1+2e-3) || got < want*(1-1e-5) {
			t.Fatalf("trial %d: worst finish-time ratio %v, optimum %v", trial, got, want)
		}
	}
}

func TestFIFOOrder(t *testing.T) {
	in := Input{Types: []planner.GPUType{"fast", "slow"}, Capacity: []float64{2, 2}}
	for i := range 4 {
		in.Jobs = append(in.Jobs, JobState{ID: fmt.Sprint(i), ScaleFactor: 1, Weight: 1, Throughput: []float64{2, 1}, Remaining: 1, TotalSteps: 1})
	}
	in.Jobs = append(in.Jobs, JobState{ID: "late", ScaleFactor: 1, Weight: 1, Throughput: []float64{2, 1}, Remaining: 1, TotalSteps: 1})
	a, err := FIFO{}.Allocate(in)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]float64{{1, 0}, {1, 0}, {0, 1}, {0, 1}, {0, 0}}
	for i := range want {
		for j := range want[i] {
			if a.X[i][j] != want[i][j] {
				t.Fatalf("X = %v, want %v", a.X, want)
			}
		}
	}
}

func TestInputValidation(t *testing.T) {
	in := Input{Types: []planner.GPUType{"a"}, Capacity: []float64{1}, Jobs: []JobState{{ID: "x", ScaleFactor: 1, Throughput: []float64{math.NaN()}}}}
	if _, err := (MaxMin{}).Allocate(in); err == nil {
		t.Fatal("want an error for a NaN throughput")
	}
	if _, err := New("nope"); err == nil {
		t.Fatal("want an error for an unknown policy")
	}
	in = randomInput(rand.New(rand.NewPCG(1, 1)), 3, 2)
	in.PricePerHour = nil
	if _, err := (MaxThroughput{PerDollar: true}).Allocate(in); err == nil {
		t.Fatal("want an error for missing prices")
	}
}

func gavelLikeInput(n int) Input {
	rng := rand.New(rand.NewPCG(42, uint64(n)))
	in := randomInput(rng, n, 3)
	scale := float64(n) / 30
	for j := range in.Capacity {
		in.Capacity[j] = math.Max(36, math.Round(36*scale/10))
	}
	return in
}

func BenchmarkMaxMin(b *testing.B) {
	for _, n := range []int{100, 500, 2048, 10000} {
		in := gavelLikeInput(n)
		b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := (MaxMin{}).Allocate(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMakespan(b *testing.B) {
	for _, n := range []int{100, 500, 2048, 10000} {
		in := gavelLikeInput(n)
		b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := (Makespan{}).Allocate(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMaxMinWithTiedTypesMatchesFullLP: real clusters have types a job
// runs equally fast on (two A100 variants profiled alike, a type added
// twice). Every job's gain is tied on the duplicated types; the solver's
// allocation must still be feasible and reach the full LP's optimum.
func TestMaxMinWithTiedTypesMatchesFullLP(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	for trial := range 40 {
		n, k := 2+rng.IntN(25), 1+rng.IntN(3)
		in := randomInput(rng, n, k)
		// Duplicate a type: same throughputs, its own capacity.
		d := rng.IntN(k)
		in.Types = append(in.Types, planner.GPUType("dup"))
		in.Capacity = append(in.Capacity, float64(1+rng.IntN(30)))
		in.PricePerHour = append(in.PricePerHour, in.PricePerHour[d])
		for i := range in.Jobs {
			in.Jobs[i].Throughput = append(in.Jobs[i].Throughput, in.Jobs[i].Throughput[d])
		}
		k++
		tp, ok := effective(in)
		var a, sf []float64
		var idx []int
		for i := range in.Jobs {
			if ok[i] {
				idx = append(idx, i)
				a = append(a, tp[i]...)
				sf = append(sf, float64(in.Jobs[i].ScaleFactor))
			}
		}
		got, x, err := solveMaxMin(len(idx), k, a, sf, in.Capacity)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		want, err := fullMaxMin(len(idx), k, a, sf, in.Capacity)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got-want) > 1e-5*math.Max(1, want) {
			t.Fatalf("trial %d: column generation %v, full LP %v", trial, got, want)
		}
		alloc := expand(n, k, idx, x)
		checkAllocation(t, in, alloc)
		for q, i := range idx {
			thr := 0.0
			for j := range k {
				thr += a[q*k+j] * alloc.X[i][j]
			}
			if thr < got*(1-1e-6)-1e-9 {
				t.Fatalf("trial %d: job %d reaches %v < t = %v", trial, i, thr, got)
			}
		}
	}
}

// TestMakespanWithIdenticalTypeIsNoWorse: adding a type identical to an
// existing one only adds capacity, so the planned makespan cannot grow.
func TestMakespanWithIdenticalTypeIsNoWorse(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for trial := range 20 {
		in := randomInput(rng, 30, 3)
		_, base, err := Makespan{}.solve(in)
		if err != nil {
			t.Fatal(err)
		}
		in.Types = append(in.Types, "v100-twin")
		in.Capacity = append(in.Capacity, in.Capacity[0])
		for i := range in.Jobs {
			in.Jobs[i].Throughput = append(in.Jobs[i].Throughput, in.Jobs[i].Throughput[0])
		}
		a, twin, err := Makespan{}.solve(in)
		if err != nil {
			t.Fatal(err)
		}
		checkAllocation(t, in, a)
		if twin > base*(1+1e-6) {
			t.Fatalf("trial %d: makespan %v with a twin type, %v without", trial, twin, base)
		}
	}
}

// TestInputValidationOfRemainingAndAge: a live daemon can hand a policy a
// job with nothing left (it finished between progress reports) or a bad
// age; each is a clear error naming the job, never a panic or a NaN.
func TestInputValidationOfRemainingAndAge(t *testing.T) {
	for _, tc := range []struct {
		name      string
		remaining float64
		age       float64
		want      string
	}{
		{"no steps left", 0, 10, "remaining steps"},
		{"negative steps left", -3, 10, "remaining steps"},
		{"NaN steps left", math.NaN(), 10, "remaining steps"},
		{"negative age", 100, -1, "age"},
		{"infinite age", 100, math.Inf(1), "age"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := randomInput(rand.New(rand.NewPCG(1, 2)), 4, 2)
			in.Jobs[2].Remaining, in.Jobs[2].Age = tc.remaining, tc.age
			for _, name := range Names() {
				p, _ := New(name)
				_, err := func() (a Allocation, err error) {
					defer func() {
						if r := recover(); r != nil {
							err = fmt.Errorf("panic: %v", r)
						}
					}()
					return p.Allocate(in)
				}()
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), in.Jobs[2].ID) || strings.Contains(err.Error(), "panic") {
					t.Fatalf("%s: err = %v, want an error naming job %s and %q", name, err, in.Jobs[2].ID, tc.want)
				}
			}
		})
	}
}
