package wire

import "time"

// The status API's answers (GET /v1/status, GET /v1/jobs/<id>): what the
// status page, `hadar status` and the demo read.

// Status is GET /v1/status: the cluster as hadar sees it, for the status
// page and `hadar status`.
type Status struct {
	Time    time.Time     `json:"time"`
	Sidecar SidecarStatus `json:"sidecar"`
	// GPUs sums the cluster's GPUs per type (nodes the planner plans on).
	GPUs []TypeSummary `json:"gpus"`
	// Racks are every node by rack, with its GPUs per type and the jobs
	// on them.
	Racks []Rack `json:"racks"`
	// Queue are the waiting jobs, first in line first.
	Queue []QueueEntry `json:"queue"`
	// Running are the jobs holding GPUs, in arrival order.
	Running []RunningEntry `json:"running"`
	Refused []RefusedJob   `json:"refused"`
	// Decisions are the most recent decisions, newest last.
	Decisions []Event `json:"decisions"`
	// Utilisation is GPUs in use per type over time, oldest first.
	Utilisation []UtilPoint `json:"utilisation"`
}

// SidecarStatus is the sidecar itself.
type SidecarStatus struct {
	Policy    string    `json:"policy"`
	Placement string    `json:"placement"`
	DryRun    bool      `json:"dry_run"`
	Leader    bool      `json:"leader"`
	Replica   string    `json:"replica"`
	Round     int       `json:"round"`
	NextRound time.Time `json:"next_round"`
	LastPlan  time.Time `json:"last_plan"`
	OK        bool      `json:"ok"`
	Problem   string    `json:"problem,omitempty"`
	// TeamQueues is true when the sidecar has queue blocks: GET
	// /v1/queues answers them (404 otherwise).
	TeamQueues bool `json:"team_queues,omitempty"`
}

// TypeSummary is one GPU type across the cluster.
type TypeSummary struct {
	Type string `json:"type"`
	GPUUse
}

// Rack is the nodes of one rack.
type Rack struct {
	Rack  string            `json:"rack"`
	Nodes []NodeObservation `json:"nodes"`
}

// QueueEntry is a waiting job.
type QueueEntry struct {
	ID string `json:"id"`
	// Position is its place in the queue, 1 first.
	Position int `json:"position"`
	// Waits is held (hadar holds it though GPUs it can run on are free)
	// or no_capacity (every GPU it can run on is taken).
	Waits string `json:"waits"`
	// Why is the planner's reason, Nomad Nomad's (when it cannot place
	// the job's groups).
	Why      string  `json:"why"`
	Nomad    string  `json:"nomad,omitempty"`
	State    string  `json:"state"`
	WaitingS float64 `json:"waiting_s"`
	// TeamQueue and QueueReason as in JobView (docs/queues.md).
	TeamQueue   string `json:"team_queue,omitempty"`
	QueueReason string `json:"queue_reason,omitempty"`
	Workers     int    `json:"workers"`
	// Widths as in JobIdentity (absent: rigid).
	Widths []int   `json:"widths,omitempty"`
	Model  string  `json:"model"`
	Weight float64 `json:"weight"`
	// RunsOn are the GPU types it can run on.
	RunsOn    []string `json:"runs_on"`
	StepsDone float64  `json:"steps_done"`
	Steps     float64  `json:"steps"`
}

// RunningEntry is a job holding GPUs.
type RunningEntry struct {
	ID      string     `json:"id"`
	State   string     `json:"state"`
	Action  string     `json:"action,omitempty"`
	Units   []UnitView `json:"units"`
	Workers int        `json:"workers"`
	// Widths as in JobIdentity (absent: rigid); the width it runs at is
	// its units' GPUs.
	Widths []int  `json:"widths,omitempty"`
	Model  string `json:"model"`
	// Progress is steps done over steps declared, 0..1.
	Progress  float64 `json:"progress"`
	StepsDone float64 `json:"steps_done"`
	Steps     float64 `json:"steps"`
	// ProgressAt is when the job last reported the progress shown
	// (absent: not yet): views say how old it is.
	ProgressAt *time.Time `json:"progress_at,omitempty"`
	// Rate is the engine's estimate of steps/s where it runs; ETA when it
	// completes at that rate (absent when unknown).
	Rate float64    `json:"rate"`
	ETAS float64    `json:"eta_s"`
	ETA  *time.Time `json:"eta,omitempty"`
	Why  string     `json:"why"`
	// StalledS: no step for this long (JobView.StalledS).
	StalledS float64 `json:"stalled_s,omitempty"`
}

// JobDetail is GET /v1/jobs/<id>.
type JobDetail struct {
	// Job is the job in the plan; nil once it left the plan (finished,
	// stopped by its owner), when only its decisions remain.
	Job   *JobObservation `json:"job"`
	ID    string          `json:"id"`
	State string          `json:"state"`
	// Waits, QueuePosition (1 first) and QueueLength for a waiting job.
	Waits         string `json:"waits,omitempty"`
	QueuePosition int    `json:"queue_position,omitempty"`
	QueueLength   int    `json:"queue_length,omitempty"`
	Why           string `json:"why"`
	Nomad         string `json:"nomad,omitempty"`
	// Progress, and the engine's ETA, for a running job.
	Progress float64    `json:"progress"`
	ETA      *time.Time `json:"eta,omitempty"`
	// ProgressAt is when the job last reported the progress shown
	// (absent: not yet): views say how old it is.
	ProgressAt *time.Time `json:"progress_at,omitempty"`
	// Placements are where it ran, oldest first: each decision that
	// placed, moved, forked or stopped it, with racks.
	Placements []Placement `json:"placements"`
	// Decisions are every recorded decision about it, newest last.
	Decisions []Event `json:"decisions"`
	// NodeNames names the nodes its units and placements name by ID.
	NodeNames map[string]string `json:"node_names"`
}

// Placement is one change of where a job runs.
type Placement struct {
	Time   time.Time  `json:"time"`
	Action string     `json:"action"`
	Units  []UnitView `json:"units"`
	Why    string     `json:"why"`
	Result string     `json:"result,omitempty"`
}

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

// GPUUse is the GPUs of one type in one rack.
type GPUUse struct {
	Total     int `json:"total"`
	Allocated int `json:"allocated"`
	Unmanaged int `json:"unmanaged"`
	Idle      int `json:"idle"`
}
