package watch

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Nomad's event types the watcher tells apart.
const (
	eventNodeDeregistration = "NodeDeregistration"
	// eventPlanResult: the scheduler placed, updated or stopped
	// allocations; only then can an allocation's job version change.
	eventPlanResult = "PlanResult"
)

// decoded is one event turned into the view's terms, before the lock.
type decoded struct {
	evType  string
	node    *Node
	job     *Job
	deleted bool // node deregistered or job purged
	alloc   *api.Allocation
	version uint64 // the allocation's job version
	eval    *api.Evaluation
}

// apply applies one batch of events. Events a list at or after their
// index already reflected are skipped, and so are objects older than the
// view's copy.
func (w *Watcher) apply(ctx context.Context, evs *streamBatch, t tableIndex) error {
	ds := make([]decoded, 0, len(evs.Events))
	skipped := 0
	for i := range evs.Events {
		ev := &evs.Events[i]
		d, ok, err := w.decode(ev, t)
		if err != nil {
			w.count(func(s *Stats) { s.APIErrors++ })
			return err
		}
		if !ok {
			skipped++
			continue
		}
		ds = append(ds, d)
	}
	if err := w.allocVersions(ctx, ds); err != nil {
		return err
	}

	w.mu.Lock()
	var kinds ChangeKind
	for _, d := range ds {
		kinds |= w.applyOne(d)
	}
	w.st.index = max(w.st.index, evs.Index)
	w.snap = nil // the index moved at least
	w.stats.EventsApplied += uint64(len(ds))
	w.stats.EventsSkipped += uint64(skipped)
	w.stats.LastEvent = time.Now()
	index := w.st.index
	w.mu.Unlock()

	w.notify(Change{Kinds: kinds, Index: index})
	return nil
}

// allocVersions fills in the job version of the batch's allocations of
// managed jobs. Allocation events carry no job (Nomad strips it), so the
// version is kept from the view's copy, except for new allocations and
// scheduler writes: those take it from one job allocation list per job.
// Only the Run goroutine writes w.st, so it reads w.st without the lock.
func (w *Watcher) allocVersions(ctx context.Context, ds []decoded) error {
	managed := func(k JobKey) bool {
		for i := len(ds) - 1; i >= 0; i-- { // a job event of this batch wins over the view
			if ds[i].job != nil && ds[i].job.Key() == k {
				return ds[i].job.Managed && !ds[i].deleted
			}
		}
		j := w.st.jobs[k]
		return j != nil && j.Managed
	}
	need := map[JobKey][]int{}
	for i := range ds {
		a := ds[i].alloc
		if a == nil {
			continue
		}
		k := jobKey(a.Namespace, a.JobID)
		old := w.st.allocs[a.ID]
		if old != nil && ds[i].evType != eventPlanResult {
			ds[i].version = old.JobVersion
			continue
		}
		if managed(k) {
			need[k] = append(need[k], i)
		}
	}
	for k, idx := range need {
		q := &api.QueryOptions{Namespace: k.Namespace}
		stubs, _, err := w.client.Jobs().Allocations(k.ID, true, q.WithContext(ctx))
		if err != nil {
			w.count(func(s *Stats) { s.APIErrors++ })
			return fmt.Errorf("read allocation job versions of job %s: %w", k, err)
		}
		versions := make(map[string]uint64, len(stubs))
		for _, s := range stubs {
			versions[s.ID] = s.JobVersion
		}
		for _, i := range idx {
			v, ok := versions[ds[i].alloc.ID]
			if !ok {
				// Collected since, or not visible yet: the job's
				// current version is the scheduler's likely one.
				if j := w.st.jobs[k]; j != nil {
					v = j.Version
				}
				w.log.Debug("allocation missing from its job's allocation list; assuming the job's version", "alloc", ds[i].alloc.ID, "job", k.String(), "version", v)
			}
			ds[i].version = v
		}
	}
	return nil
}

// decode turns ev into the view's terms; ok is false for events to skip
// (already listed, another namespace, another topic).
func (w *Watcher) decode(ev *streamEvent, t tableIndex) (d decoded, ok bool, err error) {
	d = decoded{evType: ev.Type}
	var listed uint64
	switch ev.Topic {
	case api.TopicNode:
		listed = t.nodes
	case api.TopicJob:
		listed = t.jobs
	case api.TopicAllocation:
		listed = t.allocs
	case api.TopicEvaluation:
		listed = t.evals
	default:
		return d, false, nil
	}
	if ev.Index <= listed {
		return d, false, nil
	}
	p, err := ev.payload()
	if err != nil {
		return d, false, err
	}
	missing := func() (decoded, bool, error) {
		return d, false, fmt.Errorf("%s event %s at index %d: no %s in the payload", ev.Topic, ev.Type, ev.Index, ev.Topic)
	}
	switch ev.Topic {
	case api.TopicNode:
		if p.Node == nil {
			return missing()
		}
		d.node, d.deleted = convertNode(p.Node, w.cfg.RackMetaKey), ev.Type == eventNodeDeregistration
		return d, true, nil
	case api.TopicJob:
		if p.Job == nil {
			return missing()
		}
		// Every namespace: a purge of an unwatched job frees the GPUs its
		// allocations held (applyOne).
		d.job, d.deleted = convertJob(p.Job), p.Deleted
		return d, true, nil
	case api.TopicAllocation:
		if p.Allocation == nil {
			return missing()
		}
		// Every namespace: an allocation of an unwatched job still holds
		// GPUs (applyOne counts it in Snapshot.Unmanaged).
		d.alloc = p.Allocation
		return d, true, nil
	default:
		if p.Evaluation == nil {
			return missing()
		}
		d.eval = p.Evaluation
		return d, w.cfg.watches(namespace(d.eval.Namespace)), nil
	}
}

// applyOne applies a decoded event under w.mu.
func (w *Watcher) applyOne(d decoded) ChangeKind {
	st := w.st
	switch {
	case d.node != nil:
		old := st.nodes[d.node.ID]
		if d.deleted {
			delete(st.nodes, d.node.ID)
			return nodeChange(old, nil)
		}
		if old != nil && old.ModifyIndex > d.node.ModifyIndex {
			return 0
		}
		st.nodes[d.node.ID] = d.node
		return nodeChange(old, d.node)

	case d.job != nil:
		k := d.job.Key()
		if !w.cfg.watches(k.Namespace) {
			if d.deleted {
				return st.dropHolds(k)
			}
			return 0
		}
		old := st.jobs[k]
		if d.deleted {
			delete(st.jobs, k)
			return jobChange(old, nil) | st.removeJobObjects(k)
		}
		if old != nil && old.ModifyIndex > d.job.ModifyIndex {
			return 0
		}
		st.jobs[k] = d.job
		kinds := jobChange(old, d.job)
		switch {
		case old != nil && old.Managed && !d.job.Managed:
			// Its allocations now hold GPUs as an unmanaged job's: the
			// re-list counts them.
			kinds |= st.removeJobObjects(k)
			w.resync = true
		case old != nil && !old.Managed && d.job.Managed:
			// Its allocations and evaluations so far were not kept.
			w.resync = true
		}
		return kinds

	case d.alloc != nil:
		j := st.jobs[jobKey(d.alloc.Namespace, d.alloc.JobID)]
		old := st.allocs[d.alloc.ID]
		if j == nil || !j.Managed {
			delete(st.allocs, d.alloc.ID)
			return allocChange(old, nil) | st.hold(d.alloc) | st.use(d.alloc)
		}
		a := convertAlloc(allocStub(d.alloc, d.version), trainTask(j), w.cfg.TaskEvents)
		if old != nil && old.ModifyIndex > a.ModifyIndex {
			return 0
		}
		st.allocs[a.ID] = a
		return allocChange(old, a) | st.use(d.alloc)

	case d.eval != nil:
		j := st.jobs[jobKey(d.eval.Namespace, d.eval.JobID)]
		old := st.evals[d.eval.ID]
		if j == nil || !j.Managed || d.eval.Status != api.EvalStatusBlocked {
			delete(st.evals, d.eval.ID)
			return evalChange(old, nil)
		}
		e := convertEval(d.eval)
		if old != nil && old.ModifyIndex > e.ModifyIndex {
			return 0
		}
		st.evals[e.ID] = e
		return evalChange(old, e)
	}
	return 0
}
