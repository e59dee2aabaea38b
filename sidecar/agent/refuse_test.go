package agent

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/leader"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// noteCase is one job the refusal note may be written on or taken off.
type noteCase struct {
	name string
	// meta of the job; placed: it carries a generated group and its
	// template holds the gate; running: an allocation of it runs.
	meta            map[string]string
	noted           bool
	placed, running bool
	wantNote        bool // the job carries the note afterwards
}

func noteState(t *testing.T, cases []noteCase) (*watch.Snapshot, *recordedNomad) {
	t.Helper()
	snap := &watch.Snapshot{Index: 1, Synced: time.Now(), Nodes: map[string]*watch.Node{}, Jobs: map[watch.JobKey]*watch.Job{},
		Allocs: map[string]*watch.Alloc{}, BlockedEvals: map[string]*watch.Eval{}}
	rec := &recordedNomad{jobs: map[string]*api.Job{}}
	for i, c := range cases {
		id := c.name
		j := api.NewBatchJob(id, id, "global", 50)
		j.Namespace = ptr("default")
		j.Meta = c.meta
		task := api.NewTask("t", "hadar-train")
		one := uint64(1)
		task.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: &one}}})
		tg := api.NewTaskGroup("train", 1).AddTask(task)
		j.AddTaskGroup(tg)
		if c.placed {
			// The gate moved to the template; one generated worker group.
			tg.Constrain(jobspec.GateConstraint())
			zero := 0
			tg.Count = &zero
			w := api.NewTaskGroup(groupname.Format("train", 0, 0), 1).AddTask(task)
			j.AddTaskGroup(w)
		} else {
			j.Constrain(jobspec.GateConstraint())
		}
		if c.noted {
			j.Constraints = append([]*api.Constraint{api.NewConstraint(jobform.ErrorAttribute, "=", "hadar: an old error")}, j.Constraints...)
		}
		idx := uint64(10 + i)
		j.JobModifyIndex, j.Version, j.Status = &idx, ptr(uint64(0)), ptr("pending")
		rec.jobs[id] = j
		wj := watch.NewJob(j)
		wj.SubmitTime = time.Now()
		snap.Jobs[wj.Key()] = wj
		if c.running {
			snap.Allocs[id+"/a"] = &watch.Alloc{ID: id + "/a", Namespace: "default", JobID: id, TaskGroup: groupname.Format("train", 0, 0),
				Worker: generated(groupname.Format("train", 0, 0)), Task: "t", DesiredStatus: api.AllocDesiredStatusRun, ClientStatus: api.AllocClientStatusRunning}
		}
	}
	return snap, rec
}

func hasNoteConstraint(j *api.Job) bool {
	return slices.ContainsFunc(j.Constraints, func(c *api.Constraint) bool { return c.LTarget == jobform.ErrorAttribute })
}

// The refusal note is a constraint no node satisfies: Nomad stops every
// allocation of a job that carries it. So it goes only on a job of which
// nothing runs, comes off once the job is valid, and needs the lease.
func TestRefusalNotesNeverStopRunningWork(t *testing.T) {
	bad := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "lots"}
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "100"}
	cases := []noteCase{
		{name: "held-invalid", meta: bad, wantNote: true},
		// A person edited the template of a placed job into an invalid
		// spec: its running worker must not be stopped.
		{name: "placed-invalid-running", meta: bad, placed: true, running: true},
		// Placed, nothing running yet: its generated group is still
		// Nomad's to place, so it is not noted either.
		{name: "placed-invalid-idle", meta: bad, placed: true},
		{name: "held-valid-noted", meta: good, noted: true, wantNote: false},
		{name: "running-valid-noted", meta: good, noted: true, placed: true, running: true, wantNote: true},
	}
	snap, rec := noteState(t, cases)
	srv := httptest.NewServer(rec)
	defer srv.Close()
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "1h"}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Without the lease (an election configured, this replica following)
	// nothing is written.
	a.lock = stubLock{}
	a.mu.Lock()
	if err := a.sync(snap, a.now()); err != nil {
		t.Fatal(err)
	}
	a.noteRefusals(ctx, snap)
	a.mu.Unlock()
	if rec.registers != 0 {
		t.Fatalf("a follower wrote %d notes", rec.registers)
	}

	a.lock = nil
	a.mu.Lock()
	a.noteRefusals(ctx, snap)
	a.mu.Unlock()
	for _, c := range cases {
		if got := hasNoteConstraint(rec.jobs[c.name]); got != c.wantNote {
			t.Errorf("%s: carries the note %v, want %v", c.name, got, c.wantNote)
		}
	}
	if rec.registers != 2 {
		t.Fatalf("%d writes, want 2 (one note written, one taken off)", rec.registers)
	}
	// Once per version: the next cycle writes nothing more.
	a.mu.Lock()
	a.noteRefusals(ctx, observedJobs(snap, rec))
	a.mu.Unlock()
	if rec.registers != 2 {
		t.Fatalf("%d writes after a second pass, want 2", rec.registers)
	}
}

// observedJobs is snap with the jobs as the recorded Nomad holds them now.
func observedJobs(snap *watch.Snapshot, rec *recordedNomad) *watch.Snapshot {
	next := *snap
	next.Jobs = map[watch.JobKey]*watch.Job{}
	for k, j := range snap.Jobs {
		c := watch.NewJob(rec.jobs[k.ID])
		c.SubmitTime = j.SubmitTime
		next.Jobs[k] = c
	}
	return &next
}

// stubLock is an election this replica does not win: no lease.
type stubLock struct{}

func (stubLock) Acquire(ctx context.Context) (*leader.Lease, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (stubLock) Holder(context.Context) (string, error) { return "other", nil }
func (stubLock) Where() string                          { return "stub" }
