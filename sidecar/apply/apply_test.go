package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// fakeJobs keeps one job in memory and answers Nomad's three job calls the
// way Nomad does for the parts apply relies on: check-and-set on
// JobModifyIndex, and plans whose failures the test sets.
type fakeJobs struct {
	job        *api.Job
	index      uint64
	failGroup  map[string]bool // PlanOpts reports these groups unplaceable
	placeAgain map[string]bool // PlanOpts reports these groups to place (a finished batch worker)
	registers  []*api.Job
	reads      int
	evals      int // EvaluateWithOpts calls
}

func (f *fakeJobs) EvaluateWithOpts(string, api.EvalOptions, *api.WriteOptions) (string, *api.WriteMeta, error) {
	f.evals++
	return "e2", &api.WriteMeta{}, nil
}

func (f *fakeJobs) Info(id string, q *api.QueryOptions) (*api.Job, *api.QueryMeta, error) {
	f.reads++
	c := *f.job // apply clones before it changes anything
	idx := f.index
	c.JobModifyIndex = &idx
	return &c, &api.QueryMeta{}, nil
}

func (f *fakeJobs) PlanOpts(job *api.Job, _ *api.PlanOptions, _ *api.WriteOptions) (*api.JobPlanResponse, *api.WriteMeta, error) {
	resp := &api.JobPlanResponse{FailedTGAllocs: map[string]*api.AllocationMetric{}, Annotations: &api.PlanAnnotations{DesiredTGUpdates: map[string]*api.DesiredUpdates{}}}
	for _, g := range job.TaskGroups {
		if f.failGroup[*g.Name] {
			resp.FailedTGAllocs[*g.Name] = &api.AllocationMetric{NodesEvaluated: 3, DimensionExhausted: map[string]int{"devices: no devices available": 1}}
		}
		if f.placeAgain[*g.Name] {
			resp.Annotations.DesiredTGUpdates[*g.Name] = &api.DesiredUpdates{Place: 1}
		}
	}
	return resp, &api.WriteMeta{}, nil
}

func (f *fakeJobs) RegisterOpts(job *api.Job, o *api.RegisterOptions, _ *api.WriteOptions) (*api.JobRegisterResponse, *api.WriteMeta, error) {
	if o.EnforceIndex && o.ModifyIndex != f.index {
		return nil, nil, fmt.Errorf("Unexpected response code: 500 (Enforcing job modify index %d: job exists with conflicting job modify index: %d)", o.ModifyIndex, f.index)
	}
	f.index++
	f.job = job
	f.registers = append(f.registers, job)
	return &api.JobRegisterResponse{JobModifyIndex: f.index, EvalID: "e"}, &api.WriteMeta{}, nil
}

// fakeCluster answers what the test says each group's allocations do.
type fakeCluster struct {
	f      *fakeJobs
	groups map[string]Group
}

func (c *fakeCluster) Job(k watch.JobKey) *Job {
	return &Job{Key: k, Raw: c.f.job, Spec: spec(c.f.job), JobModifyIndex: c.f.index}
}

func (c *fakeCluster) Leaving(watch.JobKey, string) bool { return false }

func (c *fakeCluster) Group(_ watch.JobKey, g string) Group {
	if st, ok := c.groups[g]; ok {
		return st
	}
	return Group{Ended: true}
}

// spec parses j as the watcher does (the template job when j is nil).
func spec(j *api.Job) jobspec.Spec {
	if j == nil {
		j = newJob()
	}
	s, err := jobspec.Parse(j)
	if err != nil {
		panic(err)
	}
	return s
}

func newJob() *api.Job {
	j := api.NewBatchJob("j", "j", "global", 50)
	j.Meta = map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "100", "hadar.workers": "2"}
	j.Constrain(jobspec.GateConstraint())
	task := api.NewTask("t", "hadar-train")
	one := uint64(1)
	task.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: &one}}})
	j.AddTaskGroup(api.NewTaskGroup("train", 1).AddTask(task))
	return j
}

func unit(id, port int, nodes ...string) jobform.Unit {
	u := jobform.Unit{ID: id, Port: port}
	for _, n := range nodes {
		u.Workers = append(u.Workers, jobform.Worker{Node: n, Type: "v100", Models: []string{"V100"}, Addr: "127.0.0.1"})
	}
	return u
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func setup(t *testing.T) (*Applier, *fakeJobs, *fakeCluster, *clock) {
	t.Helper()
	f := &fakeJobs{job: newJob(), index: 10, failGroup: map[string]bool{}}
	c := &clock{t: time.Unix(1000, 0)}
	a := New(f, Config{GangTimeout: time.Minute, StopTimeout: 30 * time.Second, Now: c.now})
	return a, f, &fakeCluster{f: f, groups: map[string]Group{}}, c
}

var key = watch.JobKey{Namespace: "default", ID: "j"}

func TestGangStartSucceedsWhenEveryWorkerRuns(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	op, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")})
	if err != nil {
		t.Fatal(err)
	}
	if op.Phase != Starting || len(f.registers) != 1 || len(op.Added) != 2 {
		t.Fatalf("phase %s, %d writes, added %v", op.Phase, len(f.registers), op.Added)
	}
	// One read of the job before the write, no more: at 500 nodes a round
	// writes dozens of jobs, each request a round trip to the server.
	if f.reads != 1 {
		t.Fatalf("the start read the job %d times", f.reads)
	}
	// One worker runs, the other not yet: still starting.
	cl.groups["train-hadar-u0-w0"] = Group{Running: true}
	if out := a.Step(ctx, cl); len(out) != 0 {
		t.Fatalf("ended early: %+v", out)
	}
	cl.groups["train-hadar-u0-w1"] = Group{Running: true}
	out := a.Step(ctx, cl)
	if len(out) != 1 || out[0].Phase != Done || len(out[0].Running) != 1 {
		t.Fatalf("outcome %+v", out)
	}
	if a.InFlight(key) != nil {
		t.Fatal("a done operation stays in flight")
	}
}

func TestGangStartRollsBackWhenAWorkerCannotBePlaced(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	cl.groups["train-hadar-u0-w0"] = Group{Running: true}
	cl.groups["train-hadar-u0-w1"] = Group{Failed: "devices: no devices available on 1 node"}
	out := a.Step(ctx, cl)
	if len(out) != 1 || out[0].Phase != Failed || !strings.Contains(out[0].Err.Error(), "rolled back") {
		t.Fatalf("outcome %+v", out)
	}
	// The rollback wrote the held form: no worker left.
	last := f.registers[len(f.registers)-1]
	if len(last.TaskGroups) != 1 || !jobspec.HasGate(last) {
		t.Fatalf("rollback wrote %d groups, gated %v", len(last.TaskGroups), jobspec.HasGate(last))
	}
}

func TestGangStartRollsBackAfterTheTimeout(t *testing.T) {
	a, f, cl, c := setup(t)
	ctx := context.Background()
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	// Both placed at once; one runs, the other never starts.
	cl.groups["train-hadar-u0-w0"] = Group{Running: true, Placed: true}
	cl.groups["train-hadar-u0-w1"] = Group{Placed: true}
	if out := a.Step(ctx, cl); len(out) != 0 {
		t.Fatalf("rolled back at once: %+v", out)
	}
	c.t = c.t.Add(59 * time.Second)
	if out := a.Step(ctx, cl); len(out) != 0 {
		t.Fatalf("rolled back before the timeout: %+v", out)
	}
	c.t = c.t.Add(2 * time.Second)
	out := a.Step(ctx, cl)
	if len(out) != 1 || out[0].Phase != Failed || !strings.Contains(out[0].Err.Error(), "within 1m0s of being placed") {
		t.Fatalf("outcome %+v", out)
	}
	if len(f.registers) != 2 {
		t.Fatalf("%d writes, want the start and the rollback", len(f.registers))
	}
}

// TestGangClockStartsAtPlacement: a start Nomad has not evaluated yet (its
// evaluation queued on a busy server: nothing placed, nothing refused) is
// not rolled back at the gang timeout; the gang gets its full timeout from
// the moment Nomad placed every worker, and a write Nomad never places is
// rolled back after placeWaitFactor timeouts.
func TestGangClockStartsAtPlacement(t *testing.T) {
	a, f, cl, c := setup(t)
	ctx := context.Background()
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(90 * time.Second) // past the gang timeout, nothing placed
	if out := a.Step(ctx, cl); len(out) != 0 {
		t.Fatalf("rolled back while Nomad had placed nothing yet: %+v", out)
	}
	cl.groups["train-hadar-u0-w0"] = Group{Placed: true}
	cl.groups["train-hadar-u0-w1"] = Group{Placed: true}
	if out := a.Step(ctx, cl); len(out) != 0 {
		t.Fatalf("rolled back as Nomad placed the workers: %+v", out)
	}
	c.t = c.t.Add(50 * time.Second)
	cl.groups["train-hadar-u0-w0"] = Group{Placed: true, Running: true}
	cl.groups["train-hadar-u0-w1"] = Group{Placed: true, Running: true}
	out := a.Step(ctx, cl)
	if len(out) != 1 || out[0].Phase != Done {
		t.Fatalf("outcome %+v, want done: both run within the timeout of their placement", out)
	}

	// Never placed: rolled back once Nomad had 4 timeouts to place it.
	b, f2, cl2, c2 := setup(t)
	if _, err := b.Begin(ctx, cl2.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	c2.t = c2.t.Add(placeWaitFactor*time.Minute - time.Second)
	if out := b.Step(ctx, cl2); len(out) != 0 {
		t.Fatalf("rolled back before %d timeouts: %+v", placeWaitFactor, out)
	}
	c2.t = c2.t.Add(2 * time.Second)
	out = b.Step(ctx, cl2)
	if len(out) != 1 || out[0].Phase != Failed || !strings.Contains(out[0].Err.Error(), "had not placed every worker within 4m0s") {
		t.Fatalf("outcome %+v", out)
	}
	if len(f2.registers) != 2 || len(f.registers) != 1 {
		t.Fatalf("%d and %d writes, want the start and the rollback, and the start alone", len(f2.registers), len(f.registers))
	}
}

func TestNomadRefusingThePlacementWritesNothing(t *testing.T) {
	a, f, cl, _ := setup(t)
	f.failGroup["train-hadar-u0-w1"] = true
	_, err := a.Begin(context.Background(), cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")})
	if err == nil || !strings.Contains(err.Error(), "cannot place the new workers") || !strings.Contains(err.Error(), "no devices available") {
		t.Fatalf("err = %v", err)
	}
	if len(f.registers) != 0 {
		t.Fatalf("%d writes, want none", len(f.registers))
	}
}

// A job that finished as it was moved (its rank 0 ended with its run
// done after the stop was decided on older progress) is not started again:
// its new units would run the finished run from its first step (make test
// run 52: TestPyTorchScriptFromTheDocs, docs-a trained twice).
func TestMoveOfAJobThatFinishedStartsNothing(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	cl.groups["train-hadar-u0-w0"] = Group{Running: true}
	cl.groups["train-hadar-u0-w1"] = Group{Running: true}
	a.Step(ctx, cl)
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(1, 29501, "n3", "n4")}); err != nil {
		t.Fatal(err)
	}
	writes := len(f.registers)
	cl.groups["train-hadar-u0-w0"] = Group{Ended: true, Placed: true, Done: true}
	cl.groups["train-hadar-u0-w1"] = Group{Ended: true, Placed: true}
	out := a.Step(ctx, cl)
	if len(out) != 1 || out[0].Phase != Failed || !errors.Is(out[0].Err, ErrFinished) || !strings.Contains(out[0].Err.Error(), "train-hadar-u0-w0") {
		t.Fatalf("outcome %+v, want Failed with ErrFinished naming the group that finished", out)
	}
	if len(f.registers) != writes {
		t.Fatalf("%d writes after the stop, want none: the finished job was started again", len(f.registers)-writes)
	}
	if a.InFlight(key) != nil {
		t.Fatal("the move is still in flight")
	}
}

func TestMoveStopsBeforeItStarts(t *testing.T) {
	a, f, cl, c := setup(t)
	ctx := context.Background()
	first := []jobform.Unit{unit(0, 29500, "n1", "n2")}
	if _, err := a.Begin(ctx, cl.Job(key), first); err != nil {
		t.Fatal(err)
	}
	cl.groups["train-hadar-u0-w0"] = Group{Running: true}
	cl.groups["train-hadar-u0-w1"] = Group{Running: true}
	a.Step(ctx, cl)
	// Move to other nodes: first the old workers go.
	op, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(1, 29501, "n3", "n4")})
	if err != nil {
		t.Fatal(err)
	}
	if op.Phase != Stopping || len(f.registers) != 2 {
		t.Fatalf("phase %s, %d writes", op.Phase, len(f.registers))
	}
	if us, _ := jobform.Units(f.job, spec(nil)); len(us) != 0 {
		t.Fatalf("phase 1 left units %+v", us)
	}
	// The old workers are still checkpointing: no new write.
	cl.groups["train-hadar-u0-w0"] = Group{}
	if a.Step(ctx, cl); len(f.registers) != 2 {
		t.Fatal("started the new unit before the old one ended")
	}
	cl.groups["train-hadar-u0-w0"] = Group{Ended: true}
	cl.groups["train-hadar-u0-w1"] = Group{Ended: true}
	a.Step(ctx, cl)
	if len(f.registers) != 3 {
		t.Fatalf("%d writes, want the new unit written once the old one ended", len(f.registers))
	}
	if us, _ := jobform.Units(f.job, spec(nil)); len(us) != 1 || us[0].ID != 1 {
		t.Fatalf("phase 2 wrote %+v", us)
	}
	// A stop that outlives StopTimeout goes on anyway.
	op, _ = a.Begin(ctx, cl.Job(key), nil)
	cl.groups["train-hadar-u1-w0"] = Group{Running: true}
	c.t = c.t.Add(31 * time.Second)
	if out := a.Step(ctx, cl); len(out) != 1 || out[0].Phase != Done {
		t.Fatalf("stop past its timeout: %+v (%+v)", out, op)
	}
}

// A move's start that Nomad's plan refuses after the old workers ended
// (its scheduler may count their GPUs a moment longer) is asked again a
// second later, not failed: the move completes. One refused for good
// fails 15 s after the first refusal.
func TestMovesStartIsAskedAgainWhenNomadStillHoldsTheGPUs(t *testing.T) {
	a, f, cl, c := setup(t)
	ctx := context.Background()
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	cl.groups["train-hadar-u0-w0"] = Group{Running: true}
	cl.groups["train-hadar-u0-w1"] = Group{Running: true}
	a.Step(ctx, cl)
	move := func(id int) {
		t.Helper()
		if op, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(id, 29500+id, "n1")}); err != nil || op.Phase != Stopping {
			t.Fatalf("move to unit %d: %+v, %v", id, op, err)
		}
	}
	move(1)
	writes := len(f.registers)
	f.failGroup["train-hadar-u1-w0"] = true
	cl.groups["train-hadar-u0-w0"] = Group{Ended: true}
	cl.groups["train-hadar-u0-w1"] = Group{Ended: true}
	if out := a.Step(ctx, cl); len(out) != 0 || len(f.registers) != writes {
		t.Fatalf("refused start: outcomes %+v, %d writes: want it kept, unwritten", out, len(f.registers)-writes)
	}
	// Within the second, no new plan; after it, Nomad places it.
	f.failGroup["train-hadar-u1-w0"] = false
	c.t = c.t.Add(500 * time.Millisecond)
	if a.Step(ctx, cl); len(f.registers) != writes {
		t.Fatal("asked again within the second")
	}
	c.t = c.t.Add(600 * time.Millisecond)
	a.Step(ctx, cl)
	if got := a.InFlight(key); len(f.registers) != writes+1 || got == nil || got.Phase != Starting {
		t.Fatalf("%d writes, in flight %+v: want the start written", len(f.registers)-writes, got)
	}
	cl.groups["train-hadar-u1-w0"] = Group{Running: true}
	if out := a.Step(ctx, cl); len(out) != 1 || out[0].Phase != Done {
		t.Fatalf("outcomes %+v, want the move done", out)
	}

	// Refused for good: asked once a second, failed 15 s on.
	move(2)
	writes = len(f.registers)
	f.failGroup["train-hadar-u2-w0"] = true
	cl.groups["train-hadar-u1-w0"] = Group{Ended: true}
	var out []Outcome
	first := c.t
	for i := 0; i < 20 && len(out) == 0; i++ {
		out = a.Step(ctx, cl)
		c.t = c.t.Add(time.Second)
	}
	if len(out) != 1 || out[0].Phase != Failed || !errors.Is(out[0].Err, ErrUnplaceable) || len(f.registers) != writes {
		t.Fatalf("outcomes %+v, %d writes: want the start failed, unwritten", out, len(f.registers)-writes)
	}
	if waited := c.t.Sub(first); waited < 15*time.Second || waited > 17*time.Second {
		t.Fatalf("failed after %v of refusals, want 15 s", waited)
	}
}

func TestForkLeavesTheRunningUnitAlone(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	u0 := unit(0, 29500, "n1", "n2")
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{u0}); err != nil {
		t.Fatal(err)
	}
	op, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{u0, unit(1, 29501, "n3")})
	if err != nil {
		t.Fatal(err)
	}
	if op.Phase != Starting || len(op.Removed) != 0 || len(op.Keep) != 1 || len(op.Added) != 1 {
		t.Fatalf("fork op %+v", op)
	}
	if len(f.registers) != 2 {
		t.Fatalf("%d writes, want 2", len(f.registers))
	}
	// Nothing to do when the job already has that placement.
	op, err = a.Begin(ctx, cl.Job(key), []jobform.Unit{u0, unit(1, 29501, "n3")})
	if err != nil || op.Phase != Done || len(f.registers) != 2 {
		t.Fatalf("no-op: %v %+v, %d writes", err, op, len(f.registers))
	}
}

func TestAPersonsEditIsNotOverwritten(t *testing.T) {
	a, f, cl, _ := setup(t)
	// The person edits between our read and our write: the write's
	// check-and-set fails and nothing of theirs is lost.
	edit := &editingJobs{fakeJobs: f}
	a.jobs = edit
	_, err := a.Begin(context.Background(), cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("err = %v, want ErrConflict", err)
	}
	if f.job.Meta["owner"] != "edited" || len(f.registers) != 0 {
		t.Fatalf("the person's edit was overwritten (meta %v, %d writes)", f.job.Meta, len(f.registers))
	}
}

// editingJobs changes the job (as a person would) right after apply reads
// it.
type editingJobs struct{ *fakeJobs }

func (e *editingJobs) Info(id string, q *api.QueryOptions) (*api.Job, *api.QueryMeta, error) {
	j, m, err := e.fakeJobs.Info(id, q)
	e.fakeJobs.job.Meta = map[string]string{"owner": "edited"}
	e.fakeJobs.index++
	return j, m, err
}

func TestDryRunWritesNothing(t *testing.T) {
	f := &fakeJobs{job: newJob(), index: 10}
	a := New(f, Config{GangTimeout: time.Minute, StopTimeout: time.Minute, DryRun: true})
	cl := &fakeCluster{f: f}
	op, err := a.Begin(context.Background(), cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")})
	if err != nil || len(f.registers) != 0 {
		t.Fatalf("dry run: %v, %d writes", err, len(f.registers))
	}
	if out := a.Step(context.Background(), cl); len(out) != 1 || out[0].Phase != Done {
		t.Fatalf("dry run outcome %+v (op %+v)", out, op)
	}
	if a.Writes()["start"] != 1 {
		t.Fatalf("dry-run writes counted %v", a.Writes())
	}
}

func TestPorts(t *testing.T) {
	p := NewPorts(100, 102)
	now := time.Unix(0, 0)
	p.Reset(map[string][]int{"a": {100}}, now)
	if got, _ := p.Take("a"); got != 101 {
		t.Fatalf("took %d, want 101", got)
	}
	// Another address has the whole range.
	if got, _ := p.Take("b"); got != 100 {
		t.Fatalf("took %d on b, want 100", got)
	}
	// 100 leaves the written units on a: quarantined, not reused at once.
	p.Reset(map[string][]int{"a": {101}, "b": {100}}, now)
	if got, _ := p.Take("a"); got != 102 {
		t.Fatalf("took %d, want 102 (100 is quarantined)", got)
	}
	if _, err := p.Take("a"); err == nil || !strings.Contains(err.Error(), "rendezvous_ports") {
		t.Fatalf("err = %v, want the range exhausted", err)
	}
	p.Reset(map[string][]int{"a": {101, 102}}, now.Add(6*time.Minute))
	if got, _ := p.Take("a"); got != 100 {
		t.Fatalf("took %d, want 100 after its quarantine", got)
	}
	p.Give("a", 100)
	if got, _ := p.Take("a"); got != 100 {
		t.Fatalf("took %d, want 100 given back", got)
	}
}

// twoJobs answers for jobs x and y, each a fakeJobs.
type twoJobs map[string]*fakeJobs

func (t twoJobs) Info(id string, q *api.QueryOptions) (*api.Job, *api.QueryMeta, error) {
	if t[id] == nil {
		return nil, nil, fmt.Errorf("Unexpected response code: 404 (job not found)")
	}
	return t[id].Info(id, q)
}

func (t twoJobs) PlanOpts(job *api.Job, o *api.PlanOptions, w *api.WriteOptions) (*api.JobPlanResponse, *api.WriteMeta, error) {
	return t[*job.ID].PlanOpts(job, o, w)
}

func (t twoJobs) RegisterOpts(job *api.Job, o *api.RegisterOptions, w *api.WriteOptions) (*api.JobRegisterResponse, *api.WriteMeta, error) {
	return t[*job.ID].RegisterOpts(job, o, w)
}

// twoCluster is fakeCluster for twoJobs; groups are keyed "job/group".
type twoCluster struct {
	js     twoJobs
	groups map[string]Group
	// leaving: "<job>/<node>" has an allocation asked to stop, not ended.
	leaving map[string]bool
}

func (c *twoCluster) Leaving(k watch.JobKey, node string) bool { return c.leaving[k.ID+"/"+node] }

func (c *twoCluster) Job(k watch.JobKey) *Job {
	f := c.js[k.ID]
	return &Job{Key: k, Raw: f.job, Spec: spec(f.job), JobModifyIndex: f.index}
}

func (c *twoCluster) Group(k watch.JobKey, g string) Group {
	if st, ok := c.groups[k.ID+"/"+g]; ok {
		return st
	}
	return Group{Ended: true}
}

func setupTwo(t *testing.T) (*Applier, twoJobs, *twoCluster, *clock) {
	t.Helper()
	js := twoJobs{}
	for _, id := range []string{"x", "y"} {
		j := newJob()
		j.ID, j.Name = &id, &id
		js[id] = &fakeJobs{job: j, index: 10, failGroup: map[string]bool{}}
	}
	c := &clock{t: time.Unix(1000, 0)}
	a := New(js, Config{GangTimeout: time.Minute, StopTimeout: 30 * time.Second, Now: c.now})
	return a, js, &twoCluster{js: js, groups: map[string]Group{}, leaving: map[string]bool{}}, c
}

// A round that swaps job y onto the GPU job x leaves (time-slicing) writes
// y's start only once x's worker has ended: written before, Nomad would
// find the GPU held and refuse it.
func TestStartWaitsForTheJobLeavingItsGPUs(t *testing.T) {
	a, js, cl, c := setupTwo(t)
	ctx := context.Background()
	x, y := watch.JobKey{Namespace: "default", ID: "x"}, watch.JobKey{Namespace: "default", ID: "y"}
	if _, err := a.Begin(ctx, cl.Job(x), []jobform.Unit{unit(0, 29500, "n1")}); err != nil {
		t.Fatal(err)
	}
	cl.groups["x/train-hadar-u0-w0"] = Group{Running: true}
	if out := a.Step(ctx, cl); len(out) != 1 || out[0].Phase != Done {
		t.Fatalf("x's start: %+v", out)
	}
	// The round: x is preempted, y takes its GPU.
	if op, err := a.Begin(ctx, cl.Job(x), nil); err != nil || op.Phase != Stopping {
		t.Fatalf("x's stop: %+v, %v", op, err)
	}
	op, err := a.BeginAfter(ctx, cl.Job(y), []jobform.Unit{unit(0, 29501, "n1")}, []watch.JobKey{x, y})
	if err != nil || op.Phase != Waiting || len(js["y"].registers) != 0 {
		t.Fatalf("y's start: %+v, %v, %d writes: want waiting, unwritten", op, err, len(js["y"].registers))
	}
	if len(op.After) != 1 || op.After[0] != x {
		t.Fatalf("y comes after %v, want only x (never itself)", op.After)
	}
	// x checkpoints: y waits.
	cl.groups["x/train-hadar-u0-w0"] = Group{}
	c.t = c.t.Add(10 * time.Second)
	if out := a.Step(ctx, cl); len(out) != 0 || len(js["y"].registers) != 0 {
		t.Fatalf("y written while x still held the GPU: %+v, %d writes", out, len(js["y"].registers))
	}
	if got := a.InFlight(y); got == nil || got.Phase != Waiting {
		t.Fatalf("y in flight: %+v", got)
	}
	// x's worker ended: x is done and y's start goes out.
	cl.groups["x/train-hadar-u0-w0"] = Group{Ended: true}
	if out := a.Step(ctx, cl); len(out) != 1 || out[0].Key != x || out[0].Phase != Done {
		t.Fatalf("outcomes %+v, want x done", out)
	}
	if len(js["y"].registers) != 1 {
		t.Fatalf("%d writes of y, want its start", len(js["y"].registers))
	}
	if got := a.InFlight(y); got == nil || got.Phase != Starting {
		t.Fatalf("y in flight: %+v, want starting", got)
	}
	cl.groups["y/train-hadar-u0-w0"] = Group{Running: true}
	if out := a.Step(ctx, cl); len(out) != 1 || out[0].Key != y || out[0].Phase != Done {
		t.Fatalf("outcomes %+v, want y done", out)
	}
}

// A start on GPUs that an allocation asked to stop earlier still holds
// (issue 32, item 7: its job's operation had ended, yet its workers were
// inside their kill_timeout) waits for that allocation to end, as it
// waits for a job stopping in the same round: written at once, Nomad
// refused it ("no devices match request") and the job lost a round.
func TestStartWaitsForAllocationsStillLeaving(t *testing.T) {
	a, js, cl, c := setupTwo(t)
	ctx := context.Background()
	x, y := watch.JobKey{Namespace: "default", ID: "x"}, watch.JobKey{Namespace: "default", ID: "y"}
	cl.leaving["x/n1"] = true // no operation of x in flight
	op, err := a.BeginAfter(ctx, cl.Job(y), []jobform.Unit{unit(0, 29501, "n1")}, []watch.JobKey{x})
	if err != nil || op.Phase != Waiting {
		t.Fatalf("y's start: %+v, %v", op, err)
	}
	c.t = c.t.Add(5 * time.Second)
	if a.Step(ctx, cl); len(js["y"].registers) != 0 {
		t.Fatal("y written while x's allocation still held the GPU")
	}
	cl.leaving["x/n1"] = false
	if a.Step(ctx, cl); len(js["y"].registers) != 1 {
		t.Fatalf("%d writes of y once x's allocation ended, want its start", len(js["y"].registers))
	}
	// An allocation leaving another node does not hold a start.
	cl.leaving["y/n2"] = true
	if op, err := a.BeginAfter(ctx, cl.Job(x), []jobform.Unit{unit(0, 29502, "n1")}, []watch.JobKey{y}); err != nil {
		t.Fatal(err)
	} else if a.Step(ctx, cl); a.InFlight(x) == nil || a.InFlight(x).Phase != Starting {
		t.Fatalf("x's start: %+v then %+v, want written", op, a.InFlight(x))
	}
}

// A leaving job that never stops does not hold the start for ever: past
// StopTimeout the start is tried, and Nomad's plan decides.
func TestStartAfterAStuckStopIsTriedAtTheTimeout(t *testing.T) {
	a, js, cl, c := setupTwo(t)
	ctx := context.Background()
	x, y := watch.JobKey{Namespace: "default", ID: "x"}, watch.JobKey{Namespace: "default", ID: "y"}
	if _, err := a.Begin(ctx, cl.Job(x), []jobform.Unit{unit(0, 29500, "n1")}); err != nil {
		t.Fatal(err)
	}
	cl.groups["x/train-hadar-u0-w0"] = Group{Running: true}
	a.Step(ctx, cl)
	if _, err := a.Begin(ctx, cl.Job(x), nil); err != nil {
		t.Fatal(err)
	}
	cl.groups["x/train-hadar-u0-w0"] = Group{}
	if _, err := a.BeginAfter(ctx, cl.Job(y), []jobform.Unit{unit(0, 29501, "n1")}, []watch.JobKey{x}); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(29 * time.Second)
	if a.Step(ctx, cl); len(js["y"].registers) != 0 {
		t.Fatal("y written before the timeout")
	}
	// Past the timeout Nomad still sees the GPU held: y fails, unwritten.
	js["y"].failGroup["train-hadar-u0-w0"] = true
	c.t = c.t.Add(2 * time.Second)
	var yOut *Outcome
	for _, o := range a.Step(ctx, cl) {
		if o.Key == y {
			yOut = &o
		}
	}
	if yOut == nil || yOut.Phase != Failed || !strings.Contains(yOut.Err.Error(), "cannot place") || len(js["y"].registers) != 0 {
		t.Fatalf("y: %+v, %d writes: want failed on Nomad's refusal, unwritten", yOut, len(js["y"].registers))
	}
}

// A move that waits on another job's stop starts its new units only once
// both its own old workers and the other job's have ended.
func TestMoveWaitsForTheOtherJobToo(t *testing.T) {
	a, js, cl, _ := setupTwo(t)
	ctx := context.Background()
	x, y := watch.JobKey{Namespace: "default", ID: "x"}, watch.JobKey{Namespace: "default", ID: "y"}
	for _, k := range []watch.JobKey{x, y} {
		if _, err := a.Begin(ctx, cl.Job(k), []jobform.Unit{unit(0, 29500, "n-"+k.ID)}); err != nil {
			t.Fatal(err)
		}
		cl.groups[k.ID+"/train-hadar-u0-w0"] = Group{Running: true}
	}
	a.Step(ctx, cl)
	// x leaves n-x; y moves from n-y to n-x.
	if _, err := a.Begin(ctx, cl.Job(x), nil); err != nil {
		t.Fatal(err)
	}
	if op, err := a.BeginAfter(ctx, cl.Job(y), []jobform.Unit{unit(1, 29501, "n-x")}, []watch.JobKey{x}); err != nil || op.Phase != Stopping {
		t.Fatalf("y's move: %+v, %v", op, err)
	}
	cl.groups["x/train-hadar-u0-w0"] = Group{}
	cl.groups["y/train-hadar-u0-w0"] = Group{Ended: true}
	if a.Step(ctx, cl); len(js["y"].registers) != 2 {
		t.Fatalf("%d writes of y: want its start and its stop only (x still holds n-x)", len(js["y"].registers))
	}
	cl.groups["x/train-hadar-u0-w0"] = Group{Ended: true}
	if a.Step(ctx, cl); len(js["y"].registers) != 3 {
		t.Fatalf("%d writes of y: want the new unit once x ended", len(js["y"].registers))
	}
}

// A fork written just after the kept copy finished would make Nomad run
// that copy again (a batch allocation finished under an older version is
// placed anew): the plan shows it, and nothing is written.
func TestNoWriteRunsAFinishedWorkerAgain(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	u0 := unit(0, 29500, "n1")
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{u0}); err != nil {
		t.Fatal(err)
	}
	f.placeAgain = map[string]bool{"train-hadar-u0-w0": true}
	_, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{u0, unit(1, 29501, "n3")})
	if !errors.Is(err, ErrFinished) || !strings.Contains(err.Error(), "train-hadar-u0-w0") {
		t.Fatalf("err = %v, want ErrFinished naming the group", err)
	}
	if len(f.registers) != 1 {
		t.Fatalf("%d writes, want only the first start", len(f.registers))
	}
}

// A reservation (the agent's write going out in the background) shows the
// job in flight at once, is not stepped, and holds back a start that comes
// after it until its write returned; a failed write leaves nothing in
// flight; a reservation cancelled meanwhile (a lost lease) is not revived.
func TestReservedWriteIsInFlightUntilItReturns(t *testing.T) {
	a, js, cl, c := setupTwo(t)
	ctx := context.Background()
	x, y := watch.JobKey{Namespace: "default", ID: "x"}, watch.JobKey{Namespace: "default", ID: "y"}
	if _, err := a.Begin(ctx, cl.Job(x), []jobform.Unit{unit(0, 29500, "n1")}); err != nil {
		t.Fatal(err)
	}
	cl.groups["x/train-hadar-u0-w0"] = Group{Running: true}
	if out := a.Step(ctx, cl); len(out) != 1 || out[0].Phase != Done {
		t.Fatalf("x's start: %+v", out)
	}
	// x's stop is reserved, not yet written; y's start comes after it.
	rx := a.Reserve(x)
	if got := a.InFlight(x); got == nil || got.Phase != Writing {
		t.Fatalf("x in flight: %+v, want writing", got)
	}
	op, err := a.BeginAfter(ctx, cl.Job(y), []jobform.Unit{unit(0, 29501, "n1")}, []watch.JobKey{x})
	if err != nil || op.Phase != Waiting {
		t.Fatalf("y's start: %+v, %v", op, err)
	}
	c.t = c.t.Add(time.Second)
	if out := a.Step(ctx, cl); len(out) != 0 || len(js["y"].registers) != 0 {
		t.Fatalf("y written while x's stop was still being written: %+v, %d writes", out, len(js["y"].registers))
	}
	// x's stop returns: x is stopping, y still waits for its worker.
	if op, err := a.BeginReserved(ctx, rx, cl.Job(x), nil, nil); err != nil || op.Phase != Stopping {
		t.Fatalf("x's stop: %+v, %v", op, err)
	}
	if got := a.InFlight(x); got == nil || got.Phase != Stopping {
		t.Fatalf("x in flight: %+v, want stopping", got)
	}
	if out := a.Step(ctx, cl); len(out) != 0 || len(js["y"].registers) != 0 {
		t.Fatalf("y written before x's worker ended: %+v", out)
	}
	cl.groups["x/train-hadar-u0-w0"] = Group{Ended: true}
	a.Step(ctx, cl)
	if len(js["y"].registers) != 1 {
		t.Fatalf("%d writes of y once x ended, want its start", len(js["y"].registers))
	}

	// A failed write leaves nothing in flight.
	z := watch.JobKey{Namespace: "default", ID: "gone"}
	rz := a.Reserve(z)
	if _, err := a.BeginReserved(ctx, rz, &Job{Key: z, Raw: js["x"].job, Spec: spec(js["x"].job)}, nil, nil); err == nil {
		t.Fatal("a write of a job Nomad does not have succeeded")
	}
	if got := a.InFlight(z); got != nil {
		t.Fatalf("a failed write left %+v in flight", got)
	}
	// Cancelled while writing: the returning write does not revive it.
	rx = a.Reserve(x)
	a.CancelAll()
	if _, err := a.BeginReserved(ctx, rx, cl.Job(x), []jobform.Unit{unit(1, 29502, "n1")}, nil); err != nil {
		t.Fatal(err)
	}
	if got := a.InFlight(x); got != nil {
		t.Fatalf("an operation cancelled while its write went out is in flight again: %+v", got)
	}
}

// A person takes the job over between the snapshot the decision was
// planned on and the write (every hadar.* key and the gate removed, to run
// it themselves): hadar's old decision is not written over it.
func TestATakeoverAfterThePlanIsNeverWrittenOver(t *testing.T) {
	a, f, cl, _ := setup(t)
	planned := cl.Job(key)
	taken := newJob()
	taken.Meta = map[string]string{"owner": "alice"}
	taken.Constraints = nil
	f.job, f.index = taken, f.index+1
	for _, target := range [][]jobform.Unit{{unit(0, 29500, "n1", "n2")}, nil} {
		_, err := a.Begin(context.Background(), planned, target)
		if !errors.Is(err, ErrNotManaged) {
			t.Fatalf("target %v: err = %v, want ErrNotManaged", target, err)
		}
	}
	if len(f.registers) != 0 {
		t.Fatalf("%d writes on a job a person took over", len(f.registers))
	}
}

// An edit that keeps the job managed but lands after the snapshot: the
// decision was planned on another version, so it is not written, even
// though the fresh read would pass check-and-set.
func TestADecisionIsNeverWrittenOnAVersionItWasNotPlannedOn(t *testing.T) {
	a, f, cl, _ := setup(t)
	planned := cl.Job(key)
	f.job.Meta["hadar.steps"] = "500"
	f.index++
	_, err := a.Begin(context.Background(), planned, []jobform.Unit{unit(0, 29500, "n1", "n2")})
	if !errors.Is(err, ErrConflict) || len(f.registers) != 0 {
		t.Fatalf("err = %v, %d writes; want ErrConflict and none", err, len(f.registers))
	}
	// The same version read again (the next cycle) is written.
	if _, err := a.Begin(context.Background(), cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil || len(f.registers) != 1 {
		t.Fatalf("replanned on the new version: %v, %d writes", err, len(f.registers))
	}
}

// A move's second write (the new units) goes out cycles after its first:
// an edit in between is not written over, even though the snapshot the
// step reads already shows the edited version.
func TestAMovesSecondWriteStandsOnItsFirst(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	cl.groups["train-hadar-u0-w0"] = Group{Running: true}
	cl.groups["train-hadar-u0-w1"] = Group{Running: true}
	a.Step(ctx, cl)
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(1, 29501, "n3", "n4")}); err != nil {
		t.Fatal(err)
	}
	writes := len(f.registers)
	// A person edits the job while the old workers checkpoint.
	edited := *f.job
	edited.Meta = map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "100", "hadar.workers": "2", "owner": "bob"}
	f.job, f.index = &edited, f.index+1
	cl.groups["train-hadar-u0-w0"] = Group{Ended: true}
	cl.groups["train-hadar-u0-w1"] = Group{Ended: true}
	out := a.Step(ctx, cl)
	if len(out) != 1 || out[0].Phase != Failed || !errors.Is(out[0].Err, ErrConflict) {
		t.Fatalf("outcome %+v, want a conflict", out)
	}
	if len(f.registers) != writes || f.job.Meta["owner"] != "bob" {
		t.Fatalf("the edit was written over (%d writes after the edit)", len(f.registers)-writes)
	}
}

// A decision planned on a view that predates hadar's own last write of
// the job still stands: the engine assumed that write.
func TestAPlanOnAViewBeforeHadarsOwnWriteStands(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	stale := cl.Job(key)
	u0 := unit(0, 29500, "n1", "n2")
	if _, err := a.Begin(ctx, stale, []jobform.Unit{u0}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Begin(ctx, stale, []jobform.Unit{u0, unit(1, 29501, "n3")}); err != nil {
		t.Fatalf("a fork planned on the view before hadar's own start: %v", err)
	}
	if len(f.registers) != 2 {
		t.Fatalf("%d writes, want 2", len(f.registers))
	}
}

// The guard is asked after the plan and the journal, right before the
// registration: a lease lost while those ran stops the write.
func TestTheGuardIsAskedRightBeforeTheRegistration(t *testing.T) {
	a, f, cl, _ := setup(t)
	var order []string
	lost := false
	a.cfg.Journal = func(_ context.Context, w Write) error {
		if !w.Applied {
			order = append(order, "journal")
			lost = true // the lease lapses while the journal entry is written
		}
		return nil
	}
	a.cfg.Guard = func(context.Context) error {
		order = append(order, "guard")
		if lost {
			return errors.New("not the leader")
		}
		return nil
	}
	_, err := a.Begin(context.Background(), cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")})
	if err == nil || !strings.Contains(err.Error(), "not the leader") || len(f.registers) != 0 {
		t.Fatalf("err %v, %d writes; want the guard's refusal and none", err, len(f.registers))
	}
	if strings.Join(order, ",") != "journal,guard" {
		t.Fatalf("order %v: the guard must come after the journal", order)
	}
	// A write whose context already ended is not made either.
	lost = false
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("lease lost"))
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err == nil || len(f.registers) != 0 {
		t.Fatalf("ended context: err %v, %d writes", err, len(f.registers))
	}
}

// hadar.gang = false: the start is written although Nomad cannot place a
// worker yet, and not rolled back after the gang timeout.
func TestWithoutGangNothingIsRolledBack(t *testing.T) {
	a, f, cl, c := setup(t)
	f.job.Meta["hadar.gang"] = "false"
	f.failGroup["train-hadar-u0-w1"] = true
	ctx := context.Background()
	op, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")})
	if err != nil || op.Phase != Starting || len(f.registers) != 1 {
		t.Fatalf("no gang, one worker unplaceable: %v, %+v, %d writes; want the start written", err, op, len(f.registers))
	}
	cl.groups["train-hadar-u0-w0"] = Group{Running: true}
	cl.groups["train-hadar-u0-w1"] = Group{Failed: "devices: no devices available on 1 node"}
	c.t = c.t.Add(2 * time.Minute)
	out := a.Step(ctx, cl)
	if len(out) != 1 || out[0].Phase != Done || len(f.registers) != 1 {
		t.Fatalf("outcome %+v, %d writes: want done, no rollback", out, len(f.registers))
	}
}

// The operator's storage settings (the sidecar config's storage block)
// reach the worker groups written for a task on Nomad's own exec driver:
// its host volumes, where they are mounted, and the kill timeout.
func TestWritesUseTheConfiguredStorage(t *testing.T) {
	f := &fakeJobs{job: newJob(), index: 10, failGroup: map[string]bool{}}
	f.job.TaskGroups[0].Tasks[0].Driver = "exec"
	f.job.TaskGroups[0].Tasks[0].Config = map[string]any{"command": "/usr/bin/python3"}
	f.job.Meta["hadar.forkable"] = "true"
	form := jobform.Options{CheckpointVolume: "team-ckpt", MergeVolume: "team-merge", MountDir: "/mnt/hadar", KillTimeout: 2 * time.Minute}
	a := New(f, Config{GangTimeout: time.Minute, StopTimeout: 30 * time.Second, Now: (&clock{t: time.Unix(1000, 0)}).now, Form: form})
	cl := &fakeCluster{f: f, groups: map[string]Group{}}
	if _, err := a.Begin(context.Background(), cl.Job(key), []jobform.Unit{unit(0, 29500, "n1")}); err != nil {
		t.Fatal(err)
	}
	if len(f.registers) != 1 {
		t.Fatalf("%d writes", len(f.registers))
	}
	var g *api.TaskGroup
	for _, tg := range f.registers[0].TaskGroups {
		if *tg.Name == "train-hadar-u0-w0" {
			g = tg
		}
	}
	if g == nil {
		t.Fatal("no generated worker group")
	}
	sources := map[string]bool{}
	for _, v := range g.Volumes {
		sources[v.Source] = true
	}
	if !sources["team-ckpt"] || !sources["team-merge"] || sources[jobform.DefaultCheckpointVolume] {
		t.Fatalf("volumes %v: want the configured team-ckpt and team-merge", sources)
	}
	task := g.Tasks[0]
	mounts := map[string]bool{}
	for _, m := range task.VolumeMounts {
		mounts[*m.Destination] = true
	}
	if !mounts["/mnt/hadar/checkpoints"] || !mounts["/mnt/hadar/merge"] {
		t.Fatalf("mounts %v: want them under /mnt/hadar", mounts)
	}
	if task.KillTimeout == nil || *task.KillTimeout != 2*time.Minute {
		t.Fatalf("kill_timeout %v: want the configured 2m", task.KillTimeout)
	}
	if !strings.HasPrefix(task.Env["HADAR_CHECKPOINT_DIR"], "/mnt/hadar/checkpoints/") {
		t.Fatalf("HADAR_CHECKPOINT_DIR %q: want it on the configured mount", task.Env["HADAR_CHECKPOINT_DIR"])
	}
}

// TestPlacingAHeldJobEvaluatesItAgain: Nomad leaves the template group of a
// job placed from its held form at Queued 1 in the job summary until an
// evaluation with nothing to place (issue 33, item 9): the first placement
// asks for one, later rewrites of a placed job do not.
func TestPlacingAHeldJobEvaluatesItAgain(t *testing.T) {
	a, f, cl, _ := setup(t)
	ctx := context.Background()
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2")}); err != nil {
		t.Fatal(err)
	}
	if f.evals != 1 {
		t.Fatalf("placing the held job asked for %d evaluations, want 1", f.evals)
	}
	cl.groups["train-hadar-u0-w0"] = Group{Running: true, Placed: true}
	cl.groups["train-hadar-u0-w1"] = Group{Running: true, Placed: true}
	a.Step(ctx, cl)
	if _, err := a.Begin(ctx, cl.Job(key), []jobform.Unit{unit(0, 29500, "n1", "n2"), unit(1, 29501, "n3")}); err != nil {
		t.Fatal(err)
	}
	if len(f.registers) != 2 || f.evals != 1 {
		t.Fatalf("%d writes, %d evaluations; want 2 and 1 (the placed job's template is at count 0 already)", len(f.registers), f.evals)
	}
}
