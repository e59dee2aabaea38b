package netmodel

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Gbps converts gigabits per second, the unit of topology files and node
// meta, into bytes per second, the unit of every computation here.
func Gbps(g float64) float64 { return g * 1e9 / 8 }

// Topology is a validated, immutable cluster network. Build one with
// NewTopology, ParseTopology, LoadTopologyFile or FromNodes; it is safe for
// concurrent use.
type Topology struct {
	nodes []node
	byID  map[string]int
	racks []rack

	intraLat float64 // one hop between two GPUs of one node, s
	nodeLat  float64 // one way node <-> top-of-rack switch, s
	rackLat  float64 // one way top-of-rack switch <-> spine, s
	spineBW  float64 // aggregate spine capacity, bytes/s
	spineLat float64 // spine traversal, s

	schedule []congestionState // sorted by at; before the first: none
	refs     map[string]typeRef
}

type node struct {
	id      string
	gpuType string
	rack    int
	gpus    int
	intraBW float64 // GPU-to-GPU inside the node, bytes/s
	nicBW   float64 // node uplink to its top-of-rack switch, bytes/s
}

type rack struct {
	name     string
	uplinkBW float64 // top-of-rack switch to spine, bytes/s
}

// congestionState is the background load from at on: the fraction of each
// link's capacity that other tenants take.
type congestionState struct {
	at    time.Duration
	spine float64
	node  float64   // every node uplink
	rack  []float64 // per rack index
}

// typeRef holds the best links a GPU type can get in this topology; the
// consolidated reference placement and Sensitivity are priced on them.
type typeRef struct {
	maxGPUs int
	intraBW float64
	nicBW   float64
	rackBW  float64
	racks   int // racks holding the type
}

// NodeCount is the number of nodes.
func (tp *Topology) NodeCount() int { return len(tp.nodes) }

// RackNames lists the racks in declaration order.
func (tp *Topology) RackNames() []string {
	out := make([]string, len(tp.racks))
	for i, r := range tp.racks {
		out[i] = r.name
	}
	return out
}

// NodeSummary is a read-only view of one node.
type NodeSummary struct {
	ID      string
	Rack    string
	GPUType string
	GPUs    int
	// IntraBandwidth and UplinkBandwidth are in bytes/s.
	IntraBandwidth  float64
	UplinkBandwidth float64
}

// Nodes lists the nodes in declaration order.
func (tp *Topology) Nodes() []NodeSummary {
	out := make([]NodeSummary, len(tp.nodes))
	for i, n := range tp.nodes {
		out[i] = NodeSummary{ID: n.id, Rack: tp.racks[n.rack].name, GPUType: n.gpuType, GPUs: n.gpus,
			IntraBandwidth: n.intraBW, UplinkBandwidth: n.nicBW}
	}
	return out
}

// RackUplinkBandwidth is the capacity of a rack's uplink to the spine in
// bytes/s, after oversubscription.
func (tp *Topology) RackUplinkBandwidth(rackName string) (float64, bool) {
	for _, r := range tp.racks {
		if r.name == rackName {
			return r.uplinkBW, true
		}
	}
	return 0, false
}

// Congestion is the background load at one instant, as fractions of link
// capacity taken by other traffic.
type Congestion struct {
	Spine float64
	Node  float64
	Racks map[string]float64
}

// CongestionAt reports the background load in force at time t.
func (tp *Topology) CongestionAt(t time.Duration) Congestion {
	c := Congestion{Racks: make(map[string]float64, len(tp.racks))}
	s := tp.stateAt(t)
	if s == nil {
		for _, r := range tp.racks {
			c.Racks[r.name] = 0
		}
		return c
	}
	c.Spine, c.Node = s.spine, s.node
	for i, r := range tp.racks {
		c.Racks[r.name] = s.rack[i]
	}
	return c
}

// stateAt returns the congestion entry in force at t, nil before the first.
func (tp *Topology) stateAt(t time.Duration) *congestionState {
	i := sort.Search(len(tp.schedule), func(i int) bool { return tp.schedule[i].at > t })
	if i == 0 {
		return nil
	}
	return &tp.schedule[i-1]
}

// WithCongestion returns a copy of tp whose schedule is replaced by one
// constant background load from time zero. Simulators use it to sweep
// congestion levels without writing files.
func (tp *Topology) WithCongestion(c Congestion) (*Topology, error) {
	if err := checkFraction("spine", c.Spine); err != nil {
		return nil, err
	}
	if err := checkFraction("node", c.Node); err != nil {
		return nil, err
	}
	st := congestionState{spine: c.Spine, node: c.Node, rack: make([]float64, len(tp.racks))}
	idx := make(map[string]int, len(tp.racks))
	for i, r := range tp.racks {
		idx[r.name] = i
	}
	for name, f := range c.Racks {
		i, ok := idx[name]
		if !ok {
			return nil, fmt.Errorf("congestion racks[%q]: no such rack; use one of %v", name, tp.RackNames())
		}
		if err := checkFraction(fmt.Sprintf("racks[%q]", name), f); err != nil {
			return nil, err
		}
		st.rack[i] = f
	}
	cp := *tp
	cp.schedule = []congestionState{st}
	return &cp, nil
}

// maxCongestion bounds background load below 1 so that every link keeps
// some capacity and every time stays finite.
const maxCongestion = 0.99

func checkFraction(field string, f float64) error {
	if math.IsNaN(f) || f < 0 || f > maxCongestion {
		return fmt.Errorf("%s: want a fraction of capacity in [0, %g], got %g", field, maxCongestion, f)
	}
	return nil
}
