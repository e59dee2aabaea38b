package watch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// readWorkers bounds concurrent per-object reads (node and job Info) of a
// re-list: enough to hide round trips, few enough to spare the server.
const readWorkers = 8

// List reads the whole view once, without a cache or a stream: what a
// dry run needs, and what tests compare a watched view with.
func List(ctx context.Context, client *api.Client, cfg Config) (*Snapshot, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	l := lister{client: client, cfg: cfg, log: hclog.NewNullLogger()}
	st, err := l.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	return st.freeze(), nil
}

// relist replaces the view with a fresh list and notifies what differs.
// With reuse, objects whose modify index did not change are taken from the
// current view instead of read again; without it (after a connection
// error, when the server may have restarted with another history in which
// an ID and a modify index can mean another object) everything is read.
// reset reports a list at a lower index than the view's: the server lost
// state.
func (w *Watcher) relist(ctx context.Context, gapCheck, reuse bool) (t tableIndex, reset bool, err error) {
	var prev *state
	if reuse {
		w.mu.Lock()
		prev = w.st
		w.mu.Unlock()
	}
	l := lister{client: w.client, cfg: w.cfg, log: w.log, onError: func() { w.count(func(s *Stats) { s.APIErrors++ }) }}
	start := time.Now()
	fresh, err := l.list(ctx, prev)
	if err != nil {
		return tableIndex{}, false, err
	}
	fresh.index = fresh.tables.max()
	fresh.synced = time.Now()

	w.mu.Lock()
	kinds := diffStates(w.st, fresh) | Resynced
	if reset = fresh.index < w.st.index; reset {
		w.stats.IndexResets++
		w.log.Warn("Nomad's index went back: the server restarted with less state; view replaced", "was", w.st.index, "now", fresh.index)
	}
	w.st, w.snap = fresh, nil
	w.stats.Relists++
	if gapCheck {
		w.stats.GapChecks++
	}
	w.stats.LastRelist = fresh.synced
	w.resync = false
	w.mu.Unlock()

	// Announced before Ready closes: a reader that waited for Ready and
	// then drains Changes has seen the first list's change, and the next
	// one it receives is news.
	w.notify(Change{Kinds: kinds, Index: fresh.index})
	select {
	case <-w.ready:
	default:
		close(w.ready)
	}
	w.log.Debug("re-listed", "index", fresh.index, "nodes", len(fresh.nodes), "jobs", len(fresh.jobs),
		"allocs", len(fresh.allocs), "blocked_evals", len(fresh.evals), "gap_check", gapCheck, "took", time.Since(start))
	return fresh.tables, reset, nil
}

// lister reads the view through Nomad's list endpoints.
type lister struct {
	client  *api.Client
	cfg     Config
	log     hclog.Logger
	onError func() // counts a failed call; may be nil
}

func (l lister) fail(err error, format string, args ...any) error {
	if l.onError != nil {
		l.onError()
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// list reads allocations and evaluations before jobs, so every managed
// job an allocation or evaluation belongs to is in the job list (or was
// purged in between), and jobs registered after the job list only have
// allocations the event stream will deliver. Allocations come first: the
// busiest table (clients update it all the time) gives the event stream
// the latest start (see tableIndex). prev, when not nil, lends objects
// whose modify index is unchanged.
func (l lister) list(ctx context.Context, prev *state) (*state, error) {
	st := newState()
	// One read per table: the index argument above holds only for a single
	// read, so several namespaces are read as "*" and filtered here.
	ns := l.cfg.listNamespace()
	// Allocations of every namespace, with resources: those of jobs the
	// view leaves out (unmanaged, or of an unwatched namespace) still hold
	// GPUs the planner must not count as free.
	allocs, meta, err := l.client.Allocations().List(l.query(ctx, "*", map[string]string{"task_states": "true", "resources": "true"}, ""))
	if err != nil {
		return nil, l.fail(err, "list allocations (all namespaces)")
	}
	st.tables.allocs = meta.LastIndex
	evals, meta, err := l.client.Evaluations().List(l.query(ctx, ns, map[string]string{}, `Status == "blocked"`))
	if err != nil {
		return nil, l.fail(err, "list blocked evaluations (namespace %q)", ns)
	}
	st.tables.evals = meta.LastIndex
	stubs, meta, err := l.client.Jobs().List(l.query(ctx, ns, map[string]string{"meta": "true"}, ""))
	if err != nil {
		return nil, l.fail(err, "list jobs (namespace %q)", ns)
	}
	st.tables.jobs = meta.LastIndex
	stubs = slices.DeleteFunc(stubs, func(s *api.JobListStub) bool { return !l.cfg.watches(namespace(s.Namespace)) })
	if err := l.jobs(ctx, st, stubs, prev); err != nil {
		return nil, err
	}
	for _, a := range allocs {
		full := &api.Allocation{ID: a.ID, NodeID: a.NodeID, Namespace: a.Namespace, JobID: a.JobID,
			ClientStatus: a.ClientStatus, AllocatedResources: a.AllocatedResources}
		if j := st.jobs[jobKey(a.Namespace, a.JobID)]; j != nil && j.Managed {
			st.allocs[a.ID] = convertAlloc(a, trainTask(j), l.cfg.TaskEvents)
		} else {
			st.hold(full)
		}
		st.use(full)
	}
	for _, e := range evals {
		if j := st.jobs[jobKey(e.Namespace, e.JobID)]; j != nil && j.Managed {
			st.evals[e.ID] = convertEval(e)
		}
	}
	if err := l.nodes(ctx, st, prev); err != nil {
		return nil, err
	}
	// The lists ran one after another against one server state, so each
	// read happened at an index at least as high as every list index
	// before it, and its table had no write between its own index and
	// that. Raising each threshold to the running maximum lets apply skip
	// more events it would only apply again.
	t := &st.tables
	t.evals = max(t.evals, t.allocs)
	t.jobs = max(t.jobs, t.evals)
	t.nodes = max(t.nodes, t.jobs)
	return st, nil
}

func (l lister) query(ctx context.Context, ns string, params map[string]string, filter string) *api.QueryOptions {
	q := &api.QueryOptions{Namespace: ns, Params: params, Filter: filter}
	return q.WithContext(ctx)
}

func jobKey(ns, id string) JobKey { return JobKey{namespace(ns), id} }

// namespace is ns, or Nomad's default namespace for "" (objects of the
// default namespace may leave it out).
func namespace(ns string) string {
	if ns == "" {
		return api.DefaultNamespace
	}
	return ns
}

// trainTask is the task whose progress file Progress reads.
func trainTask(j *Job) string {
	if j.Spec != nil {
		return j.Spec.Task
	}
	return ""
}

// jobs fills st.jobs: unmanaged jobs from their list stub, managed ones
// from a full read unless prev holds the same spec version.
func (l lister) jobs(ctx context.Context, st *state, stubs []*api.JobListStub, prev *state) error {
	var read []*api.JobListStub
	for _, s := range stubs {
		k := jobKey(s.Namespace, s.ID)
		if !jobspec.IsManagedStub(s) {
			st.jobs[k] = convertJobStub(s)
			continue
		}
		if old := l.reusable(prev, k, s, st.tables.jobs); old != nil {
			j := *old
			j.Status, j.Stop, j.ModifyIndex = s.Status, s.Stop, s.ModifyIndex
			st.jobs[k] = &j
			continue
		}
		read = append(read, s)
	}
	got := make([]*Job, len(read))
	err := parallel(ctx, len(read), func(i int) error {
		s := read[i]
		q := &api.QueryOptions{Namespace: s.Namespace}
		j, _, err := l.client.Jobs().Info(s.ID, q.WithContext(ctx))
		if isNotFound(err) {
			return nil // purged since the list
		}
		if err != nil {
			return l.fail(err, "read job %q (namespace %q)", s.ID, s.Namespace)
		}
		got[i] = convertJob(j)
		return nil
	})
	if err != nil {
		return err
	}
	for _, j := range got {
		if j != nil {
			st.jobs[j.Key()] = j
		}
	}
	return nil
}

// reusable returns prev's managed job k when its spec is the version s
// lists. A job index lower than prev's means the server lost state: read
// everything again.
func (l lister) reusable(prev *state, k JobKey, s *api.JobListStub, index uint64) *Job {
	if prev == nil || index < prev.tables.jobs {
		return nil
	}
	old := prev.jobs[k]
	if old == nil || !old.Managed || old.JobModifyIndex != s.JobModifyIndex {
		return nil
	}
	return old
}

// nodes fills st.nodes from the node list, reading each node whose modify
// index changed: the list stub lacks node meta (the rack) and attributes.
func (l lister) nodes(ctx context.Context, st *state, prev *state) error {
	stubs, meta, err := l.client.Nodes().List(l.query(ctx, "", nil, ""))
	if err != nil {
		return l.fail(err, "list nodes")
	}
	st.tables.nodes = meta.LastIndex
	var read []string
	for _, s := range stubs {
		if prev != nil && meta.LastIndex >= prev.tables.nodes {
			if old := prev.nodes[s.ID]; old != nil && old.ModifyIndex == s.ModifyIndex {
				st.nodes[s.ID] = old
				continue
			}
		}
		read = append(read, s.ID)
	}
	got := make([]*Node, len(read))
	err = parallel(ctx, len(read), func(i int) error {
		n, _, err := l.client.Nodes().Info(read[i], l.query(ctx, "", nil, ""))
		if isNotFound(err) {
			return nil // garbage-collected since the list
		}
		if err != nil {
			return l.fail(err, "read node %s", read[i])
		}
		got[i] = convertNode(n, l.cfg.RackMetaKey)
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range got {
		if n != nil {
			st.nodes[n.ID] = n
		}
	}
	return nil
}

func isNotFound(err error) bool {
	var e api.UnexpectedResponseError
	return errors.As(err, &e) && e.StatusCode() == http.StatusNotFound
}

// parallel runs f(0..n-1) on up to readWorkers goroutines and returns the
// first error; after one, the rest are skipped.
func parallel(ctx context.Context, n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if first != nil || next >= n || ctx.Err() != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for range min(n, readWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, ok := take(); ok; i, ok = take() {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}
