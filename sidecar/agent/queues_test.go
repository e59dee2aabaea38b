package agent

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// With queue blocks the agent plans inside the queues: each job in the
// queue its namespace or its hadar.queue (where allowed) gives it, its
// Nomad priority carried, and the queues' status kept after the plan.
func TestAgentPlansInsideQueues(t *testing.T) {
	job := func(q string) map[string]string {
		m := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
		if q != "" {
			m["hadar.queue"] = q
		}
		return m
	}
	snap, rec := noteState(t, []noteCase{{name: "plain", meta: job("")}, {name: "chosen", meta: job("team-b")}, {name: "refused", meta: job("team-c")}, {name: "capped", meta: job("team-d")}})
	rec.jobs["chosen"].Priority = ptr(70)
	chosen := watch.NewJob(rec.jobs["chosen"])
	chosen.SubmitTime = snap.Jobs[chosen.Key()].SubmitTime
	snap.Jobs[chosen.Key()] = chosen
	snap.Nodes["n1"], snap.Nodes["n2"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 1), gpuNode("n2", "Tesla V100-SXM2-16GB", 1)

	c, err := config.ParseConfig("s.hcl", []byte(`
policy    = "gavel-maxmin"
placement = "pack"
round     = "1h"
state { store = "none" }
queue "team-a" {
  namespaces = ["default"]
}
queue "team-b" {
  meta_namespaces = ["*"]
  guarantee       = { v100 = 1 }
}
queue "team-c" {
  policy = "fifo"
}
queue "team-d" {
  meta_namespaces = ["*"]
  limit           = { v100 = 0 }
}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.settleWrites)
	if _, _, ok := a.Queues(); ok {
		t.Fatal("queue status before any plan")
	}

	a.mu.Lock()
	now := a.now()
	if err := a.sync(snap, now); err != nil {
		a.mu.Unlock()
		t.Fatal(err)
	}
	if got := a.core.eng.Scheduler().Name(); got != "queues(gavel-maxmin)" {
		t.Errorf("scheduler %q, want queues(gavel-maxmin)", got)
	}
	want := map[string]struct {
		queue    string
		priority int
	}{"plain": {"team-a", 50}, "chosen": {"team-b", 70}, "refused": {"team-a", 50}}
	for id, w := range want {
		st, ok := a.core.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: id}))
		if !ok || st.Job.Queue != w.queue || st.Job.Priority != w.priority {
			t.Errorf("job %s: queue %q priority %d (admitted %v), want %q, %d", id, st.Job.Queue, st.Job.Priority, ok, w.queue, w.priority)
		}
	}
	_, err = a.plan(context.Background(), now, engine.Boundary, true)
	a.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}

	st, qc, ok := a.Queues()
	if !ok || len(qc.Queues) != 4 {
		t.Fatalf("queue status after a plan: ok %v, %d queues configured", ok, len(qc.Queues))
	}
	byName := map[string]queue.QueueStatus{}
	for _, q := range st.Queues {
		byName[q.Name] = q
	}
	// team-b's guarantee is its one V100; team-a runs one job on the
	// other and the third waits.
	if b := byName["team-b"]; b.Used["v100"] != 1 || b.Admitted != 1 {
		t.Errorf("team-b: %+v, want its guaranteed V100 used", b)
	}
	if a := byName["team-a"]; a.Admitted != 1 || a.Pending != 1 {
		t.Errorf("team-a: %+v, want 1 admitted and 1 pending", a)
	}
	if js, ok := st.Jobs["default/chosen"]; !ok || !js.Running || js.Queue != "team-b" {
		t.Errorf("job chosen: %+v", js)
	}
	// No GPU is free: the job its queue's limit holds is held by hadar,
	// the one waiting its turn in team-a has no capacity.
	a.mu.Lock()
	obs := a.observe(snap, true)
	a.mu.Unlock()
	pending := map[string]string{}
	for _, j := range obs.Jobs {
		pending[j.ID] = j.Pending
		// The plan's view of each job names its queue and the queue's
		// reason (/v1/plan, /v1/status, /v1/jobs/...).
		if j.ID == "default/capped" && (j.TeamQueue != "team-d" || j.QueueReason != queue.ReasonAtLimit) {
			t.Errorf("capped in the plan view: queue %q reason %q, want team-d, at_limit", j.TeamQueue, j.QueueReason)
		}
		if j.ID == "default/chosen" && (j.TeamQueue != "team-b" || j.QueueReason != "") {
			t.Errorf("chosen in the plan view: queue %q reason %q, want team-b and no queue reason", j.TeamQueue, j.QueueReason)
		}
	}
	if pending["default/capped"] != wire.PendingHeld || pending["default/refused"] != wire.PendingNoCapacity {
		t.Errorf("pending: %v; want capped held (at its queue's limit), refused no_capacity", pending)
	}
	if js := st.Jobs["default/capped"]; js.Code != queue.ReasonAtLimit {
		t.Errorf("capped: %+v, want at_limit", js)
	}
}

// The planner gets the sidecar's min_run_time as given, with or without
// queues: an explicit 0 is none (registry.Options' negative; its 0 would
// be its own 30-minute default), left out it is the config's default.
func TestPlannerMinRunTime(t *testing.T) {
	for _, tc := range []struct {
		src           string
		options, plac float64
	}{
		{`min_run_time = "0s"`, -1, -1},
		{``, config.DefaultMinRunTime.Seconds(), config.DefaultMinRunTime.Seconds()},
		{`min_run_time = "10m"`, 600, 600},
		{"min_run_time = \"0s\"\nqueue \"q\" {\n  namespaces = [\"default\"]\n}", -1, -1},
	} {
		c, err := config.ParseConfig("s.hcl", []byte(tc.src))
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Resolve()
		if err != nil {
			t.Fatal(err)
		}
		a := &Agent{cfg: s}
		o, pc := a.plannerOptions(speed.Model{})
		if o.MinRunTime != tc.options || pc.MinRunTime != tc.plac {
			t.Errorf("%q: registry min run time %v, placer's %v; want %v, %v", tc.src, o.MinRunTime, pc.MinRunTime, tc.options, tc.plac)
		}
	}
}
