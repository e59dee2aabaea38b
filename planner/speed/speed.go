// Package speed turns a placement into a training speed: the steps/s a job
// makes given which GPU types and servers its workers sit on.
//
// The model (docs/policies.md, "Speed of a placement"):
//   - A unit whose workers share one GPU type runs at the profiled
//     throughput of that type, consolidated when it sits on one server and
//     spread (Gavel's "_unconsolidated" figures) when it spans several.
//   - A unit mixing GPU types (Hadar's task-level placement) trains
//     synchronously: every step waits for the slowest worker, so it runs at
//     the minimum over its types of the throughput that type alone would
//     give, spread if the unit spans servers, times MixedEfficiency.
//   - A job's speed is the sum of its units' speeds (HadarE copies).
//   - An optional Network multiplies in a topology-aware slowdown.
//
// Elastic jobs (planner.Job.Widths) keep a fixed global batch, and their
// speed at any width w is the profiled figure T(w), with no conversion.
// A profile's figures are steps/s of the whole job aggregated over its
// workers (docs/formats.md): one step is one worker's step on its
// per-worker batch b, so a job processes about b*T(w) samples/s at width
// w, and its TotalSteps count those same steps (samples / b). With the
// global batch fixed the samples a job needs do not depend on its width,
// so its progress in its own steps is T(w) per second (to first order:
// the per-worker batch at width w is s*b/w, measured at b). Reading T(w)
// as synchronous steps of w*b samples each would make the rate w*T(w)/s
// instead, which Gavel's figures refute: they grow about linearly in w
// (ResNet-50, batch 64, on K80: 0.62 steps/s at 1 GPU, 4.57 at 8), and
// that reading would have 8 K80s process 59 times the samples of one.
package speed

import (
	"fmt"
	"math"

	"github.com/hadar-sched/hadar/planner"
)

// Profile is the throughput source (planner/profile.Profile satisfies it).
type Profile interface {
	Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error)
}

// Network prices communication: the factor (>= 1) by which a unit's step
// time grows at time now because of where its workers sit. It replaces the
// consolidated/spread distinction of the profile when set.
type Network interface {
	Slowdown(job planner.Job, u planner.Unit, now float64) float64
}

// Model computes placement speeds.
type Model struct {
	Profile Profile
	// IgnoreSpread treats every placement as consolidated (Gavel's
	// simulator has no placement effect).
	IgnoreSpread bool
	// MixedEfficiency scales a mixed-type unit's speed to account for
	// load imbalance beyond the slowest worker (1 = none). Zero means 1.
	MixedEfficiency float64
	Network         Network
}

// UnitRate returns the steps/s of one unit of job: the profiled figure at
// the unit's width, for rigid and elastic jobs alike (see the package
// comment, "Elastic jobs").
func (m Model) UnitRate(job planner.Job, u planner.Unit, now float64) (float64, error) {
	workers := u.GPUs()
	if workers == 0 {
		return 0, nil
	}
	spread := u.Nodes() > 1 && !m.IgnoreSpread && m.Network == nil
	rate := math.Inf(1)
	types := u.Types()
	for _, t := range types {
		tp, err := m.Profile.Throughput(job.Model, workers, t, spread)
		if err != nil {
			return 0, fmt.Errorf("job %s on %d GPUs: %w", job.ID, workers, err)
		}
		rate = math.Min(rate, tp)
	}
	if len(types) > 1 {
		eff := m.MixedEfficiency
		if eff == 0 {
			eff = 1
		}
		rate *= eff
	}
	if m.Network != nil && u.Nodes() > 1 {
		rate /= math.Max(1, m.Network.Slowdown(job, u, now))
	}
	return rate, nil
}

// Rate returns the steps/s of a job's whole placement.
func (m Model) Rate(job planner.Job, p planner.Placement, now float64) (float64, error) {
	total := 0.0
	for _, u := range p.Units {
		r, err := m.UnitRate(job, u, now)
		if err != nil {
			return 0, err
		}
		total += r
	}
	return total, nil
}
