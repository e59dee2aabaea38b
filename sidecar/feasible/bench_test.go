package feasible

import (
	"fmt"
	"maps"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

// benchCluster is 500 nodes of eight GPUs each (V100, A100 or K80), in two
// datacenters and 25 racks, with 2,000 allocations of jobs hadar does not
// manage, and 1,000 managed jobs with a mix of constraints.
func benchCluster(b *testing.B) (*watch.Snapshot, []*watch.Job) {
	models := []watch.GPUGroup{gpus(v100, 16384, "7.0", 8, 0), gpus(a100, 40960, "8.0", 8, 0), gpus(k80, 12288, "3.7", 8, 0)}
	snap := &watch.Snapshot{Nodes: map[string]*watch.Node{}, Jobs: map[watch.JobKey]*watch.Job{}, Usage: map[string]*watch.Usage{}}
	for i := range 500 {
		id := fmt.Sprintf("node-%03d", i)
		snap.Nodes[id] = node(id, withGPUs(models[i%3]), func(n *watch.Node) {
			n.Datacenter = []string{"dc1", "dc2"}[i%2]
			n.Meta["rack"] = fmt.Sprintf("r%02d", i/20)
			n.Resources = watch.Resources{CPU: 64000, MemoryMB: 512 * 1024, DiskMB: 1 << 20}
		})
	}
	for i := range 2000 {
		id := fmt.Sprintf("alloc-%04d", i)
		snap.Usage[id] = &watch.Usage{AllocID: id, NodeID: fmt.Sprintf("node-%03d", i%500), Job: watch.JobKey{Namespace: "default", ID: "service"},
			Resources: watch.Resources{CPU: 500, MemoryMB: 2048, DiskMB: 300}}
	}
	var jobs []*watch.Job
	for i := range 1000 {
		j := trainJob(fmt.Sprintf("job-%04d", i), []string{"nvidia/gpu", "nvidia/gpu/" + v100, "gpu"}[i%3], func(j *api.Job) {
			j.Datacenters = []string{"dc*"}
			j.Constrain(&api.Constraint{LTarget: "${attr.kernel.name}", Operand: "=", RTarget: "linux"})
			group(j).Constrain(&api.Constraint{LTarget: "${meta.rack}", Operand: "regexp", RTarget: fmt.Sprintf("^r[0-%d]", 1+i%9)})
			if i%2 == 0 {
				d := gpuTask(j).Resources.Devices[0]
				d.Constraints = append(d.Constraints, &api.Constraint{LTarget: "${device.attr.memory}", Operand: ">=", RTarget: "12 GiB"})
			}
			gpuTask(j).Resources.MemoryMB = ptr(4096)
		})
		wj := managedJob(b, j)
		snap.Jobs[wj.Key()] = wj
		jobs = append(jobs, wj)
	}
	return snap, jobs
}

// BenchmarkEvaluate: one planning cycle, every managed job evaluated.
// fresh: Evaluate, no cache. cold: a new Evaluator (the sidecar's first
// cycle). unchanged: nothing changed since the last cycle. node-changed:
// one node changed since (its GPUs' health, say). usage-changed: an
// allocation of a job hadar does not plan started on one node.
func BenchmarkEvaluate(b *testing.B) {
	snap, jobs := benchCluster(b)
	name := "jobs=1000/nodes=500/"
	cycle := func(e *Evaluator, s *watch.Snapshot) {
		for _, j := range jobs {
			if r := e.Evaluate(j, s); r.Why != "" {
				b.Fatalf("job %s: %s", j.ID, r.Why)
			}
		}
	}
	b.Run(name+"fresh", func(b *testing.B) {
		for b.Loop() {
			for _, j := range jobs {
				if r := Evaluate(j.Raw, *j.Spec, snap, typeOf); r.Why != "" {
					b.Fatal(r.Why)
				}
			}
		}
	})
	b.Run(name+"cold", func(b *testing.B) {
		for b.Loop() {
			cycle(NewEvaluator(typeOf), snap)
		}
	})
	b.Run(name+"unchanged", func(b *testing.B) {
		e := NewEvaluator(typeOf)
		cycle(e, snap)
		for b.Loop() {
			cycle(e, snap)
		}
	})
	b.Run(name+"node-changed", func(b *testing.B) {
		e := NewEvaluator(typeOf)
		cycle(e, snap)
		i := 0
		for b.Loop() {
			next := *snap
			next.Nodes = maps.Clone(snap.Nodes)
			id := fmt.Sprintf("node-%03d", i%500)
			n := *snap.Nodes[id]
			n.ModifyIndex = uint64(i + 1)
			next.Nodes[id] = &n
			cycle(e, &next)
			i++
		}
	})
	b.Run(name+"usage-changed", func(b *testing.B) {
		e := NewEvaluator(typeOf)
		cycle(e, snap)
		i := 0
		for b.Loop() {
			next := *snap
			next.Usage = maps.Clone(snap.Usage)
			next.Usage["new"] = &watch.Usage{AllocID: "new", NodeID: fmt.Sprintf("node-%03d", i%500), Job: watch.JobKey{Namespace: "default", ID: "batch"},
				Resources: watch.Resources{CPU: 100 + int64(i), MemoryMB: 256}}
			cycle(e, &next)
			i++
		}
	})
}
