// Package profile holds measured job throughputs: steps/s of a model at a
// scale factor on a GPU type, consolidated on one server or spread across
// several. It reads Gavel's throughput files and hadar's own format
// (docs/formats.md) and embeds Gavel's simulation and physical-cluster
// measurements.
//
// A Profile is immutable once built, so one value may be shared freely
// between goroutines.
package profile

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// key identifies one profiled job configuration.
type key struct {
	model string
	sf    int
}

// entry holds the figures of one (model, sf). spread only has types whose
// spread throughput was measured; the others fall back to consolidated.
type entry struct {
	consolidated map[planner.GPUType]float64
	spread       map[planner.GPUType]float64
}

// Profile maps (model, scale factor, GPU type, spread) to steps/s.
type Profile struct {
	source  string
	entries map[key]entry
	types   []planner.GPUType // union of consolidated types, sorted
	models  []string          // sorted
	sfs     map[string][]int  // per model, sorted
}

// Entry is one (model, scale factor) of a profile in exported form, used to
// build a profile in code (New) and to walk one (Entries).
type Entry struct {
	Model       string
	ScaleFactor int
	// Consolidated: steps/s of the whole job with all its workers on one
	// server, per GPU type. Zero means the job cannot run on that type.
	Consolidated map[planner.GPUType]float64
	// Spread: steps/s with the workers on several servers. Types missing
	// here fall back to Consolidated. Must be empty at scale factor 1.
	Spread map[planner.GPUType]float64
}

// New builds a profile from entries after validating them: non-empty
// model, positive scale factor, unique (model, sf), finite non-negative
// throughputs, lowercase non-empty type names, spread types also present in
// consolidated. source is free text saying where the figures came from.
func New(source string, entries []Entry) (*Profile, error) {
	if len(entries) == 0 {
		return nil, errors.New("profile has no entries: want at least one (model, scale_factor) entry")
	}
	p := &Profile{source: source, entries: make(map[key]entry, len(entries)), sfs: map[string][]int{}}
	seenType := map[planner.GPUType]bool{}
	for i, e := range entries {
		where := fmt.Sprintf("entry %d (model %q, scale_factor %d)", i, e.Model, e.ScaleFactor)
		if strings.TrimSpace(e.Model) == "" {
			return nil, fmt.Errorf("entry %d: model is empty: want a job type such as \"ResNet-18 (batch size 16)\"", i)
		}
		if e.ScaleFactor <= 0 {
			return nil, fmt.Errorf("%s: scale_factor: want a positive number of GPUs", where)
		}
		k := key{e.Model, e.ScaleFactor}
		if _, dup := p.entries[k]; dup {
			return nil, fmt.Errorf("%s: duplicate (model, scale_factor): keep one entry per pair", where)
		}
		if len(e.Consolidated) == 0 {
			return nil, fmt.Errorf("%s: consolidated is empty: want steps/s for at least one GPU type", where)
		}
		if e.ScaleFactor == 1 && len(e.Spread) > 0 {
			return nil, fmt.Errorf("%s: spread given at scale_factor 1: a one-GPU job cannot be split across servers; remove spread", where)
		}
		cons, err := checkFigures(where, "consolidated", e.Consolidated)
		if err != nil {
			return nil, err
		}
		spread, err := checkFigures(where, "spread", e.Spread)
		if err != nil {
			return nil, err
		}
		for t := range spread {
			if _, ok := cons[t]; !ok {
				return nil, fmt.Errorf("%s: spread.%s has no consolidated.%s: add the consolidated figure or drop the spread one", where, t, t)
			}
		}
		for t := range cons {
			seenType[t] = true
		}
		p.entries[k] = entry{consolidated: cons, spread: spread}
		if _, ok := p.sfs[e.Model]; !ok {
			p.models = append(p.models, e.Model)
		}
		p.sfs[e.Model] = append(p.sfs[e.Model], e.ScaleFactor)
	}
	for t := range seenType {
		p.types = append(p.types, t)
	}
	slices.Sort(p.types)
	slices.Sort(p.models)
	for _, s := range p.sfs {
		slices.Sort(s)
	}
	return p, nil
}

// checkFigures validates one type->steps/s map and returns a copy (so the
// caller cannot mutate the profile afterwards).
func checkFigures(where, field string, in map[planner.GPUType]float64) (map[planner.GPUType]float64, error) {
	out := make(map[planner.GPUType]float64, len(in))
	for t, v := range in {
		name := strings.TrimSpace(string(t))
		switch {
		case name == "":
			return nil, fmt.Errorf("%s: %s has an empty GPU type name: want a name such as \"v100\"", where, field)
		case name != strings.ToLower(name) || name != string(t):
			return nil, fmt.Errorf("%s: %s GPU type %q: want a lowercase name without spaces, e.g. %q", where, field, t, strings.ToLower(name))
		case math.IsNaN(v) || math.IsInf(v, 0):
			return nil, fmt.Errorf("%s: %s.%s = %v: want a finite number of steps/s", where, field, t, v)
		case v < 0:
			return nil, fmt.Errorf("%s: %s.%s = %v: want steps/s >= 0 (0 = cannot run there)", where, field, t, v)
		}
		out[t] = v
	}
	return out, nil
}

// Source says where the profile's figures came from (free text, may be "").
func (p *Profile) Source() string { return p.source }

// Types returns every GPU type with a consolidated figure in some entry,
// sorted by name.
func (p *Profile) Types() []planner.GPUType { return slices.Clone(p.types) }

// Models returns the profiled models, sorted.
func (p *Profile) Models() []string { return slices.Clone(p.models) }

// ScaleFactors returns the profiled scale factors of model, sorted; nil for
// an unknown model.
func (p *Profile) ScaleFactors(model string) []int { return slices.Clone(p.sfs[model]) }

// HasType reports whether t has a consolidated figure in some entry.
func (p *Profile) HasType(t planner.GPUType) bool {
	_, ok := slices.BinarySearch(p.types, t)
	return ok
}

// Throughput returns the steps/s of the whole job (aggregate over its sf
// workers) of model at scale factor sf on GPU type t. spread=true asks for
// the job's workers sitting on several servers (Gavel's "<type>_unconsolidated"
// figures). Where no spread figure was measured for t the consolidated one is
// returned: the profile then knows of no penalty, and inventing one here
// would hide that from the network model which owns such estimates. sf == 1
// is never spread. A measured zero returns (0, nil): the job cannot run on t.
func (p *Profile) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	e, err := p.lookup(model, sf)
	if err != nil {
		return 0, err
	}
	if spread && sf > 1 {
		if v, ok := e.spread[t]; ok {
			return v, nil
		}
	}
	if v, ok := e.consolidated[t]; ok {
		return v, nil
	}
	return 0, fmt.Errorf("profile: %q at scale factor %d has no throughput for GPU type %q (its types: %s): add a consolidated %q figure to that entry, or use a type the profile knows",
		model, sf, t, joinTypes(sortedTypes(e.consolidated)), t)
}

func (p *Profile) lookup(model string, sf int) (entry, error) {
	e, ok := p.entries[key{model, sf}]
	if ok {
		return e, nil
	}
	sfs, known := p.sfs[model]
	if !known {
		return entry{}, fmt.Errorf("profile: unknown model %q: want one of %s, or add entries for it to the profile", model, quoteAll(p.models))
	}
	return entry{}, fmt.Errorf("profile: model %q has no scale factor %d (profiled: %s): use one of those or add a (%q, %d) entry to the profile",
		model, sf, joinInts(sfs), model, sf)
}

// Runnable reports whether model at sf has a positive consolidated
// throughput on t. Unknown keys are not runnable.
func (p *Profile) Runnable(model string, sf int, t planner.GPUType) bool {
	e, ok := p.entries[key{model, sf}]
	return ok && e.consolidated[t] > 0
}

// maxCheckErrors bounds the errors Check lists: a wrong profile for a whole
// trace would otherwise print every job.
const maxCheckErrors = 10

// Check verifies that the profile can drive jobs on a cluster of types:
// every type is known to the profile, and every job's (model, sf) is
// profiled and runnable (positive consolidated throughput) on at least one of
// types. It lists up to 10 problems, each naming the job, the key and a fix.
// Resolve does the same check per (model, scale factor) pair, names trace
// lines, and can skip or extrapolate jobs the profile lacks.
func (p *Profile) Check(jobs []planner.Job, types []planner.GPUType) error {
	if len(types) == 0 {
		return errors.New("profile check: no GPU types given: want the cluster's types, e.g. v100,p100,k80")
	}
	var errs []error
	for _, t := range types {
		if !p.HasType(t) {
			errs = append(errs, fmt.Errorf("GPU type %q is not in the profile (it has %s): add %q figures to the profile or drop the type from the cluster", t, joinTypes(p.types), t))
		}
	}
	for _, j := range jobs {
		if _, err := p.lookup(j.Model, j.ScaleFactor); err != nil {
			errs = append(errs, fmt.Errorf("job %s: %w", j.ID, err))
		} else if !slices.ContainsFunc(types, func(t planner.GPUType) bool { return p.Runnable(j.Model, j.ScaleFactor, t) }) {
			errs = append(errs, fmt.Errorf("job %s: (%q, %d) has zero or no throughput on every cluster type (%s): add a GPU type it runs on or drop the job",
				j.ID, j.Model, j.ScaleFactor, joinTypes(types)))
		}
	}
	if n := len(errs); n > maxCheckErrors {
		errs = append(errs[:maxCheckErrors], fmt.Errorf("... and %d more problems", n-maxCheckErrors))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("profile check: %w", errors.Join(errs...))
}

// Entries returns the profile's entries sorted by model then scale factor;
// the maps are copies.
func (p *Profile) Entries() []Entry {
	out := make([]Entry, 0, len(p.entries))
	for _, m := range p.models {
		for _, sf := range p.sfs[m] {
			e := p.entries[key{m, sf}]
			x := Entry{Model: m, ScaleFactor: sf, Consolidated: cloneMap(e.consolidated)}
			if len(e.spread) > 0 {
				x.Spread = cloneMap(e.spread)
			}
			out = append(out, x)
		}
	}
	return out
}

// Equal reports whether p and q hold the same figures (Source is ignored).
func (p *Profile) Equal(q *Profile) bool {
	if len(p.entries) != len(q.entries) {
		return false
	}
	for k, a := range p.entries {
		b, ok := q.entries[k]
		if !ok || !mapsEqual(a.consolidated, b.consolidated) || !mapsEqual(a.spread, b.spread) {
			return false
		}
	}
	return true
}

func mapsEqual(a, b map[planner.GPUType]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for t, v := range a {
		w, ok := b[t]
		if !ok || v != w {
			return false
		}
	}
	return true
}

func cloneMap(m map[planner.GPUType]float64) map[planner.GPUType]float64 {
	out := make(map[planner.GPUType]float64, len(m))
	for t, v := range m {
		out[t] = v
	}
	return out
}

func sortedTypes(m map[planner.GPUType]float64) []planner.GPUType {
	out := make([]planner.GPUType, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func joinTypes(ts []planner.GPUType) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	sort.Strings(q)
	return strings.Join(q, ", ")
}
