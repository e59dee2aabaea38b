package agent

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// writers bounds the job writes made at once.
const writers = 48

// pendingWrite is one job's change of a decision, written to Nomad in the
// background.
type pendingWrite struct {
	mj     *managed
	jd     engine.JobDecision
	job    *apply.Job
	target []jobform.Unit
	fresh  []jobform.Unit
	after  []watch.JobKey
	ev     wire.Event
	err    error
	leaves bool          // it set its job's GPUs leaving (roster)
	done   chan struct{} // closed once the write returned
}

// act carries out the changes of a decision: each job's units are worked
// out in order (they take unit numbers and ports), and the writes go out
// to Nomad in the background, so that a round does not wait on dozens of
// round trips to the server: collectWrites records how each went, in the
// next cycle (Run cycles as soon as one returns). Until then the job's
// operation shows in flight (apply's Reserve): Nomad's view of it is not
// taken for the truth, and starts on the GPUs it gives up wait for it.
func (a *Agent) act(ctx context.Context, snap *watch.Snapshot, d engine.Decision) {
	byID := map[string]*managed{}
	for mj := range a.roster.all() {
		byID[mj.id] = mj
	}
	// A job whose previous write is still going out: that write returns
	// first, so its units and ports are known before new ones are chosen.
	waited := false
	for _, jd := range d.Changes() {
		if mj := byID[jd.Job]; mj != nil {
			if pw := a.out.inFlight(mj.key); pw != nil {
				<-pw.done
				waited = true
			}
		}
	}
	if waited {
		a.collectWrites()
	}
	var ws []*pendingWrite
	for _, jd := range d.Changes() {
		mj := byID[jd.Job]
		if mj == nil {
			continue
		}
		j := snap.Jobs[mj.key]
		if j == nil || j.Raw == nil || j.Spec == nil {
			continue
		}
		w := &pendingWrite{mj: mj, jd: jd, job: &apply.Job{Key: mj.key, Raw: j.Raw, Spec: *j.Spec, JobModifyIndex: j.JobModifyIndex},
			ev: wire.Event{Time: a.clock(), Job: jd.Job, Action: wireAction(jd.Action), Why: jd.Reason.Why, Kind: wireKind(d.Kind), Reason: wireReason(jd.Reason)}, done: make(chan struct{})}
		w.ev.To = append(w.ev.To, wireUnits(jd.To.Units)...)
		w.target, w.fresh, w.err = a.target(mj, j, jd)
		ws = append(ws, w)
	}
	// A job starting on GPUs another job leaves, in this decision (a swap
	// under time-slicing) or in an earlier one still stopping, is written
	// once that job's workers have ended.
	a.roster.settleLeaving(func(k watch.JobKey) bool { return a.applier.InFlight(k) == nil })
	for _, w := range ws {
		if w.err == nil {
			a.roster.left(w.job.Key) // its new decision replaces the old
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
		for _, k := range a.roster.leavingKeys() {
			if k != w.job.Key && takesFrom(w.fresh, a.roster.leavingGPUs(k)) {
				w.after = append(w.after, k)
			}
		}
		// Allocations asked to stop earlier that still hold GPUs of the
		// new units' types (inside their kill_timeout; their operation
		// ended, or a restarted sidecar never had one): Nomad would refuse
		// the start, and the job would wait a round.
		for _, k := range leavingJobs(snap, w.fresh) {
			if k != w.job.Key && !slices.Contains(w.after, k) {
				w.after = append(w.after, k)
			}
		}
	}
	// The journal records the index each write was planned on, whichever
	// cycle it returns in; each write runs under the lease it was decided
	// under and ends with it.
	wctx, cancelWrites, leading := a.underLease(context.WithValue(ctx, plannedKey{}, snap.Index))
	if !leading {
		for _, w := range ws {
			w.err = errNotLeader
		}
	}
	var inFlight sync.WaitGroup
	defer func() {
		go func() { inFlight.Wait(); cancelWrites() }()
	}()
	for _, w := range ws {
		if w.err != nil {
			close(w.done)
			a.finishWrite(w)
			continue
		}
		k := w.job.Key
		r := a.applier.Reserve(k) // replaces any operation of the job
		// Until the write returns, the GPUs it gives up count as leaving:
		// a later start on them waits for it.
		if rel := released(w.jd); len(rel) > 0 {
			a.roster.leaves(k, rel)
			w.leaves = true
		}
		for _, u := range w.fresh {
			w.mj.units = max(w.mj.units, u.ID+1)
		}
		inFlight.Add(1)
		a.out.start(k, w, func() {
			defer inFlight.Done()
			_, w.err = a.applier.BeginReserved(wctx, r, w.job, w.target, w.after)
		})
	}
}

// plannedKey carries, in a background write's context, the Nomad index
// its decision was planned on (the journal's PlannedIndex).
type plannedKey struct{}

// collectWrites records how the writes that returned went. Called under
// a.mu.
func (a *Agent) collectWrites() {
	for _, w := range a.out.collect() {
		a.finishWrite(w)
	}
}

// settleWrites waits for every write in the background and records how
// each went (shutdown, tests). Called without a.mu.
func (a *Agent) settleWrites() {
	a.out.wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.collectWrites()
}

// finishWrite records how one job's write went. Called under a.mu.
func (a *Agent) finishWrite(w *pendingWrite) {
	jd, mj, ev := w.jd, w.mj, w.ev
	if err := w.err; err != nil {
		// Nothing was written: the new units' ports are free again (their
		// numbers are skipped), and its GPUs are not leaving.
		for _, u := range w.fresh {
			a.ports.Give(u.Workers[0].Addr, u.Port)
		}
		if w.leaves {
			a.roster.left(w.job.Key)
		}
		ev.Result = "not applied: " + err.Error()
		if errors.Is(err, apply.ErrConflict) {
			a.log.Info("job changed by someone else during the round: re-reading it, not overwriting", "job", jd.Job, "error", err)
		} else if errors.Is(err, apply.ErrNotManaged) {
			a.log.Info("job taken over (no longer managed): hadar's decision not written", "job", jd.Job)
		} else if errors.Is(err, apply.ErrNotVisible) {
			// Just submitted: the job is not refused, only not readable
			// yet; no back-off, the next cycle plans it again.
			a.log.Info("job not visible in Nomad yet: decided again next cycle", "job", jd.Job, "error", err)
		} else if errors.Is(err, apply.ErrFinished) {
			a.log.Info("job is completing: not rewritten, so no finished worker runs again", "job", jd.Job, "error", err)
		} else {
			a.log.Warn("decision not applied", "job", jd.Job, "action", jd.Action, "error", err)
			a.backOff(mj, err)
		}
		// The engine assumed the change; Nomad is the truth: the next
		// reconcile puts the engine back where Nomad is.
	} else {
		a.log.Info("decision", "job", jd.Job, "action", jd.Action, "why", jd.Reason.Why)
	}
	a.note(ev)
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

// leavingJobs lists, in a stable order, the jobs with an allocation asked
// to stop, not yet ended, that holds GPUs of a model a worker of the new
// units may take on that worker's node.
func leavingJobs(snap *watch.Snapshot, fresh []jobform.Unit) []watch.JobKey {
	var out []watch.JobKey
	for _, al := range snap.Allocs {
		if al.DesiredStatus == api.AllocDesiredStatusRun || al.Terminal() || len(al.GPUs) == 0 || slices.Contains(out, al.Job()) {
			continue
		}
		for _, u := range fresh {
			for _, w := range u.Workers {
				if w.Node != al.NodeID {
					continue
				}
				for _, m := range w.Models {
					if al.GPUs[m] > 0 && !slices.Contains(out, al.Job()) {
						out = append(out, al.Job())
					}
				}
			}
		}
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
	current, err := j.Units, j.UnitsErr
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
				nu.Workers = append(nu.Workers, jobform.Worker{Node: sl.Node, Type: sl.Type, Models: a.workerModels(mj, sl.Node, sl.Type)})
			}
		}
		addr := a.cluster.addr(nu.Workers[0].Node)
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

// workerModels are the device models a worker of mj on node is pinned to
// for type t: those of the node the job's own device rules allow
// (sidecar/feasible), else every model of that type there.
func (a *Agent) workerModels(mj *managed, node string, t planner.GPUType) []string {
	if f, ok := mj.feas.Nodes[node]; ok && len(f.Models[t]) > 0 {
		return f.Models[t]
	}
	return a.cluster.deviceModels(node, t)
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

func (c clusterView) Job(k watch.JobKey) *apply.Job {
	j := c.snap.Jobs[k]
	if j == nil || j.Raw == nil || j.Spec == nil || j.Stop {
		return nil
	}
	return &apply.Job{Key: k, Raw: j.Raw, Spec: *j.Spec, JobModifyIndex: j.JobModifyIndex}
}

func (c clusterView) Leaving(k watch.JobKey, node string) bool {
	for _, al := range c.snap.AllocsOf(k) {
		if al.NodeID == node && al.DesiredStatus != api.AllocDesiredStatusRun && !al.Terminal() && len(al.GPUs) > 0 {
			return true
		}
	}
	return false
}

func (c clusterView) Group(k watch.JobKey, group string) apply.Group {
	g := apply.Group{Ended: true}
	mj := c.a.roster.job(k)
	for _, al := range c.snap.AllocsOf(k) {
		if al.TaskGroup != group {
			continue
		}
		g.Done = g.Done || mj != nil && doneOnItsOwn(al, mj)
		// Placed: Nomad placed it, even if it ended since (a worker that
		// failed to start counts from its placement, so its gang is
		// rolled back after gang_timeout, not left waiting for Nomad).
		g.Placed = true
		if !al.Terminal() {
			g.Ended = false
		}
		if al.DesiredStatus == api.AllocDesiredStatusRun && al.ClientStatus == api.AllocClientStatusRunning {
			g.Running = true
		}
	}
	for _, ev := range c.snap.BlockedEvalsOf(k) {
		if m := ev.FailedTGAllocs[group]; m != nil {
			g.Failed = apply.Explain(m)
		}
	}
	return g
}

// transientBackOff is the pause after a transient API error.
const transientBackOff = 5 * time.Second

// backOff keeps a job whose placement could not be carried out out of the
// next plans for a while, doubling with each failure in a row (10 s up to
// 5 min), so a placement Nomad refuses is not proposed again every second.
// A transient API error (a 5xx, no answer) says nothing of the placement:
// a short pause, not counted, or a few unlucky requests in a row kept a
// job waiting minutes on a flaky link.
func (a *Agent) backOff(mj *managed, why error) {
	wait := transientBackOff
	if !apply.IsTransient(why) {
		wait = min(10*time.Second<<min(mj.refusals, 5), 5*time.Minute)
		mj.refusals++
	}
	if err := a.core.eng.Defer(mj.id, a.now()+wait.Seconds(), why.Error(), a.now()); err != nil {
		a.log.Debug("defer", "job", mj.id, "error", err)
	}
}
