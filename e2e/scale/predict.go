package scale

import (
	"context"
	"fmt"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Predict runs `hadar sim` (the same engine and scheduler the sidecar
// runs) on the trace and cluster: improved fidelity, placement pack, exact
// estimates, learning off, the same minimum run time, as the live run is
// configured. Times are
// simulated seconds. prof is the throughput profile: profile.Default()
// for the uncompressed prediction, Compressed(...) with the trace's times
// and costs divided by the compression for the sidecar's own time frame.
func Predict(ctx context.Context, c planner.Cluster, jobs []planner.Job, prof *profile.Profile, policy string, round, restart, minRun float64) (sim.Result, error) {
	model := speed.Model{Profile: prof}
	// The sidecar's wiring (registry.Live): the scheduler plans with the
	// minimum run time the engine holds jobs to, as the live run's does.
	o, pc := registry.Live(model, minRun, restart, 0)
	o.Types = c.Types()
	sched, _, err := registry.Scheduler(policy, placement.Pack, nil, o, pc)
	if err != nil {
		return sim.Result{}, fmt.Errorf("predict %s: %w", policy, err)
	}
	res, err := sim.Run(ctx, sim.Config{Cluster: c, Jobs: jobs, Speed: model, Round: round, RestartCost: restart, MinRunTime: minRun}, sched)
	if err != nil {
		return sim.Result{}, fmt.Errorf("predict %s: %w", policy, err)
	}
	return res, nil
}

// Scaled is the trace in a time frame compress times faster: arrivals
// divided by compress (steps unchanged; the profile is Compressed).
func Scaled(jobs []planner.Job, compress float64) []planner.Job {
	out := make([]planner.Job, len(jobs))
	for i, j := range jobs {
		j.Arrival /= compress
		out[i] = j
	}
	return out
}
