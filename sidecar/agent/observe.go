package agent

import (
	"sort"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Observe reads the sidecar's state once.
func (a *Agent) Observe() wire.Observation {
	leader := a.Leading()
	snap := a.watcher.Snapshot()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.observe(snap, leader)
}

// observe is Observe on a view of the cluster. Called under a.mu.
func (a *Agent) observe(snap *watch.Snapshot, leader bool) wire.Observation {
	o := wire.Observation{Time: a.clock(), Plan: a.planView(snap), Leader: leader}

	// Who holds what, per node and type: the engine's placements of
	// managed jobs, Nomad's allocations of the others.
	type nt struct {
		node string
		t    planner.GPUType
	}
	holders := map[nt][]wire.Holder{}
	managedUse := map[nt]int{}
	states := map[string]int{}
	eng := a.core.eng.Jobs()
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
			holders[k] = append(holders[k], wire.Holder{Job: st.Job.ID, Count: n, Managed: true})
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
			holders[k] = append(holders[k], wire.Holder{Job: job, Count: n})
		}
	}

	// Free GPUs per type where new work may go: what the pending class of
	// a waiting job is judged against.
	free := map[planner.GPUType]float64{}
	for id, n := range a.cluster.open() {
		for t, c := range n.GPUs {
			free[t] += float64(max(0, c-managedUse[nt{id, t}]-otherUse[nt{id, t}]))
		}
	}

	for _, n := range snap.Nodes {
		no := wire.NodeObservation{ID: n.ID, Name: n.Name, Rack: n.Rack, Status: n.Status, Schedulable: n.Schedulable()}
		if pn, ok := a.cluster.node(n.ID); ok {
			no.Planned, no.Rack = true, pn.Rack
		}
		if no.Rack == "" {
			no.Rack = "rack-" + n.ID // as the planner sees it: a rack of its own
		}
		byType := map[planner.GPUType]*wire.GPUObservation{}
		var order []planner.GPUType
		unmapped := []wire.GPUObservation{}
		for _, g := range n.GPUs {
			t := a.types.Type(g.Model)
			if t == "" {
				unmapped = append(unmapped, wire.GPUObservation{Models: []string{g.Model}, Total: len(g.Instances), Healthy: g.Healthy, Holders: holders[nt{n.ID, ""}]})
				continue
			}
			gu := byType[t]
			if gu == nil {
				gu = &wire.GPUObservation{Type: string(t), Holders: holders[nt{n.ID, t}]}
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
		jo := wire.JobObservation{JobView: jv, Throughput: map[string]float64{}}
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
				jo.Pending = wire.PendingNoCapacity
				if runnable || a.queueHolds(jv.ID) {
					jo.Pending = wire.PendingHeld
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
