package agent

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobform"
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
	s, err := Config{Policy: policy, Placement: "pack", Round: "1h", State: StateConfig{Store: "none"}}.Resolve()
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
	st, ok := a.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "waiting"}))
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
	st, _ = a.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "waiting"}))
	if !st.Running || st.Placement.Units[0].Slots[0] != (planner.Slot{Node: "n1", Type: "v100", Count: 1}) {
		t.Fatalf("after the refused job's worker ended: running %v on %v", st.Running, st.Placement)
	}
}

// groupsOf counts a job's template and generated groups.
func groupsOf(j *api.Job) (template, generated int) {
	for _, g := range j.TaskGroups {
		if _, _, _, gen := jobform.ParseGroupName(*g.Name); gen {
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
	st, _ := a.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "not-n1"}))
	if !st.Running || st.Placement.Units[0].Slots[0].Node != "n2" {
		t.Fatalf("not-n1 runs %v on %v: want n2, the one node its constraint allows", st.Running, st.Placement)
	}
	st, _ = a.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "windows"}))
	if st.Running || !strings.Contains(st.Reason.Why, "kernel.name") {
		t.Fatalf("a job no node can run: running %v, why %q", st.Running, st.Reason.Why)
	}
	if _, gen := groupsOf(rec.jobs["windows"]); gen > 0 {
		t.Fatal("a start Nomad would refuse was written")
	}
}
