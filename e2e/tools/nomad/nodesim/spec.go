// Package nodesim simulates Nomad client nodes with GPUs against a real
// Nomad server, for hadar's scale tests: hundreds of nodes in one small
// process.
//
// It speaks the server's node RPCs itself, as a Nomad client does
// (Node.Register, Node.UpdateStatus, Node.GetClientAllocs, Alloc.GetAllocs,
// Node.UpdateAlloc), over Nomad's own connection pool and msgpack codec,
// one multiplexed connection per node. Each node carries GPU device groups
// shaped like hadar-gpu's (vendor "nvidia", type "gpu", the model as the
// group name, healthy instances with IDs, a memory attribute), a rack in
// its node meta, its own address and a task driver named by
// Config.Driver. It does not run the real client package: a real client
// per node fingerprints the host, keeps a state database, runs alloc and
// task runners and stats collectors, which costs megabytes and CPU per
// node; the RPC level is what the server sees of a client, and that is
// what a scale test of the server and hadar's sidecar needs.
//
// Allocations placed on a simulated node run as simulated training tasks
// (see world): the workers of a unit start making progress once all of
// them run (a rendezvous), after a restart delay, at the throughput of the
// slowest worker's GPU model given in the task config, time-compressed;
// when the job's steps are done every worker completes (exit 0). An
// allocation Nomad stops ends at once as complete and its job keeps the
// steps done (a checkpoint). The training progress file hadar's sidecar
// reads through /v1/client/fs/cat is served over the node's connection
// (the server forwards FileSystem.Stream to the node, as to a real one).
package nodesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// Spec is a simulated cluster: its nodes, each with a rack, an address
// and GPUs.
type Spec struct {
	// Datacenter of every node; default "dc1".
	Datacenter string     `json:"datacenter,omitempty"`
	Nodes      []NodeSpec `json:"nodes"`
}

// NodeSpec is one simulated node.
type NodeSpec struct {
	// Name is the node name, unique in the spec.
	Name string `json:"name"`
	// Rack is the node meta "rack".
	Rack string `json:"rack"`
	// Address is the node's IPv4 address: its unique.network.ip-address
	// and the host network Nomad reserves ports on. Nothing listens
	// there; every node has its own, so static ports never collide.
	Address string `json:"address"`
	// GPUs are the node's device groups, one per model.
	GPUs []GPUSpec `json:"gpus"`
}

// GPUSpec is a group of identical GPUs on a node.
type GPUSpec struct {
	// Model is the device group name, e.g. "Tesla V100-SXM2-16GB".
	Model     string `json:"model"`
	Count     int    `json:"count"`
	MemoryMiB int64  `json:"memory_mib"`
}

// LoadSpec reads a JSON spec file and validates it.
func LoadSpec(path string) (Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, fmt.Errorf("nodesim spec: %w", err)
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return Spec{}, fmt.Errorf("nodesim spec %s: %w", path, err)
	}
	if err := s.Validate(); err != nil {
		return Spec{}, fmt.Errorf("nodesim spec %s: %w", path, err)
	}
	return s, nil
}

// Validate reports the first thing wrong with the spec.
func (s Spec) Validate() error {
	if len(s.Nodes) == 0 {
		return errors.New("no nodes: want at least one entry in nodes")
	}
	names, addrs := map[string]bool{}, map[string]bool{}
	for i, n := range s.Nodes {
		where := fmt.Sprintf("node %d (%q)", i, n.Name)
		switch {
		case strings.TrimSpace(n.Name) == "":
			return fmt.Errorf("node %d: name is empty", i)
		case names[n.Name]:
			return fmt.Errorf("%s: name given twice: node names must be unique", where)
		case addrs[n.Address]:
			return fmt.Errorf("%s: address %s given twice: every node needs its own, or static ports would collide", where, n.Address)
		}
		a, err := netip.ParseAddr(n.Address)
		if err != nil || !a.Is4() {
			return fmt.Errorf("%s: address %q: want an IPv4 address such as 10.0.0.1", where, n.Address)
		}
		names[n.Name], addrs[n.Address] = true, true
		models := map[string]bool{}
		for j, g := range n.GPUs {
			switch {
			case strings.TrimSpace(g.Model) == "":
				return fmt.Errorf("%s: gpus[%d]: model is empty", where, j)
			case models[g.Model]:
				return fmt.Errorf("%s: gpus[%d]: model %q given twice: one group per model", where, j, g.Model)
			case g.Count <= 0:
				return fmt.Errorf("%s: gpus[%d] (%s): count %d: want a positive number of GPUs", where, j, g.Model, g.Count)
			case g.MemoryMiB < 0:
				return fmt.Errorf("%s: gpus[%d] (%s): memory_mib %d: want >= 0", where, j, g.Model, g.MemoryMiB)
			}
			models[g.Model] = true
		}
	}
	return nil
}

// GPUs counts the spec's GPUs by model.
func (s Spec) GPUs() map[string]int {
	out := map[string]int{}
	for _, n := range s.Nodes {
		for _, g := range n.GPUs {
			out[g.Model] += g.Count
		}
	}
	return out
}
