package estimate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
)

// truthCells are a profile's positive consolidated figures.
func truthCells(p *profile.Profile) []Cell {
	var out []Cell
	for _, e := range p.Entries() {
		for t, v := range e.Consolidated {
			if v > 0 {
				out = append(out, Cell{Model: e.Model, Width: e.ScaleFactor, Type: t, Value: v})
			}
		}
	}
	sort.Slice(out, func(a, b int) bool {
		x, y := out[a], out[b]
		if x.Model != y.Model {
			return x.Model < y.Model
		}
		if x.Width != y.Width {
			return x.Width < y.Width
		}
		return x.Type < y.Type
	})
	return out
}

func logErr(e Estimate, truth float64) float64 {
	if !(e.Value > 0) {
		return math.Inf(1)
	}
	return math.Abs(math.Log(e.Value / truth))
}

type errStats struct {
	errs []float64
	srcs map[Source]int
}

func (s *errStats) add(e Estimate, truth float64) {
	s.errs = append(s.errs, logErr(e, truth))
	if s.srcs == nil {
		s.srcs = map[Source]int{}
	}
	s.srcs[e.Source]++
}

// median and mean |log error|, as factors (1.25 = 25 % off).
func (s *errStats) summary() (med, mean, p90 float64) {
	xs := slices.Clone(s.errs)
	slices.Sort(xs)
	if len(xs) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return math.Exp(xs[len(xs)/2]), math.Exp(sum / float64(len(xs))), math.Exp(xs[int(0.9*float64(len(xs)-1))])
}

// unseenModel holds one model out of the table, reveals n of its cells at
// random, and estimates the rest with method m; over every model and seed.
func unseenModel(truth []Cell, m Method, n int, seeds int) *errStats {
	models := map[string][]Cell{}
	var names []string
	for _, c := range truth {
		if _, ok := models[c.Model]; !ok {
			names = append(names, c.Model)
		}
		models[c.Model] = append(models[c.Model], c)
	}
	st := &errStats{}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		for _, name := range names {
			own := slices.Clone(models[name])
			if n >= len(own) {
				continue
			}
			rng.Shuffle(len(own), func(a, b int) { own[a], own[b] = own[b], own[a] })
			var known []Cell
			for _, c := range truth {
				if c.Model != name {
					known = append(known, c)
				}
			}
			known = append(known, own[:n]...)
			tab, err := Fit(known, Config{Method: m})
			if err != nil {
				panic(err)
			}
			for _, c := range own[n:] {
				st.add(tab.Estimate(c.Model, c.Width, c.Type), c.Value)
			}
		}
	}
	return st
}

// unseenType holds one GPU type out, reveals n of its cells (of any
// model), and estimates the rest of its cells. With prior, the operator
// gives the type's speed against ref: its true median ratio, 30 % off.
func unseenType(truth []Cell, m Method, n int, seeds int, prior bool) *errStats {
	types := map[planner.GPUType]bool{}
	for _, c := range truth {
		types[c.Type] = true
	}
	var tnames []planner.GPUType
	for t := range types {
		tnames = append(tnames, t)
	}
	slices.Sort(tnames)
	st := &errStats{}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 11))
		for _, hid := range tnames {
			var own, known []Cell
			for _, c := range truth {
				if c.Type == hid {
					own = append(own, c)
				} else {
					known = append(known, c)
				}
			}
			rng.Shuffle(len(own), func(a, b int) { own[a], own[b] = own[b], own[a] })
			known = append(known, own[:n]...)
			cfg := Config{Method: m}
			if prior {
				ref := tnames[0]
				if ref == hid {
					ref = tnames[1]
				}
				cfg.Priors = map[planner.GPUType]TypePrior{hid: {Reference: ref, Speed: 1.3 * medianRatio(truth, hid, ref)}}
			}
			tab, err := Fit(known, cfg)
			if err != nil {
				panic(err)
			}
			for _, c := range own[n:] {
				st.add(tab.Estimate(c.Model, c.Width, c.Type), c.Value)
			}
		}
	}
	return st
}

func medianRatio(truth []Cell, t, ref planner.GPUType) float64 {
	at := map[string]float64{}
	for _, c := range truth {
		if c.Type == ref {
			at[fmt.Sprint(c.Model, c.Width)] = c.Value
		}
	}
	var rs []float64
	for _, c := range truth {
		if r, ok := at[fmt.Sprint(c.Model, c.Width)]; ok && c.Type == t {
			rs = append(rs, c.Value/r)
		}
	}
	slices.Sort(rs)
	return rs[len(rs)/2]
}

// TestEstimatorError measures every method's error against the number of
// observations, on Gavel's simulation and physical profiles: the table of
// docs/results.md ("Estimating what no one measured"), printed with -v.
// It holds the default method to what it was chosen for: at least as good
// as every other method once the model has two figures, and better with
// each figure it gains.
func TestEstimatorError(t *testing.T) {
	seeds := 3
	if testing.Short() {
		seeds = 1
	}
	for _, pc := range []struct {
		name string
		p    *profile.Profile
	}{{"simulation", profile.Default()}, {"physical", profile.GavelPhysical()}} {
		truth := truthCells(pc.p)
		var b strings.Builder
		fmt.Fprintf(&b, "\nGavel's %s profile: an unseen model, N of its figures observed (median / mean / p90 error factor)\n", pc.name)
		fmt.Fprintf(&b, "| method | N=0 | N=1 | N=2 | N=3 | N=4 | N=6 |\n|---|---|---|---|---|---|---|\n")
		means := map[Method][]float64{}
		for _, m := range Methods() {
			fmt.Fprintf(&b, "| %s |", m)
			for _, n := range []int{0, 1, 2, 3, 4, 6} {
				med, mean, p90 := unseenModel(truth, m, n, seeds).summary()
				means[m] = append(means[m], mean)
				fmt.Fprintf(&b, " %.2f / %.2f / %.2f |", med, mean, p90)
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "\nan unseen GPU type, N of its figures observed (any models)\n")
		fmt.Fprintf(&b, "| method | N=0, operator speed 30 %% off | N=1 | N=2 | N=4 | N=8 | N=16 |\n|---|---|---|---|---|---|---|\n")
		for _, m := range Methods() {
			fmt.Fprintf(&b, "| %s |", m)
			med, mean, p90 := unseenType(truth, m, 0, seeds, true).summary()
			fmt.Fprintf(&b, " %.2f / %.2f / %.2f |", med, mean, p90)
			for _, n := range []int{1, 2, 4, 8, 16} {
				med, mean, p90 := unseenType(truth, m, n, seeds, false).summary()
				fmt.Fprintf(&b, " %.2f / %.2f / %.2f |", med, mean, p90)
			}
			b.WriteString("\n")
		}
		t.Log(b.String())
		def := means[Similar]
		for n := 2; n < len(def); n++ {
			if def[n] > def[n-1]*1.02 {
				t.Errorf("%s: the default method's mean error grows from %v to %v with more observations", pc.name, def[n-1], def[n])
			}
		}
		for _, m := range Methods()[1:] {
			if def[3] > means[m][3]*1.05 {
				t.Errorf("%s: at 3 observations the default method (%.3f) is worse than %s (%.3f)", pc.name, def[3], m, means[m][3])
			}
		}
	}
}

// The sigmas the exploration rule relies on cover the errors measured.
func TestSigmasCoverTheMeasuredErrors(t *testing.T) {
	truth := truthCells(profile.Default())
	bySrc := map[Source][]float64{}
	for _, n := range []int{1, 2, 4} {
		models := map[string][]Cell{}
		for _, c := range truth {
			models[c.Model] = append(models[c.Model], c)
		}
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		for name, own := range models {
			own = slices.Clone(own)
			if n >= len(own) {
				continue
			}
			rng.Shuffle(len(own), func(a, b int) { own[a], own[b] = own[b], own[a] })
			var known []Cell
			for _, c := range truth {
				if c.Model != name {
					known = append(known, c)
				}
			}
			known = append(known, own[:n]...)
			tab, _ := Fit(known, Config{})
			for _, c := range own[n:] {
				e := tab.Estimate(c.Model, c.Width, c.Type)
				bySrc[e.Source] = append(bySrc[e.Source], math.Log(e.Value/c.Value))
			}
		}
	}
	for src, xs := range bySrc {
		ss := 0.0
		for _, x := range xs {
			ss += x * x
		}
		rms := math.Sqrt(ss / float64(len(xs)))
		t.Logf("%s: %d estimates, RMS log error %.3f, sigma %.3f", src, len(xs), rms, SigmaOf(src))
		if rms > 1.5*SigmaOf(src) {
			t.Errorf("%s: RMS log error %.3f, far above its sigma %.3f", src, rms, SigmaOf(src))
		}
	}
}

func TestEstimateSourcesAndBounds(t *testing.T) {
	cells := []Cell{
		{Model: "a", Width: 1, Type: "v100", Value: 10},
		{Model: "a", Width: 1, Type: "k80", Value: 2},
		{Model: "a", Width: 4, Type: "v100", Value: 30},
		{Model: "b", Width: 1, Type: "v100", Value: 100},
		{Model: "b", Width: 1, Type: "k80", Value: 25},
		{Model: "c", Width: 1, Type: "v100", Value: 50},
	}
	tab, err := Fit(cells, Config{Priors: map[planner.GPUType]TypePrior{"h100": {Reference: "v100", Speed: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model string
		w     int
		typ   planner.GPUType
		src   Source
		lo    float64
		hi    float64
	}{
		{"a", 1, "v100", Known, 10, 10},
		{"a", 4, "k80", Scaled, 3, 12},    // its own k80 ratio, its own scaling
		{"c", 1, "k80", Completed, 8, 17}, // k80 is 1/4 to 1/5 of v100 for the others
		{"c", 1, "h100", Operator, 100, 200},
		{"new", 1, "v100", Prior, 10, 100},
		{"a", 1, "a100", NoData, 0, 0},
		{"a", 2, "v100", Scaled, 10, 20}, // between its 1- and 4-GPU figures
		{"a", 16, "v100", Scaled, 30, 120},
	} {
		e := tab.Estimate(tc.model, tc.w, tc.typ)
		if e.Source != tc.src || e.Value < tc.lo-1e-9 || e.Value > tc.hi+1e-9 {
			t.Errorf("%s x%d on %s: %v from %s, want %s in [%v, %v]", tc.model, tc.w, tc.typ, e.Value, e.Source, tc.src, tc.lo, tc.hi)
		}
	}
	if s, ok := tab.TypeSpeed("k80", "v100"); !ok || s < 0.15 || s > 0.3 {
		t.Errorf("k80 against v100: %v, %v", s, ok)
	}
	if _, ok := tab.TypeSpeed("a100", "v100"); ok {
		t.Error("a type with nothing known has a speed")
	}
}

// One model's figures, however wild, move another model's estimate by a
// bounded factor, which shrinks as 1/n with the n models known: the pulls
// on the shared terms are clamped to MaxPull (the liar moves a type's
// speed, its width cost, and the other model's level through them).
func TestOneModelPullsOthersBoundedly(t *testing.T) {
	for _, honest := range []int{8, 30, 100} {
		tc := struct {
			honest int
			bound  float64
		}{honest, math.Pow(MaxPull, 8/float64(honest+1))}
		var cells []Cell
		for i := range tc.honest {
			m := fmt.Sprint("m", i)
			cells = append(cells, Cell{Model: m, Width: 1, Type: "v100", Value: 10 * float64(i+1)}, Cell{Model: m, Width: 1, Type: "h100", Value: 20 * float64(i+1)})
		}
		cells = append(cells, Cell{Model: "x", Width: 1, Type: "v100", Value: 7})
		honest, _ := Fit(cells, Config{})
		for _, lie := range []float64{1e9, 1e-9} {
			liar := append(slices.Clone(cells), Cell{Model: "liar", Width: 1, Type: "v100", Value: 1}, Cell{Model: "liar", Width: 1, Type: "h100", Value: lie})
			lied, _ := Fit(liar, Config{})
			a, b := honest.Estimate("x", 1, "h100"), lied.Estimate("x", 1, "h100")
			if r := math.Exp(math.Abs(math.Log(b.Value / a.Value))); r > tc.bound {
				t.Errorf("one liar (h100 %v) among %d models moved another's estimate by %.3fx (honest %v, lied %v), want at most %v", lie, tc.honest, r, a.Value, b.Value, tc.bound)
			}
		}
	}
}

func TestFitIgnoresBadCellsAndIsDeterministic(t *testing.T) {
	cells := truthCells(profile.Default())
	bad := append(slices.Clone(cells), Cell{Model: "z", Width: 1, Type: "v100", Value: math.NaN()}, Cell{Model: "z", Width: 0, Type: "v100", Value: 1},
		Cell{Model: "z", Width: 1, Type: "v100", Value: math.Inf(1)}, Cell{Model: "z", Width: 1, Type: "v100", Value: -3})
	a, _ := Fit(cells, Config{})
	b, _ := Fit(bad, Config{})
	c, _ := Fit(cells, Config{})
	for _, m := range []string{"ResNet-18 (batch size 16)", "z", "unknown"} {
		for _, ty := range []planner.GPUType{"v100", "k80"} {
			ea, eb, ec := a.Estimate(m, 3, ty), b.Estimate(m, 3, ty), c.Estimate(m, 3, ty)
			if ea != eb || ea != ec {
				t.Errorf("%s on %s: %v, %v with bad cells, %v refitted", m, ty, ea, eb, ec)
			}
		}
	}
	if _, err := Fit(nil, Config{Method: "magic"}); err == nil {
		t.Error("an unknown method is accepted")
	}
	if e := (&Table{}).Estimate("m", 1, "v100"); e.Source != NoData {
		t.Errorf("an empty table estimates %v", e)
	}
	empty, _ := Fit(nil, Config{})
	if e := empty.Estimate("m", 1, "v100"); e.Source != NoData || e.Value != 0 {
		t.Errorf("an empty fit estimates %v", e)
	}
}
