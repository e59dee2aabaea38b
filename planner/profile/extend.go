package profile

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/hadar-sched/hadar/planner"
)

// Pair is one (model, scale factor) key of a profile.
type Pair struct {
	Model       string
	ScaleFactor int
}

func (k Pair) String() string { return fmt.Sprintf("(%q, %d)", k.Model, k.ScaleFactor) }

// Extrapolation says how Extend derived one entry.
type Extrapolation struct {
	Pair Pair
	// Anchor is the profiled scale factor of the same model the figures
	// scale from: the nearest one below, or the smallest when none is below.
	Anchor int
	// Efficiency is, per GPU type with a positive figure at the anchor, the
	// per-GPU throughput kept per doubling of the scale factor (1 = linear
	// scaling), and EfficiencyFrom where it came from. Types with a zero at
	// the anchor have none: their figure stays 0.
	Efficiency     map[planner.GPUType]float64
	EfficiencyFrom map[planner.GPUType]Evidence
	// SpreadRatio is, per GPU type with a spread figure, spread/consolidated
	// applied to the extrapolated consolidated figure, and SpreadFrom where
	// it came from. Types without one have no spread figure.
	SpreadRatio map[planner.GPUType]float64
	SpreadFrom  map[planner.GPUType]Evidence
}

// Evidence says where an extrapolation parameter came from.
type Evidence string

const (
	FromModel   Evidence = "model"          // the model's own profiled figures
	FromProfile Evidence = "profile median" // the median over the profile's models with evidence
	NoEvidence  Evidence = "no evidence"    // nothing in the profile: linear scaling
)

// Extend returns p with an extrapolated entry for each of pairs that p
// lacks (pairs p has are left alone), and how each was derived, sorted by
// model then scale factor. A pair whose model p does not know at all is an
// error: there is nothing to extrapolate from. p itself is not changed.
//
// The rule (docs/formats.md, "Jobs the profile does not cover"): data-parallel
// throughput per GPU falls by a roughly constant factor e per doubling of the
// workers, as the all-reduce grows against the compute. For a model m
// missing scale factor s, per GPU type t:
//
//   - u(x) = T(m, x, t) / x is the per-GPU throughput at a profiled x;
//   - if s lies between two profiled scale factors lo < s < hi, e is fitted
//     through them, e = (u(hi)/u(lo))^(1/log2(hi/lo)), anchor lo: log-linear
//     interpolation, exact at both ends;
//   - otherwise e is fitted through the model's smallest and largest profiled
//     scale factors (all its evidence, which on Gavel's data predicts better
//     than the nearest pair alone), capped at 1 so that a super-linear
//     measurement is never compounded into a faster-than-linear prediction,
//     and the anchor is the nearest profiled scale factor (the largest when
//     s is above them all, the smallest when below);
//   - T(m, s, t) = s * u(anchor) * e^log2(s/anchor).
//
// A zero at the anchor stays zero (data parallelism keeps the per-GPU
// memory need, so a job that does not fit at the anchor does not fit at s).
// Where the model gives no e for t (one profiled scale factor, or a zero at
// the other end), e is the median over the profile's other models for t
// (capped at 1), or 1 if none has evidence. The spread figure at s > 1 is the
// extrapolated consolidated one times spread/consolidated at the model's
// nearest profiled multi-GPU scale factor with a spread figure for t, else
// the median of that ratio over the profile's models at their largest such
// scale factor, else none (the profile then knows no penalty, as for any
// entry without spread figures).
func (p *Profile) Extend(pairs []Pair) (*Profile, []Extrapolation, error) {
	var want []Pair
	var unknown []string
	for _, k := range pairs {
		if k.ScaleFactor <= 0 {
			return nil, nil, fmt.Errorf("profile: extend %s: want a positive scale factor", k)
		}
		if _, ok := p.entries[key{k.Model, k.ScaleFactor}]; ok || slices.Contains(want, k) {
			continue
		}
		if _, ok := p.sfs[k.Model]; !ok {
			if !slices.Contains(unknown, k.Model) {
				unknown = append(unknown, k.Model)
			}
			continue
		}
		want = append(want, k)
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, nil, fmt.Errorf("profile: cannot extrapolate models the profile does not have at any scale factor (%s): add entries for them", quoteAll(unknown))
	}
	if len(want) == 0 {
		return p, nil, nil
	}
	slices.SortFunc(want, comparePairs)
	medEff, medSpread := p.medianScaling()
	entries := p.Entries()
	out := make([]Extrapolation, 0, len(want))
	for _, k := range want {
		e, x := p.extrapolate(k, medEff, medSpread)
		entries = append(entries, e)
		out = append(out, x)
	}
	source := fmt.Sprintf("%d entries extrapolated (docs/formats.md)", len(want))
	if p.source != "" {
		source = p.source + "; " + source
	}
	q, err := New(source, entries)
	if err != nil {
		return nil, nil, fmt.Errorf("profile: extend: %w", err)
	}
	return q, out, nil
}

// extrapolate derives the entry of k, whose model p has.
func (p *Profile) extrapolate(k Pair, medEff, medSpread map[planner.GPUType]float64) (Entry, Extrapolation) {
	sfs := p.sfs[k.Model]
	s := k.ScaleFactor
	lo, hi := sfs[0], sfs[len(sfs)-1]
	anchor, capped := lo, true
	switch i, _ := slices.BinarySearch(sfs, s); {
	case i > 0 && i < len(sfs): // between two profiled sizes
		lo, hi, anchor, capped = sfs[i-1], sfs[i], sfs[i-1], false
	case i == len(sfs):
		anchor = hi
	}
	a := p.entries[key{k.Model, anchor}]
	e := Entry{Model: k.Model, ScaleFactor: s, Consolidated: map[planner.GPUType]float64{}}
	x := Extrapolation{Pair: k, Anchor: anchor, Efficiency: map[planner.GPUType]float64{}, EfficiencyFrom: map[planner.GPUType]Evidence{}}
	for t, v := range a.consolidated {
		if v == 0 {
			e.Consolidated[t] = 0
			continue
		}
		eff, from := 1.0, NoEvidence
		if own, ok := p.efficiency(k.Model, lo, hi, t); ok {
			eff, from = own, FromModel
			if capped {
				eff = min(eff, 1)
			}
		} else if m, ok := medEff[t]; ok {
			eff, from = m, FromProfile
		}
		x.Efficiency[t], x.EfficiencyFrom[t] = eff, from
		e.Consolidated[t] = float64(s) * v / float64(anchor) * math.Pow(eff, math.Log2(float64(s)/float64(anchor)))
	}
	if s == 1 {
		return e, x
	}
	for t, v := range e.Consolidated {
		r, from := 0.0, FromModel
		ok := false
		if r, ok = p.spreadRatio(k.Model, s, t); !ok {
			r, ok = medSpread[t]
			from = FromProfile
		}
		if !ok {
			continue
		}
		if e.Spread == nil {
			e.Spread = map[planner.GPUType]float64{}
			x.SpreadRatio, x.SpreadFrom = map[planner.GPUType]float64{}, map[planner.GPUType]Evidence{}
		}
		e.Spread[t], x.SpreadRatio[t], x.SpreadFrom[t] = v*r, r, from
	}
	return e, x
}

// efficiency is the per-doubling efficiency of model on t between its
// profiled scale factors lo < hi; false when they are one size or either
// figure is not positive.
func (p *Profile) efficiency(model string, lo, hi int, t planner.GPUType) (float64, bool) {
	if lo == hi {
		return 0, false
	}
	a, b := p.entries[key{model, lo}].consolidated[t], p.entries[key{model, hi}].consolidated[t]
	if !(a > 0 && b > 0) {
		return 0, false
	}
	ua, ub := a/float64(lo), b/float64(hi)
	return math.Pow(ub/ua, 1/math.Log2(float64(hi)/float64(lo))), true
}

// spreadRatio is spread/consolidated on t at the profiled multi-GPU scale
// factor of model nearest to s (in doublings; the larger on a tie) that has
// a spread figure for t and a positive consolidated one.
func (p *Profile) spreadRatio(model string, s int, t planner.GPUType) (float64, bool) {
	best, bestDist, found := 0.0, math.Inf(1), false
	for _, sf := range p.sfs[model] {
		e := p.entries[key{model, sf}]
		sp, ok := e.spread[t]
		if sf == 1 || !ok || !(e.consolidated[t] > 0) {
			continue
		}
		if d := math.Abs(math.Log2(float64(s) / float64(sf))); d <= bestDist {
			best, bestDist, found = sp/e.consolidated[t], d, true
		}
	}
	return best, found
}

// medianScaling returns, per GPU type, the median over the models with
// evidence of the per-doubling efficiency between their smallest and largest
// profiled scale factors (capped at 1), and of spread/consolidated at their
// largest scale factor with a spread figure.
func (p *Profile) medianScaling() (eff, spread map[planner.GPUType]float64) {
	effs, ratios := map[planner.GPUType][]float64{}, map[planner.GPUType][]float64{}
	for _, m := range p.models {
		sfs := p.sfs[m]
		lo, hi := sfs[0], sfs[len(sfs)-1]
		for _, t := range p.types {
			if e, ok := p.efficiency(m, lo, hi, t); ok {
				effs[t] = append(effs[t], min(e, 1))
			}
			for i := len(sfs) - 1; i >= 0; i-- {
				e := p.entries[key{m, sfs[i]}]
				if sp, ok := e.spread[t]; ok && sfs[i] > 1 && e.consolidated[t] > 0 {
					ratios[t] = append(ratios[t], sp/e.consolidated[t])
					break
				}
			}
		}
	}
	return medians(effs), medians(ratios)
}

func medians(in map[planner.GPUType][]float64) map[planner.GPUType]float64 {
	out := make(map[planner.GPUType]float64, len(in))
	for t, v := range in {
		slices.Sort(v)
		n := len(v)
		out[t] = (v[(n-1)/2] + v[n/2]) / 2
	}
	return out
}
