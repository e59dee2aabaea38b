package belief

import (
	"math"
	"strconv"
	"testing"

	"github.com/hadar-sched/hadar/netmodel"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
)

const resnet = "ResNet-50 (batch size 64)"

func TestProfileDeclaredFigures(t *testing.T) {
	p := NewProfile(profile.Default())
	key := ModelKey(resnet, true, "default/own")
	if key != "job:default/own" || ModelKey(resnet, false, "default/own") != resnet {
		t.Fatalf("model keys %q", key)
	}
	p.Declare(key, Declared{Model: resnet, Workers: 2, Throughput: map[planner.GPUType]float64{"a100": 100}, Sensitivity: 4})
	for _, tc := range []struct {
		t      planner.GPUType
		sf     int
		spread bool
		want   float64
	}{
		{"a100", 2, false, 100},
		{"a100", 1, false, 50},     // a copy of half the width: half the speed
		{"a100", 2, true, 100 / 2}, // spread within a rack: the square root of the sensitivity
	} {
		got, err := p.Throughput(key, tc.sf, tc.t, tc.spread)
		if err != nil || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s x%d spread=%v: %v, %v; want %v", tc.t, tc.sf, tc.spread, got, err, tc.want)
		}
	}
	// A type it does not declare comes from its model's profile.
	base, _ := profile.Default().Throughput(resnet, 2, "v100", false)
	if got, err := p.Throughput(key, 2, "v100", false); err != nil || got != base {
		t.Fatalf("v100 from the profile: %v, %v; want %v", got, err, base)
	}
	// A type no one profiled for a profiled model: it cannot run there.
	if got, err := p.Throughput(resnet, 2, "h100", false); err != nil || got != 0 {
		t.Fatalf("an unprofiled type: %v, %v; want 0, nil", got, err)
	}
	if p.Family(key) != resnet || p.Family(resnet) != resnet {
		t.Fatalf("families %q %q", p.Family(key), p.Family(resnet))
	}
	p.Forget(key)
	if _, err := p.Throughput(key, 2, "a100", false); err == nil {
		t.Fatal("a forgotten job's figures still answer")
	}
}

// Two racks of two 4-GPU V100 nodes.
func fourNodes(n *Network) {
	for i, id := range []string{"a", "b", "c", "d"} {
		n.SetNode(Node{ID: id, Rack: "r" + strconv.Itoa(i/2), GPUs: map[planner.GPUType]int{"v100": 4}})
	}
}

func unitOn(nodes ...string) planner.Unit {
	var u planner.Unit
	for _, nd := range nodes {
		u.Slots = append(u.Slots, planner.Slot{Node: nd, Type: "v100", Count: 1})
	}
	return u
}

// hadar.sensitivity = auto: the network model prices the unit, exactly as
// netmodel does on the topology the nodes describe.
func TestAutoSensitivityGoesThroughTheNetworkModel(t *testing.T) {
	prof := NewProfile(profile.Default())
	n, err := NewNetwork(prof, nil)
	if err != nil {
		t.Fatal(err)
	}
	fourNodes(n)
	// ResNet-18's gradients do not hide behind its compute: spreading it
	// costs (ResNet-50's nearly nothing, by the calibrated model).
	job := planner.Job{ID: "default/j", Model: "ResNet-18 (batch size 16)", ScaleFactor: 2, TotalSteps: 1, Weight: 1}
	inRack, cross := n.Slowdown(job, unitOn("a", "b"), 0), n.Slowdown(job, unitOn("a", "c"), 0)
	if !(1 < inRack && inRack <= cross) {
		t.Fatalf("slowdowns in a rack %v, across racks %v: want 1 < in-rack <= cross-rack", inRack, cross)
	}
	// The same from netmodel directly.
	rep, err := netmodel.DefaultCalibration()
	if err != nil {
		t.Fatal(err)
	}
	var infos []netmodel.NodeInfo
	for i, id := range []string{"a", "b", "c", "d"} {
		infos = append(infos, netmodel.NodeInfo{ID: id, Rack: "r" + strconv.Itoa(i/2), Attributes: map[string]string{netmodel.MetaGPUType: "v100", netmodel.MetaGPUs: "4"}})
	}
	tp, err := netmodel.FromNodes(infos, DefaultFabric(rep))
	if err != nil {
		t.Fatal(err)
	}
	want, err := placement.NewNetwork(tp, rep, prof, []planner.Job{job}, []planner.GPUType{"v100"})
	if err != nil {
		t.Fatal(err)
	}
	if w := want.Slowdown(job, unitOn("a", "c"), 0); math.Abs(w-cross) > 1e-12 {
		t.Fatalf("cross-rack slowdown %v, netmodel's %v", cross, w)
	}
	// A faster uplink on the nodes (node meta) makes spreading cheaper.
	for i, id := range []string{"a", "b", "c", "d"} {
		n.SetNode(Node{ID: id, Rack: "r" + strconv.Itoa(i/2), GPUs: map[planner.GPUType]int{"v100": 4}, Meta: map[string]string{"hadar.nic_gbps": "400"}})
	}
	if fast := n.Slowdown(job, unitOn("a", "c"), 0); !(fast < cross) {
		t.Fatalf("with 400 Gbit/s uplinks the cross-rack slowdown is %v, not below %v", fast, cross)
	}
}

// A declared sensitivity decides across racks; within a rack, and for a
// model the calibration does not know, the profile's spread penalty.
func TestDeclaredSensitivityAndUnknownModels(t *testing.T) {
	prof := NewProfile(profile.Default())
	n, err := NewNetwork(prof, nil)
	if err != nil {
		t.Fatal(err)
	}
	fourNodes(n)
	job := planner.Job{ID: "default/s", Model: resnet, ScaleFactor: 2, TotalSteps: 1, Weight: 1}
	n.SetSensitivity(job.ID, 9)
	c, _ := prof.Throughput(resnet, 2, "v100", false)
	s, _ := prof.Throughput(resnet, 2, "v100", true)
	if got := n.Slowdown(job, unitOn("a", "b"), 0); math.Abs(got-c/s) > 1e-12 {
		t.Fatalf("in a rack: %v, want the profile's spread penalty %v", got, c/s)
	}
	if got := n.Slowdown(job, unitOn("a", "c"), 0); got != 9 {
		t.Fatalf("across racks: %v, want the declared 9", got)
	}
	// Own figures and no model: nothing to calibrate; spread within a rack
	// pays the square root of the sensitivity (in the profile), no more.
	key := ModelKey("", true, "default/own")
	prof.Declare(key, Declared{Workers: 2, Throughput: map[planner.GPUType]float64{"v100": 80}})
	own := planner.Job{ID: "default/own", Model: key, ScaleFactor: 2, TotalSteps: 1, Weight: 1}
	if got := n.Slowdown(own, unitOn("a", "c"), 0); got != 1 {
		t.Fatalf("own figures, no model, auto: %v, want 1 (nothing says spreading costs)", got)
	}
	if got := n.Slowdown(own, unitOn("a"), 0); got != 1 {
		t.Fatalf("one node: %v", got)
	}
}
