// Package estimate fills in the throughputs no one measured: the steps/s
// of a model at a width on a GPU type, from the figures known for other
// (model, width, type) cells — a profile's, and what jobs reported.
//
// The known cells form a three-way table, model x width x type, with most
// cells missing (a new model has one or two, a new GPU type none). The
// estimator fits, in log space of the per-GPU throughput log(T/width):
//
//	y(m, w, t) = a(m) + b(t) + g(w) + d(w, t)     the Additive method
//	           + r(m, t) + k(m, w)                Interact: the model's own
//	                                              type ratios and scaling
//
// a is the model's level, b each GPU type's relative speed learned across
// every model, g the per-GPU cost of width, d how that cost differs per
// type; r and k are the model's own departures (Recommendation runs faster
// on P100 than on V100 at every width; a model that scales badly does so
// on every type). Every term but a is shrunk towards 0 by a ridge penalty,
// so with little evidence the estimate falls back to what every model
// shows. The Similar method (the default) then fills r and k for a type
// or width the model has no figure on from the models most like it on
// the types and widths both have (nearest neighbours in log space), which
// is what Gavel's matrix completion against reference jobs does for an
// unseen job; LowRank is that matrix completion itself (alternating least
// squares, rank 2, over models x (width, type) on the Additive residuals),
// kept for comparison. docs/results.md, "Estimating what no one measured",
// measures each method's error against the number of observations.
//
// The fit is robust: a cell's pull on the shared terms (b, g, d) is clamped
// to a factor of MaxPull either way, so one model's figures (a job's
// progress file, which is untrusted) move every other model's estimate by
// a bounded amount.
package estimate

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// Cell is one known figure: Value steps/s of the whole job of Model at
// Width workers on Type, consolidated on one server.
type Cell struct {
	Model string
	Width int
	Type  planner.GPUType
	Value float64
	// Weight is how much the figure counts (0 means 1).
	Weight float64
}

// Method is how missing cells are estimated.
type Method string

// Methods (package comment).
const (
	Additive Method = "additive"
	Interact Method = "interact"
	Similar  Method = "similar"
	LowRank  Method = "lowrank"
)

// Methods lists every method, the default first.
func Methods() []Method { return []Method{Similar, Interact, Additive, LowRank} }

// ParseMethod reads a method name ("" is the default, Similar).
func ParseMethod(s string) (Method, error) {
	if s == "" {
		return Similar, nil
	}
	m := Method(strings.ToLower(strings.TrimSpace(s)))
	if slices.Contains(Methods(), m) {
		return m, nil
	}
	names := make([]string, 0, 4)
	for _, x := range Methods() {
		names = append(names, string(x))
	}
	return "", fmt.Errorf("estimator %q: want one of %s", s, strings.Join(names, ", "))
}

// TypePrior is an operator's word on a GPU type: Speed times as fast as
// Reference. It holds the type's speed until figures of it outweigh it.
type TypePrior struct {
	Reference planner.GPUType
	Speed     float64
}

// Config of a fit.
type Config struct {
	Method Method
	// Priors are operator-given relative speeds, per type.
	Priors map[planner.GPUType]TypePrior
}

// Source says what an estimate rests on, from the firmest to none.
type Source int

// Sources.
const (
	// Known: the cell is a known figure.
	Known Source = iota
	// Scaled: the model's own figures on this type at other widths.
	Scaled
	// Completed: the model's figures on other types, each type's relative
	// speed and the models most like it.
	Completed
	// Operator: as Completed, but the type's speed is the operator's word
	// alone (no figure of the type is known).
	Operator
	// Prior: nothing of the model is known: a typical model's figure.
	Prior
	// NoData: nothing of the GPU type is known: no estimate.
	NoData
)

var sourceNames = [...]string{Known: "known", Scaled: "scaled", Completed: "completed", Operator: "operator", Prior: "prior", NoData: "none"}

func (s Source) String() string {
	if s >= 0 && int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Sigma is the typical error of an estimate of each source, as the
// standard deviation of log(estimate/truth): measured with Similar on
// Gavel's profiles (TestEstimatorError, docs/results.md), rounded up.
// NoData has none: +Inf.
var sigma = [...]float64{Known: 0, Scaled: 0.25, Completed: 0.45, Operator: 0.5, Prior: 1.5, NoData: math.Inf(1)}

// SigmaOf is the typical error of an estimate from source s.
func SigmaOf(s Source) float64 {
	if s >= 0 && int(s) < len(sigma) {
		return sigma[s]
	}
	return math.Inf(1)
}

// Estimate is one cell's estimate.
type Estimate struct {
	// Value is steps/s of the whole job, consolidated; 0 with NoData.
	Value float64
	// Sigma is the typical error, in log space (SigmaOf(Source)).
	Sigma  float64
	Source Source
}

// MaxPull bounds, as a factor either way, how far one cell pulls a term
// every model shares.
const MaxPull = 4.0

// Ridge penalties: how many cells' worth of evidence pulls a term to its
// prior (0 for b, g and d; the operator's speed for b). Chosen on Gavel's
// profiles (TestEstimatorError).
const (
	ridgeShared = 1e-3 // b, g: only pins them where nothing is known
	ridgeD      = 1.0
	ridgeR      = 0.5
	ridgeK      = 0.5
	ridgePrior  = 2.0 // an operator's relative speed counts as 2 cells
	ridgeLR     = 1.0
	sweeps      = 40
	rank        = 2
)

// Table is a fitted estimator. It is immutable.
type Table struct {
	method Method
	models map[string]int
	types  map[planner.GPUType]int
	widths []int // sorted; index l
	// data per cell index (model, width, type): the weighted mean of the
	// known log per-GPU figures.
	known map[cellKey]float64
	// per model: which types and widths it has figures on
	rowTypes  []map[int]bool
	rowWidths []map[int]bool
	// typeData: types with a figure (not only a prior)
	typeData map[int]bool
	// fitted terms
	a, b, g []float64
	d       [][]float64 // [l][k]
	r       [][]float64 // [i][k]
	kk      [][]float64 // [i][l]
	hasB    []bool      // b[k] is defined (data or a prior)
	meanA   float64
	// low rank factors (LowRank)
	u, v [][]float64 // u[i], v[l*nt+k]
}

type cellKey struct{ i, l, k int }

// Fit builds the estimator from known cells. Cells with a value that is
// not a positive finite number are ignored (a 0 means the job cannot run
// there: the caller keeps that apart, there is no log of it).
func Fit(cells []Cell, cfg Config) (*Table, error) {
	if cfg.Method == "" {
		cfg.Method = Similar
	}
	if !slices.Contains(Methods(), cfg.Method) {
		return nil, fmt.Errorf("estimate: method %q: want one of %v", cfg.Method, Methods())
	}
	t := &Table{method: cfg.Method, models: map[string]int{}, types: map[planner.GPUType]int{}, known: map[cellKey]float64{}, typeData: map[int]bool{}}
	type acc struct{ sum, w float64 }
	sums := map[cellKey]*acc{}
	var modelNames []string
	var typeNames []planner.GPUType
	widthSet := map[int]bool{}
	for _, c := range cells {
		if !(c.Value > 0) || math.IsInf(c.Value, 0) || c.Width <= 0 || c.Model == "" || c.Type == "" || c.Weight < 0 || math.IsNaN(c.Weight) {
			continue
		}
		if _, ok := t.models[c.Model]; !ok {
			t.models[c.Model] = -1
			modelNames = append(modelNames, c.Model)
		}
		if _, ok := t.types[c.Type]; !ok {
			t.types[c.Type] = -1
			typeNames = append(typeNames, c.Type)
		}
		widthSet[c.Width] = true
	}
	// Types the priors name count too (a type known only by its speed).
	for ty, p := range cfg.Priors {
		for _, x := range []planner.GPUType{ty, p.Reference} {
			if _, ok := t.types[x]; !ok && x != "" {
				t.types[x] = -1
				typeNames = append(typeNames, x)
			}
		}
	}
	slices.Sort(modelNames)
	slices.Sort(typeNames)
	for i, m := range modelNames {
		t.models[m] = i
	}
	for k, ty := range typeNames {
		t.types[ty] = k
	}
	for w := range widthSet {
		t.widths = append(t.widths, w)
	}
	slices.Sort(t.widths)
	for _, c := range cells {
		i, ok := t.models[c.Model]
		if !ok || !(c.Value > 0) || math.IsInf(c.Value, 0) || c.Width <= 0 || c.Weight < 0 || math.IsNaN(c.Weight) {
			continue
		}
		l, _ := slices.BinarySearch(t.widths, c.Width)
		ck := cellKey{i, l, t.types[c.Type]}
		w := c.Weight
		if w == 0 {
			w = 1
		}
		a := sums[ck]
		if a == nil {
			a = &acc{}
			sums[ck] = a
		}
		a.sum += w * math.Log(c.Value/float64(c.Width))
		a.w += w
	}
	nm, nt, nw := len(modelNames), len(typeNames), len(t.widths)
	t.rowTypes, t.rowWidths = make([]map[int]bool, nm), make([]map[int]bool, nm)
	for i := range nm {
		t.rowTypes[i], t.rowWidths[i] = map[int]bool{}, map[int]bool{}
	}
	type obs struct {
		i, l, k int
		y, w    float64
	}
	var data []obs
	// Deterministic order: the fit is Gauss-Seidel, order matters in the
	// last bits.
	keys := make([]cellKey, 0, len(sums))
	for ck := range sums {
		keys = append(keys, ck)
	}
	slices.SortFunc(keys, func(x, y cellKey) int {
		return cmp.Or(cmp.Compare(x.i, y.i), cmp.Compare(x.l, y.l), cmp.Compare(x.k, y.k))
	})
	for _, ck := range keys {
		a := sums[ck]
		if a.w <= 0 {
			continue
		}
		y := a.sum / a.w
		t.known[ck] = y
		t.rowTypes[ck.i][ck.k] = true
		t.rowWidths[ck.i][ck.l] = true
		t.typeData[ck.k] = true
		data = append(data, obs{ck.i, ck.l, ck.k, y, a.w})
	}
	t.a, t.b, t.g = make([]float64, nm), make([]float64, nt), make([]float64, nw)
	t.d, t.r, t.kk = grid(nw, nt), grid(nm, nt), grid(nm, nw)
	t.hasB = make([]bool, nt)
	interact := cfg.Method == Interact || cfg.Method == Similar
	priors := map[int]TypePrior{}
	for ty, p := range cfg.Priors {
		priors[t.types[ty]] = p
	}
	clamp := func(x float64) float64 { return min(max(x, -math.Log(MaxPull)), math.Log(MaxPull)) }
	fitted := func(o obs) float64 {
		return t.a[o.i] + t.b[o.k] + t.g[o.l] + t.d[o.l][o.k] + t.r[o.i][o.k] + t.kk[o.i][o.l]
	}
	if len(data) > 0 {
		// Start the levels at the row means: fewer sweeps to converge.
		sum, wt := make([]float64, nm), make([]float64, nm)
		for _, o := range data {
			sum[o.i] += o.w * o.y
			wt[o.i] += o.w
		}
		for i := range nm {
			t.a[i] = sum[i] / wt[i]
		}
	}
	// Scratch sums, reused by every sweep.
	num, den := make([]float64, max(nm, nt, nw)), make([]float64, max(nm, nt, nw))
	numD, denD := grid(nw, nt), grid(nw, nt)
	numR, denR := grid(nm, nt), grid(nm, nt)
	numK, denK := grid(nm, nw), grid(nm, nw)
	zero := func(xs ...[]float64) {
		for _, x := range xs {
			clear(x)
		}
	}
	zeroGrid := func(gs ...[][]float64) {
		for _, g := range gs {
			for _, row := range g {
				clear(row)
			}
		}
	}
	for sweep := range sweeps {
		moved := 0.0
		set := func(p *float64, v float64) {
			moved = max(moved, math.Abs(*p-v))
			*p = v
		}
		// a: the model's level, its own cells only.
		zero(num, den)
		for _, o := range data {
			num[o.i] += o.w * (o.y - (fitted(o) - t.a[o.i]))
			den[o.i] += o.w
		}
		for i := range nm {
			if den[i] > 0 {
				set(&t.a[i], num[i]/den[i])
			}
		}
		// b: each type's speed, shared; an operator's prior pulls it.
		zero(num, den)
		for _, o := range data {
			num[o.k] += o.w * clamp(o.y-(fitted(o)-t.b[o.k]))
			den[o.k] += o.w
		}
		for k := range nt {
			n, dn := num[k], den[k]+ridgeShared
			if p, ok := priors[k]; ok {
				if ref, ok := t.types[p.Reference]; ok && (t.hasB[ref] || den[ref] > 0) {
					n += ridgePrior * (t.b[ref] + math.Log(p.Speed))
					dn += ridgePrior
					t.hasB[k] = true
				}
			}
			if den[k] > 0 {
				t.hasB[k] = true
			}
			set(&t.b[k], n/dn)
		}
		// g and d: the per-GPU cost of width, and per type.
		zero(num, den)
		for _, o := range data {
			num[o.l] += o.w * clamp(o.y-(fitted(o)-t.g[o.l]))
			den[o.l] += o.w
		}
		for l := range nw {
			set(&t.g[l], num[l]/(den[l]+ridgeShared))
		}
		zeroGrid(numD, denD)
		for _, o := range data {
			numD[o.l][o.k] += o.w * clamp(o.y-(fitted(o)-t.d[o.l][o.k]))
			denD[o.l][o.k] += o.w
		}
		for l := range nw {
			for k := range nt {
				set(&t.d[l][k], numD[l][k]/(denD[l][k]+ridgeD))
			}
		}
		if interact {
			zeroGrid(numR, denR)
			for _, o := range data {
				numR[o.i][o.k] += o.w * (o.y - (fitted(o) - t.r[o.i][o.k]))
				denR[o.i][o.k] += o.w
			}
			for i := range nm {
				for k := range nt {
					set(&t.r[i][k], numR[i][k]/(denR[i][k]+ridgeR))
				}
			}
			zeroGrid(numK, denK)
			for _, o := range data {
				numK[o.i][o.l] += o.w * (o.y - (fitted(o) - t.kk[o.i][o.l]))
				denK[o.i][o.l] += o.w
			}
			for i := range nm {
				for l := range nw {
					set(&t.kk[i][l], numK[i][l]/(denK[i][l]+ridgeK))
				}
			}
		}
		// Converged: no term moved by 1e-6 (in log space) this sweep.
		if sweep > 2 && moved < 1e-6 {
			break
		}
	}
	if nm > 0 {
		for _, x := range t.a {
			t.meanA += x
		}
		t.meanA /= float64(nm)
	}
	if cfg.Method == LowRank {
		t.lowRank(func(yield func(i, c int, res, w float64)) {
			for _, o := range data {
				yield(o.i, o.l*nt+o.k, o.y-fitted(o), o.w)
			}
		}, nm, nw*nt)
	}
	return t, nil
}

func grid(n, m int) [][]float64 {
	out := make([][]float64, n)
	for i := range out {
		out[i] = make([]float64, m)
	}
	return out
}

// lowRank fits residual ~ u[i].v[c] by alternating ridge least squares,
// from a deterministic start.
func (t *Table) lowRank(each func(func(i, c int, res, w float64)), nm, nc int) {
	t.u, t.v = grid(nm, rank), grid(nc, rank)
	for i := range nm {
		for r := range rank {
			t.u[i][r] = 0.1 * math.Sin(float64(1+i*rank+r))
		}
	}
	for c := range nc {
		for r := range rank {
			t.v[c][r] = 0.1 * math.Cos(float64(1+c*rank+r))
		}
	}
	solve := func(rows [][]float64, other [][]float64, pairs map[int][][2]float64) {
		// pairs[x] = (index into other, residual) with weights folded in.
		for x := range rows {
			var A [rank][rank]float64
			var bb [rank]float64
			for r := range rank {
				A[r][r] = ridgeLR
			}
			for _, p := range pairs[x] {
				o := other[int(p[0])]
				for r := range rank {
					bb[r] += o[r] * p[1]
					for s := range rank {
						A[r][s] += o[r] * o[s]
					}
				}
			}
			// 2x2 solve (rank is 2).
			det := A[0][0]*A[1][1] - A[0][1]*A[1][0]
			if det == 0 {
				continue
			}
			rows[x][0] = (bb[0]*A[1][1] - bb[1]*A[0][1]) / det
			rows[x][1] = (A[0][0]*bb[1] - A[1][0]*bb[0]) / det
		}
	}
	byRow, byCol := map[int][][2]float64{}, map[int][][2]float64{}
	each(func(i, c int, res, w float64) {
		// Unit weights: the figures here are one per cell.
		byRow[i] = append(byRow[i], [2]float64{float64(c), res})
		byCol[c] = append(byCol[c], [2]float64{float64(i), res})
	})
	for range 30 {
		solve(t.u, t.v, byRow)
		solve(t.v, t.u, byCol)
	}
}

// Estimate returns the estimate of model at width workers on type typ.
func (t *Table) Estimate(model string, width int, typ planner.GPUType) Estimate {
	k, okT := t.types[typ]
	if width <= 0 || !okT || !t.hasB[k] {
		return Estimate{Sigma: math.Inf(1), Source: NoData}
	}
	i, okM := t.models[model]
	g, d, l, exact := t.widthTerms(width, k)
	if !okM {
		y := t.meanA + t.b[k] + g + d
		return Estimate{Value: math.Exp(y) * float64(width), Sigma: SigmaOf(Prior), Source: Prior}
	}
	if exact {
		if y, ok := t.known[cellKey{i, l, k}]; ok {
			return Estimate{Value: math.Exp(y) * float64(width), Source: Known}
		}
	}
	src := Completed
	switch {
	case t.rowTypes[i][k]:
		src = Scaled
	case !t.typeData[k]:
		src = Operator
	}
	y := t.a[i] + t.b[k] + g + d
	switch t.method {
	case Interact, Similar:
		r := t.r[i][k]
		if !t.rowTypes[i][k] && t.method == Similar {
			r = t.similarR(i, k)
		}
		kk := 0.0
		if exact {
			kk = t.kk[i][l]
			if !t.rowWidths[i][l] && t.method == Similar {
				kk = t.similarK(i, l)
			}
		}
		y += r + kk
	case LowRank:
		if exact {
			c := l*len(t.types) + k
			for r := range rank {
				y += t.u[i][r] * t.v[c][r]
			}
		}
	}
	return Estimate{Value: math.Exp(y) * float64(width), Sigma: SigmaOf(src), Source: src}
}

// widthTerms returns g and d at width for type k: fitted at a width with
// figures (exact, its index l); else interpolated in log2(width) between
// the nearest widths with figures, or extrapolated from the nearest two
// with the per-GPU figure never growing with width (scaling at best
// linear), d then 0.
func (t *Table) widthTerms(width, k int) (g, d float64, l int, exact bool) {
	n := len(t.widths)
	if n == 0 {
		return 0, 0, 0, false
	}
	l, exact = slices.BinarySearch(t.widths, width)
	if exact {
		return t.g[l], t.d[l][k], l, true
	}
	x := math.Log2(float64(width))
	at := func(j int) (float64, float64) { return math.Log2(float64(t.widths[j])), t.g[j] + t.d[j][k] }
	switch {
	case n == 1:
		return t.g[0] + t.d[0][k], 0, -1, false
	case l > 0 && l < n:
		x0, y0 := at(l - 1)
		x1, y1 := at(l)
		return y0 + (y1-y0)*(x-x0)/(x1-x0), 0, -1, false
	case l == 0:
		x0, y0 := at(0)
		x1, y1 := at(1)
		slope := min((y1-y0)/(x1-x0), 0)
		// Narrower than any figure: per GPU at least as fast.
		return y0 + slope*(x-x0), 0, -1, false
	default:
		x0, y0 := at(n - 2)
		x1, y1 := at(n - 1)
		slope := min((y1-y0)/(x1-x0), 0)
		return y1 + slope*(x-x1), 0, -1, false
	}
}

// neighbours is how many similar models the Similar method averages, and
// bandwidth the log distance at which a model counts half.
const (
	neighbours = 5
	bandwidth  = 0.25
	ridgeSim   = 0.5
)

// similarR estimates model i's own departure on type k, which it has no
// figure on, from the models most like it: their departure on k relative
// to the types both have, weighted by how alike they are there.
func (t *Table) similarR(i, k int) float64 {
	shared := func(j int) []int {
		var out []int
		for x := range t.rowTypes[i] {
			if t.rowTypes[j][x] {
				out = append(out, x)
			}
		}
		slices.Sort(out)
		return out
	}
	return t.similar(i, func(j int) (float64, float64, bool) {
		if !t.rowTypes[j][k] {
			return 0, 0, false
		}
		// One shared type says nothing of likeness: b already holds what
		// every model shows.
		xs := shared(j)
		if len(xs) < 2 {
			return 0, 0, false
		}
		mi, mj := 0.0, 0.0
		for _, x := range xs {
			mi += t.r[i][x]
			mj += t.r[j][x]
		}
		mi /= float64(len(xs))
		mj /= float64(len(xs))
		dist := 0.0
		for _, x := range xs {
			e := (t.r[i][x] - mi) - (t.r[j][x] - mj)
			dist += e * e
		}
		conf := float64(len(xs)-1) / float64(len(xs))
		dist /= float64(len(xs) - 1)
		return mi + (t.r[j][k] - mj), conf * math.Exp(-dist/(2*bandwidth*bandwidth)), true
	}, t.r[i][k])
}

// similarK is similarR for a width model i has no figure at.
func (t *Table) similarK(i, l int) float64 {
	return t.similar(i, func(j int) (float64, float64, bool) {
		if !t.rowWidths[j][l] {
			return 0, 0, false
		}
		var xs []int
		for x := range t.rowWidths[i] {
			if t.rowWidths[j][x] {
				xs = append(xs, x)
			}
		}
		if len(xs) < 2 {
			return 0, 0, false
		}
		slices.Sort(xs)
		// Compare the scaling between the shared widths and l: nearest
		// shared width.
		near := xs[0]
		for _, x := range xs {
			if abs(x-l) < abs(near-l) {
				near = x
			}
		}
		dist := 0.0
		for _, x := range xs {
			e := (t.kk[i][x] - t.kk[i][near]) - (t.kk[j][x] - t.kk[j][near])
			dist += e * e
		}
		dist /= float64(len(xs) - 1)
		conf := float64(len(xs)-1) / float64(len(xs))
		return t.kk[i][near] + (t.kk[j][l] - t.kk[j][near]), conf * math.Exp(-dist/(2*bandwidth*bandwidth)), true
	}, t.kk[i][l])
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// similar averages vote(j) over the `neighbours` models with the highest
// weight, shrunk towards fallback by ridgeSim.
func (t *Table) similar(i int, vote func(j int) (value, weight float64, ok bool), fallback float64) float64 {
	type nb struct {
		j    int
		v, w float64
	}
	var nbs []nb
	for j := range t.a {
		if j == i {
			continue
		}
		if v, w, ok := vote(j); ok && w > 0 {
			nbs = append(nbs, nb{j, v, w})
		}
	}
	sort.Slice(nbs, func(a, b int) bool {
		if nbs[a].w != nbs[b].w {
			return nbs[a].w > nbs[b].w
		}
		return nbs[a].j < nbs[b].j
	})
	if len(nbs) > neighbours {
		nbs = nbs[:neighbours]
	}
	// Each vote is clamped around the fallback like every shared pull: a
	// wild model moves the others by a bounded amount.
	lim := math.Log(MaxPull)
	num, den := 0.0, ridgeSim
	for _, n := range nbs {
		num += n.w * min(max(n.v-fallback, -lim), lim)
		den += n.w
	}
	return fallback + num/den
}

// TypeSpeed is how many times as fast typ runs as ref, as learned across
// every model (exp(b(typ) - b(ref))); false when either has no figure and
// no prior.
func (t *Table) TypeSpeed(typ, ref planner.GPUType) (float64, bool) {
	k, ok1 := t.types[typ]
	r, ok2 := t.types[ref]
	if !ok1 || !ok2 || !t.hasB[k] || !t.hasB[r] {
		return 0, false
	}
	return math.Exp(t.b[k] - t.b[r]), true
}

// HasData reports whether some figure of typ is known (not only a prior).
func (t *Table) HasData(typ planner.GPUType) bool {
	k, ok := t.types[typ]
	return ok && t.typeData[k]
}
