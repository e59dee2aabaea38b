package placement

import (
	"cmp"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// Level is how far apart a unit's GPUs sit (delay scheduling's locality
// levels).
type Level int

// Levels, tightest first.
const (
	SameNode Level = iota
	SameRack
	Anywhere
)

func (l Level) String() string {
	switch l {
	case SameNode:
		return "node"
	case SameRack:
		return "rack"
	}
	return "any"
}

// LevelOf is the locality level of u, racks as pool knows them.
func LevelOf(pool *round.Pool, u planner.Unit) Level {
	if len(u.Slots) == 0 {
		return SameNode
	}
	lvl := SameNode
	first := u.Slots[0]
	for _, s := range u.Slots[1:] {
		if s.Node != first.Node {
			lvl = SameRack
			if pool.Rack(s.Node) != pool.Rack(first.Node) {
				return Anywhere
			}
		}
	}
	return lvl
}

// Tightest is the best level count GPUs of type t can ever have on the
// cluster: same node if a node has that many, else same rack if a rack
// does, else anywhere.
func Tightest(c planner.Cluster, t planner.GPUType, count int) Level {
	racks := map[string]int{}
	lvl := Anywhere
	for _, n := range c.Nodes {
		k := n.GPUs[t]
		if k >= count {
			return SameNode
		}
		racks[n.Rack] += k
		if racks[n.Rack] >= count {
			lvl = SameRack
		}
	}
	return lvl
}

// Candidate finds count free GPUs of type t at level lvl in pool without
// taking them: at SameNode the best-fitting node; at SameRack the rack
// that needs the fewest nodes (most free first inside it; the fullest
// such rack on ties, to keep big holes for big jobs); Anywhere is
// Pool.Pack (fewest servers over the whole cluster).
func Candidate(pool *round.Pool, t planner.GPUType, count int, lvl Level) (planner.Unit, bool) {
	if count <= 0 || pool.FreeOfType(t) < count {
		return planner.Unit{}, false
	}
	switch lvl {
	case SameNode:
		best, ok := pool.BestFit(t, count)
		if !ok {
			return planner.Unit{}, false
		}
		return planner.Unit{Slots: []planner.Slot{{Node: best, Type: t, Count: count}}}, true
	case SameRack:
		return rackCandidate(pool, t, count)
	}
	return pool.Pack(t, count)
}

func rackCandidate(pool *round.Pool, t planner.GPUType, count int) (planner.Unit, bool) {
	members := map[string][]string{}
	var racks []string
	for _, n := range pool.Nodes() {
		if pool.Free(n, t) == 0 {
			continue
		}
		r := pool.Rack(n)
		if members[r] == nil {
			racks = append(racks, r)
		}
		members[r] = append(members[r], n)
	}
	var best []string
	bestNodes, bestFree := 0, 0
	for _, r := range racks {
		nodes := members[r]
		slices.SortStableFunc(nodes, func(a, b string) int { return cmp.Compare(pool.Free(b, t), pool.Free(a, t)) })
		total, need, left := 0, 0, count
		for _, n := range nodes {
			f := pool.Free(n, t)
			total += f
			if left > 0 {
				left -= min(f, left)
				need++
			}
		}
		if left > 0 {
			continue
		}
		if best == nil || need < bestNodes || (need == bestNodes && total < bestFree) {
			best, bestNodes, bestFree = nodes, need, total
		}
	}
	if best == nil {
		return planner.Unit{}, false
	}
	var u planner.Unit
	left := count
	for _, n := range best[:bestNodes] {
		k := min(pool.Free(n, t), left)
		u.Slots = append(u.Slots, planner.Slot{Node: n, Type: t, Count: k})
		left -= k
	}
	return u, true
}
