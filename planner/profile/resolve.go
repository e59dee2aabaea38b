package profile

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// Unprofiled says what Resolve does with jobs whose (model, scale factor)
// the profile lacks.
type Unprofiled int

const (
	// Refuse (the default) fails, naming every unprofiled pair once with its
	// number of jobs and where the first one is.
	Refuse Unprofiled = iota
	// Skip drops those jobs and reports how many, per pair.
	Skip
	// Extrapolate keeps them and adds entries derived from the nearest
	// profiled scale factor of the same model (Extend has the rule).
	Extrapolate
)

var unprofiledNames = [...]string{Refuse: "refuse", Skip: "skip", Extrapolate: "extrapolate"}

func (u Unprofiled) String() string {
	if u >= 0 && int(u) < len(unprofiledNames) {
		return unprofiledNames[u]
	}
	return fmt.Sprintf("Unprofiled(%d)", int(u))
}

// ParseUnprofiled reads "refuse", "skip" or "extrapolate" ("" is refuse).
func ParseUnprofiled(s string) (Unprofiled, error) {
	if s == "" {
		return Refuse, nil
	}
	if i := slices.Index(unprofiledNames[:], strings.ToLower(strings.TrimSpace(s))); i >= 0 {
		return Unprofiled(i), nil
	}
	return 0, fmt.Errorf("unprofiled mode %q: want refuse (the default), skip or extrapolate", s)
}

// UnprofiledPair is one (model, scale factor) of the input that the profile
// lacks.
type UnprofiledPair struct {
	Pair  Pair
	Jobs  int    // jobs of the input with this pair
	First string // where the first of them is (Resolve's where)
	// Profiled holds the model's profiled scale factors; nil when the
	// profile does not know the model at all.
	Profiled []int
	// Extrapolation says how its entry was made (Extrapolate mode only).
	Extrapolation *Extrapolation
}

// Resolution is what Resolve settled on.
type Resolution struct {
	// Jobs are the jobs to run, in input order: all of them, less the
	// skipped ones in Skip mode.
	Jobs []planner.Job
	// Profile is the profile to run them with: the input's, or in
	// Extrapolate mode a copy with the extrapolated entries added.
	Profile *Profile
	Mode    Unprofiled
	// Unprofiled lists the pairs the input profile lacked, sorted by model
	// then scale factor: skipped in Skip mode, extrapolated in Extrapolate
	// mode.
	Unprofiled []UnprofiledPair
	total      int
}

// Skipped is the number of jobs dropped (Skip mode).
func (r *Resolution) Skipped() int { return r.total - len(r.Jobs) }

// Report says what was skipped or extrapolated, one pair a line, for a
// person to read (the simulator prints it); "" when the profile covered
// every job.
func (r *Resolution) Report() string {
	if len(r.Unprofiled) == 0 {
		return ""
	}
	n := 0
	for _, u := range r.Unprofiled {
		n += u.Jobs
	}
	var b strings.Builder
	if r.Mode == Skip {
		fmt.Fprintf(&b, "skipped %d of %d jobs: their (model, scale factor) is not in the profile:\n", n, r.total)
	} else {
		fmt.Fprintf(&b, "extrapolated %s for %d of %d jobs (the rule: docs/formats.md, \"Jobs the profile does not cover\"):\n",
			plural(len(r.Unprofiled), "(model, scale factor) entry", "(model, scale factor) entries"), n, r.total)
	}
	for _, u := range r.Unprofiled {
		fmt.Fprintf(&b, "  %s: %s, first at %s", u.Pair, plural(u.Jobs, "job", "jobs"), u.First)
		if x := u.Extrapolation; x != nil {
			fmt.Fprintf(&b, "; from scale factor %d, per-GPU throughput kept per doubling:", x.Anchor)
			for _, t := range sortedTypes(x.Efficiency) {
				fmt.Fprintf(&b, " %s %.3g", t, x.Efficiency[t])
				if from := x.EfficiencyFrom[t]; from != FromModel {
					fmt.Fprintf(&b, " (%s)", from)
				}
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// UnprofiledError is Resolve's error for jobs the profile lacks: in Refuse
// mode every unprofiled pair, in Extrapolate mode the pairs whose model the
// profile does not know at all.
type UnprofiledError struct {
	Mode  Unprofiled
	Pairs []UnprofiledPair
}

func (e *UnprofiledError) Error() string {
	n := 0
	for _, u := range e.Pairs {
		n += u.Jobs
	}
	var b strings.Builder
	what := "(model, scale factor) pair"
	if len(e.Pairs) != 1 {
		what += "s"
	}
	if e.Mode == Extrapolate {
		fmt.Fprintf(&b, "%d %s of %s cannot be extrapolated: the profile has the model at no scale factor:\n", len(e.Pairs), what, plural(n, "job", "jobs"))
	} else {
		fmt.Fprintf(&b, "%d %s of %s not in the profile:\n", len(e.Pairs), what, plural(n, "job is", "jobs are"))
	}
	for _, u := range e.Pairs {
		fmt.Fprintf(&b, "  %s: %s, first at %s; ", u.Pair, plural(u.Jobs, "job", "jobs"), u.First)
		if u.Profiled == nil {
			b.WriteString("model not in the profile\n")
		} else {
			fmt.Fprintf(&b, "profiled at scale factor %s\n", joinInts(u.Profiled))
		}
	}
	if e.Mode == Extrapolate {
		b.WriteString("fix: add entries for these models to the profile, or skip their jobs (mode skip; hadar sim --unprofiled skip)")
	} else {
		b.WriteString("fix: add these entries to the profile, or skip those jobs or extrapolate them from the nearest profiled scale factor of the model (mode skip or extrapolate; hadar sim --unprofiled skip|extrapolate)")
	}
	return b.String()
}

// Resolve checks jobs against the profile for a cluster of types, as Check
// does, and settles what to do with jobs whose (model, scale factor) the
// profile lacks according to mode. Every problem is reported once per
// (model, scale factor) pair, with its number of jobs and where(id) of the
// first one: pass trace.Lines.Where to name trace lines ("FILE:LINE"); nil
// names the job ID. Problems no mode settles are errors in every mode: a
// cluster type the profile lacks, and a pair with zero or no throughput on
// every cluster type. An error from Resolve lists every problem found; in
// Refuse mode (and for unknown models in Extrapolate mode) it wraps an
// *UnprofiledError.
func (p *Profile) Resolve(jobs []planner.Job, types []planner.GPUType, mode Unprofiled, where func(id string) string) (*Resolution, error) {
	if mode < Refuse || mode > Extrapolate {
		return nil, fmt.Errorf("profile: unprofiled mode %d: want Refuse, Skip or Extrapolate", mode)
	}
	if len(types) == 0 {
		return nil, errors.New("profile: no GPU types given: want the cluster's types, e.g. v100,p100,k80")
	}
	if where == nil {
		where = func(id string) string { return "job " + id }
	}
	var errs []error
	for _, t := range types {
		if !p.HasType(t) {
			errs = append(errs, fmt.Errorf("GPU type %q is not in the profile (it has %s): add %q figures to the profile or drop the type from the cluster", t, joinTypes(p.types), t))
		}
	}
	missing := groupPairs(jobs, where, func(k Pair) bool {
		_, ok := p.entries[key{k.Model, k.ScaleFactor}]
		return !ok
	})
	for i := range missing {
		if sfs, ok := p.sfs[missing[i].Pair.Model]; ok {
			missing[i].Profiled = slices.Clone(sfs)
		}
	}
	res := &Resolution{Jobs: jobs, Profile: p, Mode: mode, total: len(jobs)}
	switch mode {
	case Refuse:
		if len(missing) > 0 {
			errs = append(errs, &UnprofiledError{Mode: Refuse, Pairs: missing})
		}
	case Skip:
		res.Unprofiled = missing
		res.Jobs = slices.DeleteFunc(slices.Clone(jobs), func(j planner.Job) bool {
			_, ok := p.entries[key{j.Model, j.ScaleFactor}]
			return !ok
		})
	case Extrapolate:
		var unknown []UnprofiledPair
		var pairs []Pair
		for _, u := range missing {
			if u.Profiled == nil {
				unknown = append(unknown, u)
			} else {
				pairs = append(pairs, u.Pair)
			}
		}
		if len(unknown) > 0 {
			errs = append(errs, &UnprofiledError{Mode: Extrapolate, Pairs: unknown})
			break
		}
		q, xs, err := p.Extend(pairs)
		if err != nil {
			return nil, err
		}
		res.Profile, res.Unprofiled = q, missing
		for i := range res.Unprofiled {
			res.Unprofiled[i].Extrapolation = &xs[i]
		}
	}
	if len(errs) == 0 {
		unrunnable := groupPairs(res.Jobs, where, func(k Pair) bool {
			return !slices.ContainsFunc(types, func(t planner.GPUType) bool { return res.Profile.Runnable(k.Model, k.ScaleFactor, t) })
		})
		for _, u := range unrunnable {
			errs = append(errs, fmt.Errorf("%s: %s, first at %s: zero or no throughput on every cluster type (%s): add a GPU type it runs on or drop those jobs",
				u.Pair, plural(u.Jobs, "job", "jobs"), u.First, joinTypes(types)))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return res, nil
}

// groupPairs returns the (model, scale factor) pairs of jobs for which bad
// holds, each once with its number of jobs and where its first job is,
// sorted by model then scale factor.
func groupPairs(jobs []planner.Job, where func(string) string, bad func(Pair) bool) []UnprofiledPair {
	idx := map[Pair]int{}
	var out []UnprofiledPair
	for _, j := range jobs {
		k := Pair{j.Model, j.ScaleFactor}
		if i, seen := idx[k]; seen {
			out[i].Jobs++
			continue
		}
		if !bad(k) {
			continue
		}
		idx[k] = len(out)
		out = append(out, UnprofiledPair{Pair: k, Jobs: 1, First: where(j.ID)})
	}
	slices.SortFunc(out, func(a, b UnprofiledPair) int { return comparePairs(a.Pair, b.Pair) })
	return out
}

func comparePairs(a, b Pair) int {
	if c := strings.Compare(a.Model, b.Model); c != 0 {
		return c
	}
	return a.ScaleFactor - b.ScaleFactor
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
