package registry

import (
	"github.com/hadar-sched/hadar/planner/hadar"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/round"
)

// BuildQueues makes the queue-aware scheduler of qc (planner/queue): each
// queue's scheduler is made as Build makes one, from the queue's policy or
// def, with the placement policy named (a placer of its own per queue:
// placers keep state). The queues hold jobs to the minimum run time of o
// (0: the default of the sidecar and hadar sim; negative, or Gavel's
// fidelity: none), as the engine does.
func BuildQueues(qc queue.Config, def, placementName string, o Options, pc placement.Config) (*queue.Scheduler, error) {
	minRun := o.MinRunTime
	switch {
	case o.GavelFidelity || minRun < 0:
		minRun = 0
	case minRun == 0:
		minRun = placement.DefaultMinRunTime
	}
	factory := func(policy string) (round.Scheduler, error) {
		s, _, err := Build(policy, placementName, o, pc)
		return s, err
	}
	// Hadar plans with the minimum run time itself (planner/hadar,
	// restart.go); the policies of round.PolicyScheduler do not.
	plans := func(s round.Scheduler) bool {
		_, ok := s.(*hadar.Scheduler)
		return ok
	}
	return queue.New(qc, queue.Options{Default: def, Factory: factory, MinRunTime: minRun, PlansMinRun: plans})
}
