package agent

import (
	"sort"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

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
	Type   planner.GPUType `json:"type"`
	Models []string        `json:"models"`
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

// Observe reads the sidecar's state once.
func (a *Agent) Observe() Observation {
	leader := a.Leading()
	snap := a.watcher.Snapshot()
	a.mu.Lock()
	defer a.mu.Unlock()
	o := Observation{Time: a.clock(), Plan: a.planView(snap), Leader: leader}

	// Who holds what, per node and type: the engine's placements of
	// managed jobs, Nomad's allocations of the others.
	type nt struct {
		node string
		t    planner.GPUType
	}
	holders := map[nt][]Holder{}
	managedUse := map[nt]int{}
	states := map[string]int{}
	eng := a.eng.Jobs()
	for i, st := range eng {
		states[st.Job.ID] = i
		if !st.Running {
			continue
		}
		use := map[nt]int{}
		for _, u := range st.Placement.Units {
			for _, sl := range u.Slots {
				use[nt{sl.Node, sl.Type}] += sl.Count
			}
		}
		for k, n := range use {
			holders[k] = append(holders[k], Holder{Job: st.Job.ID, Count: n, Managed: true})
			managedUse[k] += n
		}
	}
	otherUse := map[nt]int{}
	others := map[nt]map[string]int{}
	for _, h := range snap.Unmanaged {
		for model, n := range h.GPUs {
			k := nt{h.NodeID, a.types.Type(model)}
			if others[k] == nil {
				others[k] = map[string]int{}
			}
			others[k][h.Job.String()] += n
			otherUse[k] += n
		}
	}
	for k, byJob := range others {
		for job, n := range byJob {
			holders[k] = append(holders[k], Holder{Job: job, Count: n})
		}
	}

	// Free GPUs per type where new work may go: what the pending class of
	// a waiting job is judged against.
	free := map[planner.GPUType]float64{}
	for id, n := range a.nodes {
		if a.drained[id] {
			continue
		}
		for t, c := range n.GPUs {
			free[t] += float64(max(0, c-managedUse[nt{id, t}]-otherUse[nt{id, t}]))
		}
	}

	for _, n := range snap.Nodes {
		no := NodeObservation{ID: n.ID, Name: n.Name, Rack: n.Rack, Status: n.Status, Schedulable: n.Schedulable()}
		if pn, ok := a.nodes[n.ID]; ok {
			no.Planned, no.Rack = true, pn.Rack
		}
		if no.Rack == "" {
			no.Rack = "rack-" + n.ID // as the planner sees it: a rack of its own
		}
		byType := map[planner.GPUType]*GPUObservation{}
		var order []planner.GPUType
		unmapped := []GPUObservation{}
		for _, g := range n.GPUs {
			t := a.types.Type(g.Model)
			if t == "" {
				unmapped = append(unmapped, GPUObservation{Models: []string{g.Model}, Total: len(g.Instances), Healthy: g.Healthy, Holders: holders[nt{n.ID, ""}]})
				continue
			}
			gu := byType[t]
			if gu == nil {
				gu = &GPUObservation{Type: t, Holders: holders[nt{n.ID, t}]}
				byType[t] = gu
				order = append(order, t)
			}
			gu.Models = append(gu.Models, g.Model)
			gu.Total += len(g.Instances)
			gu.Healthy += g.Healthy
		}
		sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
		for _, t := range order {
			gu := *byType[t]
			sort.Slice(gu.Holders, func(i, j int) bool { return gu.Holders[i].Job < gu.Holders[j].Job })
			no.GPUs = append(no.GPUs, gu)
		}
		no.GPUs = append(no.GPUs, unmapped...)
		o.Nodes = append(o.Nodes, no)
	}
	sort.Slice(o.Nodes, func(i, j int) bool {
		if o.Nodes[i].Rack != o.Nodes[j].Rack {
			return o.Nodes[i].Rack < o.Nodes[j].Rack
		}
		if o.Nodes[i].Name != o.Nodes[j].Name {
			return o.Nodes[i].Name < o.Nodes[j].Name
		}
		return o.Nodes[i].ID < o.Nodes[j].ID
	})

	for _, jv := range o.Plan.Jobs {
		jo := JobObservation{JobView: jv, Throughput: map[string]float64{}}
		if i, ok := states[jv.ID]; ok {
			st := eng[i]
			jo.Arrival = unixTime(st.Job.Arrival)
			runnable := false
			for t, tp := range st.Throughput {
				if tp <= 0 {
					continue
				}
				jo.Throughput[t] = tp
				runnable = runnable || planner.Runnable(tp, st.Job.ScaleFactor, free[planner.GPUType(t)])
			}
			if !st.Running {
				jo.WaitingSince = unixTime(st.WaitingSince)
				jo.Pending = PendingNoCapacity
				if runnable {
					jo.Pending = PendingHeld
				}
			}
		}
		o.Jobs = append(o.Jobs, jo)
	}
	return o
}

// unixTime turns the engine's clock (Unix seconds) into a time.
func unixTime(s float64) time.Time { return time.Unix(0, int64(s*1e9)) }

// WatchStats returns the watcher's counters (Nomad API errors,
// reconnects, re-lists), for the metrics.
func (a *Agent) WatchStats() watch.Stats { return a.watcher.Stats() }
