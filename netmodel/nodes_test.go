package netmodel

import (
	"strings"
	"testing"
)

func TestFromNodes(t *testing.T) {
	fabric := Fabric{
		IntraNode:  LinkSpec{Gbps: 200, LatencyUS: 5},
		NodeUplink: LinkSpec{Gbps: 10, LatencyUS: 10},
		RackUplink: RackUplinkSpec{LatencyUS: 20, Oversubscription: 2},
	}
	meta := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	nodes := []NodeInfo{
		{ID: "n1", Rack: "r1", Attributes: meta(MetaGPUType, "v100", MetaGPUs, "4", MetaNICGbps, "25", MetaIntraGbps, "300")},
		{ID: "n2", Attributes: meta(MetaRack, "r1", MetaGPUType, "v100", MetaGPUs, "4")},
		{ID: "n3", Attributes: meta(MetaRack, "r2", MetaGPUType, "k80", MetaGPUs, "2")},
	}
	tp, err := FromNodes(nodes, fabric)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tp.RackNames(), ","); got != "r1,r2" {
		t.Errorf("racks %s, want r1,r2 in order of first appearance", got)
	}
	ns := tp.Nodes()
	if ns[0].UplinkBandwidth != Gbps(25) || ns[0].IntraBandwidth != Gbps(300) || ns[1].UplinkBandwidth != Gbps(10) || ns[1].Rack != "r1" {
		t.Errorf("nodes %+v: meta link speeds or defaults not applied", ns)
	}
	if bw, _ := tp.RackUplinkBandwidth("r1"); !near(bw, Gbps(35)/2) {
		t.Errorf("r1 uplink %g, want the NIC sum over 2:1", bw)
	}

	for _, tc := range []struct {
		name string
		node NodeInfo
		want string
	}{
		{"no rack", NodeInfo{ID: "x", Attributes: meta(MetaGPUType, "v100", MetaGPUs, "4")}, `node "x": no rack; set NodeInfo.Rack or the node meta key meta.rack`},
		{"no type", NodeInfo{ID: "x", Rack: "r", Attributes: meta(MetaGPUs, "4")}, `node "x": meta.hadar.gpu_type`},
		{"bad count", NodeInfo{ID: "x", Rack: "r", Attributes: meta(MetaGPUType, "v100", MetaGPUs, "four")}, `node "x": meta.hadar.gpus: want a positive integer, got "four"`},
		{"bad nic", NodeInfo{ID: "x", Rack: "r", Attributes: meta(MetaGPUType, "v100", MetaGPUs, "1", MetaNICGbps, "fast")}, `meta.hadar.nic_gbps: want a positive speed in Gbit/s such as "25", got "fast"`},
		{"bad intra", NodeInfo{ID: "x", Rack: "r", Attributes: meta(MetaGPUType, "v100", MetaGPUs, "1", MetaIntraGbps, "-1")}, `meta.hadar.intra_gbps`},
		{"duplicate", nodes[0], `nodes: nodes[3].id: "n1" is declared twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromNodes(append(append([]NodeInfo{}, nodes...), tc.node), fabric)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
