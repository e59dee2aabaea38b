package belief

import (
	"maps"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/hadar-sched/hadar/netmodel"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
)

// Node is what the network knows of a node: its rack, its GPUs per type,
// and its meta (hadar.nic_gbps and hadar.intra_gbps give its link speeds,
// netmodel.MetaNICGbps without the "meta." prefix).
type Node struct {
	ID   string
	Rack string
	GPUs map[planner.GPUType]int
	Meta map[string]string
}

// Network is the speed.Network a live scheduler plans with: what it costs
// a unit to sit on several nodes, from each node's rack and link speeds and
// each job's declared network sensitivity.
//
//   - One node: no slowdown.
//   - A job that declares a sensitivity (hadar.sensitivity > 1): within a
//     rack, the profile's spread penalty (consolidated over spread
//     throughput, the worst over the unit's types); across racks, its
//     sensitivity when larger.
//   - Any other job ("auto"): the network model (netmodel) prices the
//     unit on the topology built from the nodes (FromNodes: racks, GPUs,
//     link speeds from node meta, the fabric for the rest), with the job's
//     communication calibrated on Gavel's measurements for its model
//     family (its declared model for a job that declares figures); where
//     it cannot price (a family it has no size for, a topology it cannot
//     build), the profile's spread penalty.
//
// Safe for concurrent use.
type Network struct {
	prof   *Profile
	fabric netmodel.Fabric
	rep    func() (*netmodel.CalibrationReport, error)

	mu    sync.RWMutex
	nodes map[string]Node
	sens  map[string]float64 // job ID -> declared cross-rack slowdown
	// nm prices on the current topology (nil: none could be built);
	// stale: the nodes changed since it was built.
	nm    *placement.Network
	stale bool
	// tried are the (model, width) pairs calibrated or found unpriceable.
	tried map[modelWidth]bool
}

type modelWidth struct {
	model string
	k     int
}

// DefaultFabric is the network between nodes when nothing says otherwise:
// Gavel's testbed as the calibration fits it (an effective inter-server
// bandwidth, non-blocking racks and spine).
func DefaultFabric(rep *netmodel.CalibrationReport) netmodel.Fabric {
	return netmodel.Fabric{
		IntraNode:  netmodel.LinkSpec{Gbps: 80, LatencyUS: 5},
		NodeUplink: netmodel.LinkSpec{Gbps: rep.BandwidthGbps, LatencyUS: 10},
		RackUplink: netmodel.RackUplinkSpec{LatencyUS: 20, Oversubscription: 1},
		Spine:      netmodel.LinkSpec{LatencyUS: 5},
	}
}

// NewNetwork returns a network over prof; fabric nil means DefaultFabric.
func NewNetwork(prof *Profile, fabric *netmodel.Fabric) (*Network, error) {
	rep, err := netmodel.DefaultCalibration()
	if err != nil {
		return nil, err
	}
	n := &Network{prof: prof, rep: func() (*netmodel.CalibrationReport, error) { return rep, nil },
		nodes: map[string]Node{}, sens: map[string]float64{}, tried: map[modelWidth]bool{}}
	n.fabric = DefaultFabric(rep)
	if fabric != nil {
		n.fabric = *fabric
	}
	return n, nil
}

// SetNode records a node or its change (the same node again changes
// nothing: the sidecar sets every node each cycle).
func (n *Network) SetNode(nd Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.nodes[nd.ID]; ok && old.Rack == nd.Rack && maps.Equal(old.GPUs, nd.GPUs) &&
		old.Meta[nicKey] == nd.Meta[nicKey] && old.Meta[intraKey] == nd.Meta[intraKey] {
		return
	}
	n.nodes[nd.ID] = Node{ID: nd.ID, Rack: nd.Rack, GPUs: maps.Clone(nd.GPUs),
		Meta: map[string]string{nicKey: nd.Meta[nicKey], intraKey: nd.Meta[intraKey]}}
	n.stale = true
}

// The node meta keys of link speeds (netmodel's, without "meta.").
var (
	nicKey   = strings.TrimPrefix(netmodel.MetaNICGbps, "meta.")
	intraKey = strings.TrimPrefix(netmodel.MetaIntraGbps, "meta.")
)

// RemoveNode forgets a node.
func (n *Network) RemoveNode(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.nodes[id]; ok {
		delete(n.nodes, id)
		n.stale = true
	}
}

// Rack is the rack of a node as last set ("" when unknown).
func (n *Network) Rack(id string) string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.nodes[id].Rack
}

// SetSensitivity records a job's declared cross-rack slowdown (<= 1:
// none, the network model decides).
func (n *Network) SetSensitivity(job string, s float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s > 1 {
		n.sens[job] = s
	} else {
		delete(n.sens, job)
	}
}

// Slowdown implements speed.Network.
func (n *Network) Slowdown(job planner.Job, u planner.Unit, now float64) float64 {
	if u.Nodes() <= 1 {
		return 1
	}
	n.mu.RLock()
	sens, declared := n.sens[job.ID]
	n.mu.RUnlock()
	if !declared {
		if s, ok := n.price(job, u, now); ok {
			return s
		}
	}
	slow := n.spreadPenalty(job, u)
	if declared && n.racks(u) > 1 {
		slow = math.Max(slow, sens)
	}
	return slow
}

// price is the network model's slowdown of u (calibrating the job's model
// and width on first use); ok is false when it cannot price it.
func (n *Network) price(job planner.Job, u planner.Unit, now float64) (float64, bool) {
	key := modelWidth{job.Model, u.GPUs()}
	n.mu.RLock()
	if !n.stale && n.tried[key] {
		defer n.mu.RUnlock()
		if n.nm == nil || !n.nm.Calibrated(key.model, key.k) {
			return 0, false
		}
		return n.nm.Slowdown(job, u, now), true
	}
	n.mu.RUnlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stale {
		n.rebuild()
	}
	if n.nm == nil {
		return 0, false
	}
	if !n.tried[key] {
		n.tried[key] = true
		n.calibrate(key)
	}
	if !n.nm.Calibrated(key.model, key.k) {
		return 0, false
	}
	return n.nm.Slowdown(job, u, now), true
}

// calibrate prices key's units from now on, when the calibration knows
// the model's family; otherwise they stay unpriced (the spread penalty
// applies). Called under n.mu.
func (n *Network) calibrate(key modelWidth) {
	family := n.prof.Family(key.model)
	rep, err := n.rep()
	if err != nil || family == "" {
		return
	}
	if _, ok := rep.Family(netmodel.ModelFamily(family)); !ok {
		return
	}
	// An error leaves it unpriced, as above.
	_ = n.nm.Calibrate(rep, n.prof, key.model, family, key.k, n.types())
}

// spreadPenalty is the profile's consolidated over spread throughput, the
// worst over the unit's types.
func (n *Network) spreadPenalty(job planner.Job, u planner.Unit) float64 {
	slow := 1.0
	for _, t := range u.Types() {
		c, err1 := n.prof.Throughput(job.Model, u.GPUs(), t, false)
		s, err2 := n.prof.Throughput(job.Model, u.GPUs(), t, true)
		if err1 == nil && err2 == nil && c > 0 && s > 0 {
			slow = math.Max(slow, c/s)
		}
	}
	return slow
}

func (n *Network) racks(u planner.Unit) int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	seen := map[string]bool{}
	for _, sl := range u.Slots {
		seen[n.nodes[sl.Node].Rack] = true
	}
	return len(seen)
}

// rebuild makes the topology from the nodes. Called under n.mu.
func (n *Network) rebuild() {
	n.stale = false
	ids := make([]string, 0, len(n.nodes))
	for id := range n.nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var infos []netmodel.NodeInfo
	for _, id := range ids {
		nd := n.nodes[id]
		typ, gpus, best := planner.GPUType(""), 0, 0
		for _, t := range sortedTypes(nd.GPUs) {
			c := nd.GPUs[t]
			gpus += c
			if c > best {
				typ, best = t, c
			}
		}
		if gpus == 0 {
			continue
		}
		attrs := map[string]string{netmodel.MetaGPUType: string(typ), netmodel.MetaGPUs: strconv.Itoa(gpus)}
		if v := nd.Meta[nicKey]; v != "" {
			attrs[netmodel.MetaNICGbps] = v
		}
		if v := nd.Meta[intraKey]; v != "" {
			attrs[netmodel.MetaIntraGbps] = v
		}
		infos = append(infos, netmodel.NodeInfo{ID: id, Rack: nd.Rack, Attributes: attrs})
	}
	var tp *netmodel.Topology
	if len(infos) > 0 {
		tp, _ = netmodel.FromNodes(infos, n.fabric)
	}
	// Calibrations start afresh: the cluster's types may have changed.
	n.tried, n.nm = map[modelWidth]bool{}, nil
	if tp != nil {
		n.nm = placement.EmptyNetwork(tp)
	}
	// Without a topology (a link speed that does not parse) the spread
	// penalty stands in until the nodes change.
}

// types lists the GPU types of the nodes. Called under n.mu.
func (n *Network) types() []planner.GPUType {
	seen := map[planner.GPUType]int{}
	for _, nd := range n.nodes {
		for t, c := range nd.GPUs {
			seen[t] += c
		}
	}
	return sortedTypes(seen)
}

func sortedTypes(m map[planner.GPUType]int) []planner.GPUType {
	out := make([]planner.GPUType, 0, len(m))
	for t, c := range m {
		if c > 0 {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
