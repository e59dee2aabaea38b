package netmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Spec is the topology file format (JSON). docs/netmodel.md documents every
// field; bandwidths are in Gbit/s and latencies in microseconds because that
// is how operators quote them.
type Spec struct {
	// IntraNode is the default GPU-to-GPU link inside a node (NVLink or
	// PCIe); a node's intra_gbps overrides the bandwidth.
	IntraNode LinkSpec `json:"intra_node"`
	// NodeUplink is the default node NIC to its top-of-rack switch; a
	// node's nic_gbps overrides the bandwidth.
	NodeUplink LinkSpec `json:"node_uplink"`
	// RackUplink is the default top-of-rack switch to spine link. Its
	// bandwidth, when zero, is the sum of the rack's NICs divided by the
	// oversubscription.
	RackUplink RackUplinkSpec `json:"rack_uplink"`
	// Spine is the aggregate capacity shared by all cross-rack flows; zero
	// bandwidth means non-blocking (the sum of the rack uplinks).
	Spine      LinkSpec         `json:"spine"`
	Racks      []RackSpec       `json:"racks"`
	Nodes      []NodeSpec       `json:"nodes"`
	Congestion []CongestionSpec `json:"congestion,omitempty"`
}

// LinkSpec is one level's bandwidth and one-way latency.
type LinkSpec struct {
	Gbps      float64 `json:"gbps,omitempty"`
	LatencyUS float64 `json:"latency_us,omitempty"`
}

// RackUplinkSpec is the rack uplink level: a latency, and either a fixed
// bandwidth or an oversubscription ratio (downlink:uplink).
type RackUplinkSpec struct {
	Gbps             float64 `json:"gbps,omitempty"`
	LatencyUS        float64 `json:"latency_us,omitempty"`
	Oversubscription float64 `json:"oversubscription,omitempty"`
}

// RackSpec names a rack and optionally overrides its uplink.
type RackSpec struct {
	Name             string  `json:"name"`
	UplinkGbps       float64 `json:"uplink_gbps,omitempty"`
	Oversubscription float64 `json:"oversubscription,omitempty"`
}

// NodeSpec is one node: its rack, GPU type and count, and optional link
// overrides.
type NodeSpec struct {
	ID        string  `json:"id"`
	Rack      string  `json:"rack"`
	GPUType   string  `json:"gpu_type"`
	GPUs      int     `json:"gpus"`
	NICGbps   float64 `json:"nic_gbps,omitempty"`
	IntraGbps float64 `json:"intra_gbps,omitempty"`
}

// CongestionSpec sets the background load from At on, until the next
// entry. Each entry states the whole load: fields left out are zero, they
// do not carry over from the previous entry.
type CongestionSpec struct {
	// At is a Go duration from the start of the run ("0s", "90m", "2h").
	At string `json:"at"`
	// Spine, RackUplink and NodeUplink are fractions of capacity in [0, 0.99].
	Spine      float64 `json:"spine,omitempty"`
	RackUplink float64 `json:"rack_uplink,omitempty"`
	NodeUplink float64 `json:"node_uplink,omitempty"`
	// Racks overrides RackUplink for the named racks.
	Racks map[string]float64 `json:"racks,omitempty"`
}

// maxTopologyBytes bounds the file a loader reads, so a wrong path to a huge
// file fails fast instead of eating memory.
const maxTopologyBytes = 64 << 20

// LoadTopologyFile reads and validates a topology file; errors name the file.
func LoadTopologyFile(path string) (*Topology, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxTopologyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	if len(data) > maxTopologyBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes; a topology file lists nodes, not data", filepath.Base(path), maxTopologyBytes)
	}
	return ParseTopology(filepath.Base(path), data)
}

// ParseTopology decodes and validates a topology file's contents; name
// prefixes every error (usually the file's base name).
func ParseTopology(name string, data []byte) (*Topology, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%s: %w", name, describeJSONError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: data after the topology object; a file holds exactly one JSON object", name)
	}
	tp, err := NewTopology(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return tp, nil
}

func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%s: want a JSON %s, got %s", te.Field, te.Type, te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("byte %d: invalid JSON: %w", se.Offset, err)
	}
	return fmt.Errorf("invalid topology: %w (see docs/netmodel.md for the fields)", err)
}

func positive(field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return fmt.Errorf("%s: want a positive number, got %g", field, v)
	}
	return nil
}

func nonNegative(field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("%s: want zero or a positive number, got %g", field, v)
	}
	return nil
}

// NewTopology validates a Spec and builds the Topology. Errors name the
// field by its JSON path and say what would fix it.
func NewTopology(s Spec) (*Topology, error) {
	if err := positive("intra_node.gbps", s.IntraNode.Gbps); err != nil {
		return nil, err
	}
	if err := positive("node_uplink.gbps", s.NodeUplink.Gbps); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		field string
		v     float64
	}{
		{"intra_node.latency_us", s.IntraNode.LatencyUS}, {"node_uplink.latency_us", s.NodeUplink.LatencyUS},
		{"rack_uplink.gbps", s.RackUplink.Gbps}, {"rack_uplink.latency_us", s.RackUplink.LatencyUS},
		{"spine.gbps", s.Spine.Gbps}, {"spine.latency_us", s.Spine.LatencyUS},
	} {
		if err := nonNegative(f.field, f.v); err != nil {
			return nil, err
		}
	}
	defOver := s.RackUplink.Oversubscription
	if defOver == 0 {
		defOver = 1
	}
	if math.IsNaN(defOver) || math.IsInf(defOver, 0) || defOver < 1 {
		return nil, fmt.Errorf("rack_uplink.oversubscription: want a ratio >= 1 (4 means 4:1), got %g", s.RackUplink.Oversubscription)
	}
	if len(s.Racks) == 0 {
		return nil, errors.New("racks: want at least one rack, e.g. [{\"name\": \"r0\"}]")
	}
	if len(s.Nodes) == 0 {
		return nil, errors.New("nodes: want at least one node, e.g. [{\"id\": \"v100-0\", \"rack\": \"r0\", \"gpu_type\": \"v100\", \"gpus\": 4}]")
	}

	tp := &Topology{
		byID:     make(map[string]int, len(s.Nodes)),
		intraLat: s.IntraNode.LatencyUS * 1e-6,
		nodeLat:  s.NodeUplink.LatencyUS * 1e-6,
		rackLat:  s.RackUplink.LatencyUS * 1e-6,
		spineLat: s.Spine.LatencyUS * 1e-6,
		refs:     make(map[string]typeRef),
	}
	rackIdx := make(map[string]int, len(s.Racks))
	for i, r := range s.Racks {
		if r.Name == "" {
			return nil, fmt.Errorf("racks[%d].name: want a non-empty name", i)
		}
		if _, dup := rackIdx[r.Name]; dup {
			return nil, fmt.Errorf("racks[%d].name: %q is declared twice; rack names must be unique", i, r.Name)
		}
		if err := nonNegative(fmt.Sprintf("racks[%d].uplink_gbps", i), r.UplinkGbps); err != nil {
			return nil, fmt.Errorf("%w; leave it out to derive it from the oversubscription", err)
		}
		if r.Oversubscription != 0 && (math.IsNaN(r.Oversubscription) || math.IsInf(r.Oversubscription, 0) || r.Oversubscription < 1) {
			return nil, fmt.Errorf("racks[%d].oversubscription: want a ratio >= 1 (4 means 4:1), got %g", i, r.Oversubscription)
		}
		rackIdx[r.Name] = i
		tp.racks = append(tp.racks, rack{name: r.Name})
	}

	nicSum := make([]float64, len(s.Racks))
	for i, n := range s.Nodes {
		if n.ID == "" {
			return nil, fmt.Errorf("nodes[%d].id: want a non-empty node ID", i)
		}
		if _, dup := tp.byID[n.ID]; dup {
			return nil, fmt.Errorf("nodes[%d].id: %q is declared twice; node IDs must be unique", i, n.ID)
		}
		ri, ok := rackIdx[n.Rack]
		if !ok {
			return nil, fmt.Errorf("nodes[%d].rack: %q is not in racks; declare it there or fix the name", i, n.Rack)
		}
		if n.GPUType == "" {
			return nil, fmt.Errorf("nodes[%d].gpu_type: want a GPU type name, e.g. \"v100\"", i)
		}
		if n.GPUs <= 0 {
			return nil, fmt.Errorf("nodes[%d].gpus: want a positive GPU count, got %d", i, n.GPUs)
		}
		intra, nic := s.IntraNode.Gbps, s.NodeUplink.Gbps
		if n.IntraGbps != 0 {
			if err := positive(fmt.Sprintf("nodes[%d].intra_gbps", i), n.IntraGbps); err != nil {
				return nil, fmt.Errorf("%w; leave it out to use intra_node.gbps", err)
			}
			intra = n.IntraGbps
		}
		if n.NICGbps != 0 {
			if err := positive(fmt.Sprintf("nodes[%d].nic_gbps", i), n.NICGbps); err != nil {
				return nil, fmt.Errorf("%w; leave it out to use node_uplink.gbps", err)
			}
			nic = n.NICGbps
		}
		tp.byID[n.ID] = len(tp.nodes)
		tp.nodes = append(tp.nodes, node{id: n.ID, gpuType: n.GPUType, rack: ri, gpus: n.GPUs,
			intraBW: Gbps(intra), nicBW: Gbps(nic)})
		nicSum[ri] += Gbps(nic)
	}

	var uplinkSum float64
	for i, r := range s.Racks {
		switch {
		case r.UplinkGbps > 0:
			tp.racks[i].uplinkBW = Gbps(r.UplinkGbps)
		case s.RackUplink.Gbps > 0:
			tp.racks[i].uplinkBW = Gbps(s.RackUplink.Gbps)
		default:
			over := r.Oversubscription
			if over == 0 {
				over = defOver
			}
			if nicSum[i] == 0 {
				return nil, fmt.Errorf("racks[%d]: rack %q has no nodes, so its uplink cannot be derived; set uplink_gbps or remove the rack", i, r.Name)
			}
			tp.racks[i].uplinkBW = nicSum[i] / over
		}
		uplinkSum += tp.racks[i].uplinkBW
	}
	tp.spineBW = Gbps(s.Spine.Gbps)
	if tp.spineBW == 0 {
		tp.spineBW = uplinkSum
	}

	if err := tp.buildSchedule(s.Congestion, rackIdx); err != nil {
		return nil, err
	}
	tp.buildRefs()
	return tp, nil
}

func (tp *Topology) buildSchedule(entries []CongestionSpec, rackIdx map[string]int) error {
	for i, c := range entries {
		at, err := time.ParseDuration(c.At)
		if err != nil {
			return fmt.Errorf("congestion[%d].at: want a duration such as \"0s\" or \"2h\", got %q", i, c.At)
		}
		if at < 0 {
			return fmt.Errorf("congestion[%d].at: want a time >= 0, got %q", i, c.At)
		}
		if i > 0 && at <= tp.schedule[i-1].at {
			return fmt.Errorf("congestion[%d].at: %s is not after congestion[%d].at; list entries in increasing time", i, at, i-1)
		}
		st := congestionState{at: at, spine: c.Spine, node: c.NodeUplink, rack: make([]float64, len(tp.racks))}
		if err := checkFraction(fmt.Sprintf("congestion[%d].spine", i), c.Spine); err != nil {
			return err
		}
		if err := checkFraction(fmt.Sprintf("congestion[%d].rack_uplink", i), c.RackUplink); err != nil {
			return err
		}
		if err := checkFraction(fmt.Sprintf("congestion[%d].node_uplink", i), c.NodeUplink); err != nil {
			return err
		}
		for r := range st.rack {
			st.rack[r] = c.RackUplink
		}
		// Sorted so that the first bad name reported is deterministic.
		names := make([]string, 0, len(c.Racks))
		for name := range c.Racks {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			ri, ok := rackIdx[name]
			if !ok {
				return fmt.Errorf("congestion[%d].racks: %q is not in racks; fix the name", i, name)
			}
			if err := checkFraction(fmt.Sprintf("congestion[%d].racks.%s", i, name), c.Racks[name]); err != nil {
				return err
			}
			st.rack[ri] = c.Racks[name]
		}
		tp.schedule = append(tp.schedule, st)
	}
	return nil
}

func (tp *Topology) buildRefs() {
	racksOf := make(map[string]map[int]bool)
	for _, n := range tp.nodes {
		r := tp.refs[n.gpuType]
		r.maxGPUs = max(r.maxGPUs, n.gpus)
		r.intraBW = max(r.intraBW, n.intraBW)
		r.nicBW = max(r.nicBW, n.nicBW)
		r.rackBW = max(r.rackBW, tp.racks[n.rack].uplinkBW)
		if racksOf[n.gpuType] == nil {
			racksOf[n.gpuType] = make(map[int]bool)
		}
		racksOf[n.gpuType][n.rack] = true
		tp.refs[n.gpuType] = r
	}
	for t, r := range tp.refs {
		r.racks = len(racksOf[t])
		tp.refs[t] = r
	}
}
