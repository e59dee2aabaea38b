// Package queues is the sidecar's side of planner/queue: what the status
// API shows of the queues to a caller (only the namespaces it may read),
// converted to sidecar/wire's types so that the API is not planner/queue's,
// and the queues' metric families and samples. The agent, the status
// server and telemetry call it; docs/queues.md, "Wiring into the
// sidecar", lists the hooks.
package queues

import (
	"slices"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Filter is what a caller sees of the last plan's queues (GET
// /v1/queues): may reports whether it may read a namespace's jobs (nil: it
// may read everything). A queue is shown when it lists a namespace the
// caller may read or holds one of its jobs; its own figures (shares, GPUs
// used, counts) are shown whole, its jobs only where the caller may read
// them. Job IDs are the engine's, "namespace/job".
func Filter(st queue.Status, cfg queue.Config, may func(ns string) bool) wire.Queues {
	v := wire.Queues{Time: st.Time, Static: st.Static, Queues: []wire.Queue{}}
	jobs := map[string][]wire.QueueJob{}
	ids := make([]string, 0, len(st.Jobs))
	for id := range st.Jobs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		js := st.Jobs[id]
		if may == nil || may(namespaceOf(id)) {
			jobs[js.Queue] = append(jobs[js.Queue], wireJob(id, js))
		}
	}
	for _, q := range st.Queues {
		qv := wireQueue(q)
		qv.Jobs = jobs[q.Name]
		if qv.Jobs == nil {
			qv.Jobs = []wire.QueueJob{}
		}
		if c, ok := cfg.Find(q.Name); ok {
			for _, ns := range c.Namespaces {
				if may == nil || may(ns) {
					qv.Namespaces = append(qv.Namespaces, ns)
				}
			}
		}
		if may != nil && len(qv.Namespaces) == 0 && len(qv.Jobs) == 0 {
			continue
		}
		v.Queues = append(v.Queues, qv)
	}
	return v
}

// wireQueue is a queue's figures as the status API writes them.
func wireQueue(q queue.QueueStatus) wire.Queue {
	return wire.Queue{Name: q.Name, Policy: q.Policy, Weight: q.Weight, Guarantee: typeMap(q.Guarantee), Scaled: q.Scaled,
		Limit: typeMap(q.Limit), Share: typeMap(q.Share), Used: typeMap(q.Used), Borrowed: typeMap(q.Borrowed),
		Pending: q.Pending, Admitted: q.Admitted, Reclaimed: q.Reclaimed, FairSharePreempted: q.FairSharePreempted}
}

func wireJob(id string, js queue.JobStatus) wire.QueueJob {
	return wire.QueueJob{ID: id, Queue: js.Queue, Priority: js.Priority, Weight: js.Weight, Clamped: js.Clamped, Running: js.Running,
		Code: js.Code, Why: js.Why}
}

// typeMap keys a per-GPU-type map by name; nil stays nil (written null,
// as the API always has for a map the queue lacks).
func typeMap(m map[planner.GPUType]int) map[string]int {
	if m == nil {
		return nil
	}
	return asStrings(m)
}

func namespaceOf(id string) string {
	ns, _, ok := strings.Cut(id, "/")
	if !ok {
		return ""
	}
	return ns
}

// Def documents one metric family, as sidecar/telemetry.Def does (the two
// convert into each other).
type Def struct {
	Name   string
	Type   string // gauge, counter
	Labels []string
	Help   string
}

// Label values of hadar_queue_preemptions_total's reason.
const (
	ReasonReclaim     = "reclaim"      // Kueue: InCohortReclamation
	ReasonFairSharing = "fair_sharing" // Kueue: InCohortFairSharing
)

// Defs are the queues' metric families, each with the policy label as
// every family of the sidecar's; Kueue's name for each is in its help.
var Defs = []Def{
	{"hadar_queue_pending_jobs", "gauge", []string{"policy", "queue", "reason"},
		"Jobs of a queue waiting for GPUs, by the queue's reason: at_limit, waiting_for_reclaim, fair_share, priority, min_run_time, or policy (the queue's own policy decided within its share). Kueue: kueue_pending_workloads."},
	{"hadar_queue_admitted_jobs", "gauge", []string{"policy", "queue"},
		"Jobs of a queue holding GPUs. Kueue: kueue_admitted_active_workloads."},
	{"hadar_queue_guaranteed_gpus", "gauge", []string{"policy", "queue", "gpu_type"},
		"GPUs of a type guaranteed to a queue, as in force (scaled down while the cluster offers fewer than the guarantees add up to). Kueue: kueue_cluster_queue_nominal_quota."},
	{"hadar_queue_limit_gpus", "gauge", []string{"policy", "queue", "gpu_type"},
		"Most GPUs of a type a queue's jobs may hold, borrowed ones included (types without a limit have no series). Kueue: nominal quota plus kueue_cluster_queue_borrowing_limit."},
	{"hadar_queue_share_gpus", "gauge", []string{"policy", "queue", "gpu_type"},
		"GPUs of a type a queue is counted for in the last plan: its fair share given what every queue wants. Kueue: kueue_cluster_queue_weighted_share, in GPUs."},
	{"hadar_queue_used_gpus", "gauge", []string{"policy", "queue", "gpu_type"},
		"GPUs of a type a queue's jobs hold after the last plan. Kueue: kueue_cluster_queue_resource_usage."},
	{"hadar_queue_borrowed_gpus", "gauge", []string{"policy", "queue", "gpu_type"},
		"GPUs of a type a queue's jobs hold beyond its guarantee. Kueue: kueue_cluster_queue_borrowing."},
	{"hadar_queue_preemptions_total", "counter", []string{"policy", "queue", "reason"},
		"Jobs of a queue preempted by the queues: reason=reclaim (to give another queue its guarantee back; Kueue InCohortReclamation), fair_sharing (the queue was above its fair share while another was below; Kueue InCohortFairSharing). Kueue: kueue_preempted_workloads_total."},
}

// Sample is one gauge value with its labels (the policy label left to
// the caller).
type Sample struct {
	Name   string
	Labels [][2]string
	Value  float64
}

// Gauges are the gauge samples of a status, in a stable order.
func Gauges(st queue.Status) []Sample {
	var out []Sample
	for _, q := range st.Queues {
		pending := map[string]int{}
		for _, js := range st.Jobs {
			if js.Queue != q.Name || js.Running {
				continue
			}
			reason := js.Code
			if reason == "" {
				reason = "policy"
			}
			pending[reason]++
		}
		for _, r := range sortedKeys(pending) {
			out = append(out, Sample{"hadar_queue_pending_jobs", [][2]string{{"queue", q.Name}, {"reason", r}}, float64(pending[r])})
		}
		out = append(out, Sample{"hadar_queue_admitted_jobs", [][2]string{{"queue", q.Name}}, float64(q.Admitted)})
		for _, g := range []struct {
			name string
			m    map[string]int
		}{
			{"hadar_queue_guaranteed_gpus", asStrings(q.Guarantee)},
			{"hadar_queue_limit_gpus", asStrings(q.Limit)},
			{"hadar_queue_share_gpus", asStrings(q.Share)},
			{"hadar_queue_used_gpus", asStrings(q.Used)},
			{"hadar_queue_borrowed_gpus", asStrings(q.Borrowed)},
		} {
			for _, t := range sortedKeys(g.m) {
				out = append(out, Sample{g.name, [][2]string{{"queue", q.Name}, {"gpu_type", t}}, float64(g.m[t])})
			}
		}
	}
	return out
}

// CounterKey names one series of hadar_queue_preemptions_total.
type CounterKey struct{ Queue, Reason string }

// Counters are the preemption totals of a status (since the scheduler's
// state began: they survive a restart through the engine's snapshot).
// Increments adds what grew since prev to the counter.
func Counters(st queue.Status) map[CounterKey]uint64 {
	out := map[CounterKey]uint64{}
	for _, q := range st.Queues {
		out[CounterKey{q.Name, ReasonReclaim}] = q.Reclaimed
		out[CounterKey{q.Name, ReasonFairSharing}] = q.FairSharePreempted
	}
	return out
}

// Increments is what each counter grew by from prev to cur (a total that
// went back, a restored older state, counts as nothing).
func Increments(prev, cur map[CounterKey]uint64) map[CounterKey]uint64 {
	out := map[CounterKey]uint64{}
	for k, v := range cur {
		if p := prev[k]; v > p {
			out[k] = v - p
		}
	}
	return out
}

func asStrings[K ~string](m map[K]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[string(k)] = v
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
