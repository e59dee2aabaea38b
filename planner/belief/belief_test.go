package belief

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/netmodel"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
)

const resnet = "ResNet-50 (batch size 64)"

func TestProfileDeclaredFigures(t *testing.T) {
	p := NewProfile(profile.Default())
	// A profiled job is learned under the model (shared across
	// submissions); one declaring figures under a key of its own, with a
	// model or without.
	if k := ModelKey(resnet, true, "default/own"); k != "job:default/own" {
		t.Fatalf("a job naming its model and declaring figures: key %q", k)
	}
	if k := ModelKey(resnet, false, "default/own"); k != resnet {
		t.Fatalf("a profiled job: key %q", k)
	}
	key := ModelKey("", true, "default/own")
	if key != "job:default/own" {
		t.Fatalf("figures alone: key %q", key)
	}
	p.Declare(key, Declared{Workers: 2, Throughput: map[planner.GPUType]float64{"a100": 100}, Sensitivity: 4})
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
	// A type its figures leave out, with no model to fall back on: the
	// job runs only on the types it names (docs/jobspec.md), a known 0
	// the estimates never explore.
	if got, err := p.Throughput(key, 2, "v100", false); err != nil || got != 0 {
		t.Fatalf("an undeclared type of figures alone: %v, %v; want a known 0", got, err)
	}
	// A key of its own with a model: the model's figures fill the rest.
	own := "job:default/mixed"
	p.Declare(own, Declared{Model: resnet, Workers: 2, Throughput: map[planner.GPUType]float64{"v100": 1}})
	base, _ := profile.Default().Throughput(resnet, 2, "k80", false)
	if got, err := p.Throughput(own, 2, "k80", false); err != nil || got != base {
		t.Fatalf("k80 from the model's profile: %v, %v; want %v", got, err, base)
	}
	if got, _ := p.Throughput(own, 2, "v100", false); got != 1 {
		t.Fatalf("a job's own figure under its own key: %v, want 1", got)
	}
	if p.Family(own) != resnet || p.Family(resnet) != resnet || p.Family(key) != "" {
		t.Fatalf("families %q %q %q", p.Family(own), p.Family(resnet), p.Family(key))
	}
	// Hints under a model's name fill what the profile lacks, and never
	// override the operator's figures.
	v100, _ := profile.Default().Throughput(resnet, 2, "v100", false)
	p.Declare(resnet, Declared{Model: resnet, Workers: 2, Throughput: map[planner.GPUType]float64{"a100": 300, "v100": 1}})
	if got, err := p.Throughput(resnet, 2, "a100", false); err != nil || got != 300 {
		t.Fatalf("a hint for a type the profile lacks: %v, %v", got, err)
	}
	if got, _ := p.Throughput(resnet, 2, "v100", false); got != v100 {
		t.Fatalf("a hint overrode the operator's figure: %v, want %v", got, v100)
	}
	if !slices.ContainsFunc(p.Entries(), func(e profile.Entry) bool {
		return e.Model == resnet && e.ScaleFactor == 2 && e.Consolidated["a100"] == 300 && len(e.Consolidated) == 1
	}) {
		t.Fatal("the hint is not among the entries the estimator learns from")
	}
	// A type no one profiled for a profiled model, and an unknown model:
	// no figure.
	if _, err := p.Throughput(resnet, 4, "h100", false); !errors.Is(err, profile.ErrNoFigure) {
		t.Fatalf("an unprofiled type: %v, want ErrNoFigure", err)
	}
	if _, err := p.Throughput("my-new-model", 4, "v100", false); !errors.Is(err, profile.ErrNoFigure) {
		t.Fatalf("an unknown model: %v, want ErrNoFigure", err)
	}
	g := p.Generation()
	p.Forget(key)
	if _, err := p.Throughput(key, 2, "a100", false); !errors.Is(err, profile.ErrNoFigure) {
		t.Fatal("a forgotten job's figures still answer")
	}
	if p.Generation() == g {
		t.Fatal("forgetting figures did not change the generation")
	}
}

// An overlay adds to the base and is replaced without a restart; relative
// speeds come from the files and from the operator's settings.
// Two teams' jobs of one model name, each declaring its own figures: each
// is planned with its own, and one leaving changes nothing of the other's
// (issue 31, item 1: under the model's name the last declared won in every
// namespace and the first to leave dropped them for all).
func TestDeclaredFiguresStayWithTheirJob(t *testing.T) {
	p := NewProfile(profile.Default())
	const m = "team-llm"
	a, b := ModelKey(m, true, "team-a/train"), ModelKey(m, true, "team-b/train")
	if a == b {
		t.Fatalf("two namespaces' jobs share the key %q", a)
	}
	p.Declare(a, Declared{Model: m, Workers: 1, Throughput: map[planner.GPUType]float64{"v100": 40}})
	p.Declare(b, Declared{Model: m, Workers: 1, Throughput: map[planner.GPUType]float64{"v100": 0.001}})
	if got, err := p.Throughput(a, 1, "v100", false); err != nil || got != 40 {
		t.Fatalf("team a's job: %v, %v; want its own 40", got, err)
	}
	if got, err := p.Throughput(b, 1, "v100", false); err != nil || got != 0.001 {
		t.Fatalf("team b's job: %v, %v; want its own 0.001", got, err)
	}
	p.Forget(b)
	if got, err := p.Throughput(a, 1, "v100", false); err != nil || got != 40 {
		t.Fatalf("team a's job after team b's left: %v, %v; want 40", got, err)
	}
	// A job of the model that declares nothing sees no one's figures.
	if _, err := p.Throughput(ModelKey(m, false, "team-c/train"), 1, "v100", false); !errors.Is(err, profile.ErrNoFigure) {
		t.Fatalf("a job declaring nothing got another job's figure: %v", err)
	}
}

func TestOverlayAndRelativeSpeeds(t *testing.T) {
	p := NewProfile(profile.Default())
	dir := t.TempDir()
	path := filepath.Join(dir, "overlay.json")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"format":"hadar-profile/v1","unit":"steps/s","source":"ops","relative_speeds":{"h100":{"reference":"v100","speed":3}},
"entries":[{"model":"ResNet-50 (batch size 64)","scale_factor":2,"consolidated":{"h100":40,"v100":7}},{"model":"llama","scale_factor":8,"consolidated":{"h100":12}}]}`)
	g := p.Generation()
	if err := p.LoadOverlay(path); err != nil {
		t.Fatal(err)
	}
	if p.Generation() == g {
		t.Fatal("an overlay did not change the generation")
	}
	for _, tc := range []struct {
		model string
		sf    int
		typ   planner.GPUType
		want  float64
	}{
		{resnet, 2, "h100", 40},
		{resnet, 2, "v100", 7}, // replaced
		{"llama", 8, "h100", 12},
	} {
		if got, err := p.Throughput(tc.model, tc.sf, tc.typ, false); err != nil || got != tc.want {
			t.Errorf("%s x%d on %s: %v, %v; want %v", tc.model, tc.sf, tc.typ, got, err, tc.want)
		}
	}
	k80, _ := profile.Default().Throughput(resnet, 2, "k80", false)
	if got, _ := p.Throughput(resnet, 2, "k80", false); got != k80 {
		t.Errorf("k80 kept from the base: %v, want %v", got, k80)
	}
	if r := p.RelativeSpeeds()["h100"]; r.Reference != "v100" || r.Speed != 3 {
		t.Errorf("the overlay's relative speed: %+v", r)
	}
	if err := p.SetRelativeSpeed("b200", "h100", 2); err != nil {
		t.Fatal(err)
	}
	if err := p.SetRelativeSpeed("v100", "b200", 0.1); err == nil {
		t.Error("a loop of relative speeds is accepted")
	}
	if err := p.SetRelativeSpeed("x", "v100", -1); err == nil {
		t.Error("a negative relative speed is accepted")
	}
	if r := p.RelativeSpeeds(); len(r) != 2 || r["b200"].Speed != 2 {
		t.Errorf("relative speeds %v", r)
	}
	// A bad file leaves the overlay in force; a new one replaces it.
	write(`{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"llama","scale_factor":8,"consolidated":{"h100":-1}}]}`)
	if err := p.LoadOverlay(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a bad overlay: %v", err)
	}
	if got, _ := p.Throughput("llama", 8, "h100", false); got != 12 {
		t.Fatalf("after a bad overlay: %v, want the old 12", got)
	}
	write(`{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"llama","scale_factor":8,"consolidated":{"h100":15}}]}`)
	if err := p.LoadOverlay(path); err != nil {
		t.Fatal(err)
	}
	if got, _ := p.Throughput("llama", 8, "h100", false); got != 15 {
		t.Fatalf("after a reload: %v, want 15", got)
	}
	if got, _ := p.Throughput(resnet, 2, "v100", false); got == 7 {
		t.Fatal("the previous overlay's figure outlived its reload")
	}
	if err := p.SetOverlay(nil); err != nil || p.Overlay() != nil {
		t.Fatal(err)
	}
	if _, err := p.Throughput("llama", 8, "h100", false); !errors.Is(err, profile.ErrNoFigure) {
		t.Fatalf("without an overlay: %v", err)
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
