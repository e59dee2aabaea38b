package agent

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// testAgent is an agent over the recorded Nomad, without a state store.
func testAgent(t *testing.T, rec *recordedNomad, policy string) *Agent {
	t.Helper()
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Scheduling: config.Scheduling{Policy: policy, Placement: "pack", Round: "1h"}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.settleWrites)
	return a
}

func gpuNode(id, model string, n int) *watch.Node {
	g := watch.GPUGroup{Model: model, Healthy: n}
	for k := range n {
		g.Instances = append(g.Instances, watch.GPU{ID: id + "-" + string(rune('a'+k)), Healthy: true})
	}
	return testNode(id, g)
}

// The GPUs a managed job's allocations hold while hadar refuses its spec
// are not the planner's to offer: another job planned there would be
// refused by Nomad, round after round.
func TestGPUsOfARefusedManagedJobAreHeld(t *testing.T) {
	bad := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "lots"}
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{
		{name: "edited", meta: bad, placed: true, running: true},
		{name: "waiting", meta: good},
	})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
	for _, al := range snap.Allocs {
		al.NodeID, al.GPUs = "n1", map[string]int{"Tesla V100-SXM2-16GB": 1}
	}
	a := testAgent(t, rec, "gavel-maxmin")
	if err := a.cycleOn(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.core.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "waiting"}))
	if !ok {
		t.Fatal("the valid job was not admitted")
	}
	if st.Running {
		t.Fatalf("the valid job was placed on %v, the GPU the refused job's worker holds", st.Placement)
	}
	if _, gen := groupsOf(rec.jobs["waiting"]); gen > 0 || rec.registers > 0 {
		t.Fatalf("%d writes: a start on a held GPU was written", rec.registers)
	}
	// Once that worker ends, the GPU is offered.
	for _, al := range snap.Allocs {
		al.ClientStatus = api.AllocClientStatusComplete
	}
	a.mu.Unlock()
	err := a.cycleOn(context.Background(), snap, false)
	a.settleWrites()
	a.mu.Lock()
	if err != nil {
		t.Fatal(err)
	}
	st, _ = a.core.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "waiting"}))
	if !st.Running || st.Placement.Units[0].Slots[0] != (planner.Slot{Node: "n1", Type: "v100", Count: 1}) {
		t.Fatalf("after the refused job's worker ended: running %v on %v", st.Running, st.Placement)
	}
}

// groupsOf counts a job's template and generated groups.
func groupsOf(j *api.Job) (template, generated int) {
	for _, g := range j.TaskGroups {
		if _, gen := groupname.Parse(*g.Name); gen {
			generated++
		} else {
			template++
		}
	}
	return
}

// The planner plans with Nomad's own placement rules: a job whose
// constraint excludes a node is never placed there, and one no node can
// run waits saying why, without a write Nomad would refuse.
func TestPlansFollowNomadsPlacementRules(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{{name: "not-n1", meta: good}, {name: "windows", meta: good}})
	v100 := func(id string) *watch.Node {
		return gpuNode(id, "Tesla V100-SXM2-16GB", 1)
	}
	snap.Nodes["n1"], snap.Nodes["n2"] = v100("n1"), v100("n2")
	constrain := func(id string, c *api.Constraint) {
		j := rec.jobs[id]
		j.Constraints = append(j.Constraints, c)
		k := watch.JobKey{Namespace: "default", ID: id}
		wj := watch.NewJob(j)
		wj.SubmitTime = snap.Jobs[k].SubmitTime
		snap.Jobs[k] = wj
	}
	constrain("not-n1", api.NewConstraint("${node.unique.name}", "!=", "n1"))
	constrain("windows", api.NewConstraint("${attr.kernel.name}", "=", "windows"))
	a := testAgent(t, rec, "gavel-maxmin")
	if err := a.cycleOn(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	a.mu.Lock()
	defer a.mu.Unlock()
	st, _ := a.core.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "not-n1"}))
	if !st.Running || st.Placement.Units[0].Slots[0].Node != "n2" {
		t.Fatalf("not-n1 runs %v on %v: want n2, the one node its constraint allows", st.Running, st.Placement)
	}
	st, _ = a.core.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "windows"}))
	if st.Running || !strings.Contains(st.Reason.Why, "kernel.name") {
		t.Fatalf("a job no node can run: running %v, why %q", st.Running, st.Reason.Why)
	}
	if _, gen := groupsOf(rec.jobs["windows"]); gen > 0 {
		t.Fatal("a start Nomad would refuse was written")
	}
}

// placedRaw is the job as hadar writes it placed: one unit, one worker on
// node, plus the allocation of that worker with the given client status.
func placedJob(t *testing.T, snap *watch.Snapshot, rec *recordedNomad, id, node, status string) {
	t.Helper()
	raw := rec.jobs[id]
	spec := *snap.Jobs[watch.JobKey{Namespace: "default", ID: id}].Spec
	u := jobform.Unit{ID: 0, Port: 29500, Workers: []jobform.Worker{{Node: node, Type: "v100", Models: []string{"Tesla V100-SXM2-16GB"}, Addr: "127.0.0.1"}}}
	placed, err := jobform.Placed(raw, spec, []jobform.Unit{u})
	if err != nil {
		t.Fatal(err)
	}
	idx := *raw.JobModifyIndex + 1
	placed.JobModifyIndex, placed.Version = &idx, ptr(uint64(1))
	rec.jobs[id] = placed
	wj := watch.NewJob(placed)
	wj.SubmitTime = snap.Jobs[wj.Key()].SubmitTime
	snap.Jobs[wj.Key()] = wj
	g := groupname.Format(spec.Group, 0, 0)
	snap.Allocs[id+"/"+g] = &watch.Alloc{ID: id + "/" + g, Namespace: "default", JobID: id, TaskGroup: g, Worker: generated(g), NodeID: node, Task: "t",
		JobVersion: 1, DesiredStatus: api.AllocDesiredStatusRun, ClientStatus: status, GPUs: map[string]int{"Tesla V100-SXM2-16GB": 1}}
}

// sync's three parts on a view of Nomad: admission (valid jobs in, refused
// specs kept apart with their error), reconcile (Nomad is the truth: a job
// found running is adopted where it runs, one whose workers died waits
// again), finished (complete, or failed: retried from its checkpoint, then
// given up).
func TestSyncAdmitsReconcilesAndFinishes(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{{name: "run", meta: good}, {name: "bad", meta: map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "x"}}})
	snap.Nodes["n1"], snap.Nodes["n2"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1), gpuNode("n2", "Tesla V100-SXM2-16GB", 1)
	a := testAgent(t, rec, "gavel-maxmin")
	run := watch.JobKey{Namespace: "default", ID: "run"}
	sync := func(now float64) {
		t.Helper()
		if err := a.sync(snap, now); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()

	// Admission.
	sync(now)
	if a.roster.job(run) == nil {
		t.Fatal("the valid job was not admitted")
	}
	if iv, ok := a.roster.refusal(watch.JobKey{Namespace: "default", ID: "bad"}); !ok || !strings.Contains(iv.err.Error(), "hadar.steps") {
		t.Fatalf("the bad spec: %+v, %v", iv, ok)
	}
	if st, _ := a.core.eng.Job(engineID(run)); st.Running {
		t.Fatal("admitted as running")
	}

	// Nomad runs it on n2 (a restart found it so): adopted there.
	placedJob(t, snap, rec, "run", "n2", api.AllocClientStatusRunning)
	sync(now + 1)
	st, _ := a.core.eng.Job(engineID(run))
	if !st.Running || st.Placement.Units[0].Slots[0].Node != "n2" {
		t.Fatalf("not adopted where Nomad runs it: %v on %v", st.Running, st.Placement)
	}

	// Its worker is lost: it waits again, counted as a failure (once per
	// run: each is another job version), and is retried (still planned)
	// until the third loss in a row: then held.
	for n := 1; n <= maxFailures; n++ {
		al := snap.Allocs["run/"+groupname.Format("train", 0, 0)]
		al.ClientStatus, al.JobVersion = api.AllocClientStatusLost, uint64(n)
		snap.Jobs[run].Status, snap.Jobs[run].Version = "dead", uint64(n)
		sync(now + 1 + float64(n))
		if n < maxFailures {
			st, ok := a.core.eng.Job(engineID(run))
			if !ok || st.Running || a.roster.job(run).failures != n {
				t.Fatalf("failure %d: planned %v, running %v, failures %d", n, ok, st.Running, a.roster.job(run).failures)
			}
			sync(now + 1.5 + float64(n)) // the same run, seen again: not another failure
			if a.roster.job(run).failures != n {
				t.Fatalf("failure %d counted %d times", n, a.roster.job(run).failures)
			}
			continue
		}
		if _, ok := a.core.eng.Job(engineID(run)); ok || a.roster.job(run) != nil {
			t.Fatalf("after %d failures the job is still planned", n)
		}
		if last := a.record.history[len(a.record.history)-1]; !strings.Contains(last.Result, "failed for good") {
			t.Fatalf("history %+v", last)
		}
	}
}

// A job whose workers all completed leaves the plan as complete.
func TestSyncFinishesACompleteJob(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{{name: "done", meta: good}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
	a := testAgent(t, rec, "gavel-maxmin")
	k := watch.JobKey{Namespace: "default", ID: "done"}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	placedJob(t, snap, rec, "done", "n1", api.AllocClientStatusRunning)
	if err := a.sync(snap, now); err != nil {
		t.Fatal(err)
	}
	snap.Allocs["done/"+groupname.Format("train", 0, 0)].ClientStatus = api.AllocClientStatusComplete
	snap.Jobs[k].Status = "dead"
	if err := a.sync(snap, now+1); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.core.eng.Job(engineID(k)); ok || a.roster.job(k) != nil {
		t.Fatal("a complete job is still planned")
	}
	if last := a.record.history[len(a.record.history)-1]; last.Result != "complete" {
		t.Fatalf("history %+v", last)
	}
}

// A rendezvous port that a live allocation holds is not given to another
// unit, also by a sidecar that just started (its quarantine of released
// ports was in the memory of the one before): the unit that left the job
// may still be listening on it while it ends. Before, a restarted sidecar
// gave it away at once, and the new unit's rank 1 reached the old rank 0,
// was refused and failed (make test: TestSidecarSurvivesKill9).
func TestPortsOfLiveAllocationsAreNotReused(t *testing.T) {
	bad := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "lots"}
	snap, rec := noteState(t, []noteCase{{name: "ending", meta: bad, placed: true, running: true}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
	const held = 29500 // the lowest port of the default range
	for _, al := range snap.Allocs {
		al.NodeID, al.GPUs, al.Ports = "n1", map[string]int{"Tesla V100-SXM2-16GB": 1}, map[string]int{jobform.PortLabel: held}
	}
	a := testAgent(t, rec, "gavel-maxmin")
	if err := a.cycleOn(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	port, err := a.ports.Take("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if port == held {
		t.Fatalf("port %d, which a running allocation holds, was given to a new unit", port)
	}
	a.ports.Give("127.0.0.1", port)
	// Once that allocation is terminal, the port is free (after the
	// quarantine of ports that left a job, which this sidecar started).
	for _, al := range snap.Allocs {
		al.ClientStatus = api.AllocClientStatusComplete
	}
	if err := a.cycleOn(context.Background(), snap, false); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	a.ports.Quarantine = 0
	if err := a.cycleOn(context.Background(), snap, false); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	if port, err := a.ports.Take("127.0.0.1"); err != nil || port != held {
		t.Fatalf("after the allocation ended: port %d, %v; want %d", port, err, held)
	}
}

// A new version of a job that changes only what the planner ranks or
// places it by (Nomad's priority, its hadar.queue, its GPU device) is a
// changed contract: planned afresh with the new values, not kept as it was
// admitted (sameSpec once compared 11 of Spec's fields).
func TestSyncReadmitsAChangedPriorityQueueOrDevice(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	for _, tc := range []struct {
		name   string
		change func(*jobspec.Spec)
	}{
		{"priority", func(s *jobspec.Spec) { s.Priority = 90 }},
		{"queue", func(s *jobspec.Spec) { s.Queue = "other" }},
		{"device", func(s *jobspec.Spec) {
			s.Device, s.DeviceModel = "nvidia/gpu/Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, rec := noteState(t, []noteCase{{name: "run", meta: good}})
			snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
			a := testAgent(t, rec, "gavel-maxmin")
			k := watch.JobKey{Namespace: "default", ID: "run"}
			a.mu.Lock()
			defer a.mu.Unlock()
			now := a.now()
			if err := a.sync(snap, now); err != nil {
				t.Fatal(err)
			}
			if a.roster.job(k) == nil {
				t.Fatal("not admitted")
			}
			j := snap.Jobs[k]
			s := *j.Spec
			tc.change(&s)
			j.Spec, j.Version = &s, j.Version+1
			if err := a.sync(snap, now+1); err != nil {
				t.Fatal(err)
			}
			mj := a.roster.job(k)
			if mj == nil || !mj.spec.Same(s) {
				t.Fatalf("after the new version the job is planned with %+v, want %+v", mj, s)
			}
			if st, ok := a.core.eng.Job(engineID(k)); !ok || st.Job.Priority != s.Priority {
				t.Fatalf("engine job priority %d (planned %v), want %d", st.Job.Priority, ok, s.Priority)
			}
		})
	}
}

// A job's own hadar.min_run_time is capped by the sidecar's
// max_min_run_time: the engine holds it to the cap, and its view says so.
func TestAuthorsMinRunTimeIsCapped(t *testing.T) {
	meta := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000", "hadar.min_run_time": "720h"}
	snap, rec := noteState(t, []noteCase{{name: "long", meta: meta}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{
		Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "1h"},
		RunLimits:  config.RunLimits{MaxMinRunTime: "1h"},
		Service:    config.Service{State: &config.StateConfig{Store: "none"}},
	}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.settleWrites)
	k := watch.JobKey{Namespace: "default", ID: "long"}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.sync(snap, a.now()); err != nil {
		t.Fatal(err)
	}
	if st, ok := a.core.eng.Job(engineID(k)); !ok || st.Job.MinRunTime != 3600 {
		t.Fatalf("the engine holds the job to %v s (planned %v), want the cap 3600", st.Job.MinRunTime, ok)
	}
	for _, jv := range a.planView(snap).Jobs {
		if jv.ID == engineID(k) && (jv.MinRunTimeS != 3600 || !strings.Contains(jv.MinRunTimeCap, "max_min_run_time")) {
			t.Fatalf("the job's view: min run time %v s, cap %q", jv.MinRunTimeS, jv.MinRunTimeCap)
		}
	}
}

// A job whose workers the driver refuses on every start (issue 32, item
// 6: a checkpoint_root of mode 0777) backs off before each retry, doubling,
// with the driver's reason as why it waits; after the third refusal for
// the same reason it is held: out of the plan, shown as refused with that
// reason, and not admitted again while the job is what it was (it was
// admitted afresh at once, and placed again every round); its owner
// registering it again releases it.
func TestFailingStartsBackOffThenHold(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{{name: "bad-root", meta: good}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
	a := testAgent(t, rec, "gavel-maxmin")
	k := watch.JobKey{Namespace: "default", ID: "bad-root"}
	const refusal = `hadar-train: checkpoint_root "/srv/ck" is mode 0777: want it root's and writable by no one else (chmod 0755 /srv/ck)`
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	sync := func() {
		t.Helper()
		now++
		if err := a.sync(snap, now); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	g := groupname.Format("train", 0, 0)
	for n := 1; n <= maxFailures; n++ {
		// Placed (version n), and the driver refuses the task.
		placedJob(t, snap, rec, "bad-root", "n1", api.AllocClientStatusRunning)
		snap.Jobs[k].Version = uint64(n)
		al := snap.Allocs["bad-root/"+g]
		al.JobVersion = uint64(n)
		sync()
		al.ClientStatus, al.ClientDescription = api.AllocClientStatusFailed, "Failed tasks"
		al.TaskStates = map[string]watch.TaskState{"t": {State: "dead", Failed: true, Events: []watch.TaskEvent{
			{Type: api.TaskReceived, Message: "Task received by client"},
			{Type: api.TaskDriverFailure, Message: refusal},
			{Type: api.TaskNotRestarting, Message: "Policy allows no restarts"}}}}
		snap.Jobs[k].Status = "dead"
		sync()
		if n == maxFailures {
			break
		}
		st, ok := a.core.eng.Job(engineID(k))
		if !ok || st.Running || a.roster.job(k).failures != n {
			t.Fatalf("failure %d: planned %v, running %v", n, ok, st.Running)
		}
		// It waits out its back-off, saying why.
		a.mu.Unlock()
		err := a.cycleOn(context.Background(), snap, true)
		a.settleWrites()
		a.mu.Lock()
		if err != nil {
			t.Fatal(err)
		}
		st, _ = a.core.eng.Job(engineID(k))
		wait := failureBackoffBase << (n - 1)
		if st.Running || !strings.Contains(st.Reason.Why, "deferred for") || !strings.Contains(st.Reason.Why, refusal) {
			t.Fatalf("failure %d: running %v, why %q: want it deferred with the driver's reason", n, st.Running, st.Reason.Why)
		}
		var left float64
		if _, err := fmt.Sscanf(st.Reason.Why, "deferred for %g s more", &left); err != nil || left > wait.Seconds() || left < wait.Seconds()-5 {
			t.Fatalf("failure %d: %q: want a back-off of %v", n, st.Reason.Why, wait)
		}
	}
	if _, ok := a.core.eng.Job(engineID(k)); ok || a.roster.job(k) != nil {
		t.Fatal("after the third refusal for the same reason the job is still planned")
	}
	view := a.planView(snap)
	if len(view.Refused) != 1 || view.Refused[0].Job != k.String() || !strings.Contains(view.Refused[0].Error, refusal) {
		t.Fatalf("refused %+v: want the held job with the driver's reason", view.Refused)
	}
	// The rollback left it held in Nomad (pending, gated): it is not
	// admitted again, however often the sidecar syncs.
	held := rec.jobs["bad-root"]
	snap.Jobs[k].Status = "pending"
	for range 3 {
		sync()
		if _, ok := a.core.eng.Job(engineID(k)); ok {
			t.Fatal("the held job was admitted again")
		}
	}
	// Its owner runs it again (the root fixed): planned again.
	idx := *held.JobModifyIndex + 100
	held.JobModifyIndex = &idx
	wj := watch.NewJob(held)
	wj.SubmitTime, wj.Status = snap.Jobs[k].SubmitTime, "pending"
	snap.Jobs[k] = wj
	sync()
	if _, ok := a.core.eng.Job(engineID(k)); !ok || len(a.planView(snap).Refused) != 0 {
		t.Fatal("the job its owner registered again is still held")
	}
}

// A job Nomad answers 404 for right after its submission (the read before
// the write reached it before the registration) is not yet visible, not
// refused (issue 32, item 7): it is not backed off, and the next cycle
// starts it, where it waited out a back-off into the next round.
func TestJustSubmittedJobsNotFoundIsNotBackedOff(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{{name: "fresh", meta: good}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
	a := testAgent(t, rec, "gavel-maxmin")
	k := watch.JobKey{Namespace: "default", ID: "fresh"}
	rec.mu.Lock()
	submitted := rec.jobs["fresh"]
	delete(rec.jobs, "fresh") // Nomad answers 404
	rec.mu.Unlock()
	cycle := func(force bool) {
		t.Helper()
		if err := a.cycleOn(context.Background(), snap, force); err != nil {
			t.Fatal(err)
		}
		a.settleWrites()
	}
	cycle(true)
	cycle(false) // records how the write went
	rec.mu.Lock()
	rec.jobs["fresh"] = submitted
	rec.mu.Unlock()
	cycle(false)
	a.mu.Lock()
	st, _ := a.core.eng.Job(engineID(k))
	refusals := a.roster.job(k).refusals
	a.mu.Unlock()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if _, gen := groupsOf(rec.jobs["fresh"]); gen == 0 || refusals != 0 {
		t.Fatalf("after the 404: running %v, why %q, refusals %d, %d writes: want it started at the next cycle, not backed off", st.Running, st.Reason.Why, refusals, rec.registers)
	}
}

// A start Nomad answers 500 for (a transient fault, nothing said of the
// placement) pauses the job a few seconds without counting a refusal: a
// few unlucky requests in a row used to back it off for minutes
// (TestSidecarUnderAPIFaults waited 5 min for a job backed off 88 s).
func TestTransientWriteErrorIsNotARefusal(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{{name: "flaky", meta: good}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
	a := testAgent(t, rec, "gavel-maxmin")
	k := watch.JobKey{Namespace: "default", ID: "flaky"}
	rec.mu.Lock()
	rec.failRegisters = 3
	rec.mu.Unlock()
	for i := range 3 {
		if err := a.cycleOn(context.Background(), snap, i == 0); err != nil {
			t.Fatal(err)
		}
		a.settleWrites()
	}
	a.mu.Lock()
	refusals := a.roster.job(k).refusals
	a.mu.Unlock()
	rec.mu.Lock()
	failed := 3 - rec.failRegisters
	rec.mu.Unlock()
	if failed == 0 || refusals != 0 {
		t.Fatalf("after %d registrations answered 500: %d refusals counted, want 0 (a transient error is not Nomad refusing the placement)", failed, refusals)
	}
}

// generated is the Worker watch parses from a generated group's name
// (nil for any other), for allocations the tests build by hand.
func generated(group string) *groupname.Worker {
	if w, ok := groupname.Parse(group); ok {
		return &w
	}
	return nil
}

// A job whose rank 0 finished on its own just as the sidecar stopped it
// (a stop decided on progress a few seconds old: its allocations are of
// an older version, desired "stop") is complete, not waiting: placed
// again, hadar-train would start the finished run's task fresh (make test
// run 16: docs-b ran its 160 steps twice). A rank 0 that Nomad stopped
// (a Killing event), or one from before the job's admission (an earlier
// run of the job), does not finish it.
func TestSyncFinishesAJobDoneAsItWasStopped(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []string
		before bool
		done   bool
	}{
		{"ended on its own", []string{"Started", "Terminated"}, false, true},
		{"stopped by Nomad", []string{"Started", api.TaskKilling, "Terminated", api.TaskKilled}, false, false},
		// The stop reached a process already exiting done (make test run
		// 31): hadar-train's event at its end says so.
		{"stopped by Nomad as it ended done", []string{"Started", api.TaskKilling, "Terminated", api.TaskKilled, "Driver:done"}, false, true},
		{"stopped by Nomad, its last progress stopped", []string{"Started", api.TaskKilling, "Terminated", api.TaskKilled, "Driver:stopped"}, false, false},
		{"an earlier run's", []string{"Started", "Terminated"}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
			snap, rec := noteState(t, []noteCase{{name: "done", meta: good}})
			snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1)
			a := testAgent(t, rec, "gavel-maxmin")
			k := watch.JobKey{Namespace: "default", ID: "done"}
			a.mu.Lock()
			defer a.mu.Unlock()
			now := a.now()
			placedJob(t, snap, rec, "done", "n1", api.AllocClientStatusRunning)
			if err := a.sync(snap, now); err != nil {
				t.Fatal(err)
			}
			al := snap.Allocs["done/"+groupname.Format("train", 0, 0)]
			al.CreateTime = snap.Jobs[k].SubmitTime.Add(time.Second)
			if tc.before {
				al.CreateTime = snap.Jobs[k].SubmitTime.Add(-time.Hour)
			}
			var evs []watch.TaskEvent
			for _, e := range tc.events {
				if st, ok := strings.CutPrefix(e, "Driver:"); ok {
					evs = append(evs, watch.TaskEvent{Type: api.TaskDriverMessage, Message: "final progress", Details: map[string]string{contract.DetailState: st}})
					continue
				}
				evs = append(evs, watch.TaskEvent{Type: e})
			}
			// The sidecar's stop: a newer version without the unit; the
			// allocation is desired "stop", but its task had ended 0.
			al.ClientStatus, al.DesiredStatus = api.AllocClientStatusComplete, api.AllocDesiredStatusStop
			al.TaskStates = map[string]watch.TaskState{al.Task: {State: "dead", Events: evs}}
			// A move's start reads the same: the group is done, and the
			// move must not start the job again (apply.Group.Done).
			if got := (clusterView{a, snap}).Group(k, al.TaskGroup).Done; got != tc.done {
				t.Fatalf("the group's Done %v after its rank 0 ended (events %v), want %v", got, tc.events, tc.done)
			}
			snap.Jobs[k].Version++
			snap.Jobs[k].Status = "dead"
			if err := a.sync(snap, now+1); err != nil {
				t.Fatal(err)
			}
			_, planned := a.core.eng.Job(engineID(k))
			if planned == tc.done {
				t.Fatalf("planned %v after its rank 0 ended (events %v); want complete %v", planned, tc.events, tc.done)
			}
		})
	}
}
