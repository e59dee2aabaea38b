package netmodel

import (
	"fmt"
	"strconv"
)

// Nomad node attribute keys FromNodes reads. The sidecar sets them from a
// node's client meta block (meta { rack = "r1" ... } appears to job
// constraints as ${meta.rack}); docs/netmodel.md lists them.
const (
	// MetaRack names the node's rack when NodeInfo.Rack is empty.
	MetaRack = "meta.rack"
	// MetaGPUType is the node's GPU type (e.g. "v100"), as the scheduler
	// names types.
	MetaGPUType = "meta.hadar.gpu_type"
	// MetaGPUs is the number of GPUs on the node.
	MetaGPUs = "meta.hadar.gpus"
	// MetaNICGbps is the node uplink speed in Gbit/s.
	MetaNICGbps = "meta.hadar.nic_gbps"
	// MetaIntraGbps is the GPU-to-GPU bandwidth inside the node in Gbit/s.
	MetaIntraGbps = "meta.hadar.intra_gbps"
)

// NodeInfo is a plain description of one cluster node, as a Nomad client
// would report it: its ID, rack and attributes (meta keys included, with
// their "meta." prefix).
type NodeInfo struct {
	ID         string
	Rack       string
	Attributes map[string]string
}

// Fabric is what node meta cannot say: the shared levels of the network
// and the defaults for nodes that leave their link speeds out. Its fields
// mean what the same-named Spec fields mean.
type Fabric struct {
	IntraNode  LinkSpec
	NodeUplink LinkSpec
	RackUplink RackUplinkSpec
	Spine      LinkSpec
	Congestion []CongestionSpec
}

// FromNodes builds a Topology from node descriptions. Racks are created in
// order of first appearance, with the fabric's oversubscription.
func FromNodes(nodes []NodeInfo, f Fabric) (*Topology, error) {
	s := Spec{IntraNode: f.IntraNode, NodeUplink: f.NodeUplink, RackUplink: f.RackUplink, Spine: f.Spine, Congestion: f.Congestion}
	seen := make(map[string]bool)
	for _, n := range nodes {
		rackName := n.Rack
		if rackName == "" {
			rackName = n.Attributes[MetaRack]
		}
		if rackName == "" {
			return nil, fmt.Errorf("node %q: no rack; set NodeInfo.Rack or the node meta key %s (meta { rack = \"r0\" })", n.ID, MetaRack)
		}
		if !seen[rackName] {
			seen[rackName] = true
			s.Racks = append(s.Racks, RackSpec{Name: rackName})
		}
		ns := NodeSpec{ID: n.ID, Rack: rackName, GPUType: n.Attributes[MetaGPUType]}
		if ns.GPUType == "" {
			return nil, fmt.Errorf("node %q: %s: want the node's GPU type, e.g. \"v100\"", n.ID, MetaGPUType)
		}
		gpus, err := strconv.Atoi(n.Attributes[MetaGPUs])
		if err != nil || gpus <= 0 {
			return nil, fmt.Errorf("node %q: %s: want a positive integer, got %q", n.ID, MetaGPUs, n.Attributes[MetaGPUs])
		}
		ns.GPUs = gpus
		if ns.NICGbps, err = optionalGbps(n, MetaNICGbps); err != nil {
			return nil, err
		}
		if ns.IntraGbps, err = optionalGbps(n, MetaIntraGbps); err != nil {
			return nil, err
		}
		s.Nodes = append(s.Nodes, ns)
	}
	tp, err := NewTopology(s)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	return tp, nil
}

func optionalGbps(n NodeInfo, key string) (float64, error) {
	v, ok := n.Attributes[key]
	if !ok || v == "" {
		return 0, nil
	}
	g, err := strconv.ParseFloat(v, 64)
	if err != nil || !(g > 0) || g > 1e6 {
		return 0, fmt.Errorf("node %q: %s: want a positive speed in Gbit/s such as \"25\", got %q", n.ID, key, v)
	}
	return g, nil
}
