package agent

import (
	"iter"
	"maps"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// mirror is the agent's copy of the cluster as the engine knows it: the
// nodes the engine was told of and which of them drain, each node's
// address and device models (kept also for nodes the engine does not plan
// on, and after a node leaves: a rank 0 there may still hold its port),
// and the snapshot the engine was last synced with. It has no lock of its
// own: it is read and written under the agent's mu, together with the
// engine it mirrors. The zero mirror is empty and ready to use.
type mirror struct {
	nodes   map[string]planner.Node // what the engine was told, by ID
	drained map[string]bool
	addrs   map[string]string                       // node address by ID
	models  map[string]map[planner.GPUType][]string // device models per node and type
	seen    *watch.Snapshot
}

// node is what the engine was told of node id; ok is false when it does
// not plan on it.
func (m *mirror) node(id string) (n planner.Node, ok bool) {
	n, ok = m.nodes[id]
	return n, ok
}

// all yields every node the engine plans on, drained or not, in no
// particular order.
func (m *mirror) all() iter.Seq2[string, planner.Node] { return maps.All(m.nodes) }

// open yields the nodes the engine plans on that do not drain: where new
// work may go.
func (m *mirror) open() iter.Seq2[string, planner.Node] {
	return func(yield func(string, planner.Node) bool) {
		for id, n := range m.nodes {
			if !m.drained[id] && !yield(id, n) {
				return
			}
		}
	}
}

// changed reports whether n differs from what the engine was told of its
// node (or the engine was told nothing of it).
func (m *mirror) changed(n planner.Node) bool {
	old, ok := m.nodes[n.ID]
	return !ok || old.Rack != n.Rack || !maps.Equal(old.GPUs, n.GPUs)
}

// gone returns the nodes the engine plans on that are not in want, sorted
// (the engine is told of them in a stable order).
func (m *mirror) gone(want map[string]planner.Node) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(m.nodes)) {
		if _, ok := want[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// set records that the engine was told of n.
func (m *mirror) set(n planner.Node) {
	if m.nodes == nil {
		m.nodes = map[string]planner.Node{}
	}
	m.nodes[n.ID] = n
}

// remove records that the engine no longer plans on node id. Its address
// and models stay: allocations there may still hold ports.
func (m *mirror) remove(id string) {
	delete(m.nodes, id)
	delete(m.drained, id)
}

// draining reports whether the engine was told node id drains.
func (m *mirror) draining(id string) bool { return m.drained[id] }

// setDrain records that the engine was told node id drains (d) or not.
func (m *mirror) setDrain(id string, d bool) {
	if m.drained == nil {
		m.drained = map[string]bool{}
	}
	m.drained[id] = d
}

// restore replaces the nodes and drains with those of a restored engine;
// addresses and models stay, as the next sync refreshes them.
func (m *mirror) restore(nodes []planner.Node, drained map[string]bool) {
	m.nodes = make(map[string]planner.Node, len(nodes))
	for _, n := range nodes {
		m.nodes[n.ID] = n
	}
	m.drained = drained
}

// describe records node id's address and device models per type as Nomad
// last reported them.
func (m *mirror) describe(id, addr string, models map[planner.GPUType][]string) {
	if m.addrs == nil {
		m.addrs, m.models = map[string]string{}, map[string]map[planner.GPUType][]string{}
	}
	m.addrs[id] = addr
	m.models[id] = models
}

// addr is node id's address, "" when unknown.
func (m *mirror) addr(id string) string { return m.addrs[id] }

// deviceModels are node id's device models of type t.
func (m *mirror) deviceModels(id string, t planner.GPUType) []string { return m.models[id][t] }

// synced records snap as the view the engine was last synced with.
func (m *mirror) synced(snap *watch.Snapshot) { m.seen = snap }

// view is the snapshot the engine was last synced with, nil before the
// first sync.
func (m *mirror) view() *watch.Snapshot { return m.seen }
