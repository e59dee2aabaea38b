package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// An elastic job (hadar.workers = "1-2") under sia, alone on a node of two
// GPUs, grows to both: the engine gets its widths from the jobspec, the
// decision's reason is sia's, and the job is written with two worker
// groups of WORLD_SIZE 2.
func TestElasticJobStartsAtTheWidthSiaChooses(t *testing.T) {
	snap, rec := noteState(t, []noteCase{{name: "el", meta: map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "100000", "hadar.workers": "1-2"}}})
	snap.Nodes["n1"] = gpuNode("n1", "Tesla V100-SXM2-16GB", 2)
	a := testAgent(t, rec, "sia")
	if err := a.cycleOn(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	a.settleWrites()
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.core.eng.Job(engineID(watch.JobKey{Namespace: "default", ID: "el"}))
	if !ok {
		t.Fatal("not admitted")
	}
	if len(st.Job.Widths) != 2 || st.Job.ScaleFactor != 1 {
		t.Fatalf("engine job %+v: want widths [1 2], scale factor 1", st.Job)
	}
	if !st.Running || len(st.Placement.Units) != 1 || st.Placement.Units[0].GPUs() != 2 {
		t.Fatalf("running %v on %+v, want one unit of 2 GPUs", st.Running, st.Placement)
	}
	ranks := map[string]bool{}
	for _, g := range rec.jobs["el"].TaskGroups {
		if _, gen := groupname.Parse(*g.Name); !gen {
			continue
		}
		env := g.Tasks[0].Env
		if env[contract.EnvWorldSize] != "2" {
			t.Fatalf("%s: WORLD_SIZE %q", *g.Name, env[contract.EnvWorldSize])
		}
		ranks[env[contract.EnvRank]] = true
	}
	if len(ranks) != 2 || !ranks["0"] || !ranks["1"] {
		t.Fatalf("ranks written %v, want 0 and 1", ranks)
	}
	found := false
	for _, ev := range a.record.history {
		found = found || strings.HasPrefix(ev.Why, "sia: 2 GPUs")
	}
	if !found {
		t.Fatalf("no decision says sia's reason for the width: %+v", a.record.history)
	}
}
