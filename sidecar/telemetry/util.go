package telemetry

import (
	"time"

	"github.com/hadar-sched/hadar/sidecar/wire"
)

// utilRing keeps the last max points, one per step. Guarded by
// Telemetry.mu.
type utilRing struct {
	max   int
	step  time.Duration
	pts   []wire.UtilPoint
	start time.Time // of the step being summed
	n     int
	sum   map[string]wire.TypeUtil
}

func (r *utilRing) add(obs wire.Observation) {
	now := obs.Time
	if r.start.IsZero() {
		r.start = now
	}
	if r.sum == nil {
		r.sum = map[string]wire.TypeUtil{}
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
	p := wire.UtilPoint{Time: now, Types: map[string]wire.TypeUtil{}}
	for typ, s := range r.sum {
		n := float64(r.n)
		p.Types[typ] = wire.TypeUtil{Total: s.Total / n, Allocated: s.Allocated / n, Unmanaged: s.Unmanaged / n}
	}
	r.pts = append(r.pts, p)
	if len(r.pts) > r.max {
		r.pts = append(r.pts[:0], r.pts[len(r.pts)-r.max:]...)
	}
	r.start, r.n, r.sum = now, 0, map[string]wire.TypeUtil{}
}

// Utilisation returns the kept points, oldest first.
func (t *Telemetry) Utilisation() []wire.UtilPoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]wire.UtilPoint(nil), t.util.pts...)
}
