package placement

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// BenchmarkPlace is the placer's hot path: one Place call for a 4-GPU
// sensitive job on the 108-GPU example cluster (27 nodes, 9 racks),
// fragmented so that no node can hold it, priced by the network model.
func BenchmarkPlace(b *testing.B) {
	jb := planner.Job{ID: "j", Model: sensitive, ScaleFactor: 4, TotalSteps: 1e6, Weight: 1}
	nw, c := exampleNetwork(b, "congested-core.json", []planner.Job{jb})
	m := speed.Model{Profile: model().Profile, Network: nw}
	frag := round.NewPool(c)
	for _, n := range c.Nodes {
		for t := range n.GPUs {
			frag.Take(planner.Unit{Slots: []planner.Slot{{Node: n.ID, Type: t, Count: 2}}})
		}
	}
	for _, name := range []string{Pack, Consolidate, Spread, Delay, DelayAutotune} {
		b.Run(name, func(b *testing.B) {
			p := newPolicy(b, name, Config{Speed: m, MaxPreemptions: -1})
			v := &round.View{Now: 0, Round: 360, Types: c.Types(), Cluster: c, Pool: frag,
				Jobs: []*round.JobView{{Job: jb, Remaining: 1e6, Throughput: []float64{1, 1, 1}, Received: make([]float64, 3)}}}
			for b.Loop() {
				// Hand the GPUs back so every iteration sees the same pool.
				if u := p.Place(v, "v100", []int{0})[0]; len(u.Slots) > 0 {
					frag.Release(u)
				}
			}
		})
	}
}

// BenchmarkSlowdown prices one cross-rack 4-GPU unit.
func BenchmarkSlowdown(b *testing.B) {
	jb := planner.Job{ID: "j", Model: sensitive, ScaleFactor: 4, TotalSteps: 1e6, Weight: 1}
	nw, _ := exampleNetwork(b, "congested-core.json", []planner.Job{jb})
	u := planner.Unit{Slots: []planner.Slot{{Node: "v100-0", Type: "v100", Count: 2}, {Node: "v100-3", Type: "v100", Count: 2}}}
	for b.Loop() {
		nw.Slowdown(jb, u, 3600)
	}
}
