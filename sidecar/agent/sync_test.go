package agent

import (
	"context"
	"net/http/httptest"
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
	return &watch.Node{ID: id, Name: id, Status: api.NodeStatusReady, SchedulingEligibility: api.NodeSchedulingEligible,
		Rack: "r1", Address: "127.0.0.1", GPUs: []watch.GPUGroup{g}}
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
