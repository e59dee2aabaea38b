package agent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// What the status page and the metrics are drawn from: who holds each
// node's GPUs (hadar's placements and the jobs it does not manage), GPU
// models it has no type for kept apart, the refused specs, and why a
// waiting job waits: held (GPUs it can run on are free) or no capacity.
func TestObserve(t *testing.T) {
	good := map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "1000"}
	snap, rec := noteState(t, []noteCase{{name: "run", meta: good}, {name: "wait", meta: good},
		{name: "bad", meta: map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "x"}}})
	const v100 = "Tesla V100-SXM2-16GB"
	snap.Nodes["n1"] = gpuNode("n1", v100, 2)
	odd := gpuNode("n3", "Mystery Accelerator 9000", 1)
	odd.Rack = "r2"
	snap.Nodes["n3"] = odd
	snap.Unmanaged = []watch.Held{{AllocID: "other/a", NodeID: "n1", Job: watch.JobKey{Namespace: "default", ID: "other"}, GPUs: map[string]int{v100: 1}}}
	a := testAgent(t, rec, "gavel-maxmin")
	placedJob(t, snap, rec, "run", "n1", "running")
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.sync(snap, a.now()); err != nil {
		t.Fatal(err)
	}
	o := a.observe(snap, true)

	if !o.Leader || len(o.Plan.Refused) != 1 || o.Plan.Refused[0].Job != "default/bad" {
		t.Fatalf("leader %v, refused %+v", o.Leader, o.Plan.Refused)
	}
	if len(o.Nodes) != 2 || o.Nodes[0].ID != "n1" || o.Nodes[1].ID != "n3" {
		t.Fatalf("nodes by rack then name: %+v", o.Nodes)
	}
	n1 := o.Nodes[0]
	if !n1.Planned || len(n1.GPUs) != 1 {
		t.Fatalf("n1: %+v", n1)
	}
	g := n1.GPUs[0]
	want := []wire.Holder{{Job: "default/other", Count: 1}, {Job: "default/run", Count: 1, Managed: true}}
	if g.Type != "v100" || g.Total != 2 || g.Healthy != 2 || len(g.Holders) != 2 || g.Holders[0] != want[0] || g.Holders[1] != want[1] {
		t.Fatalf("n1's V100s: %+v", g)
	}
	if gs := o.Nodes[1].GPUs; len(gs) != 1 || gs[0].Type != "" || gs[0].Models[0] != "Mystery Accelerator 9000" || gs[0].Total != 1 {
		t.Fatalf("a model without a type: %+v", gs)
	}
	jobs := map[string]wire.JobObservation{}
	for _, j := range o.Jobs {
		jobs[j.ID] = j
	}
	run, wait := jobs["default/run"], jobs["default/wait"]
	if run.State != "running" || len(run.Units) != 1 || run.Units[0].Slots[0].Node != "n1" || run.Pending != "" {
		t.Fatalf("the running job: %+v", run)
	}
	if wait.State != "waiting" || wait.Pending != wire.PendingNoCapacity || wait.Throughput["v100"] <= 0 {
		t.Fatalf("every V100 taken: the waiting job %+v", wait)
	}

	// The other job ends: a V100 is free, and the job waits on hadar.
	snap.Unmanaged = nil
	if err := a.sync(snap, a.now()); err != nil {
		t.Fatal(err)
	}
	o = a.observe(snap, true)
	for _, j := range o.Jobs {
		if j.ID == "default/wait" && j.Pending != wire.PendingHeld {
			t.Fatalf("a V100 free: the waiting job %+v", j)
		}
	}
	if h := o.Nodes[0].GPUs[0].Holders; len(h) != 1 || !h[0].Managed {
		t.Fatalf("holders once the other job ended: %+v", h)
	}
}

// Why Nomad cannot place a job's groups, from its blocked evaluations:
// hadar's own gate is not a reason (the planner's reason says why it
// holds the job), an exhausted dimension is.
func TestNomadReason(t *testing.T) {
	k := watch.JobKey{Namespace: "default", ID: "j"}
	gate := constraintOf(t)
	snap := &watch.Snapshot{BlockedEvals: map[string]*watch.Eval{
		"e1": {ID: "e1", Namespace: "default", JobID: "j", Status: "blocked", FailedTGAllocs: map[string]*api.AllocationMetric{
			"train": {NodesEvaluated: 3, NodesFiltered: 3, ConstraintFiltered: map[string]int{gate: 3}},
		}},
	}}
	if r := nomadReason(snap, k); r != "" {
		t.Fatalf("the gate alone given as Nomad's reason: %q", r)
	}
	snap.BlockedEvals["e2"] = &watch.Eval{ID: "e2", Namespace: "default", JobID: "j", Status: "blocked", FailedTGAllocs: map[string]*api.AllocationMetric{
		"train-u0-w0": {NodesEvaluated: 2, NodesExhausted: 2, DimensionExhausted: map[string]int{"memory": 2}},
	}}
	if r := nomadReason(snap, k); !strings.HasPrefix(r, "train-u0-w0: ") || !strings.Contains(r, "memory") {
		t.Fatalf("an exhausted dimension: %q", r)
	}
	if r := nomadReason(snap, watch.JobKey{Namespace: "default", ID: "other"}); r != "" {
		t.Fatalf("another job's evaluations: %q", r)
	}
}

// constraintOf is the gate as Nomad names it in ConstraintFiltered.
func constraintOf(t *testing.T) string {
	t.Helper()
	c := jobspec.GateConstraint()
	return fmt.Sprintf("%s %s %s", c.LTarget, c.Operand, c.RTarget)
}
