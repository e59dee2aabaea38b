// Package demo runs hadar for a person: a Nomad cluster on loopback with
// declared heterogeneous GPUs, the hadar sidecar, a mixed workload from
// jobspecs/, live progress in the terminal, the same workload under Nomad's
// own placement, the simulator's prediction of both, and a summary
// (docs/demo.md). cmd/hadar-demo is its command.
package demo

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/config"
)

// The GPU models the demo declares, as hadar-gpu reports them and as the
// sidecar's type rules read them (v100, p100, k80).
const (
	V100 = "Tesla V100-SXM2-16GB"
	P100 = "Tesla P100-PCIE-16GB"
	K80  = "Tesla K80"
)

var memoryOf = map[string]string{V100: "16GiB", P100: "16GiB", K80: "12GiB"}

// GPUs is a number of declared GPUs of one model.
type GPUs struct {
	Model string
	Count int
}

// NodeSpec is one client agent: its name, its rack (node meta "rack") and
// the GPUs hadar-gpu declares on it.
type NodeSpec struct {
	Name string
	Rack string
	GPUs []GPUs
}

// Cluster is the demo's cluster: two racks, four nodes, three GPU
// generations, 16 GPUs. Mixed nodes make the choice of node matter as much
// as the choice of type.
var Cluster = []NodeSpec{
	{Name: "v100-a", Rack: "r1", GPUs: []GPUs{{V100, 4}}},
	{Name: "mix-a", Rack: "r1", GPUs: []GPUs{{V100, 2}, {P100, 2}}},
	{Name: "mix-b", Rack: "r2", GPUs: []GPUs{{P100, 2}, {K80, 2}}},
	{Name: "k80-a", Rack: "r2", GPUs: []GPUs{{K80, 4}}},
}

// gpuTypes maps a device model to the planner's type name by the
// sidecar's own rules, so the demo and the sidecar never disagree.
var gpuTypes = config.NewGPUTypes(nil)

// TypeOf returns the planner GPU type of a device model ("" if unknown).
func TypeOf(model string) planner.GPUType { return gpuTypes.Type(model) }

// PlannerCluster is the cluster as the planner sees it, node IDs being the
// node names: what the simulator's predictions run on.
func PlannerCluster(nodes []NodeSpec) planner.Cluster {
	var c planner.Cluster
	for _, n := range nodes {
		pn := planner.Node{ID: n.Name, Rack: n.Rack, GPUs: map[planner.GPUType]int{}}
		for _, g := range n.GPUs {
			pn.GPUs[TypeOf(g.Model)] += g.Count
		}
		c.Nodes = append(c.Nodes, pn)
	}
	return c
}

// Capacity returns the GPUs of each type in the cluster.
func Capacity(nodes []NodeSpec) map[planner.GPUType]int {
	out := map[planner.GPUType]int{}
	for _, n := range nodes {
		for _, g := range n.GPUs {
			out[TypeOf(g.Model)] += g.Count
		}
	}
	return out
}

// Ports are the loopback ports of one agent.
type Ports struct{ HTTP, RPC, Serf int }

// agentConfig renders a Nomad agent's configuration: loopback only, the
// fingerprinters and drivers this kind of machine cannot run left out (the
// cloud fingerprinters fail without a metadata service; no docker, java or
// qemu), and for a client the servers to join, its node meta and both of
// hadar's plugins. server is false for a client.
func agentConfig(name string, p Ports, server bool, servers []string, meta map[string]string, plugins map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name = %q\nbind_addr = \"127.0.0.1\"\ndisable_update_check = true\nlog_level = \"INFO\"\n", name)
	fmt.Fprintf(&b, "ports {\n  http = %d\n  rpc  = %d\n  serf = %d\n}\n", p.HTTP, p.RPC, p.Serf)
	// Outside dev mode Nomad refuses to advertise a loopback address.
	b.WriteString("advertise {\n  http = \"127.0.0.1\"\n  rpc  = \"127.0.0.1\"\n  serf = \"127.0.0.1\"\n}\n")
	if server {
		b.WriteString("server {\n  enabled          = true\n  bootstrap_expect = 1\n}\n")
		return b.String()
	}
	quoted := make([]string, len(servers))
	for i, s := range servers {
		quoted[i] = fmt.Sprintf("%q", s)
	}
	fmt.Fprintf(&b, "client {\n  enabled           = true\n  network_interface = \"lo\"\n  servers           = [%s]\n", strings.Join(quoted, ", "))
	b.WriteString("  options = {\n    \"fingerprint.denylist\" = \"env_aws,env_gce,env_azure,env_digitalocean\"\n    \"driver.denylist\"      = \"docker,java,qemu\"\n  }\n")
	b.WriteString("  meta {\n")
	for _, k := range sortedKeys(meta) {
		fmt.Fprintf(&b, "    %q = %q\n", k, meta[k])
	}
	b.WriteString("  }\n}\n")
	for _, k := range sortedKeys(plugins) {
		fmt.Fprintf(&b, "plugin %q {\n  config {\n%s  }\n}\n", k, plugins[k])
	}
	return b.String()
}

// gpuInventory is hadar-gpu's declared inventory of a node.
func gpuInventory(n NodeSpec) string {
	var b strings.Builder
	b.WriteString("    fingerprint_period = \"5s\"\n")
	for _, g := range n.GPUs {
		for i := range g.Count {
			fmt.Fprintf(&b, "    gpu {\n      id     = \"%s-%s-%d\"\n      model  = %q\n      memory = %q\n    }\n",
				n.Name, TypeOf(g.Model), i, g.Model, memoryOf[g.Model])
		}
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
