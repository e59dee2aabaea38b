package agent

import (
	"fmt"
	"math"
	"sync"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// jobProfile is the throughput profile the sidecar plans with: the
// configured profile, plus the figures a job declares itself
// (hadar.throughput). A GPU type the profile does not know is one the job
// cannot run on (throughput 0), not an error: a cluster may have types no
// one profiled, and jobs that declare figures for them can still use them.
type jobProfile struct {
	base speed.Profile
	mu   sync.RWMutex
	jobs map[string]inlineFigures // by model key, see modelKey
}

type inlineFigures struct {
	model       string // hadar.model, "" if none
	workers     int
	throughput  map[planner.GPUType]float64
	sensitivity float64
}

func newJobProfile(base speed.Profile) *jobProfile {
	return &jobProfile{base: base, jobs: map[string]inlineFigures{}}
}

// modelKey is the planner model name of a managed job: its hadar.model,
// or a key of its own when it declares throughputs.
func modelKey(s jobspec.Spec) string {
	if s.Throughput == nil {
		return s.Model
	}
	return fmt.Sprintf("job:%s/%s", s.Namespace, s.JobID)
}

// register records the job's own figures (if any) and returns its model
// key.
func (p *jobProfile) register(s jobspec.Spec) string {
	key := modelKey(s)
	if s.Throughput == nil {
		return key
	}
	f := inlineFigures{model: s.Model, workers: s.Workers, throughput: map[planner.GPUType]float64{}, sensitivity: s.Sensitivity}
	for t, v := range s.Throughput {
		f.throughput[planner.GPUType(t)] = v
	}
	p.mu.Lock()
	p.jobs[key] = f
	p.mu.Unlock()
	return key
}

func (p *jobProfile) forget(key string) {
	p.mu.Lock()
	delete(p.jobs, key)
	p.mu.Unlock()
}

// Throughput implements speed.Profile.
func (p *jobProfile) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	p.mu.RLock()
	f, inline := p.jobs[model]
	p.mu.RUnlock()
	if inline {
		if v, ok := f.throughput[t]; ok {
			// Declared for the job's width; a narrower HadarE copy scales
			// linearly. Spread over the nodes of one rack it pays the square
			// root of its cross-rack sensitivity (rackNetwork adds the
			// rest across racks).
			v *= float64(sf) / float64(f.workers)
			if spread && f.sensitivity > 1 {
				v /= math.Sqrt(f.sensitivity)
			}
			return v, nil
		}
		if f.model == "" {
			return 0, nil // declared figures only, not for this type
		}
		model = f.model
	}
	v, err := p.base.Throughput(model, sf, t, spread)
	if err != nil {
		if known, _ := p.knows(model, sf); known {
			// The model and width are profiled, the type is not: the job
			// cannot be planned there.
			return 0, nil
		}
		return 0, err
	}
	return v, nil
}

// knows reports whether the base profile has (model, sf) on any type.
func (p *jobProfile) knows(model string, sf int) (bool, error) {
	type lister interface{ Types() []planner.GPUType }
	l, ok := p.base.(lister)
	if !ok {
		return false, nil
	}
	var last error
	for _, t := range l.Types() {
		if _, err := p.base.Throughput(model, sf, t, false); err == nil {
			return true, nil
		} else {
			last = err
		}
	}
	return false, last
}
