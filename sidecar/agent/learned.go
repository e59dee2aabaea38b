package agent

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Learned is what the estimates learned (GET /v1/learned), with each GPU
// type's speed against ref (empty: the first of the cluster's types, in
// name order, that some figure covers).
func (a *Agent) Learned(ref planner.GPUType) wire.Learned {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := wire.Learned{Time: a.clock(), Learning: *a.cfg.Learn, Figures: wireFigures(a.core.est.Learned()), Gaps: wireGaps(a.core.est.Gaps())}
	if ref = a.reference(ref); ref != "" {
		if ts, ok := a.core.est.TypeSpeeds(ref); ok {
			out.Reference, out.TypeSpeeds = string(ref), wireTypeSpeeds(ts)
		}
	}
	return out
}

// ExportProfile is what jobs measured as a profile file (docs/formats.md,
// "The learned table"), with relative speeds against ref (as Learned):
// `hadar profile export`, and an overlay for another cluster.
func (a *Agent) ExportProfile(ref planner.GPUType) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ref = a.reference(ref)
	if ref == "" {
		return nil, fmt.Errorf("no GPU type has a figure yet to give relative speeds against: give ?reference=TYPE")
	}
	p, err := a.core.est.Export(fmt.Sprintf("learned by hadar sidecar %s", a.id), ref)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := p.WriteJSON(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// reference is ref, or the first of the cluster's types that some figure
// covers. Called under a.mu.
func (a *Agent) reference(ref planner.GPUType) planner.GPUType {
	if ref != "" {
		return ref
	}
	types := a.core.eng.Types()
	slices.Sort(types)
	for _, t := range types {
		if _, ok := a.core.est.TypeSpeeds(t); ok {
			return t
		}
	}
	return ""
}

// warnGaps logs each (model, GPU type) pair planned without any estimate
// once, when it first appears: the jobs concerned name it in their reason
// too. Called under a.mu after a plan; only the acting replica warns.
func (a *Agent) warnGaps(acting bool) {
	if !acting {
		return
	}
	now := map[engine.Gap]bool{}
	for _, g := range a.core.est.Gaps() {
		now[g] = true
		if !a.learning.gapsWarned[g] {
			a.log.Warn("no throughput estimate: jobs of this model are planned as if the type were as slow as their slowest estimated one; give the type's speed relative to another (relative_speeds in the profile overlay) or let a job run there", "model", g.Model, "type", g.Type, "why", g.Why)
		}
	}
	a.learning.gapsWarned = now
}
