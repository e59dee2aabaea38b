// Package round is the round mechanism shared by the simulator and the
// sidecar: it turns a policy's time fractions into concrete placements for
// one round (priorities from allocation versus time received, lease
// extension, placement onto as few servers as possible).
package round

import (
	"sort"

	"github.com/hadar-sched/hadar/planner"
)

// Pool tracks the free GPUs of every node and type during one round's
// placement.
type Pool struct {
	nodes []string
	rack  map[string]string
	free  map[string]map[planner.GPUType]int
}

// NewPool returns a pool with every GPU of the cluster free.
func NewPool(c planner.Cluster) *Pool {
	p := &Pool{rack: map[string]string{}, free: map[string]map[planner.GPUType]int{}}
	for _, n := range c.Nodes {
		p.nodes = append(p.nodes, n.ID)
		p.rack[n.ID] = n.Rack
		m := map[planner.GPUType]int{}
		for t, k := range n.GPUs {
			m[t] = k
		}
		p.free[n.ID] = m
	}
	return p
}

// Clone returns an independent copy.
func (p *Pool) Clone() *Pool {
	q := &Pool{nodes: p.nodes, rack: p.rack, free: make(map[string]map[planner.GPUType]int, len(p.free))}
	for n, m := range p.free {
		c := make(map[planner.GPUType]int, len(m))
		for t, k := range m {
			c[t] = k
		}
		q.free[n] = c
	}
	return q
}

// Restrict hides from the pool every GPU job restrictions e do not allow,
// until the returned undo runs: a placement search for one job then finds
// only what it may use. Take and Release between Restrict and undo must
// touch allowed GPUs only. A nil e hides nothing.
func (p *Pool) Restrict(e Eligible) (undo func()) {
	if e == nil {
		return func() {}
	}
	type hidden struct {
		node string
		t    planner.GPUType
		n    int
	}
	var hid []hidden
	for _, node := range p.nodes {
		for t, n := range p.free[node] {
			if n > 0 && !e.Allows(node, t) {
				hid = append(hid, hidden{node, t, n})
				p.free[node][t] = 0
			}
		}
	}
	return func() {
		for _, h := range hid {
			p.free[h.node][h.t] += h.n
		}
	}
}

// Nodes lists node IDs in cluster order.
func (p *Pool) Nodes() []string { return p.nodes }

// Rack returns the rack of a node.
func (p *Pool) Rack(node string) string { return p.rack[node] }

// Free returns the free GPUs of type t on node.
func (p *Pool) Free(node string, t planner.GPUType) int { return p.free[node][t] }

// FreeOfType returns the free GPUs of type t in the whole pool.
func (p *Pool) FreeOfType(t planner.GPUType) int {
	n := 0
	for _, m := range p.free {
		n += m[t]
	}
	return n
}

// Fits reports whether every slot of u is free.
func (p *Pool) Fits(u planner.Unit) bool {
	need := map[string]map[planner.GPUType]int{}
	for _, s := range u.Slots {
		if need[s.Node] == nil {
			need[s.Node] = map[planner.GPUType]int{}
		}
		need[s.Node][s.Type] += s.Count
	}
	for n, m := range need {
		for t, k := range m {
			if p.free[n][t] < k {
				return false
			}
		}
	}
	return true
}

// FitsPlacement reports whether every unit of pl fits at once on nodes the
// pool offers. An empty placement fits nothing: callers ask of a job that
// holds GPUs, and "keep it where it is" must not pass for a job with none.
func (p *Pool) FitsPlacement(pl planner.Placement) bool {
	if len(pl.Units) == 0 {
		return false
	}
	check := p.Clone()
	for _, u := range pl.Units {
		for _, sl := range u.Slots {
			if !check.Has(sl.Node) {
				return false
			}
		}
		if !check.Fits(u) {
			return false
		}
		check.Take(u)
	}
	return true
}

// Take marks the unit's GPUs busy. The caller checks Fits first.
func (p *Pool) Take(u planner.Unit) {
	for _, s := range u.Slots {
		p.free[s.Node][s.Type] -= s.Count
	}
}

// Release marks the unit's GPUs free again.
func (p *Pool) Release(u planner.Unit) {
	for _, s := range u.Slots {
		p.free[s.Node][s.Type] += s.Count
	}
}

// BestFit is the node with the fewest free GPUs of type t that still has
// count free (planner.BestFit), ok=false when none has.
func (p *Pool) BestFit(t planner.GPUType, count int) (string, bool) {
	i := planner.BestFit(len(p.nodes), func(i int) int { return p.free[p.nodes[i]][t] }, count)
	if i < 0 {
		return "", false
	}
	return p.nodes[i], true
}

// Has reports whether node is in the pool.
func (p *Pool) Has(node string) bool {
	_, ok := p.free[node]
	return ok
}

// Pack finds count GPUs of type t on as few servers as possible: the
// best-fitting single node if one has room, else the nodes with the most
// free GPUs first. It does not take them. ok is false when the type has
// fewer than count free GPUs.
func (p *Pool) Pack(t planner.GPUType, count int) (planner.Unit, bool) {
	if count <= 0 || p.FreeOfType(t) < count {
		return planner.Unit{}, false
	}
	if best, ok := p.BestFit(t, count); ok {
		return planner.Unit{Slots: []planner.Slot{{Node: best, Type: t, Count: count}}}, true
	}
	order := append([]string(nil), p.nodes...)
	sort.SliceStable(order, func(a, b int) bool { return p.free[order[a]][t] > p.free[order[b]][t] })
	var u planner.Unit
	left := count
	for _, n := range order {
		f := p.free[n][t]
		if f == 0 {
			break
		}
		k := min(f, left)
		u.Slots = append(u.Slots, planner.Slot{Node: n, Type: t, Count: k})
		left -= k
		if left == 0 {
			break
		}
	}
	return u, true
}
