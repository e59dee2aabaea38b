package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/trace"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/leader"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// recordedNomad answers the three job calls the sidecar writes through
// (read, plan, register with check-and-set) from jobs held in memory, and
// counts the registrations: a stand-in for Nomad in the round benchmark.
type recordedNomad struct {
	mu        sync.Mutex
	jobs      map[string]*api.Job
	registers int
	// failRegisters: the next registrations answered 500 (a flaky link).
	failRegisters int
	// locks: the variables locked through ?lock-acquire (always granted,
	// renewed and released), for a sidecar with an election.
	locks map[string]*api.Variable
	// lockBase is added to the locks' generations (their ModifyIndex).
	lockBase uint64
}

func (n *recordedNomad) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	path := strings.TrimPrefix(r.URL.Path, "/v1/")
	switch {
	case r.Method == http.MethodPut && strings.HasPrefix(path, "var/") && (r.URL.Query().Has("lock-acquire") || r.URL.Query().Has("lock-renew") || r.URL.Query().Has("lock-release")):
		var v api.Variable
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if n.locks == nil {
			n.locks = map[string]*api.Variable{}
		}
		if r.URL.Query().Has("lock-acquire") {
			v.Lock = &api.VariableLock{ID: "lock-1", TTL: v.Lock.TTL, LockDelay: v.Lock.LockDelay}
			v.ModifyIndex = n.lockBase + uint64(len(n.locks)+1)
			n.locks[v.Path] = &v
		}
		json.NewEncoder(w).Encode(n.locks[v.Path])
	case r.Method == http.MethodGet && strings.HasPrefix(path, "job/"):
		j := n.jobs[strings.TrimPrefix(path, "job/")]
		if j == nil {
			http.Error(w, "job not found", http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(j)
	case strings.HasPrefix(path, "job/") && strings.HasSuffix(path, "/plan"):
		json.NewEncoder(w).Encode(api.JobPlanResponse{FailedTGAllocs: map[string]*api.AllocationMetric{}})
	case path == "jobs":
		var req api.JobRegisterRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if n.failRegisters > 0 {
			n.failRegisters--
			http.Error(w, "injected fault", http.StatusInternalServerError)
			return
		}
		old := n.jobs[*req.Job.ID]
		if req.EnforceIndex && (old == nil || *old.JobModifyIndex != req.JobModifyIndex) {
			http.Error(w, "conflicting job modify index", http.StatusInternalServerError)
			return
		}
		idx := *old.JobModifyIndex + 1
		req.Job.JobModifyIndex = &idx
		n.jobs[*req.Job.ID] = req.Job
		n.registers++
		json.NewEncoder(w).Encode(api.JobRegisterResponse{JobModifyIndex: idx})
	default:
		http.Error(w, "not recorded: "+r.Method+" "+r.URL.Path, http.StatusNotFound)
	}
}

// benchState is 500 nodes (8 GPUs each, three models, 20 racks) and n
// managed jobs of a Gavel-style mix, held, as the sidecar would see them.
func benchState(b testing.TB, n int) (*watch.Snapshot, *recordedNomad) {
	b.Helper()
	models := []string{"Tesla V100-SXM2-16GB", "Tesla P100-PCIE-16GB", "Tesla K80"}
	snap := &watch.Snapshot{Index: 1, Synced: time.Now(), Nodes: map[string]*watch.Node{}, Jobs: map[watch.JobKey]*watch.Job{},
		Allocs: map[string]*watch.Alloc{}, BlockedEvals: map[string]*watch.Eval{}}
	for i := range 500 {
		id := fmt.Sprintf("node-%03d", i)
		g := watch.GPUGroup{Model: models[i%3], Healthy: 8}
		for k := range 8 {
			g.Instances = append(g.Instances, watch.GPU{ID: fmt.Sprintf("%s-%d", id, k), Healthy: true})
		}
		n := testNode(id, g)
		n.Rack, n.Address = fmt.Sprintf("r%02d", i%20), fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		snap.Nodes[id] = n
	}
	jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: n, Seed: 1, Profile: profile.Default(), Reference: "v100"})
	if err != nil {
		b.Fatal(err)
	}
	rec := &recordedNomad{jobs: map[string]*api.Job{}}
	for _, jb := range jobs {
		j := api.NewBatchJob(jb.ID, jb.ID, "global", 50)
		j.Namespace = ptr("default")
		j.Meta = map[string]string{"hadar.model": jb.Model, "hadar.steps": fmt.Sprint(int64(jb.TotalSteps) + 1), "hadar.workers": fmt.Sprint(jb.ScaleFactor)}
		j.Constrain(jobspec.GateConstraint())
		task := api.NewTask("t", "hadar-train")
		one := uint64(1)
		task.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: &one}}})
		j.AddTaskGroup(api.NewTaskGroup("train", 1).AddTask(task))
		idx := uint64(10)
		j.JobModifyIndex, j.Version, j.Status = &idx, ptr(uint64(0)), ptr("pending")
		rec.jobs[jb.ID] = j
		wj := watch.NewJob(j)
		if wj.Spec == nil {
			b.Fatal(wj.SpecErr)
		}
		wj.SubmitTime = time.Now()
		snap.Jobs[wj.Key()] = wj
	}
	return snap, rec
}

func ptr[T any](v T) *T { return &v }

// testNode is a ready GPU node as the watcher records one: in dc1's
// default pool, with the hadar-train driver and room for many tasks.
func testNode(id string, gpus ...watch.GPUGroup) *watch.Node {
	return &watch.Node{ID: id, Name: id, Datacenter: "dc1", NodePool: "default", Status: api.NodeStatusReady,
		SchedulingEligibility: api.NodeSchedulingEligible, Attributes: map[string]string{"kernel.name": "linux"},
		Drivers: map[string]bool{"hadar-train": true}, Resources: watch.Resources{CPU: 64000, MemoryMB: 512 << 10, DiskMB: 1 << 20}, Cores: 32,
		Rack: "r1", Address: "127.0.0.1", GPUs: gpus}
}

// observed turns what the recorded Nomad holds into the next snapshot:
// every generated group runs.
func observed(snap *watch.Snapshot, rec *recordedNomad) *watch.Snapshot {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	next := *snap
	next.Jobs, next.Allocs = map[watch.JobKey]*watch.Job{}, map[string]*watch.Alloc{}
	for k, j := range snap.Jobs {
		raw := rec.jobs[k.ID]
		c := watch.NewJob(raw)
		c.Status, c.SubmitTime = "running", j.SubmitTime
		next.Jobs[k] = c
		for _, g := range raw.TaskGroups {
			if _, gen := groupname.Parse(*g.Name); !gen {
				continue
			}
			node := ""
			for _, cons := range g.Constraints {
				if cons.LTarget == jobform.NodeAttribute {
					node = cons.RTarget
				}
			}
			id := k.ID + "/" + *g.Name
			next.Allocs[id] = &watch.Alloc{ID: id, Namespace: "default", JobID: k.ID, TaskGroup: *g.Name, Worker: generated(*g.Name), NodeID: node, Task: "t",
				DesiredStatus: api.AllocDesiredStatusRun, ClientStatus: api.AllocClientStatusRunning}
		}
	}
	return &next
}

// BenchmarkRound is one sidecar round for 1,000 managed jobs on 500 nodes:
// sync the engine with the view of Nomad, read every running job's
// progress (answered in memory), plan a round boundary and diff; the
// writes it makes are counted. Nomad is the recorded stand-in above.
//
// store=file journals every write and saves the state each round in a
// bbolt file (fsync'd), as the sidecar does by default; leader=on adds the
// lease every write is fenced by. The targets (docs/sidecar.md: 1 s and
// 200 MB a round at this size) are read off these figures, not asserted.
func BenchmarkRound(b *testing.B) {
	for _, policy := range []string{"gavel-maxmin", "hadar"} {
		for _, setup := range []string{"store=none", "store=file/leader=on"} {
			b.Run("policy="+policy+"/"+setup+"/jobs=1000/nodes=500", func(b *testing.B) {
				benchRound(b, policy, setup != "store=none")
			})
		}
	}
}

func benchRound(b *testing.B, policy string, durable bool) {
	snap, rec := benchState(b, 1000)
	srv := httptest.NewServer(rec)
	defer srv.Close()
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	cfg := config.Config{Scheduling: config.Scheduling{Policy: policy, Placement: "pack", Round: "6m"}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}
	if durable {
		cfg.State = &config.StateConfig{Store: "file", Path: filepath.Join(b.TempDir(), "sidecar.db")}
	}
	s, err := cfg.Resolve()
	if err != nil {
		b.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	if durable {
		// An election (on the recorded Nomad's always-granted lock):
		// every write checks and carries the lease.
		lock, err := leader.NewNomad(client, "default", "hadar/bench", leader.Config{TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		l, err := lock.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		defer l.Release(context.Background())
		a.lock = lock
		a.lease.Store(l)
	}
	steps := 0.0
	a.ahead.read = func(context.Context, *watch.Alloc) (*contract.Progress, error) {
		return &contract.Progress{StepsDone: int64(steps)}, nil
	}
	ctx := context.Background()
	// The first round admits and places the jobs.
	if err := a.cycleOn(ctx, snap, true); err != nil {
		b.Fatal(err)
	}
	a.settleWrites()
	first := rec.registers
	snap = observed(snap, rec)
	b.ReportAllocs()
	b.ResetTimer()
	rounds, writes := 0, 0
	for b.Loop() {
		steps += 10
		before := rec.registers
		if err := a.cycleOn(ctx, snap, true); err != nil {
			b.Fatal(err)
		}
		// The round's writes, which a live round leaves going out
		// in the background, are part of its cost here.
		a.settleWrites()
		b.StopTimer()
		writes += rec.registers - before
		rounds++
		snap = observed(snap, rec)
		b.StartTimer()
	}
	b.ReportMetric(float64(writes)/float64(rounds), "writes/round")
	b.ReportMetric(float64(first), "writes/first-round")
	b.ReportMetric(float64(len(a.Plan().Jobs)), "jobs")
}
