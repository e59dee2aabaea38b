package telemetry

// Def documents one metric family: docs/status.md lists the same table,
// and a test checks that every family /metrics serves is here and there.
type Def struct {
	Name   string
	Type   string // gauge, counter, histogram
	Labels []string
	Help   string
}

// Label values.
const (
	StatusHeld       = "held"
	StatusNoCapacity = "no_capacity"

	ReasonPreempted   = "preempted"   // a stop decision: back to the queue
	ReasonMigrated    = "migrated"    // a move decision: restarted on other GPUs
	ReasonUnforked    = "unforked"    // an unfork decision: copies removed
	ReasonRolledBack  = "rolled_back" // a gang start rolled back
	ReasonInterrupted = "interrupted" // stopped running outside a decision
	ReasonNodeLost    = "node_lost"   // its node went down or away

	ResultApplied    = "applied"
	ResultNotApplied = "not_applied"
)

// Defs are hadar's own metric families. Every one carries the policy
// label (the scheduler the sidecar runs): dashboards compare policies
// across clusters by it.
var Defs = []Def{
	{"hadar_pending_jobs", "gauge", []string{"policy", "status"},
		"Managed jobs waiting for GPUs. status=held: GPUs they can run on are free and hadar's policy holds them (their turn, fairness, delay scheduling, a back-off after Nomad refused a placement); status=no_capacity: every GPU they can run on is taken, or no GPU type of the cluster runs them."},
	{"hadar_jobs", "gauge", []string{"policy", "state"},
		"Managed jobs the engine plans, by state: running, starting (new workers written, not all running yet), stopping (workers told to checkpoint and end), waiting."},
	{"hadar_stalled_jobs", "gauge", []string{"policy"},
		"Running managed jobs that made no step for 5 minutes or more (from their start or their last step): a hang, a deadlock, a broken node. Each says so in its view (stalled_s); a stall is never learned as its model's speed."},
	{"hadar_refused_jobs", "gauge", []string{"policy"},
		"Managed jobs hadar will not plan (a jobspec error, or a profile that cannot plan them); the error is on the job and in /v1/plan."},
	{"hadar_admission_wait_time_seconds", "histogram", []string{"policy", "gpu_type"},
		"Time a job waited, from its arrival or its last stop, until hadar started it; gpu_type is the type it started on (types joined by + for a job spanning several)."},
	{"hadar_round_duration_seconds", "histogram", []string{"policy", "kind"},
		"Time one cycle of the sidecar took (sync with Nomad, plan, writes, state save); kind=round for a round boundary, fill for a cycle between boundaries."},
	{"hadar_rounds_total", "counter", []string{"policy"},
		"Round boundaries planned since the sidecar started."},
	{"hadar_last_plan_timestamp_seconds", "gauge", []string{"policy"},
		"Unix time of the last plan: alert when it stops moving."},
	{"hadar_decisions_total", "counter", []string{"policy", "action", "result"},
		"Decisions that changed a job: action=start, stop, move, fork, unfork; result=applied (its first write was made) or not_applied (Nomad refused it, it conflicted with a person's edit, or it could not be written)."},
	{"hadar_preemptions_total", "counter", []string{"policy", "reason"},
		"GPUs taken from a running job by a decision of the policy: reason=preempted (stopped, back to the queue), migrated (moved: restarted on other GPUs from its checkpoint), unforked (HadarE copies removed)."},
	{"hadar_evictions_total", "counter", []string{"policy", "reason"},
		"Running workers of a managed job stopped before it finished: the preemptions' reasons, plus rolled_back (a gang start not fully running within gang_timeout was removed), interrupted (its workers died or were stopped outside a decision), node_lost (its node went down or away)."},
	{"hadar_gpus_total", "gauge", []string{"policy", "gpu_type", "rack"},
		"Healthy GPUs of nodes the planner plans on."},
	{"hadar_gpus_allocated", "gauge", []string{"policy", "gpu_type", "rack"},
		"GPUs hadar's plan gives managed jobs."},
	{"hadar_gpus_unmanaged", "gauge", []string{"policy", "gpu_type", "rack"},
		"GPUs held by jobs hadar does not manage (never offered to the planner)."},
	{"hadar_gpus_idle", "gauge", []string{"policy", "gpu_type", "rack"},
		"GPUs of schedulable nodes that nothing holds (GPUs of draining or ineligible nodes are neither idle nor allocated)."},
	{"hadar_fork_copies", "gauge", []string{"policy"},
		"HadarE copies running beyond each job's first unit."},
	{"hadar_plan_repairs_total", "counter", []string{"policy", "kind"},
		"Parts of the scheduler's answers the engine replaced so the rest of the plan could go ahead: kind=placement (a job placed where it cannot run or on GPUs not offered: it keeps its GPUs or waits), fallback (the solve failed: running jobs kept, waiting ones placed first come, first served). Each is logged with its reason; a steady rate is a scheduler bug to report."},
	{"hadar_rewrite_conflicts_total", "counter", []string{"policy"},
		"Writes refused by check-and-set because someone changed the job since hadar read it; hadar re-reads it and decides anew, never overwriting."},
	{"hadar_nomad_api_errors_total", "counter", []string{"policy", "source"},
		"Failed Nomad API calls: source=watch (lists, reads, event stream), progress (reads of a training job's progress file)."},
	{"hadar_nomad_reconnects_total", "counter", []string{"policy"},
		"Event stream sessions that ended in an error and were retried."},
	{"hadar_nomad_relists_total", "counter", []string{"policy"},
		"Full re-lists of the cluster (at start, after a gap or a reconnect)."},
	{"hadar_nomad_writes_total", "counter", []string{"policy", "kind"},
		"Job registrations hadar made: kind=start (new units), stop (units removed, job held), rollback (a failed gang start undone)."},
	{"hadar_jobs_finished_total", "counter", []string{"policy", "result"},
		"Managed jobs that left the plan: result=complete, or failed (their workers failed more than three times)."},
	{"hadar_leader", "gauge", []string{"policy"},
		"1 while this replica acts (holds the leader lock, or runs without an election), 0 while it follows."},
	{"hadar_leader_changes_total", "counter", []string{"policy", "to"},
		"Leader locks this replica took (to=leader) or lost while running (to=follower; a release at shutdown is not counted) since it started. Summed over the replicas, to=leader counts how often leadership moved; a sidecar without an election never changes."},
	{"hadar_learned_rate_steps_per_second", "gauge", []string{"policy", "model", "workers", "gpu_type"},
		"Throughput learned from jobs' progress for a model at a width (workers) on a GPU type, in steps/s: the profile's figure times the learned correction, or the rate measured where no profile had one (/v1/learned). Only figures with enough evidence to count have a series."},
	{"hadar_estimate_gaps", "gauge", []string{"policy"},
		"(model, GPU type) pairs planned without any throughput estimate (no figure, no job measured it, no relative speed given): /v1/learned names them."},
}

// def returns the definition of a family (the queues' too).
func def(name string) (Def, bool) {
	for _, d := range append(Defs[:len(Defs):len(Defs)], QueueDefs...) {
		if d.Name == name {
			return d, true
		}
	}
	return Def{}, false
}
