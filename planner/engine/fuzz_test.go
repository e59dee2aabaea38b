package engine_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/speed"
)

// FuzzRestore: any bytes given as a snapshot restore into a working engine
// or are refused; never a panic, never a half-loaded engine.
func FuzzRestore(f *testing.F) {
	s := &scripted{next: map[string]planner.Placement{"x": place(unit(slot("a", "v100", 1)))}}
	e, err := engine.New(engine.Config{Speed: speed.Model{Profile: profile.Default()}}, s)
	if err != nil {
		f.Fatal(err)
	}
	e.SetNodes(nodes(), 0)
	e.Admit(job("x", 1, 1e6), 0)
	e.Plan(context.Background(), 0, engine.Boundary)
	good, err := e.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"format":"hadar-engine-snapshot","version":1,"sha256":"00","state":{}}`))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		model := speed.Model{Profile: profile.Default()}
		sched, err := registry.New("gavel-maxmin", registry.Options{Types: []planner.GPUType{"k80", "v100"}, Speed: model})
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.Restore(data, engine.Config{Speed: model}, sched)
		if err != nil {
			if e != nil {
				t.Fatal("an engine returned with an error")
			}
			return
		}
		// A restored engine plans, and its plan fits the cluster.
		if _, err := e.Plan(context.Background(), e.Now()+360, engine.Boundary); err != nil {
			t.Fatalf("plan after restore: %v", err)
		}
		checkFits(t, e)
	})
}

// checkFits fails when the engine's running jobs hold more GPUs of a node
// and type than the node has.
func checkFits(t *testing.T, e *engine.Engine) {
	t.Helper()
	nodes, _ := e.Nodes()
	capacity := map[string]map[planner.GPUType]int{}
	for _, n := range nodes {
		capacity[n.ID] = n.GPUs
	}
	used := map[string]map[planner.GPUType]int{}
	for _, js := range e.Jobs() {
		if !js.Running {
			continue
		}
		for _, u := range js.Placement.Units {
			for _, sl := range u.Slots {
				if used[sl.Node] == nil {
					used[sl.Node] = map[planner.GPUType]int{}
				}
				used[sl.Node][sl.Type] += sl.Count
				if used[sl.Node][sl.Type] > capacity[sl.Node][sl.Type] {
					t.Fatalf("after a plan, running jobs hold %d %s GPUs of node %s, which has %d", used[sl.Node][sl.Type], sl.Type, sl.Node, capacity[sl.Node][sl.Type])
				}
			}
		}
	}
}

// FuzzRestoreState: fuzzed state inside a well-formed envelope (the
// checksum recomputed), so the fuzzer reaches the field checks.
func FuzzRestoreState(f *testing.F) {
	f.Add([]byte(`{"round_s":360,"overrun":0.05,"now":10,"epoch":1,"nodes":[{"ID":"a","Rack":"r","GPUs":{"v100":4}}],"drained":[],"types":["v100"],"jobs":[{"job":{"ID":"x","Model":"ResNet-18 (batch size 16)","ScaleFactor":1,"TotalSteps":100,"Weight":1,"Arrival":0,"SLO":0},"remaining":50,"done":50,"running":true,"placement":{"Units":[{"Slots":[{"Node":"a","Type":"v100","Count":1}]}]},"received":[10],"placed_at":0,"last_at":-1,"last_done":0,"reason":{},"waiting_since":0}],"scheduler":{"name":"scripted"}}`))
	f.Add([]byte(`{"jobs":[{"received":[1,2,3]}]}`))
	f.Fuzz(func(t *testing.T, state []byte) {
		if !json.Valid(state) {
			return
		}
		data, err := engine.Seal(engine.SnapshotFormat, engine.SnapshotVersion, json.RawMessage(state))
		if err != nil {
			return
		}
		s := &scripted{next: map[string]planner.Placement{}}
		e, err := engine.Restore(data, engine.Config{Speed: speed.Model{Profile: profile.Default()}}, s)
		if err != nil {
			return
		}
		if _, err := e.Plan(context.Background(), e.Now()+1, engine.Boundary); err != nil {
			t.Fatalf("plan after restore: %v", err)
		}
		checkFits(t, e)
		if _, err := e.Snapshot(); err != nil {
			t.Fatalf("a restored engine cannot snapshot: %v", err)
		}
	})
}
