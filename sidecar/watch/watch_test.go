package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"

	"github.com/hadar-sched/hadar/contract"
)

func ptr[T any](v T) *T { return &v }

func gpuNode(id, rack string, healthy ...bool) *api.Node {
	n := &api.Node{ID: id, Name: "n-" + id, Datacenter: "dc1", NodePool: "default", Status: "ready", SchedulingEligibility: "eligible",
		HTTPAddr: "10.0.0.1:4646", Attributes: map[string]string{"unique.network.ip-address": "10.0.0.9", "kernel.name": "linux"},
		Meta:        map[string]string{"rack": rack},
		Drivers:     map[string]*api.DriverInfo{"hadar-train": {Detected: true, Healthy: true}, "docker": {Detected: true, Healthy: false}},
		HostVolumes: map[string]*api.HostVolumeInfo{"imagenet": {Path: "/data/imagenet", ReadOnly: true}, "scratch": {Path: "/scratch", ID: "vol-1"}},
		NodeResources: &api.NodeResources{Cpu: api.NodeCpuResources{CpuShares: 8000, TotalCpuCores: 4},
			Memory: api.NodeMemoryResources{MemoryMB: 16384}, Disk: api.NodeDiskResources{DiskMB: 100000}},
		ReservedResources: &api.NodeReservedResources{Cpu: api.NodeReservedCpuResources{CpuShares: 500},
			Memory: api.NodeReservedMemoryResources{MemoryMB: 1024}}}
	g := &api.NodeDeviceResource{Vendor: "nvidia", Type: "gpu", Name: "Tesla K80",
		Attributes: map[string]*api.Attribute{"memory": {IntVal: ptr(int64(12288)), Unit: "MiB"}, "compute_capability": {StringVal: ptr("3.7")}}}
	for i, h := range healthy {
		g.Instances = append(g.Instances, &api.NodeDevice{ID: fmt.Sprintf("%s-g%d", id, i), Healthy: h})
	}
	n.NodeResources.Devices = []*api.NodeDeviceResource{g, {Vendor: "xilinx", Type: "fpga", Name: "u250"}}
	return n
}

// batchJob is a gated hadar-train job; meta nil makes it human-owned.
func batchJob(id string, meta map[string]string) *api.Job {
	j := api.NewBatchJob(id, id, "global", 50)
	j.Namespace, j.Status, j.SubmitTime = ptr("default"), ptr("pending"), ptr(int64(1767225600123456789))
	j.Meta = meta
	j.Constrain(jobspec.GateConstraint())
	t := api.NewTask("trainer", "hadar-train")
	t.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: ptr(uint64(1))}}})
	j.AddTaskGroup(api.NewTaskGroup("train", 1).AddTask(t))
	return j
}

func managed(id string) *api.Job {
	return batchJob(id, map[string]string{jobspec.KeyModel: "A3C", jobspec.KeySteps: "100"})
}

func allocOf(id, job, node, status string) *api.Allocation {
	return &api.Allocation{ID: id, Namespace: "default", JobID: job, TaskGroup: "train-hadar-u0-w0", NodeID: node, Name: job + ".x[0]",
		DesiredStatus: "run", ClientStatus: status, CreateTime: 1767225600123456789, ModifyTime: 1767225600987654321,
		TaskStates: map[string]*api.TaskState{"trainer": {State: "running", Events: []*api.TaskEvent{
			{Type: "Received", Time: 1}, {Type: "Task Setup", Time: 2}, {Type: "Started", Time: 3},
			{Type: "Driver", Time: 4, DisplayMessage: "progress: step 10/100", Details: map[string]string{"hadar.steps_done": "10"}}}}}}
}

func blocked(id, job string) *api.Evaluation {
	return &api.Evaluation{ID: id, Namespace: "default", JobID: job, Status: api.EvalStatusBlocked, TriggeredBy: "job-register",
		FailedTGAllocs: map[string]*api.AllocationMetric{"train": {NodesEvaluated: 2, NodesFiltered: 2,
			ConstraintFiltered: map[string]int{"${meta.hadar.gate} = waiting-for-hadar": 2}}}}
}

// run starts a watcher on the fake and waits for its first snapshot; the
// watcher stops when the test ends.
func run(t *testing.T, f *fakeNomad, cfg Config) *Watcher {
	t.Helper()
	return runLogging(t, f, cfg, testWriter{t})
}

// runLogging is run with the watcher's log written to out.
func runLogging(t *testing.T, f *fakeNomad, cfg Config, out io.Writer) *Watcher {
	t.Helper()
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
	}
	w, err := New(f.client(), cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: out}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of its context ending")
		}
	})
	select {
	case <-w.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("watcher not ready")
	}
	return w
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // logging after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	// Generous: it returns as soon as cond holds, and a loaded 2-core
	// machine can stall a goroutine for seconds.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fresh compares the watcher's view with a fresh list of the fake.
func fresh(t *testing.T, w *Watcher, f *fakeNomad) {
	t.Helper()
	eventually(t, "snapshot equals a fresh list", func() error {
		l, err := List(context.Background(), f.client(), w.cfg)
		if err != nil {
			return err
		}
		if s := w.Snapshot(); !s.Equal(l) {
			return errors.New(s.Diff(l))
		}
		return nil
	})
}

func drainChanges(w *Watcher) ChangeKind {
	var k ChangeKind
	for {
		select {
		case c := <-w.Changes():
			k |= c.Kinds
		default:
			return k
		}
	}
}

func waitChange(t *testing.T, w *Watcher, want ChangeKind) {
	t.Helper()
	var got ChangeKind
	deadline := time.After(30 * time.Second)
	for got&want != want {
		select {
		case c := <-w.Changes():
			got |= c.Kinds
		case <-deadline:
			t.Fatalf("changes %v, want %v", got, want)
		}
	}
}

// TestEventsApplied walks one job through its life on the fake and checks
// the view and the announced kinds at each step.
func TestEventsApplied(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true, false)))
	w := run(t, f, Config{})
	s := w.Snapshot()
	n := s.Nodes["n1"]
	if n == nil || n.Rack != "r1" || n.Address != "10.0.0.9" || len(n.GPUs) != 1 || n.GPUs[0].Healthy != 1 ||
		n.GPUs[0].Attributes["memory"] != "12288 MiB" || n.GPUs[0].Instances[0].ID != "n1-g0" {
		t.Fatalf("node %+v", n)
	}
	drainChanges(w)

	job := managed("a")
	f.write(false, f.jobEvent(job, true), f.evalEvent(blocked("e1", "a")))
	waitChange(t, w, JobArrived|EvalBlocked)
	s = w.Snapshot()
	j := s.Jobs[JobKey{"default", "a"}]
	if j == nil || j.Spec == nil || j.Spec.Steps != 100 || j.Raw == nil || len(s.BlockedEvalsOf(j.Key())) != 1 {
		t.Fatalf("job %+v, blocked %d", j, len(s.BlockedEvalsOf(JobKey{"default", "a"})))
	}

	f.write(false, f.jobEvent(managed("a"), true)) // a new version
	waitChange(t, w, JobChanged)
	f.write(false, f.allocEvent(allocOf("x1", "a", "n1", "pending"), 1, eventPlanResult),
		f.evalEvent(&api.Evaluation{ID: "e1", Namespace: "default", JobID: "a", Status: "complete"}))
	waitChange(t, w, AllocPlaced|EvalUnblocked)
	a := w.Snapshot().Allocs["x1"]
	if a == nil || a.JobVersion != 1 || a.Task != "trainer" || len(a.TaskStates["trainer"].Events) != DefaultTaskEvents ||
		a.TaskStates["trainer"].Events[2].Details["hadar.steps_done"] != "10" || a.CreateTime.UnixNano() != 1767225600123456789 {
		t.Fatalf("alloc %+v", a)
	}
	if len(w.Snapshot().BlockedEvals) != 0 {
		t.Fatal("eval still blocked")
	}
	versionReads := f.count("job")

	// A client update keeps the version without asking Nomad.
	f.write(false, f.allocEvent(allocOf("x1", "a", "n1", "running"), 1, "AllocationUpdated"))
	waitChange(t, w, AllocChanged)
	f.write(false, f.allocEvent(allocOf("x1", "a", "n1", "complete"), 1, "AllocationUpdated"))
	waitChange(t, w, AllocTerminal)
	if got := f.count("job"); got != versionReads {
		t.Fatalf("%d job reads for client updates, want none", got-versionReads)
	}
	if a := w.Snapshot().Allocs["x1"]; !a.Terminal() || a.JobVersion != 1 {
		t.Fatalf("alloc %+v", a)
	}

	// A node change; a human job stays out of allocations and evals.
	f.write(false, f.nodeEvent(gpuNode("n1", "r2", true, true)))
	waitChange(t, w, NodeChanged)
	f.write(false, f.jobEvent(batchJob("h", nil), true), f.allocEvent(allocOf("hx", "h", "n1", "running"), 0, eventPlanResult),
		f.evalEvent(blocked("he", "h")))
	eventually(t, "human job", func() error {
		s := w.Snapshot()
		if s.Jobs[JobKey{"default", "h"}] == nil {
			return errors.New("no human job")
		}
		if s.Allocs["hx"] != nil || s.BlockedEvals["he"] != nil {
			return errors.New("human job's alloc or eval kept")
		}
		return nil
	})
	fresh(t, w, f)

	// Purge: the job and its objects go.
	f.write(false, f.purgeEvent(managed("a")))
	waitChange(t, w, JobRemoved)
	if s := w.Snapshot(); s.Allocs["x1"] != nil || s.Jobs[JobKey{"default", "a"}] != nil {
		t.Fatal("purged job left behind")
	}
	fresh(t, w, f)
	if st := w.Stats(); st.Relists != 1+st.GapChecks || st.Reconnects != 0 || st.APIErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// withResources gives an allocation resources: cpu MHz and mem MB in each
// of its tasks (names), disk MB shared.
func withResources(a *api.Allocation, cpu, mem, disk int64, tasks ...string) *api.Allocation {
	a.AllocatedResources = &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{}, Shared: api.AllocatedSharedResources{DiskMB: disk}}
	for _, t := range tasks {
		a.AllocatedResources.Tasks[t] = &api.AllocatedTaskResources{Cpu: api.AllocatedCpuResources{CpuShares: cpu}, Memory: api.AllocatedMemoryResources{MemoryMB: mem}}
	}
	return a
}

// TestNodePlacementFacts: the node facts Nomad's placement rules read
// (attributes, drivers, capacity, typed device attributes) reach the view,
// and a change of one is a node change.
func TestNodePlacementFacts(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)))
	w := run(t, f, Config{})
	n := w.Snapshot().Nodes["n1"]
	wantRes := Resources{CPU: 8000, MemoryMB: 16384, DiskMB: 100000}
	switch {
	case n.Attributes["kernel.name"] != "linux":
		t.Fatalf("attributes %v", n.Attributes)
	case !reflect.DeepEqual(n.Drivers, map[string]bool{"hadar-train": true, "docker": false}):
		t.Fatalf("drivers %v", n.Drivers)
	case !reflect.DeepEqual(n.HostVolumes, map[string]HostVolume{"imagenet": {ReadOnly: true}, "scratch": {Dynamic: true}}):
		t.Fatalf("host volumes %v", n.HostVolumes)
	case n.Resources != wantRes || n.Reserved != (Resources{CPU: 500, MemoryMB: 1024}) || n.Cores != 4:
		t.Fatalf("resources %+v reserved %+v cores %d", n.Resources, n.Reserved, n.Cores)
	case n.GPUs[0].Typed["memory"] != (Attribute{Kind: AttrInt, Int: 12288, Unit: "MiB"}) ||
		n.GPUs[0].Typed["compute_capability"] != (Attribute{Kind: AttrString, Str: "3.7"}):
		t.Fatalf("typed attributes %+v", n.GPUs[0].Typed)
	}
	drainChanges(w)
	m := gpuNode("n1", "r1", true)
	m.Attributes["kernel.name"] = "windows"
	f.write(false, f.nodeEvent(m))
	waitChange(t, w, NodeChanged)
	if got := w.Snapshot().Nodes["n1"].Attributes["kernel.name"]; got != "windows" {
		t.Fatalf("attribute after the change: %q", got)
	}
	fresh(t, w, f)
}

// TestUsage: every live allocation, of managed and unmanaged jobs alike,
// shows what it holds of its node; a finished one, or one of a purged job,
// holds nothing.
func TestUsage(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)), f.jobEvent(managed("m"), true), f.jobEvent(batchJob("h", nil), true))
	f.write(false, f.allocEvent(withResources(allocOf("m1", "m", "n1", "running"), 500, 1024, 300, "trainer"), 0, eventPlanResult))
	w := run(t, f, Config{})
	if u := w.Snapshot().Usage["m1"]; u == nil || *u != (Usage{AllocID: "m1", NodeID: "n1", Job: JobKey{"default", "m"}, Resources: Resources{CPU: 500, MemoryMB: 1024, DiskMB: 300}}) {
		t.Fatalf("listed usage %+v", u)
	}
	drainChanges(w)

	// An unmanaged allocation of two tasks: both are counted.
	h := withResources(allocOf("h1", "h", "n1", "pending"), 100, 256, 150, "web", "log")
	f.write(false, f.allocEvent(h, 0, eventPlanResult))
	waitChange(t, w, UsageChanged)
	if u := w.Snapshot().Usage["h1"]; u == nil || u.Resources != (Resources{CPU: 200, MemoryMB: 512, DiskMB: 150}) || u.Job.ID != "h" {
		t.Fatalf("usage %+v", u)
	}
	fresh(t, w, f)

	// The same state again changes nothing; a finished allocation frees it.
	f.write(false, f.allocEvent(withResources(allocOf("h1", "h", "n1", "pending"), 100, 256, 150, "web", "log"), 0, "AllocationUpdated"))
	f.write(false, f.allocEvent(withResources(allocOf("m1", "m", "n1", "complete"), 500, 1024, 300, "trainer"), 0, "AllocationUpdated"))
	waitChange(t, w, AllocTerminal|UsageChanged)
	if s := w.Snapshot(); s.Usage["m1"] != nil || s.Usage["h1"] == nil {
		t.Fatalf("usage after m1 finished: %v", s.Usage)
	}
	fresh(t, w, f)

	// A purge frees what the job's allocations held.
	f.write(false, f.purgeEvent(batchJob("h", nil)))
	waitChange(t, w, UsageChanged)
	if s := w.Snapshot(); len(s.Usage) != 0 {
		t.Fatalf("usage after the purge: %v", s.Usage)
	}
	fresh(t, w, f)
}

// TestStaleObjectsIgnored: an event carrying an older copy of an object
// than the view holds does not regress it.
func TestStaleObjectsIgnored(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)))
	w := run(t, f, Config{})
	old := gpuNode("n1", "r-old", true)
	f.write(false, f.nodeEvent(gpuNode("n1", "r-new", true)))
	eventually(t, "new rack", func() error {
		if r := w.Snapshot().Nodes["n1"].Rack; r != "r-new" {
			return fmt.Errorf("rack %s", r)
		}
		return nil
	})
	// Publish a batch whose node has a lower modify index.
	f.set(func() {
		old.ModifyIndex = 1
		p := fmt.Sprintf(`{"Node":{"ID":"n1","Status":"ready","Meta":{"rack":"r-old"},"ModifyIndex":%d}}`, 1)
		f.index++
		f.publish(streamBatch{Index: f.index, Events: []streamEvent{{Topic: api.TopicNode, Type: "NodeRegistration", Index: f.index, Payload: []byte(p)}}})
	})
	// Once the watcher has taken the batch in (its index moved), the
	// stale node must not have won.
	eventually(t, "the stale batch is read", func() error {
		if got, want := w.Stats().Index, f.indexNow(); got != want {
			return fmt.Errorf("index %d, want %d", got, want)
		}
		return nil
	})
	if r := w.Snapshot().Nodes["n1"].Rack; r != "r-new" {
		t.Fatalf("a stale event moved the node back to rack %s", r)
	}
}

// TestReconnect: a cut stream and a failing API end in a re-list that
// shows what changed meanwhile.
func TestReconnect(t *testing.T) {
	f := newFake(t)
	w := run(t, f, Config{})
	f.set(func() { f.failing = true })
	f.cutStreams()
	f.write(false, f.jobEvent(managed("while-down"), true))
	eventually(t, "failing requests", func() error {
		if f.count("failed") < 3 {
			return errors.New("the watcher did not retry")
		}
		return nil
	})
	if w.Snapshot().Jobs[JobKey{"default", "while-down"}] != nil {
		t.Fatal("saw a job while cut off")
	}
	f.set(func() { f.failing = false })
	eventually(t, "job registered while down", func() error {
		if w.Snapshot().Jobs[JobKey{"default", "while-down"}] == nil {
			return errors.New("missing")
		}
		return nil
	})
	st := w.Stats()
	if st.Reconnects < 3 || st.APIErrors < 3 || st.Relists < 2 {
		t.Fatalf("stats %+v", st)
	}
	fresh(t, w, f)
}

// TestGapCheck: changes that overflow the buffer between the re-list and
// the subscription are lost to the stream; the first event after start
// makes the watcher re-list, and the view has them.
func TestGapCheck(t *testing.T) {
	f := newFake(t)
	f.bufSize = 2
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)))
	var once sync.Once
	f.onSubscribe = func(uint64) {
		once.Do(func() {
			// mu is held: apply writes as write() does, without locking.
			for _, id := range []string{"lost-1", "lost-2", "lost-3", "lost-4"} {
				f.index++
				e := f.jobEvent(managed(id), true)
				f.tables["jobs"] = f.index
				e.apply(f.index)
				p := []byte(fmt.Sprintf(`{"Job":{"ID":%q,"Namespace":"default"}}`, id))
				f.publish(streamBatch{Index: f.index, Events: []streamEvent{{Topic: api.TopicJob, Type: "JobRegistered", Index: f.index, Payload: p}}})
			}
		})
	}
	w := run(t, f, Config{})
	eventually(t, "jobs lost to the stream", func() error {
		for _, id := range []string{"lost-1", "lost-2", "lost-3", "lost-4"} {
			if j := w.Snapshot().Jobs[JobKey{"default", id}]; j == nil || j.Spec == nil {
				return fmt.Errorf("%s missing", id)
			}
		}
		return nil
	})
	if st := w.Stats(); st.GapChecks != 1 || st.Relists != 2 {
		t.Fatalf("stats %+v: want one gap check", st)
	}
	fresh(t, w, f)
}

// TestTailReplay: a subscription past every buffered batch gets the newest
// one again (Nomad's StartAtClosest); that proves no gap, so no extra
// re-list, and the batch is skipped as already listed.
func TestTailReplay(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)))
	// Every table written at the last index, so the stream starts past
	// every batch.
	f.write(false, f.jobEvent(managed("a"), true), f.evalEvent(blocked("e", "a")),
		f.allocEvent(allocOf("x", "a", "n1", "pending"), 0, eventPlanResult), f.nodeEvent(gpuNode("n2", "r1", true)))
	w := run(t, f, Config{})
	eventually(t, "replayed batch skipped", func() error {
		if st := w.Stats(); st.EventsSkipped == 0 {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
	f.write(false, f.jobEvent(managed("b"), true))
	eventually(t, "job b", func() error {
		if w.Snapshot().Jobs[JobKey{"default", "b"}] == nil {
			return errors.New("missing")
		}
		return nil
	})
	if st := w.Stats(); st.GapChecks != 0 || st.Relists != 1 {
		t.Fatalf("stats %+v: want no gap check", st)
	}
}

// TestIndexGoesBack: a stream whose index goes back makes the watcher
// re-list; a re-list at a lower index (a server that lost its state)
// replaces the view, reading again even objects whose modify index looks
// unchanged.
func TestIndexGoesBack(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)))
	f.write(false, f.jobEvent(managed("a"), true))
	w := run(t, f, Config{})
	f.write(false, f.jobEvent(managed("b"), true))
	eventually(t, "job b", func() error {
		if w.Snapshot().Jobs[JobKey{"default", "b"}] == nil {
			return errors.New("missing")
		}
		return nil
	})
	// Within one stream: a batch at an index already passed.
	before := w.Stats()
	f.set(func() {
		f.publish(streamBatch{Index: 5, Events: []streamEvent{{Topic: api.TopicJob, Type: "JobRegistered", Index: 5, Payload: []byte(`{"Job":{"ID":"ghost"}}`)}}})
	})
	eventually(t, "re-list after the index went back", func() error {
		if st := w.Stats(); st.Relists <= before.Relists || st.Reconnects <= before.Reconnects {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
	if w.Snapshot().Jobs[JobKey{"default", "ghost"}] != nil {
		t.Fatal("applied an event from the past")
	}
	// The new session's stream is live (it delivered an event) before the
	// restart below cuts it: a restart during its re-list would leave a
	// stream opened after the cut, which only the periodic resync ends.
	f.write(false, f.jobEvent(managed("c"), true))
	eventually(t, "job c on the new stream", func() error {
		if w.Snapshot().Jobs[JobKey{"default", "c"}] == nil {
			return errors.New("missing")
		}
		return nil
	})

	// The server restarts with less state: a lower index, job a gone, and
	// node n1 back with the same modify index but another rack.
	f.set(func() {
		n := gpuNode("n1", "r9", true)
		n.ModifyIndex = f.nodes["n1"].ModifyIndex
		f.index = 3
		f.nodes = map[string]*api.Node{"n1": n}
		f.jobs = map[JobKey]*api.Job{}
		f.tables = map[string]uint64{"nodes": 2, "jobs": 1}
		f.buffer = nil
	})
	f.cutStreams()
	eventually(t, "state of the restarted server", func() error {
		s := w.Snapshot()
		if len(s.Jobs) != 0 || s.Nodes["n1"].Rack != "r9" {
			// A restarted server has no stream of before: one the
			// watcher opened as the cut came (job c can arrive by a
			// re-list, the ghost batch replayed to the next stream; make
			// test run 16) is cut too, not left to the periodic resync.
			f.cutStreams()
			return fmt.Errorf("jobs %d, rack %s", len(s.Jobs), s.Nodes["n1"].Rack)
		}
		return nil
	})
	if st := w.Stats(); st.IndexResets != 1 {
		t.Fatalf("stats %+v: want one index reset", st)
	}
	fresh(t, w, f)
}

// TestPeriodicResync: a change Nomad publishes no event for (node meta
// edits, say) shows after the resync interval.
func TestPeriodicResync(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)))
	w := run(t, f, Config{ResyncInterval: time.Second})
	// Let the first session settle (its gap check included).
	f.write(false, f.jobEvent(managed("a"), true))
	eventually(t, "job a", func() error {
		if w.Snapshot().Jobs[JobKey{"default", "a"}] == nil {
			return errors.New("missing")
		}
		return nil
	})
	relists := w.Stats().Relists
	f.write(true, f.nodeEvent(gpuNode("n1", "r2", true)))
	// An event after the silent change, once read, shows the stream
	// went on without it: only the resync may bring it (unless one
	// already ran, on a slow machine).
	f.write(false, f.jobEvent(managed("b"), true))
	eventually(t, "job b", func() error {
		if w.Snapshot().Jobs[JobKey{"default", "b"}] == nil {
			return errors.New("missing")
		}
		return nil
	})
	if w.Snapshot().Nodes["n1"].Rack != "r1" && w.Stats().Relists == relists {
		t.Fatal("saw a silent change without a resync")
	}
	eventually(t, "silent change after the resync", func() error {
		if r := w.Snapshot().Nodes["n1"].Rack; r != "r2" {
			return fmt.Errorf("rack %s", r)
		}
		return nil
	})
	waitChange(t, w, Resynced|NodeChanged)
	if st := w.Stats(); st.Reconnects != 0 {
		t.Fatalf("a periodic resync counted as a reconnect: %+v", st)
	}
}

// TestRelistReusesUnchanged: a periodic re-list reads again only nodes and
// managed jobs whose modify index changed.
func TestRelistReusesUnchanged(t *testing.T) {
	f := newFake(t)
	for i := 0; i < 5; i++ {
		f.write(false, f.nodeEvent(gpuNode(fmt.Sprintf("n%d", i), "r1", true)))
	}
	f.write(false, f.jobEvent(managed("a"), true), f.jobEvent(managed("b"), true))
	w := run(t, f, Config{ResyncInterval: time.Second})
	eventually(t, "first session settled", func() error {
		if w.Stats().EventsSkipped == 0 {
			return errors.New("no event yet")
		}
		return nil
	})
	nodeReads, jobReads := f.count("node"), f.count("job")
	f.write(true, f.nodeEvent(gpuNode("n3", "r2", true)), f.jobEvent(managed("b"), true))
	eventually(t, "changed node and job", func() error {
		s := w.Snapshot()
		if s.Nodes["n3"].Rack != "r2" || s.Jobs[JobKey{"default", "b"}].Version != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	if n, j := f.count("node")-nodeReads, f.count("job")-jobReads; n != 1 || j != 1 {
		t.Fatalf("re-list read %d nodes and %d jobs, want 1 and 1", n, j)
	}
}

// TestBecameManaged: a human job that gains hadar meta makes the watcher
// re-list, so the allocations it already had join the view.
func TestBecameManaged(t *testing.T) {
	f := newFake(t)
	f.write(false, f.jobEvent(batchJob("h", nil), true), f.allocEvent(allocOf("hx", "h", "n1", "running"), 0, eventPlanResult))
	w := run(t, f, Config{})
	if w.Snapshot().Allocs["hx"] != nil {
		t.Fatal("human job's allocation in the view")
	}
	f.write(false, f.jobEvent(managed("h"), true))
	waitChange(t, w, JobArrived)
	eventually(t, "earlier allocation", func() error {
		if w.Snapshot().Allocs["hx"] == nil {
			return errors.New("missing")
		}
		return nil
	})
	fresh(t, w, f)
}

// TestNamespaces: a watcher of one namespace drops the others' events.
func TestNamespaces(t *testing.T) {
	f := newFake(t)
	w := run(t, f, Config{Namespaces: []string{"ml"}})
	other := managed("o")
	mine := managed("m")
	mine.Namespace = ptr("ml")
	f.write(false, f.jobEvent(other, true), f.jobEvent(mine, true))
	eventually(t, "job of ml", func() error {
		if w.Snapshot().Jobs[JobKey{"ml", "m"}] == nil {
			return errors.New("missing")
		}
		return nil
	})
	if len(w.Snapshot().Jobs) != 1 {
		t.Fatalf("jobs %v", w.Snapshot().Jobs)
	}
	fresh(t, w, f)

	// A job of an unwatched namespace still holds GPUs.
	drainChanges(w)
	a := allocOf("ox", "o", "n1", "running")
	a.AllocatedResources = &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"trainer": {
		Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "Tesla K80", DeviceIDs: []string{"g0", "g1"}}}}}}
	f.write(false, f.allocEvent(a, 0, eventPlanResult))
	waitChange(t, w, CapacityChanged)
	want := []Held{{AllocID: "ox", NodeID: "n1", Job: JobKey{"default", "o"}, GPUs: map[string]int{"Tesla K80": 2}}}
	if got := w.Snapshot().Unmanaged; !reflect.DeepEqual(got, want) {
		t.Fatalf("unmanaged holds %+v, want %+v", got, want)
	}
	fresh(t, w, f)
	done := allocOf("ox", "o", "n1", "complete")
	done.AllocatedResources = a.AllocatedResources
	f.write(false, f.allocEvent(done, 0, "AllocationUpdated"))
	waitChange(t, w, CapacityChanged)
	if got := w.Snapshot().Unmanaged; len(got) != 0 {
		t.Fatalf("a finished allocation still holds %+v", got)
	}
	fresh(t, w, f)

	// A purge deletes the job's allocations without allocation events
	// (seen on Nomad 1.11.3): the job's deletion frees their GPUs.
	f.write(false, f.allocEvent(a, 0, eventPlanResult))
	waitChange(t, w, CapacityChanged)
	f.write(false, f.purgeEvent(other))
	waitChange(t, w, CapacityChanged)
	if got := w.Snapshot().Unmanaged; len(got) != 0 {
		t.Fatalf("a purged job's allocation still holds %+v", got)
	}
	fresh(t, w, f)
}

// TestUndecodableStream: a garbled stream line ends the session and the
// watcher reconnects.
func TestUndecodableStream(t *testing.T) {
	f := newFake(t)
	f.set(func() { f.garbage = `{"Index": "not a number"}` })
	w := run(t, f, Config{})
	eventually(t, "reconnect after garbage", func() error {
		if st := w.Stats(); st.Reconnects < 1 || st.APIErrors < 1 || f.count("stream") < 2 {
			return fmt.Errorf("stats %+v, %d streams", st, f.count("stream"))
		}
		return nil
	})
	f.write(false, f.jobEvent(managed("a"), true))
	eventually(t, "events flow again", func() error {
		if w.Snapshot().Jobs[JobKey{"default", "a"}] == nil {
			return errors.New("missing")
		}
		return nil
	})
}

// TestBackoffNeverSpins: against an API that always fails, the watcher
// retries with growing waits and stops at once when its context ends.
func TestBackoffNeverSpins(t *testing.T) {
	f := newFake(t)
	f.set(func() { f.failing = true })
	w, err := New(f.client(), Config{BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 1700*time.Millisecond {
		t.Fatalf("Run returned %v after its deadline", d-1500*time.Millisecond)
	}
	// Waits of 10..20, 20..40, 40..80, 80..160, then 100..200 ms: about
	// ten attempts in 1.5 s; a spinning loop would make thousands.
	if n := f.count("failed"); n < 5 || n > 25 {
		t.Fatalf("%d attempts in 1.5s", n)
	}
	select {
	case <-w.Ready():
		t.Fatal("ready without a list")
	default:
	}
}

func TestBackoffBounds(t *testing.T) {
	for n := 1; n < 40; n++ {
		d := backoff(100*time.Millisecond, 2*time.Second, n)
		hi := min(100*time.Millisecond<<(n-1), 2*time.Second)
		if n > 20 {
			hi = 2 * time.Second
		}
		if d < hi/2 || d > hi {
			t.Fatalf("backoff(%d) = %v, want in [%v, %v]", n, d, hi/2, hi)
		}
	}
}

// TestChangesCoalesce: a reader that does not keep up gets one Change with
// every kind.
func TestChangesCoalesce(t *testing.T) {
	w := &Watcher{changes: make(chan Change, 1)}
	w.notify(Change{Kinds: NodeAdded, Index: 3})
	w.notify(Change{Kinds: JobArrived, Index: 9})
	w.notify(Change{})
	w.notify(Change{Kinds: AllocTerminal, Index: 7})
	c := <-w.Changes()
	if c.Kinds != NodeAdded|JobArrived|AllocTerminal || c.Index != 9 {
		t.Fatalf("change %+v (%v)", c, c.Kinds)
	}
	select {
	case c := <-w.Changes():
		t.Fatalf("second change %+v", c)
	default:
	}
	if s := (NodeAdded | Resynced | UsageChanged).String(); s != "node-added|resynced|usage-changed" || ChangeKind(0).String() != "none" {
		t.Fatalf("String %q", s)
	}
}

func TestConfig(t *testing.T) {
	c, err := Config{}.withDefaults()
	if err != nil || c.RackMetaKey != "rack" || c.ResyncInterval != 5*time.Minute || c.ProgressPath != DefaultProgressPath || c.Namespaces[0] != "*" {
		t.Fatalf("defaults %+v %v", c, err)
	}
	for _, bad := range []Config{
		{Namespaces: []string{""}},
		{ResyncInterval: time.Millisecond},
		{BackoffMin: time.Second, BackoffMax: time.Millisecond},
		{TaskEvents: -1},
		{ProgressPath: "/etc/passwd"},
	} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
	if _, err := New(nil, Config{}, nil); err == nil {
		t.Error("New without a client")
	}
}

func TestProgress(t *testing.T) {
	f := newFake(t)
	w, err := New(f.client(), Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &Alloc{ID: "x1", Namespace: "default", NodeID: "nowhere", Task: "trainer"}
	f.set(func() {
		f.files["x1/trainer/local/hadar-progress.json"] = `{"steps_done": 1200, "total_steps": 5000, "steps_per_sec": 41.5, "loss": 0.312,
 "checkpoint": "/alloc/data/checkpoints/ckpt-1200.json", "updated": "2026-11-21T23:59:00Z", "state": "running", "copies": 2, "copy_index": 1, "local_steps": 600, "extra": true}`
	})
	p, err := w.Progress(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	want := contract.Progress{StepsDone: 1200, TotalSteps: 5000, StepsPerSec: 41.5, Loss: 0.312, Checkpoint: "/alloc/data/checkpoints/ckpt-1200.json",
		Updated: time.Date(2026, 11, 21, 23, 59, 0, 0, time.UTC), State: "running", Copies: 2, CopyIndex: 1, LocalSteps: 600}
	if *p != want {
		t.Fatalf("progress %+v, want %+v", *p, want)
	}

	// The task from the only task state; a configured path.
	w2, _ := New(f.client(), Config{ProgressPath: "alloc/data/{task}.json"}, nil)
	f.set(func() { f.files["x1/alloc/data/solo.json"] = `{"steps_done": 7}` })
	p, err = w2.Progress(context.Background(), &Alloc{ID: "x1", TaskStates: map[string]TaskState{"solo": {}}})
	if err != nil || p.StepsDone != 7 {
		t.Fatalf("progress %+v, %v", p, err)
	}

	for name, c := range map[string]struct {
		alloc *Alloc
		file  string
		want  string
	}{
		"not JSON":     {a, "steps", "docs/training-contract.md"},
		"wrong type":   {a, `{"steps_done": "many"}`, "steps_done"},
		"too big":      {a, `{"loss": "` + strings.Repeat("x", contract.MaxProgressBytes) + `"}`, "more than"},
		"missing file": {&Alloc{ID: "x2", Task: "trainer"}, "", "read progress file"},
		"no task":      {&Alloc{ID: "x1", TaskStates: map[string]TaskState{"a": {}, "b": {}}}, "", `no training task known`},
	} {
		f.set(func() { f.files["x1/trainer/local/hadar-progress.json"] = c.file })
		if _, err := w.Progress(context.Background(), c.alloc); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, c.want)
		}
	}
	if st := w.Stats(); st.ProgressReads != 6 || st.ProgressErrors != 5 {
		t.Errorf("stats %+v", st)
	}
}

// TestRunTwice: one watcher runs once at a time.
func TestRunTwice(t *testing.T) {
	f := newFake(t)
	w := run(t, f, Config{})
	if err := w.Run(context.Background()); err == nil {
		t.Fatal("a second Run started")
	}
}

// BenchmarkRelist: a re-list of 500 nodes and 1,000 managed jobs on the
// fake API, cold (every node and job read) and warm (nothing changed, so
// only the four lists are read).
func BenchmarkRelist(b *testing.B) {
	f := newFake(b)
	for i := 0; i < 500; i++ {
		f.write(false, f.nodeEvent(gpuNode(fmt.Sprintf("n%03d", i), fmt.Sprintf("r%d", i/20), true, true, true, true, true, true, true, true)))
	}
	for i := 0; i < 1000; i++ {
		f.write(false, f.jobEvent(managed(fmt.Sprintf("j%04d", i)), true))
	}
	cfg, _ := Config{}.withDefaults()
	l := lister{client: f.client(), cfg: cfg, log: hclog.NewNullLogger()}
	warm, err := l.list(context.Background(), nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		prev *state
	}{{"cold", nil}, {"warm", warm}} {
		b.Run("nodes=500,jobs=1000/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				st, err := l.list(context.Background(), c.prev)
				if err != nil || len(st.nodes) != 500 || len(st.jobs) != 1000 {
					b.Fatalf("%v", err)
				}
			}
		})
	}
}

// TestAllocVersionFallback: an allocation its job's allocation list does
// not show (collected already) takes the job's current version.
func TestAllocVersionFallback(t *testing.T) {
	f := newFake(t)
	f.write(false, f.jobEvent(managed("a"), true))
	f.write(false, f.jobEvent(managed("a"), true))
	w := run(t, f, Config{})
	f.set(func() {
		f.index++
		p := []byte(`{"Allocation":{"ID":"gone","Namespace":"default","JobID":"a","ClientStatus":"complete","ModifyIndex":` + fmt.Sprint(f.index) + `}}`)
		f.publish(streamBatch{Index: f.index, Events: []streamEvent{{Topic: api.TopicAllocation, Type: eventPlanResult, Index: f.index, Payload: p}}})
	})
	eventually(t, "allocation with the job's version", func() error {
		a := w.Snapshot().Allocs["gone"]
		if a == nil || a.JobVersion != 1 {
			return fmt.Errorf("alloc %+v", a)
		}
		return nil
	})
}

// An allocation's host ports, from its group's ports and its networks',
// by label: the sidecar keeps a rendezvous port a live allocation holds.
func TestAllocPorts(t *testing.T) {
	stub := &api.AllocationListStub{ID: "a1", JobID: "j", ClientStatus: api.AllocClientStatusRunning,
		AllocatedResources: &api.AllocatedResources{Shared: api.AllocatedSharedResources{
			Ports:    []api.PortMapping{{Label: "hadar_rdzv", Value: 29501, HostIP: "10.0.0.9"}},
			Networks: []*api.NetworkResource{{ReservedPorts: []api.Port{{Label: "metrics", Value: 9100}}, DynamicPorts: []api.Port{{Label: "http", Value: 24000}}}},
		}}}
	got := convertAlloc(stub, "train", 0).Ports
	want := map[string]int{"hadar_rdzv": 29501, "metrics": 9100, "http": 24000}
	if len(got) != len(want) {
		t.Fatalf("ports %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("ports %v, want %v", got, want)
		}
	}
	if p := convertAlloc(&api.AllocationListStub{ID: "a2"}, "", 0).Ports; p != nil {
		t.Fatalf("an allocation without resources: ports %v, want none", p)
	}
}

// An allocation's worker is parsed once, from its group's name.
func TestAllocWorker(t *testing.T) {
	w := convertAlloc(&api.AllocationListStub{ID: "a1", TaskGroup: "train-hadar-u3-w1"}, "", 0).Worker
	if w == nil || *w != (groupname.Worker{Template: "train", Unit: 3, Rank: 1}) {
		t.Fatalf("worker %+v, want train unit 3 rank 1", w)
	}
	if w := convertAlloc(&api.AllocationListStub{ID: "a2", TaskGroup: "train"}, "", 0).Worker; w != nil {
		t.Fatalf("a group hadar did not generate: worker %+v, want none", w)
	}
}

// TestReadyAfterTheFirstChange: once Ready is closed, the first list's
// change is already waiting, so a reader that drains Changes after Ready
// takes no stale news for a later event (TestUsage failed so on a loaded
// machine: the list's UsageChanged came after its drain). The watcher's
// log line after the list is held until the test has looked, so that a
// change announced after Ready is not announced in time.
func TestReadyAfterTheFirstChange(t *testing.T) {
	f := newFake(t)
	f.write(false, f.nodeEvent(gpuNode("n1", "r1", true)), f.jobEvent(managed("m"), true))
	looked := make(chan struct{})
	w := runLogging(t, f, Config{}, holdWriter{t: t, on: "re-listed", until: looked})
	var first ChangeKind
	select {
	case c := <-w.Changes():
		first = c.Kinds
	default:
	}
	close(looked)
	if first&Resynced == 0 || first&NodeAdded == 0 {
		t.Fatalf("change waiting when Ready closed: %v, want the list's (Resynced, NodeAdded)", first)
	}
}

// holdWriter logs to t, holding a line that contains on until until is
// closed (at most 5 s).
type holdWriter struct {
	t     *testing.T
	on    string
	until chan struct{}
}

func (w holdWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.on) {
		select {
		case <-w.until:
		case <-time.After(5 * time.Second):
		}
	}
	return testWriter{w.t}.Write(p)
}
