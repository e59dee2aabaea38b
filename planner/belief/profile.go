// Package belief is what a live scheduler believes about speeds before it
// measures them: the throughputs it is told (a profile, and the figures a
// job declares for itself) and what it costs a unit to spread over nodes
// and racks (the network). The sidecar builds its speed model from these;
// the engine's estimates (planner/engine) correct the throughputs with what
// jobs then report. The simulator builds its model the same way when it
// predicts the sidecar (internal/demo, e2e/scale).
package belief

import (
	"fmt"
	"math"
	"sync"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Declared is what a job says of its own speed (hadar.throughput and
// hadar.sensitivity): steps/s of the whole job, all Workers on one node,
// per GPU type; Model, when also named, covers the types it leaves out.
type Declared struct {
	Model       string
	Workers     int
	Throughput  map[planner.GPUType]float64
	Sensitivity float64
}

// Profile is the throughput profile a live scheduler plans with: a base
// profile plus the figures jobs declare. A GPU type the base does not know
// for a model and width it knows is one the job cannot run on (throughput
// 0), not an error: a cluster may have types no one profiled, and jobs
// that declare figures for them still use them. Safe for concurrent use.
type Profile struct {
	base speed.Profile
	mu   sync.RWMutex
	jobs map[string]Declared // by model key (ModelKey)
}

// NewProfile returns a profile over base.
func NewProfile(base speed.Profile) *Profile {
	return &Profile{base: base, jobs: map[string]Declared{}}
}

// ModelKey is the model name a job is planned under: its profile model, or
// a key of its own (from id) when it declares throughputs.
func ModelKey(model string, declares bool, id string) string {
	if !declares {
		return model
	}
	return "job:" + id
}

// Declare records a job's own figures under key (ModelKey).
func (p *Profile) Declare(key string, d Declared) {
	c := d
	c.Throughput = make(map[planner.GPUType]float64, len(d.Throughput))
	for t, v := range d.Throughput {
		c.Throughput[t] = v
	}
	p.mu.Lock()
	p.jobs[key] = c
	p.mu.Unlock()
}

// Forget drops a job's figures.
func (p *Profile) Forget(key string) {
	p.mu.Lock()
	delete(p.jobs, key)
	p.mu.Unlock()
}

// Family is the base profile's model behind key: the job's declared model
// for a key of declared figures ("" when it named none), else key itself.
func (p *Profile) Family(key string) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if d, ok := p.jobs[key]; ok {
		return d.Model
	}
	return key
}

// Throughput implements speed.Profile.
func (p *Profile) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	p.mu.RLock()
	d, declared := p.jobs[model]
	p.mu.RUnlock()
	if declared {
		if v, ok := d.Throughput[t]; ok {
			// Declared for the job's width; a narrower HadarE copy scales
			// linearly. Spread over the nodes of one rack it pays the square
			// root of its cross-rack sensitivity (Network adds the rest
			// across racks).
			v *= float64(sf) / float64(d.Workers)
			if spread && d.Sensitivity > 1 {
				v /= math.Sqrt(d.Sensitivity)
			}
			return v, nil
		}
		if d.Model == "" {
			return 0, nil // declared figures only, not for this type
		}
		model = d.Model
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
func (p *Profile) knows(model string, sf int) (bool, error) {
	type lister interface{ Types() []planner.GPUType }
	l, ok := p.base.(lister)
	if !ok {
		return false, nil
	}
	var last error
	for _, t := range l.Types() {
		_, err := p.base.Throughput(model, sf, t, false)
		if err == nil {
			return true, nil
		}
		last = err
	}
	if last == nil {
		last = fmt.Errorf("model %q on %d GPUs: no profiled type", model, sf)
	}
	return false, last
}
