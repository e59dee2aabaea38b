package telemetry

import (
	"time"

	"github.com/hadar-sched/hadar/sidecar/wire"
)

// UtilPoint is the GPUs in use per type over one step, averaged over the
// samples of the step: what the status page plots.
type UtilPoint struct {
	// Time is the end of the step.
	Time  time.Time           `json:"time"`
	Types map[string]TypeUtil `json:"types"`
}

// TypeUtil is one GPU type's average GPUs over a step.
type TypeUtil struct {
	Total     float64 `json:"total"`
	Allocated float64 `json:"allocated"`
	Unmanaged float64 `json:"unmanaged"`
}

// Busy is the fraction of the type's GPUs held by anyone (0 without GPUs).
func (u TypeUtil) Busy() float64 {
	if u.Total <= 0 {
		return 0
	}
	return (u.Allocated + u.Unmanaged) / u.Total
}

// utilRing keeps the last max points, one per step. Guarded by
// Telemetry.mu.
type utilRing struct {
	max   int
	step  time.Duration
	pts   []UtilPoint
	start time.Time // of the step being summed
	n     int
	sum   map[string]TypeUtil
}

func (r *utilRing) add(obs wire.Observation) {
	now := obs.Time
	if r.start.IsZero() {
		r.start = now
	}
	if r.sum == nil {
		r.sum = map[string]TypeUtil{}
	}
	for typ, racks := range GPUs(obs) {
		s := r.sum[typ]
		for _, u := range racks {
			s.Total += float64(u.Total)
			s.Allocated += float64(u.Allocated)
			s.Unmanaged += float64(u.Unmanaged)
		}
		r.sum[typ] = s
	}
	r.n++
	if now.Sub(r.start) < r.step {
		return
	}
	p := UtilPoint{Time: now, Types: map[string]TypeUtil{}}
	for typ, s := range r.sum {
		n := float64(r.n)
		p.Types[typ] = TypeUtil{Total: s.Total / n, Allocated: s.Allocated / n, Unmanaged: s.Unmanaged / n}
	}
	r.pts = append(r.pts, p)
	if len(r.pts) > r.max {
		r.pts = append(r.pts[:0], r.pts[len(r.pts)-r.max:]...)
	}
	r.start, r.n, r.sum = now, 0, map[string]TypeUtil{}
}

// Utilisation returns the kept points, oldest first.
func (t *Telemetry) Utilisation() []UtilPoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]UtilPoint(nil), t.util.pts...)
}
