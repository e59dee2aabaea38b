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

// GlobalBatchRate converts a profiled figure into the step rate of an
// elastic job (planner.Job.Widths) that keeps its global batch fixed.
//
// Profiles (Gavel's measurements) give tw, the steps/s at width w with a
// fixed per-worker batch: each step covers w per-worker batches, so the
// job processes samples at a rate proportional to w*tw. An elastic job
// keeps the global batch of its scale factor s whatever its width: each
// of its steps covers s per-worker batches. At width w it therefore makes
// w*tw/s of its own steps per second. At w = s that is tw itself (returned
// as is, so rigid figures stay bit for bit what they were).
func GlobalBatchRate(tw float64, w, s int) float64 {
	if w == s || s <= 0 {
		return tw
	}
	return float64(w) * tw / float64(s)
}

// UnitRate returns the steps/s of one unit of job. A unit of an elastic job
// (len(job.Widths) > 0) at a width other than its scale factor runs at the
// global-batch rate (GlobalBatchRate); other units (rigid jobs, HadarE's
// copies, which each train their own per-worker batches) at the profiled
// figure.
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
	if len(job.Widths) > 0 {
		rate = GlobalBatchRate(rate, workers, job.ScaleFactor)
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
