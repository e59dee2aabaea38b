package watch

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/nomad/api"
)

// fakeNomad is a small Nomad HTTP API for the edge cases a real agent
// cannot be made to show on demand: the list and read endpoints the
// watcher uses, and an event stream with Nomad's buffer semantics (a
// subscription starts at the closest buffered batch, silently), that a
// test can cut, corrupt or feed lower indexes.
type fakeNomad struct {
	t   testing.TB
	srv *httptest.Server

	mu      sync.Mutex
	index   uint64
	tables  map[string]uint64 // "nodes", "jobs", "allocs", "evals"
	nodes   map[string]*api.Node
	jobs    map[JobKey]*api.Job
	allocs  map[string]*fakeAlloc
	evals   map[string]*api.Evaluation
	files   map[string]string // "<alloc>/<path>" -> content
	buffer  []streamBatch     // the event buffer, oldest first
	seqs    []int             // buffer[i] was the seqs[i]-th batch published
	seq     int
	bufSize int
	wake    chan struct{} // closed and replaced on every new batch
	drop    chan struct{} // closed and replaced to cut every stream
	// failing answers every request with 500 while set.
	failing bool
	// onSubscribe runs before a subscription's start is chosen (with mu
	// held), to change the state in the window after a re-list.
	onSubscribe func(index uint64)
	// garbage is written to the next stream instead of events.
	garbage  string
	requests map[string]int // by endpoint kind
}

type fakeAlloc struct {
	a       *api.Allocation
	version uint64
}

func newFake(t testing.TB) *fakeNomad {
	f := &fakeNomad{
		t: t, index: 10, tables: map[string]uint64{},
		nodes: map[string]*api.Node{}, jobs: map[JobKey]*api.Job{}, allocs: map[string]*fakeAlloc{}, evals: map[string]*api.Evaluation{},
		files: map[string]string{}, bufSize: 100, wake: make(chan struct{}), drop: make(chan struct{}), requests: map[string]int{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.cutStreams()
		f.srv.Close()
	})
	return f
}

func (f *fakeNomad) client() *api.Client {
	c, err := api.NewClient(&api.Config{Address: f.srv.URL})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// write applies one raft write: it bumps the index, stamps the tables it
// touched, and publishes the batch unless silent.
func (f *fakeNomad) write(silent bool, events ...fakeEvent) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	b := streamBatch{Index: f.index}
	for _, e := range events {
		f.tables[e.table] = f.index
		e.apply(f.index)
		p, err := json.Marshal(e.payload)
		if err != nil {
			f.t.Fatal(err)
		}
		b.Events = append(b.Events, streamEvent{Topic: e.topic, Type: e.typ, Index: f.index, Payload: p})
	}
	if !silent {
		f.publish(b)
	}
	return f.index
}

// indexNow is the fake's current index.
func (f *fakeNomad) indexNow() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.index
}

func (f *fakeNomad) publish(b streamBatch) {
	f.seq++
	f.buffer, f.seqs = append(f.buffer, b), append(f.seqs, f.seq)
	if len(f.buffer) > f.bufSize {
		f.buffer, f.seqs = f.buffer[len(f.buffer)-f.bufSize:], f.seqs[len(f.seqs)-f.bufSize:]
	}
	close(f.wake)
	f.wake = make(chan struct{})
}

type fakeEvent struct {
	table, typ string
	topic      api.Topic
	apply      func(index uint64)
	payload    eventPayload
}

func (f *fakeNomad) nodeEvent(n *api.Node) fakeEvent {
	return fakeEvent{table: "nodes", typ: "NodeRegistration", topic: api.TopicNode, payload: eventPayload{Node: n}, apply: func(i uint64) {
		n.ModifyIndex = i
		f.nodes[n.ID] = n
	}}
}

// jobEvent registers j; spec tells a new version (a spec change) from a
// status update of the same version.
func (f *fakeNomad) jobEvent(j *api.Job, spec bool) fakeEvent {
	e := fakeEvent{table: "jobs", typ: "JobRegistered", topic: api.TopicJob}
	e.apply = func(i uint64) {
		k := jobKey(deref(j.Namespace), *j.ID)
		old := f.jobs[k]
		v, jmi := uint64(0), i
		switch {
		case old != nil && spec:
			v = *old.Version + 1
		case old != nil:
			v, jmi = *old.Version, *old.JobModifyIndex
		}
		j.Version, j.JobModifyIndex, j.ModifyIndex = &v, &jmi, &i
		f.jobs[k] = j
	}
	e.payload = eventPayload{Job: j}
	return e
}

func (f *fakeNomad) purgeEvent(j *api.Job) fakeEvent {
	return fakeEvent{table: "jobs", typ: "JobDeregistered", topic: api.TopicJob, payload: eventPayload{Job: j, Deleted: true}, apply: func(uint64) {
		k := jobKey(deref(j.Namespace), *j.ID)
		delete(f.jobs, k)
		for id, a := range f.allocs {
			if jobKey(a.a.Namespace, a.a.JobID) == k {
				delete(f.allocs, id)
			}
		}
	}}
}

func (f *fakeNomad) allocEvent(a *api.Allocation, version uint64, typ string) fakeEvent {
	return fakeEvent{table: "allocs", typ: typ, topic: api.TopicAllocation, payload: eventPayload{Allocation: a}, apply: func(i uint64) {
		a.ModifyIndex = i
		f.allocs[a.ID] = &fakeAlloc{a: a, version: version}
	}}
}

func (f *fakeNomad) evalEvent(e *api.Evaluation) fakeEvent {
	return fakeEvent{table: "evals", typ: "EvaluationUpdated", topic: api.TopicEvaluation, payload: eventPayload{Evaluation: e}, apply: func(i uint64) {
		e.ModifyIndex = i
		if e.Status == api.EvalStatusBlocked {
			f.evals[e.ID] = e
		} else {
			delete(f.evals, e.ID)
		}
	}}
}

// cutStreams ends every open event stream.
func (f *fakeNomad) cutStreams() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.drop)
	f.drop = make(chan struct{})
}

func (f *fakeNomad) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *fakeNomad) count(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[kind]
}

func (f *fakeNomad) serve(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	q := r.URL.Query()
	if path == "/v1/event/stream" {
		f.stream(w, r)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing {
		f.requests["failed"]++
		http.Error(w, "fake failure", http.StatusInternalServerError)
		return
	}
	ns := q.Get("namespace")
	inNS := func(x string) bool { return ns == "*" || namespace(x) == namespace(ns) }
	var out any
	var table string
	parts := strings.Split(strings.TrimPrefix(path, "/v1/"), "/")
	f.requests[parts[0]]++
	switch {
	case path == "/v1/nodes":
		table = "nodes"
		var stubs []*api.NodeListStub
		for _, n := range f.nodes {
			stubs = append(stubs, &api.NodeListStub{ID: n.ID, Name: n.Name, Status: n.Status, ModifyIndex: n.ModifyIndex})
		}
		out = stubs
	case parts[0] == "node" && len(parts) == 2:
		n := f.nodes[parts[1]]
		if n == nil {
			http.Error(w, "node not found", http.StatusNotFound)
			return
		}
		table, out = "nodes", n
	case path == "/v1/jobs":
		table = "jobs"
		var stubs []*api.JobListStub
		for _, j := range f.jobs {
			if inNS(*j.Namespace) {
				stubs = append(stubs, &api.JobListStub{ID: *j.ID, Namespace: *j.Namespace, Name: deref(j.Name), Type: *j.Type,
					Status: deref(j.Status), Stop: j.Stop != nil && *j.Stop, ModifyIndex: *j.ModifyIndex, JobModifyIndex: *j.JobModifyIndex,
					SubmitTime: *j.SubmitTime, Meta: j.Meta})
			}
		}
		out = stubs
	case parts[0] == "job" && len(parts) == 2:
		j := f.jobs[jobKey(ns, parts[1])]
		if j == nil {
			http.Error(w, "job not found", http.StatusNotFound)
			return
		}
		table, out = "jobs", j
	case parts[0] == "job" && len(parts) == 3 && parts[2] == "allocations":
		table = "allocs"
		var stubs []*api.AllocationListStub
		for _, a := range f.allocs {
			if a.a.JobID == parts[1] && inNS(a.a.Namespace) {
				stubs = append(stubs, allocStub(a.a, a.version))
			}
		}
		out = stubs
	case path == "/v1/allocations":
		table = "allocs"
		var stubs []*api.AllocationListStub
		for _, a := range f.allocs {
			if inNS(a.a.Namespace) {
				s := allocStub(a.a, a.version)
				if q.Get("resources") == "true" {
					s.AllocatedResources = a.a.AllocatedResources
				}
				stubs = append(stubs, s)
			}
		}
		out = stubs
	case path == "/v1/evaluations":
		table = "evals"
		var evs []*api.Evaluation
		for _, e := range f.evals {
			if inNS(e.Namespace) {
				evs = append(evs, e)
			}
		}
		out = evs
	case parts[0] == "client" && len(parts) == 4 && parts[1] == "fs" && parts[2] == "cat":
		c, ok := f.files[parts[3]+"/"+q.Get("path")]
		if !ok {
			http.Error(w, "no such file", http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte(c))
		return
	default:
		http.Error(w, "fake Nomad: no route "+path, http.StatusNotFound)
		return
	}
	w.Header().Set("X-Nomad-Index", strconv.FormatUint(max(f.tables[table], 1), 10))
	w.Header().Set("X-Nomad-KnownLeader", "true")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		f.t.Errorf("fake Nomad: encode %s: %v", path, err)
	}
}

// stream serves /v1/event/stream the way Nomad's event broker does: from
// the batch at the index asked for, else the next one after it, else the
// oldest buffered one when the index left the buffer, else (the index is
// past every batch) the newest.
func (f *fakeNomad) stream(w http.ResponseWriter, r *http.Request) {
	index, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	f.mu.Lock()
	f.requests["stream"]++
	if f.failing {
		f.mu.Unlock()
		http.Error(w, "fake failure", http.StatusInternalServerError)
		return
	}
	if f.onSubscribe != nil {
		f.onSubscribe(index)
	}
	sent := f.seq // batches published up to this one were sent
	if len(f.buffer) > 0 {
		start := f.seqs[len(f.seqs)-1]
		for i, b := range f.buffer {
			if b.Index >= index {
				start = f.seqs[i]
				break
			}
		}
		sent = start - 1
	}
	garbage := f.garbage
	f.garbage = ""
	drop := f.drop
	f.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	if garbage != "" {
		fmt.Fprintln(w, garbage)
		fl.Flush()
		return
	}
	for {
		f.mu.Lock()
		var out []streamBatch
		for i, b := range f.buffer {
			if f.seqs[i] > sent {
				out = append(out, b)
			}
		}
		last := f.seq
		wake := f.wake
		f.mu.Unlock()
		for _, b := range out {
			line, err := json.Marshal(struct {
				Index  uint64
				Events []streamEvent
			}{b.Index, b.Events})
			if err != nil {
				f.t.Errorf("fake Nomad: %v", err)
				return
			}
			if _, err := w.Write(append(line, '\n')); err != nil {
				return
			}
		}
		sent = last
		fl.Flush()
		select {
		case <-wake:
		case <-drop:
			return
		case <-r.Context().Done():
			return
		}
	}
}
