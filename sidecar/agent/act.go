package agent

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// writers bounds the job writes made at once.
const writers = 48

// act carries out the changes of a decision: each job's units are worked
// out in order (they take unit numbers and ports), the writes to Nomad go
// out concurrently, and the outcomes are recorded in order.
func (a *Agent) act(ctx context.Context, snap *watch.Snapshot, d engine.Decision) {
	byID := map[string]*managed{}
	for _, mj := range a.jobs {
		byID[mj.id] = mj
	}
	type write struct {
		mj     *managed
		jd     engine.JobDecision
		job    *apply.Job
		target []jobform.Unit
		fresh  []jobform.Unit
		after  []apply.Key
		err    error
	}
	var ws []*write
	for _, jd := range d.Changes() {
		mj := byID[jd.Job]
		if mj == nil {
			continue
		}
		j := snap.Jobs[mj.key]
		if j == nil || j.Raw == nil || j.Spec == nil {
			continue
		}
		w := &write{mj: mj, jd: jd, job: &apply.Job{Key: apply.Key(mj.key), Raw: j.Raw, Spec: *j.Spec, JobModifyIndex: j.JobModifyIndex}}
		w.target, w.fresh, w.err = a.target(mj, j, jd)
		ws = append(ws, w)
	}
	// A job starting on GPUs another job leaves, in this decision (a swap
	// under time-slicing) or in an earlier one still stopping, is written
	// once that job's workers have ended.
	for k := range a.leaving {
		if a.applier.InFlight(k) == nil {
			delete(a.leaving, k)
		}
	}
	for _, w := range ws {
		if w.err == nil {
			delete(a.leaving, w.job.Key) // its new decision replaces the old
		}
	}
	for _, w := range ws {
		if w.err != nil || len(w.fresh) == 0 {
			continue
		}
		for _, x := range ws {
			if x != w && x.err == nil && takesFrom(w.fresh, released(x.jd)) {
				w.after = append(w.after, x.job.Key)
			}
		}
		for _, k := range sortedLeaving(a.leaving) {
			if k != w.job.Key && takesFrom(w.fresh, a.leaving[k]) {
				w.after = append(w.after, k)
			}
		}
	}
	sem := make(chan struct{}, writers)
	var wg sync.WaitGroup
	for _, w := range ws {
		if w.err != nil {
			continue
		}
		a.applier.Cancel(w.job.Key)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			_, w.err = a.applier.BeginAfter(ctx, w.job, w.target, w.after)
		}()
	}
	wg.Wait()
	for _, w := range ws {
		jd, mj := w.jd, w.mj
		ev := Event{Time: a.clock(), Job: jd.Job, Action: jd.Action, Why: jd.Reason.Why, Kind: d.Kind, Reason: jd.Reason}
		ev.To = append(ev.To, jd.To.Units...)
		if err := w.err; err != nil {
			// Nothing was written: the new units' numbers and ports stay
			// free.
			for _, u := range w.fresh {
				a.ports.Give(u.Workers[0].Addr, u.Port)
			}
			ev.Result = "not applied: " + err.Error()
			if errors.Is(err, apply.ErrConflict) {
				a.log.Info("job changed by someone else during the round: re-reading it, not overwriting", "job", jd.Job)
			} else if errors.Is(err, apply.ErrFinished) {
				a.log.Info("job is completing: not rewritten, so no finished worker runs again", "job", jd.Job, "error", err)
			} else {
				a.log.Warn("decision not applied", "job", jd.Job, "action", jd.Action, "error", err)
				a.backOff(mj, err)
			}
			// The engine assumed the change; Nomad is the truth: the next
			// reconcile puts the engine back where Nomad is.
		} else {
			if rel := released(jd); len(rel) > 0 {
				a.leaving[w.job.Key] = rel
			}
			for _, u := range w.fresh {
				mj.units = max(mj.units, u.ID+1)
			}
			a.log.Info("decision", "job", jd.Job, "action", jd.Action, "why", jd.Reason.Why)
		}
		a.note(ev)
	}
}

// gpuSlot is a GPU type on a node.
type gpuSlot struct {
	node string
	typ  planner.GPUType
}

// released counts the GPUs per node and type a job gives up in its
// decision: held before, not after.
func released(jd engine.JobDecision) map[gpuSlot]int {
	out := map[gpuSlot]int{}
	for _, u := range jd.From.Units {
		for _, sl := range u.Slots {
			out[gpuSlot{sl.Node, sl.Type}] += sl.Count
		}
	}
	for _, u := range jd.To.Units {
		for _, sl := range u.Slots {
			out[gpuSlot{sl.Node, sl.Type}] -= sl.Count
		}
	}
	for k, n := range out {
		if n <= 0 {
			delete(out, k)
		}
	}
	return out
}

// sortedLeaving lists the jobs of leaving in a stable order.
func sortedLeaving(m map[apply.Key]map[gpuSlot]int) []apply.Key {
	out := make([]apply.Key, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// takesFrom says whether a worker of the new units sits on a node and
// type in rel.
func takesFrom(fresh []jobform.Unit, rel map[gpuSlot]int) bool {
	for _, u := range fresh {
		for _, w := range u.Workers {
			if rel[gpuSlot{w.Node, w.Type}] > 0 {
				return true
			}
		}
	}
	return false
}

// target turns the engine's placement of a job into units to write: a
// unit the engine kept keeps its number, port and workers; a new unit
// gets a fresh number and port, and its workers the node's GPU models of
// their type. fresh are the new units (their numbers are the job's only
// once written).
func (a *Agent) target(mj *managed, j *watch.Job, jd engine.JobDecision) (target, fresh []jobform.Unit, err error) {
	current, err := jobform.Units(j.Raw, *j.Spec)
	if err != nil {
		return nil, nil, err
	}
	var out []jobform.Unit
	next := mj.units
	for k, u := range jd.To.Units {
		if f := jd.KeptFrom[k]; f >= 0 && f < len(jd.From.Units) {
			if cu := unitOf(current, jd.From.Units[f]); cu != nil {
				out = append(out, *cu)
				continue
			}
		}
		nu := jobform.Unit{ID: next}
		for _, sl := range u.Slots {
			for range sl.Count {
				nu.Workers = append(nu.Workers, jobform.Worker{Node: sl.Node, Type: sl.Type, Models: a.models[sl.Node][sl.Type]})
			}
		}
		addr := a.addrs[nu.Workers[0].Node]
		for i := range nu.Workers {
			nu.Workers[i].Addr = addr
		}
		port, err := a.ports.Take(addr)
		if err != nil {
			for _, f := range fresh {
				a.ports.Give(f.Workers[0].Addr, f.Port)
			}
			return nil, nil, err
		}
		nu.Port = port
		next++
		out = append(out, nu)
		fresh = append(fresh, nu)
	}
	return out, fresh, nil
}

// unitOf finds the written unit on exactly the GPUs of u.
func unitOf(written []jobform.Unit, u planner.Unit) *jobform.Unit {
	for i := range written {
		if written[i].Planner().Equal(u) {
			return &written[i]
		}
	}
	return nil
}

// clusterView adapts a watch.Snapshot to what apply reads.
type clusterView struct {
	a    *Agent
	snap *watch.Snapshot
}

func (c clusterView) Job(k apply.Key) *apply.Job {
	j := c.snap.Jobs[watch.JobKey(k)]
	if j == nil || j.Raw == nil || j.Spec == nil || j.Stop {
		return nil
	}
	return &apply.Job{Key: k, Raw: j.Raw, Spec: *j.Spec, JobModifyIndex: j.JobModifyIndex}
}

func (c clusterView) Group(k apply.Key, group string) apply.Group {
	g := apply.Group{Ended: true}
	for _, al := range c.snap.AllocsOf(watch.JobKey(k)) {
		if al.TaskGroup != group {
			continue
		}
		if !al.Terminal() {
			g.Ended = false
		}
		if al.DesiredStatus == api.AllocDesiredStatusRun && al.ClientStatus == api.AllocClientStatusRunning {
			g.Running = true
		}
	}
	for _, ev := range c.snap.BlockedEvalsOf(watch.JobKey(k)) {
		if m := ev.FailedTGAllocs[group]; m != nil {
			g.Failed = apply.Explain(m)
		}
	}
	return g
}

// backOff keeps a job whose placement could not be carried out out of the
// next plans for a while, doubling with each failure in a row (10 s up to
// 5 min), so a placement Nomad refuses is not proposed again every second.
func (a *Agent) backOff(mj *managed, why error) {
	wait := min(10*time.Second<<min(mj.refusals, 5), 5*time.Minute)
	mj.refusals++
	if err := a.eng.Defer(mj.id, a.now()+wait.Seconds(), why.Error(), a.now()); err != nil {
		a.log.Debug("defer", "job", mj.id, "error", err)
	}
}
