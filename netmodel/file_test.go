package netmodel

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const minimalTopology = `{
  "intra_node": {"gbps": 200, "latency_us": 5},
  "node_uplink": {"gbps": 25, "latency_us": 10},
  "rack_uplink": {"latency_us": 20, "oversubscription": 2},
  "spine": {"gbps": 100},
  "racks": [{"name": "r0"}, {"name": "r1", "uplink_gbps": 40}, {"name": "r2", "oversubscription": 4}],
  "nodes": [
    {"id": "a", "rack": "r0", "gpu_type": "v100", "gpus": 4},
    {"id": "b", "rack": "r0", "gpu_type": "v100", "gpus": 4, "nic_gbps": 100},
    {"id": "c", "rack": "r1", "gpu_type": "k80", "gpus": 2, "intra_gbps": 50},
    {"id": "d", "rack": "r2", "gpu_type": "k80", "gpus": 2}
  ],
  "congestion": [{"at": "0s"}, {"at": "90m", "spine": 0.5, "rack_uplink": 0.1, "racks": {"r2": 0.7}}]
}`

func TestParseTopology(t *testing.T) {
	tp, err := ParseTopology("topology.json", []byte(minimalTopology))
	if err != nil {
		t.Fatal(err)
	}
	if tp.NodeCount() != 4 || strings.Join(tp.RackNames(), ",") != "r0,r1,r2" || strings.Join(tp.GPUTypes(), ",") != "k80,v100" {
		t.Fatalf("nodes %d racks %v types %v", tp.NodeCount(), tp.RackNames(), tp.GPUTypes())
	}
	nodes := tp.Nodes()
	if nodes[1].UplinkBandwidth != Gbps(100) || nodes[0].UplinkBandwidth != Gbps(25) || nodes[2].IntraBandwidth != Gbps(50) || nodes[3].IntraBandwidth != Gbps(200) {
		t.Errorf("node overrides not applied: %+v", nodes)
	}
	for rack, want := range map[string]float64{
		"r0": Gbps(25+100) / 2, // derived: NIC sum over the default 2:1
		"r1": Gbps(40),         // explicit
		"r2": Gbps(25) / 4,     // derived with the rack's own 4:1
	} {
		if got, ok := tp.RackUplinkBandwidth(rack); !ok || !near(got, want) {
			t.Errorf("rack %s uplink %g, want %g", rack, got, want)
		}
	}
	c := tp.CongestionAt(2 * time.Hour)
	if c.Spine != 0.5 || c.Racks["r0"] != 0.1 || c.Racks["r2"] != 0.7 || c.Node != 0 {
		t.Errorf("congestion at 2h: %+v", c)
	}
	if c := tp.CongestionAt(time.Hour); c.Spine != 0 || c.Racks["r2"] != 0 {
		t.Errorf("congestion at 1h: %+v", c)
	}
}

// Every validation error names the file, the field and the fix.
func TestParseTopologyErrors(t *testing.T) {
	// edit returns the minimal topology with one change applied.
	edit := func(f func(m map[string]any)) string {
		var m map[string]any
		_ = json.Unmarshal([]byte(minimalTopology), &m)
		f(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	rack := func(m map[string]any, i int) map[string]any { return m["racks"].([]any)[i].(map[string]any) }
	nodeAt := func(m map[string]any, i int) map[string]any { return m["nodes"].([]any)[i].(map[string]any) }
	cong := func(m map[string]any, i int) map[string]any { return m["congestion"].([]any)[i].(map[string]any) }
	for _, tc := range []struct {
		name, in, want string
	}{
		{"syntax", `{"racks": [}`, "topology.json: byte 12: invalid JSON"},
		{"unknown field", `{"rackz": []}`, `unknown field "rackz"`},
		{"wrong type", `{"nodes": [{"gpus": "four"}]}`, "topology.json: nodes.gpus: want a JSON int, got string"},
		{"trailing data", minimalTopology + "{}", "data after the topology object"},
		{"no intra", edit(func(m map[string]any) { delete(m, "intra_node") }), "topology.json: intra_node.gbps: want a positive number, got 0"},
		{"negative nic", edit(func(m map[string]any) { m["node_uplink"].(map[string]any)["gbps"] = -1 }), "node_uplink.gbps: want a positive number, got -1"},
		{"negative latency", edit(func(m map[string]any) { m["spine"].(map[string]any)["latency_us"] = -3 }), "spine.latency_us: want zero or a positive number, got -3"},
		{"oversubscription below 1", edit(func(m map[string]any) { m["rack_uplink"].(map[string]any)["oversubscription"] = 0.5 }), "rack_uplink.oversubscription: want a ratio >= 1"},
		{"rack uplink", edit(func(m map[string]any) { rack(m, 2)["uplink_gbps"] = -3 }), "topology.json: racks[2].uplink_gbps: want zero or a positive number, got -3; leave it out to derive it from the oversubscription"},
		{"rack oversubscription", edit(func(m map[string]any) { rack(m, 1)["oversubscription"] = 0.2 }), "racks[1].oversubscription: want a ratio >= 1"},
		{"rack name", edit(func(m map[string]any) { rack(m, 0)["name"] = "" }), "racks[0].name: want a non-empty name"},
		{"duplicate rack", edit(func(m map[string]any) { rack(m, 1)["name"] = "r0" }), `racks[1].name: "r0" is declared twice`},
		{"no racks", edit(func(m map[string]any) { m["racks"] = []any{} }), "racks: want at least one rack"},
		{"no nodes", edit(func(m map[string]any) { m["nodes"] = []any{} }), "nodes: want at least one node"},
		{"empty rack", edit(func(m map[string]any) { m["racks"] = append(m["racks"].([]any), map[string]any{"name": "r3"}) }), `racks[3]: rack "r3" has no nodes`},
		{"node id", edit(func(m map[string]any) { nodeAt(m, 1)["id"] = "" }), "nodes[1].id: want a non-empty node ID"},
		{"duplicate node", edit(func(m map[string]any) { nodeAt(m, 3)["id"] = "a" }), `nodes[3].id: "a" is declared twice`},
		{"unknown rack", edit(func(m map[string]any) { nodeAt(m, 2)["rack"] = "r9" }), `nodes[2].rack: "r9" is not in racks; declare it there or fix the name`},
		{"gpu type", edit(func(m map[string]any) { delete(nodeAt(m, 0), "gpu_type") }), "nodes[0].gpu_type: want a GPU type name"},
		{"gpus", edit(func(m map[string]any) { nodeAt(m, 0)["gpus"] = 0 }), "nodes[0].gpus: want a positive GPU count, got 0"},
		{"nic override", edit(func(m map[string]any) { nodeAt(m, 1)["nic_gbps"] = -5 }), "nodes[1].nic_gbps: want a positive number, got -5; leave it out to use node_uplink.gbps"},
		{"intra override", edit(func(m map[string]any) { nodeAt(m, 2)["intra_gbps"] = -5 }), "nodes[2].intra_gbps: want a positive number"},
		{"congestion at", edit(func(m map[string]any) { cong(m, 1)["at"] = "soon" }), `congestion[1].at: want a duration such as "0s" or "2h", got "soon"`},
		{"congestion negative at", edit(func(m map[string]any) { cong(m, 0)["at"] = "-1h" }), "congestion[0].at: want a time >= 0"},
		{"congestion order", edit(func(m map[string]any) { cong(m, 1)["at"] = "0s" }), "congestion[1].at: 0s is not after congestion[0].at; list entries in increasing time"},
		{"congestion fraction", edit(func(m map[string]any) { cong(m, 1)["spine"] = 1 }), "congestion[1].spine: want a fraction of capacity in [0, 0.99], got 1"},
		{"congestion rack uplink", edit(func(m map[string]any) { cong(m, 1)["rack_uplink"] = -0.1 }), "congestion[1].rack_uplink: want a fraction"},
		{"congestion node uplink", edit(func(m map[string]any) { cong(m, 0)["node_uplink"] = 2 }), "congestion[0].node_uplink: want a fraction"},
		{"congestion rack name", edit(func(m map[string]any) { cong(m, 1)["racks"] = map[string]any{"zz": 0.1} }), `congestion[1].racks: "zz" is not in racks`},
		{"congestion rack fraction", edit(func(m map[string]any) { cong(m, 1)["racks"] = map[string]any{"r1": 1.5} }), "congestion[1].racks.r1: want a fraction"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTopology("topology.json", []byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "topology.json: ") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestLoadTopologyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mine.json")
	if err := os.WriteFile(path, []byte(`{"racks": []}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTopologyFile(path); err == nil || !strings.HasPrefix(err.Error(), "mine.json: intra_node.gbps") {
		t.Errorf("error %v, want it to start with the file's name and the field", err)
	}
	if _, err := LoadTopologyFile(filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("missing file: error %v", err)
	}
}

func TestWithCongestionErrors(t *testing.T) {
	tp := mustTopology(t, gridSpec(1, 1, 1, 10, 10))
	for _, c := range []Congestion{{Spine: 1}, {Node: -0.1}, {Racks: map[string]float64{"r9": 0.1}}, {Racks: map[string]float64{"r0": 3}}} {
		if _, err := tp.WithCongestion(c); err == nil {
			t.Errorf("WithCongestion(%+v): want an error", c)
		}
	}
}
