package sim_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
)

const resnet = "ResNet-18 (batch size 16)"

func twoNodes() planner.Cluster {
	return planner.Cluster{Nodes: []planner.Node{
		{ID: "a", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}},
		{ID: "b", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 4}},
	}}
}

func runEvents(t *testing.T, c planner.Cluster, jobs []planner.Job, events []sim.Event) sim.Result {
	t.Helper()
	model := speed.Model{Profile: profile.Default()}
	s, err := registry.New("fifo", registry.Options{Types: c.Types(), Speed: model})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: model, RestartCost: 20, Events: events}, s)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestLostNodeRestartsItsJobFromTheLastCheckpoint(t *testing.T) {
	prof := profile.Default()
	r, _ := prof.Throughput(resnet, 4, "v100", false)
	// 1000 s of work on 4 V100s. It starts on a at 0 (20 s restart), has
	// done 340 s of work at the round boundary (360 s: a checkpoint), and
	// node a dies at 500 s: the 140 s done since are lost; it restarts on
	// b (20 s) with 660 s of work left: done at 500 + 20 + 660 = 1180 s.
	jobs := []planner.Job{{ID: "j", Model: resnet, ScaleFactor: 4, TotalSteps: 1000 * r, Weight: 1}}
	res := runEvents(t, twoNodes(), jobs, []sim.Event{{Time: 500, Kind: sim.Lose, NodeID: "a"}})
	if got := res.Jobs[0].JCT; math.Abs(got-1180) > 1e-6 {
		t.Fatalf("JCT %v s, want 1180 (restart from the checkpoint at 360 s on the other node)", got)
	}
	if res.Jobs[0].Restarts != 1 {
		t.Fatalf("%d restarts, want 1", res.Jobs[0].Restarts)
	}
	// Without the loss: 1020 s.
	if got := runEvents(t, twoNodes(), jobs, nil).Jobs[0].JCT; math.Abs(got-1020) > 1e-6 {
		t.Fatalf("JCT without the loss %v, want 1020", got)
	}
}

func TestJoiningNodeTakesAWaitingJobAtOnce(t *testing.T) {
	prof := profile.Default()
	r, _ := prof.Throughput(resnet, 4, "v100", false)
	one := planner.Cluster{Nodes: twoNodes().Nodes[:1]}
	jobs := []planner.Job{
		{ID: "first", Model: resnet, ScaleFactor: 4, TotalSteps: 1000 * r, Weight: 1},
		{ID: "second", Model: resnet, ScaleFactor: 4, TotalSteps: 1000 * r, Weight: 1},
	}
	join := sim.Event{Time: 100, Kind: sim.Join, Node: twoNodes().Nodes[1]}
	res := runEvents(t, one, jobs, []sim.Event{join})
	if got := res.Jobs[1].Start; got != 100 {
		t.Fatalf("second job started at %v, want 100 (when b joined)", got)
	}
	if got := res.Jobs[1].Finish; math.Abs(got-1120) > 1e-6 {
		t.Fatalf("second job finished at %v, want 1120", got)
	}
}

func TestDrainedNodeIsLeftAtTheNextRound(t *testing.T) {
	prof := profile.Default()
	r, _ := prof.Throughput(resnet, 4, "v100", false)
	jobs := []planner.Job{{ID: "j", Model: resnet, ScaleFactor: 4, TotalSteps: 1000 * r, Weight: 1}}
	// Drained at 100 s, it keeps running on a until the boundary at 360 s,
	// then moves to b (20 s): 1020 + 20 = 1040 s.
	res := runEvents(t, twoNodes(), jobs, []sim.Event{{Time: 100, Kind: sim.Drain, NodeID: "a"}})
	if got := res.Jobs[0].JCT; math.Abs(got-1040) > 1e-6 {
		t.Fatalf("JCT %v, want 1040", got)
	}
}

func TestParseEvents(t *testing.T) {
	evs, err := sim.ParseEvents(strings.NewReader("# header\n10h drain v100-3\n90m,lose,p100-1\n\n20h join a100-0 a100=8+v100=2 rack-a\n30 undrain v100-3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 4 || evs[0].Time != 36000 || evs[1].Time != 5400 || evs[2].Node.GPUs["a100"] != 8 || evs[2].Node.GPUs["v100"] != 2 || evs[2].Node.Rack != "rack-a" || evs[3].Time != 30 {
		t.Fatalf("parsed %+v", evs)
	}
	for _, bad := range []string{"10h explode a", "x drain a", "10h join b", "10h join b v100=0", "10h drain", "5 lose a extra"} {
		if _, err := sim.ParseEvents(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: err = %v, want an error naming line 1", bad, err)
		}
	}
	// Unknown nodes are refused before the run.
	model := speed.Model{Profile: profile.Default()}
	s, _ := registry.New("fifo", registry.Options{Types: []planner.GPUType{"v100"}, Speed: model})
	_, err = sim.Run(context.Background(), sim.Config{Cluster: twoNodes(), Jobs: []planner.Job{{ID: "j", Model: "ResNet-18 (batch size 16)", ScaleFactor: 1, TotalSteps: 10, Weight: 1}},
		Speed: model, Events: []sim.Event{{Time: 5, Kind: sim.Lose, NodeID: "zz"}}}, s)
	if err == nil || !strings.Contains(err.Error(), `"zz"`) {
		t.Fatalf("err = %v, want the unknown node named", err)
	}
}
