package jobspec

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner/profile"
)

// CheckProfile checks the spec against the throughput profile the sidecar
// plans with: hadar.model must name a profiled job type, and without
// hadar.throughput the profile must have figures at hadar.workers. With
// hadar.throughput the job needs nothing more from the profile. The error
// is a *FieldError.
func (s Spec) CheckProfile(p *profile.Profile) error {
	if s.Model == "" {
		return nil
	}
	fail := func(field, value, want string) error {
		return &FieldError{Job: s.JobID, Namespace: s.Namespace, Field: field, Value: value, Want: want}
	}
	sfs := p.ScaleFactors(s.Model)
	if sfs == nil {
		models := p.Models()
		if len(models) > 3 {
			models = append(models[:3], "...")
		}
		return fail(KeyModel, s.Model, fmt.Sprintf("unknown job type: want one of the profile's %d job types (%s), or drop hadar.model and give hadar.throughput (e.g. \"v100=40,k80=12\")",
			len(p.Models()), strings.Join(quote(models), ", ")))
	}
	if s.Throughput != nil {
		return nil
	}
	for _, sf := range sfs {
		if sf == s.Workers {
			return nil
		}
	}
	shown := make([]string, len(sfs))
	for i, sf := range sfs {
		shown[i] = strconv.Itoa(sf)
	}
	return fail(KeyWorkers, strconv.Itoa(s.Workers), fmt.Sprintf("the profile has no figures for %q at %d workers (it has %s): use one of those or give hadar.throughput",
		s.Model, s.Workers, strings.Join(shown, ", ")))
}

func quote(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		if s == "..." {
			out[i] = s
			continue
		}
		out[i] = strconv.Quote(s)
	}
	return out
}
