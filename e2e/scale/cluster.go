// Package scale runs hadar's sidecar at cluster scale against a real Nomad
// server: one server-only agent (bin/nomad), hundreds of simulated client
// nodes with GPUs (e2e/tools/nomad/nodesim, in its own process), the
// sidecar in this process, and a Gavel-style continuous trace of managed
// jobs; it measures the control loop (round latency, time to placement,
// writes, CPU and memory) and the schedule (makespan, JCT) against `hadar
// sim` on the same trace and cluster, and against Nomad's own placement of
// the same jobs. `make scale` runs it (TestScale); the numbers are in
// docs/results.md.
package scale

import (
	"fmt"

	"github.com/hadar-sched/hadar/planner"
)

// GPUKind is one GPU generation of the simulated cluster: the planner's type,
// the device model the node reports (the names hadar's built-in rules map,
// as e2e/sidecar_test.go's declared GPUs), and how many a node of that kind
// holds.
type GPUKind struct {
	Type      planner.GPUType
	Model     string
	MemoryMiB int64
	PerNode   int
}

// Kinds are the cluster's node kinds, in the order nodes cycle through
// them.
var Kinds = []GPUKind{
	{Type: "v100", Model: "Tesla V100-SXM2-16GB", MemoryMiB: 16384, PerNode: 8},
	{Type: "p100", Model: "Tesla P100-PCIE-16GB", MemoryMiB: 16384, PerNode: 4},
	{Type: "k80", Model: "Tesla K80", MemoryMiB: 12288, PerNode: 8},
}

// ModelOf maps a planner type to its device model.
func ModelOf(t planner.GPUType) string {
	for _, k := range Kinds {
		if k.Type == t {
			return k.Model
		}
	}
	return ""
}

// Spec is nodesim's cluster spec (e2e/tools/nomad/nodesim.Spec, JSON).
// The node simulator lives in the Nomad wrapper module, which this module
// does not import: the JSON shape is the contract, repeated here.
type Spec struct {
	Datacenter string     `json:"datacenter,omitempty"`
	Nodes      []NodeSpec `json:"nodes"`
}

// NodeSpec is one node of a Spec.
type NodeSpec struct {
	Name    string    `json:"name"`
	Rack    string    `json:"rack"`
	Address string    `json:"address"`
	GPUs    []GPUSpec `json:"gpus"`
}

// GPUSpec is a node's group of identical GPUs.
type GPUSpec struct {
	Model     string `json:"model"`
	Count     int    `json:"count"`
	MemoryMiB int64  `json:"memory_mib"`
}

// Cluster is the simulated cluster as nodesim runs it and as the simulator
// plans it: the same nodes, racks and GPUs.
type Cluster struct {
	Spec    Spec
	Planner planner.Cluster
}

// NewCluster lays out n nodes in racks: node i is of kind i mod 3 and sits
// in rack i*racks/n, so every rack mixes the three generations (the
// heterogeneous racks hadar's placement chooses among).
func NewCluster(n, racks int) (Cluster, error) {
	if n <= 0 || racks <= 0 || racks > n {
		return Cluster{}, fmt.Errorf("cluster: %d nodes in %d racks: want 1 <= racks <= nodes", n, racks)
	}
	if n > 250*250 {
		return Cluster{}, fmt.Errorf("cluster: %d nodes: at most %d (one 10.x.y.z address each)", n, 250*250)
	}
	var c Cluster
	for i := range n {
		k := Kinds[i%len(Kinds)]
		name := fmt.Sprintf("sim-%04d", i)
		rack := fmt.Sprintf("r%02d", i*racks/n)
		c.Spec.Nodes = append(c.Spec.Nodes, NodeSpec{Name: name, Rack: rack, Address: fmt.Sprintf("10.0.%d.%d", i/250, 1+i%250),
			GPUs: []GPUSpec{{Model: k.Model, Count: k.PerNode, MemoryMiB: k.MemoryMiB}}})
		c.Planner.Nodes = append(c.Planner.Nodes, planner.Node{ID: name, Rack: rack, GPUs: map[planner.GPUType]int{k.Type: k.PerNode}})
	}
	return c, nil
}
