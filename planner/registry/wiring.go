package registry

import (
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Scheduler wires a run's scheduler from its settings, the one definition
// the sidecar, hadar sim, the demo's prediction and the scale test's
// share, so that a prediction runs the scheduler the live run does: the
// policy with its placement policy alone (Build) when qc is nil, else
// inside qc's team queues (BuildQueues). The placer is returned for its
// reports: nil with pack, and with queues (each queue has its own).
func Scheduler(policy, placementName string, qc *queue.Config, o Options, pc placement.Config) (round.Scheduler, placement.Placer, error) {
	if qc == nil {
		return Build(policy, placementName, o, pc)
	}
	s, err := BuildQueues(*qc, policy, placementName, o, pc)
	if err != nil {
		return nil, nil, err
	}
	return s, nil, nil
}

// Live is the options and the placer's configuration of a scheduler that
// runs beside the engine (the sidecar, the demo's prediction of it): the
// speed model it plans with and the engine's minimum run time, restart
// and merge costs, in seconds. A minimum run time of 0 is none, which
// Options and placement.Config spell negative (their 0 is the planner's
// default, 30 minutes), so the scheduler holds jobs exactly as long as
// the engine does.
func Live(model speed.Model, minRun, restart, merge float64) (Options, placement.Config) {
	o := Options{Speed: model, RestartCost: restart, MergeCost: merge, MinRunTime: minRun}
	if minRun == 0 {
		o.MinRunTime = -1
	}
	return o, placement.Config{MinRunTime: o.MinRunTime, RestartCost: restart}
}
