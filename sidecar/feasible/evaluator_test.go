package feasible

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

// TestEvaluatorCaches: with nothing changed a job's Result is the one
// before; a changed node is judged again for every job, and only it; a
// new job version is read again.
func TestEvaluatorCaches(t *testing.T) {
	var nodes []*watch.Node
	for i := range 10 {
		nodes = append(nodes, node(fmt.Sprintf("n%d", i)))
	}
	a := managedJob(t, trainJob("a", "nvidia/gpu"))
	b := managedJob(t, trainJob("b", "nvidia/gpu/"+v100))
	snap := snapshot(nodes, a, b)
	e := NewEvaluator(typeOf)
	ra, rb := e.Evaluate(a, snap), e.Evaluate(b, snap)
	if st := e.Stats(); st.Judged != 20 || st.Compiled != 2 || st.Cached != 0 {
		t.Fatalf("first pass: %+v", st)
	}
	// The same snapshot, and an equal new one: nothing to redo.
	again := snapshot(nodes, a, b)
	for _, s := range []*watch.Snapshot{snap, again} {
		if r := e.Evaluate(a, s); reflect.ValueOf(r.Nodes).UnsafePointer() != reflect.ValueOf(ra.Nodes).UnsafePointer() {
			t.Fatal("a Result was computed again with nothing changed")
		}
	}
	if st := e.Stats(); st.Judged != 20 || st.Cached != 2 {
		t.Fatalf("unchanged: %+v", st)
	}

	// One node loses its GPUs: judged again for each job, alone.
	changed := maps.Clone(again.Nodes)
	changed["n3"] = node("n3", withGPUs())
	s3 := &watch.Snapshot{Nodes: changed, Jobs: again.Jobs, Usage: again.Usage}
	ra, rb = e.Evaluate(a, s3), e.Evaluate(b, s3)
	if st := e.Stats(); st.Judged != 22 {
		t.Fatalf("one node changed: %+v", st)
	}
	if len(ra.Nodes) != 9 || len(rb.Nodes) != 9 || ra.Excluded["missing devices"] != 1 {
		t.Fatalf("after n3 lost its GPUs: %+v, %+v", ra, rb)
	}
	// Usage of a job hadar does not plan changes what n5 has free.
	used := map[string]*watch.Usage{"h": {AllocID: "h", NodeID: "n5", Job: watch.JobKey{Namespace: "default", ID: "human"}, Resources: watch.Resources{MemoryMB: 15000}}}
	s4 := &watch.Snapshot{Nodes: changed, Jobs: again.Jobs, Usage: used}
	if r := e.Evaluate(a, s4); len(r.Nodes) != 8 || r.Excluded["memory exhausted"] != 1 {
		t.Fatalf("after n5 filled up: %+v", r)
	}
	if st := e.Stats(); st.Judged != 23 {
		t.Fatalf("one node's free share changed: %+v", st)
	}
	// A new version of job a is read again and judged on every node.
	a2 := managedJob(t, trainJob("a", "nvidia/gpu", func(j *api.Job) {
		j.Constrain(&api.Constraint{LTarget: "${node.unique.id}", Operand: "=", RTarget: "n1"})
	}))
	a2.JobModifyIndex = 2
	jobs := maps.Clone(s4.Jobs)
	jobs[a2.Key()] = a2
	s5 := &watch.Snapshot{Nodes: changed, Jobs: jobs, Usage: used}
	if r := e.Evaluate(a2, s5); len(r.Nodes) != 1 {
		t.Fatalf("new version: %+v", r)
	}
	if st := e.Stats(); st.Compiled != 3 || st.Judged != 33 {
		t.Fatalf("new version: %+v", st)
	}
	// A job gone from the snapshot is dropped from the cache.
	delete(jobs, b.Key())
	e.Evaluate(a2, &watch.Snapshot{Nodes: changed, Jobs: jobs, Usage: used})
	e.mu.Lock()
	_, kept := e.jobs[b.Key()]
	e.mu.Unlock()
	if kept {
		t.Fatal("the cache kept a job the snapshot no longer has")
	}
}

// TestEvaluatorMatchesEvaluate: through random walks of cluster changes
// (nodes added, removed, changed; usage; new job versions), with jobs
// evaluated now and then, and a change log long or short, the cached
// Evaluator gives exactly what a fresh Evaluate gives.
func TestEvaluatorMatchesEvaluate(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomWalk(t, seed) })
	}
}

func randomWalk(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 18))
	models := []watch.GPUGroup{gpus(v100, 16384, "7.0", 2, 0), gpus(a100, 40960, "8.0", 4, 0), gpus(k80, 12288, "3.7", 0, 2), gpus(oddGPU, 8192, "9.0", 1, 0)}
	randomNode := func(id string) *watch.Node {
		return node(id, func(n *watch.Node) {
			n.Datacenter = []string{"dc1", "dc2", "lab"}[rng.IntN(3)]
			n.NodePool = []string{"default", "gpu"}[rng.IntN(2)]
			n.Meta["rack"] = fmt.Sprintf("r%d", rng.IntN(3))
			if rng.IntN(8) == 0 {
				n.Status = "down"
			}
			n.GPUs = nil
			for _, g := range models {
				if rng.IntN(2) == 0 {
					n.GPUs = append(n.GPUs, g)
				}
			}
		})
	}
	randomJob := func(id string, version uint64) *watch.Job {
		j := trainJob(id, []string{"nvidia/gpu", "nvidia/gpu/" + v100, "gpu"}[rng.IntN(3)], func(j *api.Job) {
			if rng.IntN(2) == 0 {
				j.Datacenters = []string{"dc*"}
			}
			if rng.IntN(3) == 0 {
				j.NodePool = ptr("gpu")
			}
			if rng.IntN(2) == 0 {
				group(j).Constrain(&api.Constraint{LTarget: "${meta.rack}", Operand: "!=", RTarget: fmt.Sprintf("r%d", rng.IntN(3))})
			}
			if rng.IntN(2) == 0 {
				d := gpuTask(j).Resources.Devices[0]
				d.Constraints = append(d.Constraints, &api.Constraint{LTarget: "${device.attr.memory}", Operand: ">=", RTarget: fmt.Sprintf("%d GiB", 8+rng.IntN(40))})
			}
			gpuTask(j).Resources.MemoryMB = ptr(1024 * (1 + rng.IntN(8)))
		})
		w := managedJob(t, j)
		w.JobModifyIndex = version
		return w
	}
	snap := &watch.Snapshot{Nodes: map[string]*watch.Node{}, Jobs: map[watch.JobKey]*watch.Job{}, Usage: map[string]*watch.Usage{}}
	for i := range 12 {
		id := fmt.Sprintf("n%02d", i)
		snap.Nodes[id] = randomNode(id)
	}
	for i := range 6 {
		j := randomJob(fmt.Sprintf("j%d", i), 1)
		snap.Jobs[j.Key()] = j
	}
	e := NewEvaluator(typeOf)
	if seed%2 == 1 {
		e.maxChanges = 3 // jobs left behind by the log are judged afresh
	}
	for step := range 300 {
		next := &watch.Snapshot{Nodes: maps.Clone(snap.Nodes), Jobs: maps.Clone(snap.Jobs), Usage: maps.Clone(snap.Usage)}
		switch rng.IntN(6) {
		case 0: // a node changes
			id := fmt.Sprintf("n%02d", rng.IntN(12))
			next.Nodes[id] = randomNode(id)
		case 1: // a node leaves or comes back
			id := fmt.Sprintf("n%02d", rng.IntN(14))
			if _, ok := next.Nodes[id]; ok {
				delete(next.Nodes, id)
			} else {
				next.Nodes[id] = randomNode(id)
			}
		case 2: // usage of a job hadar does not plan
			id := fmt.Sprintf("u%d", rng.IntN(8))
			if _, ok := next.Usage[id]; ok {
				delete(next.Usage, id)
			} else {
				next.Usage[id] = &watch.Usage{AllocID: id, NodeID: fmt.Sprintf("n%02d", rng.IntN(12)), Job: watch.JobKey{Namespace: "default", ID: "human"},
					Resources: watch.Resources{CPU: int64(rng.IntN(4000)), MemoryMB: int64(rng.IntN(12000))}}
			}
		case 3: // a new job version
			id := fmt.Sprintf("j%d", rng.IntN(6))
			old := next.Jobs[watch.JobKey{Namespace: "default", ID: id}]
			j := randomJob(id, old.JobModifyIndex+1)
			next.Jobs[j.Key()] = j
		}
		snap = next
		for _, j := range snap.Jobs {
			if rng.IntN(3) == 0 {
				continue // not evaluated this step: its Result falls behind
			}
			got := e.Evaluate(j, snap)
			want := Evaluate(j.Raw, *j.Spec, snap, typeOf)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d, job %s: Evaluator\n%+v\nEvaluate\n%+v", step, j.ID, got, want)
			}
		}
	}
	if st := e.Stats(); st.Cached == 0 || st.Judged >= st.Evaluations*12/2 {
		t.Fatalf("the Evaluator did not cache: %+v", st)
	}
	t.Logf("%+v", e.Stats())
}
