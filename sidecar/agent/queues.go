package agent

import (
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// The team queues (docs/queues.md) in the agent: the scheduler built
// inside them when the configuration has queue blocks, each job put in its
// queue at admission, and the queues' status after each plan for the
// status API and the metrics.

// queueState is the queues' part of the agent (under a.mu).
type queueState struct {
	// status is the queues after the last plan (by the engine or, on a
	// follower or a dry run, its scratch copy); ok once a plan ran.
	status queue.Status
	ok     bool
}

// queuesOn reports whether the configuration has queues.
func (a *Agent) queuesOn() bool { return len(a.cfg.QueueConfig.Queues) > 0 }

// scheduler builds the policy the engine runs: inside the queues when
// there are any (each queue's policy, or the sidecar's), else alone.
func (a *Agent) scheduler(model speed.Model) (round.Scheduler, error) {
	o, pc := a.plannerOptions(model)
	var qc *queue.Config
	if a.queuesOn() {
		qc = &a.cfg.QueueConfig
	}
	s, _, err := registry.Scheduler(a.cfg.Policy, a.cfg.Placement, qc, o, pc)
	return s, err
}

// plannerOptions are the registry's options and the placer's
// configuration from the settings (registry.Live). The minimum run time is
// the engine's (buildEngine), with or without queues: the config has
// defaulted it, so a 0 here is the operator's explicit min_run_time =
// "0s", none.
func (a *Agent) plannerOptions(model speed.Model) (registry.Options, placement.Config) {
	return registry.Live(model, a.cfg.MinRunTime.Duration().Seconds(), a.cfg.RestartCost.Duration().Seconds(), a.cfg.MergeCost.Duration().Seconds())
}

// placeInQueue puts a job being admitted in its queue: the queue its
// hadar.queue names where that queue accepts its namespace, else its
// namespace's. A hadar.queue not followed is logged (and shown in the
// queue status's job, under its queue).
func (a *Agent) placeInQueue(jb *planner.Job, s jobspec.Spec, k watch.JobKey) {
	if !a.queuesOn() {
		return
	}
	name, note := a.cfg.QueueConfig.QueueOf(s.Namespace, s.Queue)
	jb.Queue = name
	if note != "" {
		a.log.Warn("job meta hadar.queue not followed", "job", k.String(), "queue", name, "why", note)
	}
}

// noteQueues keeps the queues' status after a plan on e.
func (a *Agent) noteQueues(e *engine.Engine) {
	if qs, ok := e.Scheduler().(*queue.Scheduler); ok {
		a.queues = queueState{status: qs.Status(), ok: true}
	}
}

// Queues is the queues after the last plan and their configuration; ok
// is false when there are no queues or no plan ran yet (GET /v1/queues,
// the queue metrics).
func (a *Agent) Queues() (queue.Status, queue.Config, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.queuesOn() || !a.queues.ok {
		return queue.Status{}, a.cfg.QueueConfig, false
	}
	return a.queues.status, a.cfg.QueueConfig, true
}

// queueHolds reports whether the queues, not a lack of GPUs, keep job id
// waiting though no GPU it runs on is free: its queue's guarantee is
// held by other queues' jobs until the next boundary (waiting_for_reclaim),
// or its queue is at its limit (at_limit). Such a job is held by hadar
// (hadar_pending_jobs{status="held"}). Called under a.mu.
func (a *Agent) queueHolds(id string) bool {
	if !a.queues.ok {
		return false
	}
	js, ok := a.queues.status.Jobs[id]
	return ok && !js.Running && (js.Code == queue.ReasonReclaim || js.Code == queue.ReasonAtLimit)
}

// queueView adds a job's queue and its queue's reason code to its view
// (/v1/plan, /v1/status, /v1/jobs/...). Called under a.mu.
func (a *Agent) queueView(jv *wire.JobView, name string) {
	if !a.queuesOn() {
		return
	}
	jv.TeamQueue = name
	if js, ok := a.queues.status.Jobs[jv.ID]; ok && a.queues.ok {
		jv.QueueReason = js.Code
	}
}
