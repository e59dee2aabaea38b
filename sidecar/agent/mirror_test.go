package agent

import (
	"maps"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// The mirror records what the engine was told of each node, which drain,
// what leaves, and each node's address and models (which outlive the node
// leaving the plan: ports there may still be held).
func TestMirror(t *testing.T) {
	var m mirror // the zero mirror is ready to use
	if _, ok := m.node("a"); ok || m.draining("a") || m.addr("a") != "" || m.view() != nil {
		t.Fatal("an empty mirror knows of a node")
	}
	a := planner.Node{ID: "a", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 4}}
	b := planner.Node{ID: "b", Rack: "r2", GPUs: map[planner.GPUType]int{"k80": 2}}
	if !m.changed(a) {
		t.Fatal("a node the engine was not told of is not a change")
	}
	m.set(a)
	m.set(b)
	if n, ok := m.node("a"); !ok || n.Rack != "r1" {
		t.Fatalf("node a = %+v, %v", n, ok)
	}
	if m.changed(a) {
		t.Fatal("the same node is a change")
	}
	if !m.changed(planner.Node{ID: "a", Rack: "r1", GPUs: map[planner.GPUType]int{"v100": 3}}) ||
		!m.changed(planner.Node{ID: "a", Rack: "r9", GPUs: a.GPUs}) {
		t.Fatal("fewer GPUs or another rack is no change")
	}

	m.setDrain("b", true)
	if !m.draining("b") || m.draining("a") {
		t.Fatal("drains")
	}
	if got := slices.Sorted(maps.Keys(maps.Collect(m.all()))); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("all = %v", got)
	}
	if got := slices.Sorted(maps.Keys(maps.Collect(m.open()))); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("open = %v, want the node not draining", got)
	}

	m.describe("a", "10.0.0.1", map[planner.GPUType][]string{"v100": {"Tesla V100-SXM2-16GB"}})
	if m.addr("a") != "10.0.0.1" || !slices.Equal(m.deviceModels("a", "v100"), []string{"Tesla V100-SXM2-16GB"}) {
		t.Fatalf("addr %q, models %v", m.addr("a"), m.deviceModels("a", "v100"))
	}
	if m.deviceModels("a", "k80") != nil || m.deviceModels("c", "v100") != nil {
		t.Fatal("models of a type or node not described")
	}

	want := map[string]planner.Node{"b": b}
	if got := m.gone(want); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("gone = %v", got)
	}
	m.remove("a")
	m.remove("b")
	if _, ok := m.node("a"); ok || m.draining("b") {
		t.Fatal("a removed node stays")
	}
	if m.addr("a") != "10.0.0.1" {
		t.Fatal("a removed node's address is forgotten")
	}

	// A restore replaces the nodes and drains; addresses stay.
	m.set(a)
	m.restore([]planner.Node{b}, map[string]bool{"b": true})
	if _, ok := m.node("a"); ok || !m.draining("b") || m.addr("a") != "10.0.0.1" {
		t.Fatal("restore")
	}
	m.restore(nil, nil)
	if len(m.gone(nil)) != 0 || m.draining("b") {
		t.Fatal("an empty restore keeps nodes")
	}
	m.setDrain("b", false) // after an empty restore too

	snap := &watch.Snapshot{Index: 7}
	m.synced(snap)
	if m.view() != snap {
		t.Fatal("view is not the snapshot synced")
	}
}
