// Package belief is what a live scheduler believes about speeds before it
// measures them: the throughputs it is told (a profile, an operator's
// overlay and relative speeds of new GPU types, and the figures a job
// declares for itself) and what it costs a unit to spread over nodes and
// racks (the network). The sidecar builds its speed model from these;
// the engine's estimates (planner/engine) correct the throughputs with what
// jobs then report and estimate what no figure covers. The simulator
// builds its model the same way when it predicts the sidecar
// (internal/demo, e2e/scale).
package belief

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
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

// Profile is the throughput profile a live scheduler plans with, in
// layers: the operator's base profile (the embedded one, or a file), an
// overlay file on top of it (reloaded without a restart: SetOverlay), the
// operator's relative speeds of GPU types no figure covers
// (SetRelativeSpeed, and those the files give), and the figures jobs
// declare (Declare).
//
// A key no layer has a figure for answers an error wrapping
// profile.ErrNoFigure: the engine's estimates then estimate it (never a
// silent 0; a 0 is a measured "cannot run there").
//
// Declared figures: under a key of the job's own (ModelKey: "job:<id>")
// they are the job's figures, and its model's fill the types it leaves
// out; under a model's name (only an operator's tool declares there, never
// a job) they are hints, shared by the jobs of the model, that fill only
// what the operator's profile lacks.
//
// Safe for concurrent use.
type Profile struct {
	base speed.Profile

	mu      sync.RWMutex
	overlay *profile.Profile
	// merged is base with the overlay when base is a *profile.Profile
	// (nil otherwise: the overlay is consulted first, then base).
	merged *profile.Profile
	speeds map[planner.GPUType]profile.RelativeSpeed
	jobs   map[string]Declared // by model key (ModelKey)
	gen    uint64
}

// NewProfile returns a profile over base.
func NewProfile(base speed.Profile) *Profile {
	merged, _ := base.(*profile.Profile)
	return &Profile{base: base, merged: merged, jobs: map[string]Declared{}, speeds: map[planner.GPUType]profile.RelativeSpeed{}}
}

// ModelKey is the model name a job is planned and learned under: its
// model (hadar.model: a free name, shared by every job of the model
// across submissions), or, for a job that declares its figures, a key of
// its own ("job:<id>", id holding its namespace), with or without a model.
// A declaration under the model's name would be shared by every job of
// that name in every namespace: the last one admitted would set another
// team's figures, and the first to leave would drop them for all.
func ModelKey(model string, declares bool, id string) string {
	if !declares {
		return model
	}
	return jobPrefix + id
}

const jobPrefix = "job:"

// Declare records a job's own figures under key (ModelKey); a later
// declaration under the same key replaces them.
func (p *Profile) Declare(key string, d Declared) {
	c := d
	c.Throughput = make(map[planner.GPUType]float64, len(d.Throughput))
	for t, v := range d.Throughput {
		c.Throughput[t] = v
	}
	p.mu.Lock()
	p.jobs[key] = c
	p.gen++
	p.mu.Unlock()
}

// Forget drops the figures declared under key.
func (p *Profile) Forget(key string) {
	p.mu.Lock()
	if _, ok := p.jobs[key]; ok {
		delete(p.jobs, key)
		p.gen++
	}
	p.mu.Unlock()
}

// SetOverlay replaces the overlay (nil: none): its entries add to the base
// profile's and replace its figures for the types they name, its relative
// speeds add to the operator's (profile.Profile.Overlay). The engine's
// estimates see the change at their next use (Generation).
func (p *Profile) SetOverlay(over *profile.Profile) error {
	merged, _ := p.base.(*profile.Profile)
	if over != nil && merged != nil {
		m, err := merged.Overlay(over)
		if err != nil {
			return err
		}
		merged = m
	}
	p.mu.Lock()
	p.overlay, p.merged = over, merged
	p.gen++
	p.mu.Unlock()
	return nil
}

// LoadOverlay reads an overlay file (either profile format, relative
// speeds allowed alone) and puts it in force; on any error the overlay in
// force stays. The sidecar calls it at start and whenever the file
// changes.
func (p *Profile) LoadOverlay(path string) error {
	over, err := profile.Load(path)
	if err != nil {
		return fmt.Errorf("profile overlay: %w", err)
	}
	return p.SetOverlay(over)
}

// Overlay is the overlay in force (nil: none).
func (p *Profile) Overlay() *profile.Profile {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.overlay
}

// SetRelativeSpeed records the operator's word that GPU type t runs speed
// times as fast as ref (the sidecar's gpu_types); speed 0 removes it.
func (p *Profile) SetRelativeSpeed(t, ref planner.GPUType, speed float64) error {
	if speed == 0 {
		p.mu.Lock()
		if _, ok := p.speeds[t]; ok {
			delete(p.speeds, t)
			p.gen++
		}
		p.mu.Unlock()
		return nil
	}
	all := p.RelativeSpeeds()
	p.mu.Lock()
	defer p.mu.Unlock()
	next := map[planner.GPUType]profile.RelativeSpeed{}
	for k, v := range p.speeds {
		next[k] = v
	}
	next[t] = profile.RelativeSpeed{Reference: ref, Speed: speed}
	// Validate with every layer's (names, a positive speed, no loop).
	all[t] = next[t]
	if _, err := profile.Build("", nil, all); err != nil {
		return fmt.Errorf("relative speed of %s: %w", t, err)
	}
	if p.speeds[t] != next[t] {
		p.speeds = next
		p.gen++
	}
	return nil
}

// RelativeSpeeds returns the operator's relative speeds in force: the base
// profile's, the overlay's over them, and SetRelativeSpeed's over both.
func (p *Profile) RelativeSpeeds() map[planner.GPUType]profile.RelativeSpeed {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := map[planner.GPUType]profile.RelativeSpeed{}
	if b, ok := p.base.(*profile.Profile); ok {
		for t, r := range b.RelativeSpeeds() {
			out[t] = r
		}
	}
	if p.overlay != nil {
		for t, r := range p.overlay.RelativeSpeeds() {
			out[t] = r
		}
	}
	for t, r := range p.speeds {
		out[t] = r
	}
	return out
}

// Generation changes whenever a figure may have: an overlay, a relative
// speed or a declaration changed.
func (p *Profile) Generation() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.gen
}

// Family is the base profile's model behind key: the job's declared model
// for a key of its own ("" when it named none), else key itself.
func (p *Profile) Family(key string) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if d, ok := p.jobs[key]; ok && strings.HasPrefix(key, jobPrefix) {
		return d.Model
	}
	return key
}

// Throughput implements speed.Profile.
func (p *Profile) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	p.mu.RLock()
	d, declared := p.jobs[model]
	merged, over := p.merged, p.overlay
	p.mu.RUnlock()
	own := declared && strings.HasPrefix(model, jobPrefix)
	if own {
		if v, ok := d.figure(sf, t, spread); ok {
			return v, nil
		}
		if d.Model == "" {
			// hadar.throughput alone names every type the job runs on
			// (docs/jobspec.md): the others are a known 0, not a gap
			// to explore (the task may have no way to run there).
			return 0, nil
		}
		model = d.Model
	}
	v, err := p.profiled(merged, over, model, sf, t, spread)
	if err == nil || !errors.Is(err, profile.ErrNoFigure) {
		return v, err
	}
	if declared && !own {
		// A hint fills what the operator's profile lacks.
		if v, ok := d.figure(sf, t, spread); ok {
			return v, nil
		}
	}
	return 0, err
}

// figure is the declared figure on t at width sf: declared for the job's
// width, a narrower HadarE copy scales linearly; spread over the nodes of
// one rack it pays the square root of its cross-rack sensitivity (Network
// adds the rest across racks).
func (d Declared) figure(sf int, t planner.GPUType, spread bool) (float64, bool) {
	v, ok := d.Throughput[t]
	if !ok || d.Workers <= 0 {
		return 0, false
	}
	v *= float64(sf) / float64(d.Workers)
	if spread && d.Sensitivity > 1 {
		v /= math.Sqrt(d.Sensitivity)
	}
	return v, true
}

// profiled asks the operator's layers: the merged profile, or (a base that
// is not a *profile.Profile) the overlay first, then the base.
func (p *Profile) profiled(merged, over *profile.Profile, model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	if merged != nil {
		return merged.Throughput(model, sf, t, spread)
	}
	if over != nil {
		if v, err := over.Throughput(model, sf, t, spread); err == nil {
			return v, nil
		}
	}
	return p.base.Throughput(model, sf, t, spread)
}

// Entries lists the operator's figures (base and overlay) and the hints
// declared under model names, for the estimator to learn from. A base
// that cannot list its figures contributes none.
func (p *Profile) Entries() []profile.Entry {
	p.mu.RLock()
	merged, over := p.merged, p.overlay
	hints := map[string]Declared{}
	for k, d := range p.jobs {
		if !strings.HasPrefix(k, jobPrefix) {
			hints[k] = d
		}
	}
	p.mu.RUnlock()
	var out []profile.Entry
	if merged != nil {
		out = merged.Entries()
	} else {
		if l, ok := p.base.(interface{ Entries() []profile.Entry }); ok {
			out = l.Entries()
		}
		if over != nil {
			out = append(out, over.Entries()...)
		}
	}
	keys := make([]string, 0, len(hints))
	for k := range hints {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		d := hints[k]
		if d.Workers <= 0 {
			continue
		}
		e := profile.Entry{Model: k, ScaleFactor: d.Workers, Consolidated: map[planner.GPUType]float64{}}
		for t, v := range d.Throughput {
			if _, err := p.profiled(merged, over, k, d.Workers, t, false); errors.Is(err, profile.ErrNoFigure) {
				e.Consolidated[t] = v
			}
		}
		if len(e.Consolidated) > 0 {
			out = append(out, e)
		}
	}
	return out
}
