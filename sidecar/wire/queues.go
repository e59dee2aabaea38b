package wire

// Queues is GET /v1/queues: the team queues after the last plan
// (docs/queues.md), as one caller may see them.
type Queues struct {
	// Time is the plan's, in the engine's seconds.
	Time   float64 `json:"time"`
	Static bool    `json:"static,omitempty"`
	Queues []Queue `json:"queues"`
}

// Queue is one queue after a plan. GPU maps are per GPU type; Kueue's
// metric for each is named beside it (docs/queues.md).
type Queue struct {
	Name   string  `json:"name"`
	Policy string  `json:"policy"`
	Weight float64 `json:"weight"`
	// Guarantee is the guarantee in force (kueue_cluster_queue_nominal_quota),
	// scaled down when the cluster offers fewer GPUs than the guarantees
	// add up to (Scaled).
	Guarantee map[string]int `json:"guarantee"`
	Scaled    bool           `json:"scaled,omitempty"`
	// Limit is the configured limit (absent types: none).
	Limit map[string]int `json:"limit,omitempty"`
	// Share is the GPUs the queue is counted for this plan: its fair
	// share given what every queue wants.
	Share map[string]int `json:"share"`
	// Used is the GPUs its jobs hold after the plan; Borrowed the part
	// beyond the guarantee.
	Used     map[string]int `json:"used"`
	Borrowed map[string]int `json:"borrowed"`
	// Pending and Admitted count its waiting and running jobs.
	Pending  int `json:"pending"`
	Admitted int `json:"admitted"`
	// Reclaimed and FairSharePreempted count its jobs preempted in all, to
	// give a guarantee back or for fair sharing.
	Reclaimed          uint64 `json:"reclaimed_total"`
	FairSharePreempted uint64 `json:"fair_share_preempted_total"`
	// Namespaces are those whose jobs belong to the queue by default
	// (the configuration's), those the caller may read.
	Namespaces []string `json:"namespaces,omitempty"`
	// Jobs are the queue's jobs the caller may read, with the queue's
	// reason for each.
	Jobs []QueueJob `json:"jobs"`
}

// QueueJob is one job of a queue, as its queue sees it.
type QueueJob struct {
	// ID is the engine's, "namespace/job".
	ID       string  `json:"id"`
	Queue    string  `json:"queue"`
	Priority int     `json:"priority"`
	Weight   float64 `json:"weight"`
	// Clamped: the job's weight was above the queue's cap (Weight is the
	// cap then).
	Clamped bool `json:"clamped,omitempty"`
	// Running: the job holds GPUs after the plan (else it waits).
	Running bool `json:"running"`
	// Code is the queue's reason code (at_limit, waiting_for_reclaim,
	// ...; "" when the queue's own policy decided), Why in words.
	Code string `json:"code,omitempty"`
	Why  string `json:"why,omitempty"`
}
