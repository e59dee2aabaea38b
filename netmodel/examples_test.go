package netmodel

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// The example topologies describe the simulator's cluster v100=36,
// p100=36, k80=36: 4 GPUs per node, nodes <type>-<i>, 3 nodes per rack.
func TestExampleTopologies(t *testing.T) {
	job := &JobComm{Name: "t", Bytes: 1.8e8, Overlap: 0.45, Compute: map[string]float64{"v100": 0.05, "p100": 0.08, "k80": 0.2}}
	packed := Placement{{"v100-0", 0}, {"v100-0", 1}, {"v100-0", 2}, {"v100-0", 3}}
	sameRack := Placement{{"v100-0", 0}, {"v100-1", 0}, {"v100-2", 0}, {"v100-1", 1}}
	crossRack := Placement{{"v100-0", 0}, {"v100-3", 0}, {"v100-6", 0}, {"v100-4", 1}}
	slowdowns := func(tp *Topology, at time.Duration) [3]float64 {
		var out [3]float64
		for i, p := range []Placement{packed, sameRack, crossRack} {
			s, err := tp.Slowdown(job, p, at)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = s
		}
		return out
	}
	load := func(name string) *Topology {
		tp, err := LoadTopologyFile(filepath.Join("examples", name))
		if err != nil {
			t.Fatal(err)
		}
		gpus := map[string]int{}
		for _, n := range tp.Nodes() {
			gpus[n.GPUType] += n.GPUs
			if n.GPUs != 4 {
				t.Errorf("%s: node %s has %d GPUs, want 4", name, n.ID, n.GPUs)
			}
		}
		if fmt.Sprint(gpus) != "map[k80:36 p100:36 v100:36]" || tp.NodeCount() != 27 {
			t.Errorf("%s: GPUs %v on %d nodes, want 36 of each type on 27 nodes", name, gpus, tp.NodeCount())
		}
		for _, typ := range []string{"v100", "p100", "k80"} {
			for i := 0; i < 9; i++ {
				if _, ok := tp.byID[fmt.Sprintf("%s-%d", typ, i)]; !ok {
					t.Errorf("%s: no node %s-%d", name, typ, i)
				}
			}
		}
		return tp
	}

	un := slowdowns(load("uncongested.json"), 0)
	// Non-blocking core: crossing racks adds only latency.
	if un[0] != 1 || !(un[1] > 1) || un[2] < un[1] || un[2] > 1.01*un[1] {
		t.Errorf("uncongested: slowdowns packed/same-rack/cross-rack %v, want 1 < same-rack <= cross-rack within 1 %%", un)
	}
	co := slowdowns(load("congested-core.json"), 0)
	if co[0] != 1 || co[1] != un[1] || !(co[2] > 1.5*co[1]) {
		t.Errorf("congested core: slowdowns %v, want cross-rack well above same-rack %g", co, un[1])
	}
	tv := load("time-varying.json")
	quiet, busy := slowdowns(tv, time.Hour), slowdowns(tv, 5*time.Hour)
	if quiet != un || !(busy[2] > quiet[2]) || busy[1] != quiet[1] {
		t.Errorf("time-varying: slowdowns at 1h %v and 5h %v, want cross-rack higher at 5h only", quiet, busy)
	}
	if c := tv.CongestionAt(5 * time.Hour); c.Racks["rack-v100-0"] != 0.8 || c.Spine != 0.6 {
		t.Errorf("time-varying at 5h: %+v", c)
	}
}
