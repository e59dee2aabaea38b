package jobspec

import (
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/belief"
)

// The spec as the planner takes it: converted here once, for the sidecar
// and for everything that predicts it (the demo, the scale test).

// ModelKey is the model name the job is planned under (belief.ModelKey):
// its hadar.model, or a key of its own when it declares throughputs.
func (s Spec) ModelKey() string {
	return belief.ModelKey(s.Model, s.Throughput != nil, s.Namespace+"/"+s.JobID)
}

// Declared is what the job declares of its own speed (hadar.throughput,
// with hadar.model for the other types and hadar.sensitivity), for
// belief.Profile.Declare under ModelKey; ok is false when it declares no
// throughput (its figures are hadar.model's).
func (s Spec) Declared() (d belief.Declared, ok bool) {
	if s.Throughput == nil {
		return belief.Declared{}, false
	}
	d = belief.Declared{Model: s.Model, Workers: s.Workers, Throughput: make(map[planner.GPUType]float64, len(s.Throughput)), Sensitivity: s.Sensitivity}
	for t, v := range s.Throughput {
		d.Throughput[planner.GPUType(t)] = v
	}
	return d, true
}

// Job is the planner job of the spec: id its engine ID, arrival when it
// arrived (seconds on the engine's clock).
func (s Spec) Job(id string, arrival float64) planner.Job {
	jb := planner.Job{ID: id, Model: s.ModelKey(), ScaleFactor: s.Workers, TotalSteps: float64(s.Steps), Weight: s.Weight,
		Arrival: arrival, MaxCopies: 1, MinRunTime: s.MinRunTime.Seconds(), Priority: s.Priority}
	if len(s.Widths) > 1 {
		jb.Widths = append([]int(nil), s.Widths...)
	}
	if s.Forkable {
		jb.MaxCopies = 0 // HadarE decides how many copies
	}
	return jb
}
