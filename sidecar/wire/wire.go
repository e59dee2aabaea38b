// Package wire is what the sidecar serves and its clients read: the plan,
// the jobs, the decision history, its health, and the observation the
// status page and the metrics are drawn from. The CLI (hadar plan, hadar
// status), the status API's server and the demo import it; none of them
// imports the agent.
//
// Every type here is wire's own, none a planner type: the JSON is the
// status API, and a rename inside the planner must not change it. The
// producers convert (sidecar/agent from the engine, sidecar/queues from
// planner/queue); sidecar/status's golden answers hold the JSON still.
package wire

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PlanView is what the last plan decided, per job, with why: the policy's
// numbers, where each job runs or why it waits (the planner's reason and
// Nomad's, from the job's blocked evaluation), and its place in the queue.
type PlanView struct {
	Time      time.Time    `json:"time"`
	Kind      Kind         `json:"kind"`
	Policy    string       `json:"policy"`
	Placement string       `json:"placement"`
	DryRun    bool         `json:"dry_run"`
	Round     int          `json:"round"`
	NextRound time.Time    `json:"next_round"`
	Jobs      []JobView    `json:"jobs"`
	Refused   []RefusedJob `json:"refused"`
}

// JobView is one managed job in the plan. Its fields are grouped by
// concern in embedded structs; encoding/json flattens them, so the JSON is
// one flat object, its keys in the order the groups and their fields are
// declared (sidecar/status's golden answers hold it still).
type JobView struct {
	JobIdentity
	JobDecision
	JobProgress
	JobHold
	JobQueue
	// StalledS is how long a running job has made no step, once that is
	// past the engine's stall threshold (5 minutes): a hang, a deadlock or
	// a broken node, for the operator to look at. Never learned as its
	// model's speed. (Last in the JSON, after the queue's keys.)
	StalledS float64 `json:"stalled_s,omitempty"`
}

// JobIdentity is which job a JobView is and what it asked for.
type JobIdentity struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Job       string `json:"job"`
	Model     string `json:"model"`
	Workers   int    `json:"workers"`
	// Widths are an elastic job's widths (hadar.workers "2-8" or
	// "2,4,8"), ascending, Workers the first; absent for a rigid job.
	Widths []int   `json:"widths,omitempty"`
	Weight float64 `json:"weight"`
}

// JobDecision is what the plan decided for the job, where it runs, and
// why it waits.
type JobDecision struct {
	// State: running, waiting, starting, stopping.
	State  string `json:"state"`
	Action Action `json:"action"`
	// Units are where it runs (or is being placed), with racks.
	Units []UnitView `json:"units,omitempty"`
	// Position is its place among waiting jobs (0 first); -1 if running.
	Position int    `json:"position"`
	Reason   Reason `json:"reason"`
	// Nomad is Nomad's reason the job's groups cannot be placed, from its
	// blocked evaluations (the gate aside).
	Nomad string `json:"nomad,omitempty"`
}

// JobProgress is how far the job has come and how long it has waited.
type JobProgress struct {
	StepsDone float64 `json:"steps_done"`
	Steps     float64 `json:"steps"`
	// ProgressAgeS is how old StepsDone's last report from the job is
	// (absent: none yet).
	ProgressAgeS *float64 `json:"progress_age_s,omitempty"`
	Rate         float64  `json:"rate"`
	ETA          float64  `json:"eta_s"`
	WaitingS     float64  `json:"waiting_s,omitempty"`
}

// JobHold is the run-time limit the job is held to.
type JobHold struct {
	// MinRunTimeS is the minimum run time the job is held to (its own
	// hadar.min_run_time within the operator's caps, or the sidecar's
	// min_run_time); MinRunTimeCap says which cap cut the job's own ("":
	// none did).
	MinRunTimeS   float64 `json:"min_run_time_s,omitempty"`
	MinRunTimeCap string  `json:"min_run_time_cap,omitempty"`
}

// JobQueue is the job's team queue (docs/queues.md).
type JobQueue struct {
	// TeamQueue is the team queue the job belongs to, QueueReason its
	// queue's reason code when the queue, not its policy, decided ("" for
	// both without queues).
	TeamQueue   string `json:"team_queue,omitempty"`
	QueueReason string `json:"queue_reason,omitempty"`
}

// UnitView is one unit of a placement.
type UnitView struct {
	Slots []SlotView `json:"slots"`
}

// SlotView is GPUs of one type on one node.
type SlotView struct {
	Node  string `json:"node"`
	Rack  string `json:"rack"`
	Type  string `json:"type"`
	Count int    `json:"count"`
}

// RefusedJob is a managed job hadar will not plan, and why.
type RefusedJob struct {
	Job   string `json:"job"`
	Error string `json:"error"`
}

// InNamespace is the plan with the jobs of one namespace only ("" keeps
// every one): what a CLI scoped to a namespace shows.
func (p PlanView) InNamespace(ns string) PlanView {
	if ns == "" {
		return p
	}
	jobs, refused := []JobView{}, []RefusedJob{}
	for _, j := range p.Jobs {
		if strings.HasPrefix(j.ID, ns+"/") {
			jobs = append(jobs, j)
		}
	}
	for _, r := range p.Refused {
		if strings.HasPrefix(r.Job, ns+"/") {
			refused = append(refused, r)
		}
	}
	p.Jobs, p.Refused = jobs, refused
	return p
}

// WriteTable prints a plan for a person: one line per job.
func WriteTable(b *strings.Builder, p PlanView) {
	fmt.Fprintf(b, "%s plan at %s, policy %s, placement %s", p.Kind, p.Time.Format(time.RFC3339), p.Policy, p.Placement)
	if p.DryRun {
		b.WriteString(" (dry run: nothing written)")
	}
	b.WriteString("\n\n")
	fmt.Fprintf(b, "%-28s %-8s %-8s %-26s %s\n", "JOB", "STATE", "ACTION", "GPUS", "WHY")
	for _, jv := range p.Jobs {
		where := "-"
		if len(jv.Units) > 0 {
			var us []string
			for _, u := range jv.Units {
				var ss []string
				for _, s := range u.Slots {
					ss = append(ss, fmt.Sprintf("%dx%s@%s/%s", s.Count, s.Type, s.Node[:min(8, len(s.Node))], s.Rack))
				}
				us = append(us, strings.Join(ss, "+"))
			}
			where = strings.Join(us, " | ")
		}
		why := jv.Reason.Why
		if jv.Position >= 0 {
			why = fmt.Sprintf("#%d in queue: %s", jv.Position+1, why)
		}
		if jv.Nomad != "" {
			why += " (Nomad: " + jv.Nomad + ")"
		}
		fmt.Fprintf(b, "%-28s %-8s %-8s %-26s %s\n", jv.ID, jv.State, jv.Action, where, why)
	}
	for _, r := range p.Refused {
		fmt.Fprintf(b, "%-28s %-8s %-8s %-26s %s\n", r.Job, "refused", "-", "-", r.Error)
	}
}

// Health is the sidecar's state for /v1/health.
type Health struct {
	OK bool `json:"ok"`
	// Synced is when the view of Nomad was last fully re-listed; Index
	// the Nomad index it reflects.
	Synced time.Time `json:"synced"`
	Index  uint64    `json:"index"`
	// LastPlan is when the engine last planned; Rounds how many round
	// boundaries it planned.
	LastPlan time.Time `json:"last_plan"`
	Rounds   int       `json:"rounds"`
	// Cycles counts the sidecar's cycles (sync, plan, act) since it
	// started: every second, and at once on events.
	Cycles   int            `json:"cycles"`
	Jobs     int            `json:"jobs"`
	Refused  int            `json:"refused"`
	InFlight int            `json:"in_flight"`
	Writes   map[string]int `json:"writes"`
	// Repairs counts the plans' parts the engine replaced so the rest
	// could go ahead, by kind (RepairPlacement, RepairFallback).
	Repairs map[string]int `json:"repairs,omitempty"`
	DryRun  bool           `json:"dry_run"`
	// Leader: this replica acts (always, without an election); Replica
	// names it and Generation is its lock generation.
	Leader     bool   `json:"leader"`
	Replica    string `json:"replica"`
	Generation uint64 `json:"generation"`
	// LeaderGained counts the leader locks this replica took since it
	// started, LeaderLost those it lost while running (a release at
	// shutdown is not a loss): metrics count leader changes from them.
	LeaderGained int    `json:"leader_gained,omitempty"`
	LeaderLost   int    `json:"leader_lost,omitempty"`
	Problem      string `json:"problem,omitempty"`
}

// Observation is one consistent reading of what the sidecar knows, taken
// under its lock: the plan, every node of the cluster with its GPUs and who
// holds them, and for each waiting job whether hadar holds it or no
// capacity it can use is free. The status page, `hadar status` and the
// metrics read it; it changes nothing.
type Observation struct {
	Time time.Time
	// Plan is Plan()'s view (its Jobs are repeated, with more, in Jobs).
	Plan PlanView
	// Jobs are the managed jobs the engine plans, in arrival order.
	Jobs []JobObservation
	// Nodes are every node Nomad knows, sorted by rack, then name.
	Nodes []NodeObservation
	// Leader: this replica acts (Leading()).
	Leader bool
}

// Why a waiting job waits, in two classes an operator must not confuse
// (Kueue's pending_workloads{status} draws the same line): hadar holds it
// although GPUs it can run on are free (its turn, fairness, delay
// scheduling, a back-off after Nomad refused its placement), or no capacity
// it can use is free (all taken, or no GPU type of the cluster runs it).
const (
	PendingHeld       = "held"
	PendingNoCapacity = "no_capacity"
)

// JobObservation is a job of the plan with what the plan view leaves out.
type JobObservation struct {
	JobView
	// Pending is PendingHeld or PendingNoCapacity for a waiting job.
	Pending string `json:"pending,omitempty"`
	// Arrival is when the job arrived (its Nomad submit time).
	Arrival time.Time `json:"arrival"`
	// WaitingSince is when it last began to wait (zero while it runs).
	WaitingSince time.Time `json:"waiting_since,omitzero"`
	// Throughput is the engine's estimated steps/s per GPU type it can run
	// on (types it cannot run on are left out).
	Throughput map[string]float64 `json:"throughput,omitempty"`
}

// NodeObservation is one Nomad node with its GPUs.
type NodeObservation struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Rack is the rack the planner places by (a node without the rack
	// meta key is a rack of its own, as in the plan).
	Rack string `json:"rack"`
	// Status is Nomad's ("ready", "down", ...).
	Status      string `json:"status"`
	Schedulable bool   `json:"schedulable"`
	// Planned: the engine plans on the node (ready, with GPUs of a type
	// hadar knows).
	Planned bool             `json:"planned"`
	GPUs    []GPUObservation `json:"gpus"`
}

// GPUObservation is a node's GPUs of one type.
type GPUObservation struct {
	// Type is the planner's type; "" for a model hadar does not map (its
	// GPUs are left out of planning).
	Type   string   `json:"type"`
	Models []string `json:"models"`
	// Total counts the instances Nomad fingerprinted, Healthy the healthy
	// ones (only those are planned on).
	Total   int `json:"total"`
	Healthy int `json:"healthy"`
	// Holders are the jobs holding some: hadar's placements (from the
	// engine) and jobs hadar does not manage (from Nomad's allocations).
	Holders []Holder `json:"holders,omitempty"`
}

// Holder is a job holding Count GPUs of one type on one node.
type Holder struct {
	// Job is the engine's ID of a managed job, namespace/job of another.
	Job     string `json:"job"`
	Count   int    `json:"count"`
	Managed bool   `json:"managed"`
}

// Held is the GPUs a GPUObservation's holders hold.
func (g GPUObservation) Held() int {
	n := 0
	for _, h := range g.Holders {
		n += h.Count
	}
	return n
}

// Event is one decision that changed a job, kept for the status API.
type Event struct {
	Time   time.Time `json:"time"`
	Job    string    `json:"job"`
	Action Action    `json:"action"`
	To     []Unit    `json:"to,omitempty"`
	Why    string    `json:"why"`
	Result string    `json:"result,omitempty"`
	Kind   Kind      `json:"kind"`
	Reason Reason    `json:"reason"`
}

// Kinds of plan repairs (Health.Repairs, hadar_plan_repairs_total).
const (
	RepairPlacement = "placement"
	RepairFallback  = "fallback"
)

// WidthsText writes an elastic job's widths as hadar.workers takes them:
// "2-8" when they are every width of a range, "2,4,8" otherwise.
func WidthsText(ws []int) string {
	if len(ws) == 0 {
		return ""
	}
	run := true
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = strconv.Itoa(w)
		run = run && (i == 0 || w == ws[i-1]+1)
	}
	if run && len(ws) > 1 {
		return parts[0] + "-" + parts[len(parts)-1]
	}
	return strings.Join(parts, ",")
}

// WorkersText says a job's width: "4 workers" for a rigid job, "2 of
// 1-4 workers" for an elastic one running at (its units' GPUs) 2, "1-4
// workers" for an elastic one not running (at 0).
func WorkersText(workers int, widths []int, at int) string {
	if len(widths) < 2 {
		return strconv.Itoa(workers) + " workers"
	}
	if at > 0 {
		return strconv.Itoa(at) + " of " + WidthsText(widths) + " workers"
	}
	return WidthsText(widths) + " workers"
}

// Width is the GPUs of units: the width a job runs at.
func Width(units []UnitView) int {
	n := 0
	for _, u := range units {
		for _, s := range u.Slots {
			n += s.Count
		}
	}
	return n
}
