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
	// speeds are the operator's relative speeds of types (RelativeSpeed).
	speeds map[planner.GPUType]RelativeSpeed
}

// ErrNoFigure is wrapped by every Throughput error that says the profile
// has no figure for the key (an unknown model, scale factor or GPU type),
// as opposed to a measured 0: an estimator may then estimate the figure.
var ErrNoFigure = errors.New("no figure")

// noFigure wraps ErrNoFigure into a message that names the key and the fix.
type noFigure struct{ msg string }

func (e *noFigure) Error() string          { return e.msg }
func (e *noFigure) Unwrap() error          { return ErrNoFigure }
func noFigureErr(f string, a ...any) error { return &noFigure{fmt.Sprintf(f, a...)} }

// RelativeSpeed is what an operator says of a GPU type no figure covers:
// it runs Speed times as fast as Reference (2.5: a job makes 2.5 times the
// steps/s). It is a prior: an estimator uses it until jobs measured the
// type (docs/formats.md, "Relative speeds").
type RelativeSpeed struct {
	Reference planner.GPUType `json:"reference"`
	Speed     float64         `json:"speed"`
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
	return Build(source, entries, nil)
}

// Build is New that also takes the operator's relative speeds of GPU
// types (RelativeSpeed), and accepts no entries when it has speeds: an
// overlay may only say how fast a new type is.
func Build(source string, entries []Entry, speeds map[planner.GPUType]RelativeSpeed) (*Profile, error) {
	if len(entries) == 0 && len(speeds) == 0 {
		return nil, errors.New("profile has no entries and no relative speeds: want at least one (model, scale_factor) entry or one relative speed")
	}
	p := &Profile{source: source, entries: make(map[key]entry, len(entries)), sfs: map[string][]int{}}
	sp, err := checkSpeeds(speeds)
	if err != nil {
		return nil, err
	}
	p.speeds = sp
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
	return 0, noFigureErr("profile: %q at scale factor %d has no throughput for GPU type %q (its types: %s): add a consolidated %q figure to that entry, or use a type the profile knows",
		model, sf, t, joinTypes(sortedTypes(e.consolidated)), t)
}

func (p *Profile) lookup(model string, sf int) (entry, error) {
	e, ok := p.entries[key{model, sf}]
	if ok {
		return e, nil
	}
	sfs, known := p.sfs[model]
	if !known {
		return entry{}, noFigureErr("profile: unknown model %q: want one of %s, or add entries for it to the profile", model, quoteAll(p.models))
	}
	return entry{}, noFigureErr("profile: model %q has no scale factor %d (profiled: %s): use one of those or add a (%q, %d) entry to the profile",
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

// RelativeSpeeds returns the operator's relative speeds of GPU types
// (a copy; nil when none).
func (p *Profile) RelativeSpeeds() map[planner.GPUType]RelativeSpeed {
	if len(p.speeds) == 0 {
		return nil
	}
	out := make(map[planner.GPUType]RelativeSpeed, len(p.speeds))
	for t, r := range p.speeds {
		out[t] = r
	}
	return out
}

// checkSpeeds validates relative speeds: valid type names, a reference
// other than the type, a finite positive speed; no chain may loop back.
func checkSpeeds(in map[planner.GPUType]RelativeSpeed) (map[planner.GPUType]RelativeSpeed, error) {
	out := make(map[planner.GPUType]RelativeSpeed, len(in))
	for t, r := range in {
		switch {
		case !t.ValidName():
			return nil, fmt.Errorf("relative_speeds: GPU type %q: want a lowercase name of letters, digits, '-' or '_'", t)
		case !r.Reference.ValidName():
			return nil, fmt.Errorf("relative_speeds.%s: reference %q: want the name of a GPU type, e.g. \"v100\"", t, r.Reference)
		case r.Reference == t:
			return nil, fmt.Errorf("relative_speeds.%s: reference is the type itself: want another type", t)
		case !(r.Speed > 0) || math.IsInf(r.Speed, 0):
			return nil, fmt.Errorf("relative_speeds.%s: speed %v: want a positive number (2.5 = 2.5 times as fast as %s)", t, r.Speed, r.Reference)
		}
		out[t] = r
	}
	for t := range out {
		seen := map[planner.GPUType]bool{t: true}
		for r, ok := out[t]; ok; r, ok = out[r.Reference] {
			if seen[r.Reference] {
				return nil, fmt.Errorf("relative_speeds.%s: its references loop back to %s: want a chain that ends at a type with figures", t, r.Reference)
			}
			seen[r.Reference] = true
		}
	}
	return out, nil
}

// Overlay returns p with over's figures added: an entry of over replaces
// p's figures for the types it names (consolidated and spread alike) and
// adds the rest, a new (model, scale factor) is added, and over's relative
// speeds replace p's for the same types. Neither profile is changed.
func (p *Profile) Overlay(over *Profile) (*Profile, error) {
	if over == nil {
		return p, nil
	}
	byKey := map[key]Entry{}
	var order []key
	for _, e := range p.Entries() {
		k := key{e.Model, e.ScaleFactor}
		byKey[k] = e
		order = append(order, k)
	}
	for _, e := range over.Entries() {
		k := key{e.Model, e.ScaleFactor}
		b, ok := byKey[k]
		if !ok {
			byKey[k] = e
			order = append(order, k)
			continue
		}
		for t, v := range e.Consolidated {
			b.Consolidated[t] = v
			// A figure replaced without a spread one must not keep the
			// old spread figure: it belonged to the old measurement.
			if _, ok := e.Spread[t]; !ok && b.Spread != nil {
				delete(b.Spread, t)
			}
		}
		for t, v := range e.Spread {
			if b.Spread == nil {
				b.Spread = map[planner.GPUType]float64{}
			}
			b.Spread[t] = v
		}
		byKey[k] = b
	}
	entries := make([]Entry, len(order))
	for i, k := range order {
		entries[i] = byKey[k]
	}
	speeds := p.RelativeSpeeds()
	if speeds == nil {
		speeds = map[planner.GPUType]RelativeSpeed{}
	}
	for t, r := range over.speeds {
		speeds[t] = r
	}
	source := p.source
	if over.source != "" {
		source = strings.TrimPrefix(source+"; overlay: "+over.source, "; ")
	}
	q, err := Build(source, entries, speeds)
	if err != nil {
		return nil, fmt.Errorf("profile overlay: %w", err)
	}
	return q, nil
}

// Equal reports whether p and q hold the same figures and relative speeds
// (Source is ignored).
func (p *Profile) Equal(q *Profile) bool {
	if len(p.entries) != len(q.entries) || len(p.speeds) != len(q.speeds) {
		return false
	}
	for t, r := range p.speeds {
		if q.speeds[t] != r {
			return false
		}
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

// WithTypeAs returns p with type t given as's figures everywhere as has
// one (consolidated and spread): a cluster can then declare two types of
// identical GPUs (say v100 split over two node pools as v100 and v100b).
// t must be a new type; p is unchanged.
func (p *Profile) WithTypeAs(t, as planner.GPUType) (*Profile, error) {
	switch {
	case !t.ValidName():
		return nil, fmt.Errorf("GPU type %q: want a lowercase name of letters, digits, '-' or '_'", t)
	case p.HasType(t):
		return nil, fmt.Errorf("GPU type %q is already in the profile: want a new type", t)
	case !p.HasType(as):
		return nil, fmt.Errorf("GPU type %q has no figures in the profile (it has %s)", as, joinTypes(p.types))
	}
	entries := p.Entries()
	for i := range entries {
		e := &entries[i]
		if v, ok := e.Consolidated[as]; ok {
			e.Consolidated[t] = v
		}
		if v, ok := e.Spread[as]; ok {
			e.Spread[t] = v
		}
	}
	return Build(p.source+fmt.Sprintf(" (%s as %s)", t, as), entries, p.RelativeSpeeds())
}
