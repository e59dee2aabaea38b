package hadar

import (
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// segment is part of a job's committed schedule: the job holds Unit in the
// time slots [From, To) (absolute slot numbers, one slot per round).
type segment struct {
	From int64        `json:"from"`
	To   int64        `json:"to"`
	Unit planner.Unit `json:"unit"`
}

// record is what the scheduler remembers of one job.
type record struct {
	// Seq orders admissions: commitments are replayed in this order, so
	// when capacity shrinks the latest admitted lose theirs first.
	Seq int64 `json:"seq"`
	// Admitted is set once the dual subroutine admitted the job; the
	// decision stands until the job leaves.
	Admitted bool `json:"admitted"`
	// Segs is the committed schedule, in slot order, never overlapping.
	Segs []segment `json:"segs,omitempty"`
	// Density is the job's value per GPU-round when first seen; it feeds
	// the price bounds.
	Density float64 `json:"density"`
	// Seen is the placement the job held at the last plan, Since when
	// that placement started (a plan that gave it a unit it did not hold
	// before): the engine's minimum run time counts from there.
	Seen  []planner.Unit `json:"seen,omitempty"`
	Since float64        `json:"since,omitempty"`
	// Critical is set while the job is critical for the makespan (value:
	// it stays so until it is criticalBand ahead of the threshold).
	Critical bool `json:"critical,omitempty"`
}

// end is the slot after the record's last commitment (0 when none).
func (r *record) end() int64 {
	if len(r.Segs) == 0 {
		return 0
	}
	return r.Segs[len(r.Segs)-1].To
}

// holds reports whether the record commits GPUs in slot t.
func (r *record) holds(t int64) (planner.Unit, bool) {
	for _, sg := range r.Segs {
		if sg.From <= t && t < sg.To {
			return sg.Unit, true
		}
	}
	return planner.Unit{}, false
}

// clip drops the commitments outside [from, to).
func (r *record) clip(from, to int64) {
	kept := r.Segs[:0]
	for _, sg := range r.Segs {
		sg.From, sg.To = max(sg.From, from), min(sg.To, to)
		if sg.From < sg.To {
			kept = append(kept, sg)
		}
	}
	r.Segs = kept
}

// add appends the commitment of unit over [from, to), merging it with the
// last segment when it continues it on the same GPUs.
func (r *record) add(from, to int64, u planner.Unit) {
	if n := len(r.Segs); n > 0 && r.Segs[n-1].To == from && r.Segs[n-1].Unit.Equal(u) {
		r.Segs[n-1].To = to
		return
	}
	r.Segs = append(r.Segs, segment{From: from, To: to, Unit: u})
}

// grid is the planning state of one Schedule call: the capacity per (node,
// type), the GPUs committed per (slot, node, type) over the horizon (slot
// 0 is the current round), and the prices that follow from them.
type grid struct {
	nodes    []string
	nodeIdx  map[string]int
	racks    []string // rack of each node
	types    []planner.GPUType
	typeIdx  map[planner.GPUType]int
	capacity [][]int   // [node][type]
	used     [][][]int // [slot][node][type]
	typeCap  []int
	typeUsed [][]int // [slot][type]
	prices   prices
	taken    []int // scratch for cheapest
	// windows caches the free GPUs and summed prices of slot ranges; any
	// commitment drops it.
	windows map[[2]int]*window
}

func (s *Scheduler) newGrid(v *round.View, horizon int) *grid {
	g := &grid{types: v.Types, nodeIdx: map[string]int{}, typeIdx: map[planner.GPUType]int{}}
	for k, t := range v.Types {
		g.typeIdx[t] = k
	}
	// A node's capacity is what the pool offers plus, mid-round, what the
	// running jobs hold: GPUs held by work hadar does not plan (v.Pool
	// never offers them) are in no slot of the horizon, since nothing says
	// when that work ends; the engine plans again when it does.
	running := round.NewPool(planner.Cluster{})
	if v.MidRound {
		running = busyPool(v)
	}
	for _, n := range v.Pool.Nodes() {
		g.nodeIdx[n] = len(g.nodes)
		g.nodes = append(g.nodes, n)
		g.racks = append(g.racks, v.Pool.Rack(n))
		row := make([]int, len(v.Types))
		for k, t := range v.Types {
			row[k] = v.Pool.Free(n, t) + running.Free(n, t)
		}
		g.capacity = append(g.capacity, row)
	}
	g.typeCap = make([]int, len(v.Types))
	for _, row := range g.capacity {
		for k, c := range row {
			g.typeCap[k] += c
		}
	}
	g.used = make([][][]int, horizon)
	g.typeUsed = make([][]int, horizon)
	for t := range horizon {
		g.used[t] = make([][]int, len(g.nodes))
		for n := range g.nodes {
			g.used[t][n] = make([]int, len(v.Types))
		}
		g.typeUsed[t] = make([]int, len(v.Types))
	}
	if v.MidRound {
		// Mid-round, slot 0 is what the pool offers: the idle GPUs. The
		// GPUs of running jobs (committed or backfilled) are busy.
		for n, name := range g.nodes {
			for k, ty := range v.Types {
				b := running.Free(name, ty)
				g.used[0][n][k] = b
				g.typeUsed[0][k] += b
			}
		}
	}
	return g
}

// busyPool counts, as a pool's free GPUs, the GPUs the view's running jobs
// hold on the nodes of the pool.
func busyPool(v *round.View) *round.Pool {
	c := planner.Cluster{}
	at := map[string]int{}
	for _, n := range v.Pool.Nodes() {
		at[n] = len(c.Nodes)
		c.Nodes = append(c.Nodes, planner.Node{ID: n, Rack: v.Pool.Rack(n), GPUs: map[planner.GPUType]int{}})
	}
	for _, jb := range v.Jobs {
		if !jb.Running {
			continue
		}
		for _, u := range jb.Placement.Units {
			for _, sl := range u.Slots {
				if i, ok := at[sl.Node]; ok {
					c.Nodes[i].GPUs[sl.Type] += sl.Count
				}
			}
		}
	}
	return round.NewPool(c)
}

func (g *grid) horizon() int { return len(g.used) }

// server is the most GPUs of one type on one node.
func (g *grid) server() int {
	n := 0
	for _, row := range g.capacity {
		for _, c := range row {
			n = max(n, c)
		}
	}
	return n
}

func (g *grid) free(t, n, k int) int { return g.capacity[n][k] - g.used[t][n][k] }

// resolve maps a unit onto the grid's node and type indices; ok is false
// when a node or type of the unit is not in the cluster any more.
func (g *grid) resolve(u planner.Unit) ([]slotIdx, bool) {
	take := make([]slotIdx, 0, len(u.Slots))
	for _, sl := range u.Slots {
		n, okN := g.nodeIdx[sl.Node]
		k, okK := g.typeIdx[sl.Type]
		if !okN || !okK {
			return nil, false
		}
		take = append(take, slotIdx{n, k, sl.Count})
	}
	return take, true
}

// fitsAt reports whether take is free in slot t.
func (g *grid) fitsAt(t int, take []slotIdx) bool {
	for _, sl := range take {
		if g.free(t, sl.n, sl.k) < sl.count {
			return false
		}
	}
	return true
}

// commit marks take busy in the slots [from, to).
func (g *grid) commit(from, to int, take []slotIdx) {
	for t := from; t < to; t++ {
		for _, sl := range take {
			g.used[t][sl.n][sl.k] += sl.count
			g.typeUsed[t][sl.k] += sl.count
		}
	}
	g.windows = nil
}

// uncommit gives take back in the slots [from, to).
func (g *grid) uncommit(from, to int, take []slotIdx) {
	for t := from; t < to; t++ {
		for _, sl := range take {
			g.used[t][sl.n][sl.k] -= sl.count
			g.typeUsed[t][sl.k] -= sl.count
		}
	}
	g.windows = nil
}

// freeOfTypes counts the GPUs free in slot t of the types allowed.
func (g *grid) freeOfTypes(t int, allowed func(k int) bool) int {
	n := 0
	for k := range g.types {
		if allowed(k) {
			n += g.typeCap[k] - g.typeUsed[t][k]
		}
	}
	return n
}

func (g *grid) freeTotal(t int) int { return g.freeOfTypes(t, func(int) bool { return true }) }

// prices are the dual variables: the price of one GPU for one round,
// p = L * (U/L)^(u/C), u the GPUs committed and C the capacity (the OASiS
// price function, docs/policies.md).
type prices struct {
	lo, hi float64
	// node makes u and C those of the node (per node, type and slot);
	// otherwise those of the GPU type in the slot (the default).
	node bool
	// table caches the type-level price by type and GPUs committed.
	table [][]float64
}

func (g *grid) setPrices(lo, hi float64, node bool) {
	p := prices{lo: lo, hi: hi, node: node, table: make([][]float64, len(g.types))}
	for k := range g.types {
		c := g.typeCap[k]
		tab := make([]float64, c+1)
		for u := range tab {
			tab[u] = priceAt(lo, hi, float64(u)/float64(max(c, 1)))
		}
		p.table[k] = tab
	}
	g.prices = p
	g.windows = nil
}

func priceAt(lo, hi, share float64) float64 { return lo * math.Pow(hi/lo, share) }

// price of one more GPU of type k on node n in slot t, at the utilization
// before the buyer's own allocation (OASiS: a job pays the prices it sees).
func (g *grid) price(t, n, k int) float64 {
	if g.prices.node {
		c := g.capacity[n][k]
		return priceAt(g.prices.lo, g.prices.hi, float64(min(g.used[t][n][k], c))/float64(max(c, 1)))
	}
	return g.prices.table[k][min(g.typeUsed[t][k], g.typeCap[k])]
}

// window is the view of the slot range [s, e) a schedule that holds the
// same GPUs throughout sees: the GPUs free in every slot, and the price of
// one GPU summed over the slots.
type window struct {
	s, e     int
	k        int       // types per node
	frees    []int     // [node*k+type]
	prices   []float64 // [node*k+type]
	typeFree []int
	fit      map[[2]int]int
	cheap    map[cheapKey][]slotIdx
}

func (w *window) free(n, k int) int      { return w.frees[n*w.k+k] }
func (w *window) price(n, k int) float64 { return w.prices[n*w.k+k] }

func (g *grid) window(s, e int) *window {
	key := [2]int{s, e}
	if w, ok := g.windows[key]; ok {
		return w
	}
	nk := len(g.nodes) * len(g.types)
	w := &window{s: s, e: e, k: len(g.types), frees: make([]int, nk), prices: make([]float64, nk), typeFree: make([]int, len(g.types))}
	for n := range g.nodes {
		for k := range g.types {
			f := g.capacity[n][k]
			p := 0.0
			for t := s; t < e; t++ {
				f = min(f, g.free(t, n, k))
				p += g.price(t, n, k)
			}
			w.frees[n*w.k+k], w.prices[n*w.k+k] = f, p
			w.typeFree[k] += f
		}
	}
	if g.windows == nil {
		g.windows = map[[2]int]*window{}
	}
	g.windows[key] = w
	return w
}

// bestFit returns the node with the fewest free GPUs of type k that still
// has count free throughout the window, or -1.
func (w *window) bestFit(k, count int) int {
	key := [2]int{k, count}
	if n, ok := w.fit[key]; ok {
		return n
	}
	best := planner.BestFit(len(w.frees)/max(w.k, 1), func(n int) int { return w.free(n, k) }, count)
	if w.fit == nil {
		w.fit = map[[2]int]int{}
	}
	w.fit[key] = best
	return best
}

// mask is, for a job restricted to some nodes and types (JobView.Eligible),
// whether each cell (node n, type k, at n*len(types)+k) may run it; nil
// when the job may run anywhere. Built once per job and plan.
func (g *grid) mask(e round.Eligible) []bool {
	if e == nil {
		return nil
	}
	m := make([]bool, len(g.nodes)*len(g.types))
	for n, name := range g.nodes {
		for k, t := range g.types {
			m[n*len(g.types)+k] = e.Allows(name, t)
		}
	}
	return m
}

// bestFitFor is bestFit among the cells the job may use.
func (w *window) bestFitFor(ji *jobInfo, g *grid, k, count int) int {
	m := ji.cells(g)
	if m == nil {
		return w.bestFit(k, count)
	}
	return planner.BestFit(len(w.frees)/max(w.k, 1), func(n int) int {
		if !m[n*w.k+k] {
			return 0
		}
		return w.free(n, k)
	}, count)
}

// cheapestFor is cheapest among the cells the job may use.
func (g *grid) cheapestFor(ji *jobInfo, w *window, count int, allowed []bool) []slotIdx {
	m := ji.cells(g)
	if m == nil {
		return g.cheapest(w, count, allowed)
	}
	return g.pickCheapest(w, count, allowed, m)
}

// cheapest picks count GPUs among allowed types with the lowest summed
// prices over the window. On equal prices it stays on a cell already
// chosen (fewer servers), then in a rack already chosen (traffic under
// one switch), then takes the cell with the most free GPUs left.
func (g *grid) cheapest(w *window, count int, allowed []bool) []slotIdx {
	key := cheapKey{count: count}
	cacheable := len(g.types) <= 64
	if cacheable {
		for k, a := range allowed {
			if a {
				key.allowed |= 1 << k
			}
		}
		if r, ok := w.cheap[key]; ok {
			return r
		}
	}
	out := g.pickCheapest(w, count, allowed, nil)
	if cacheable {
		if w.cheap == nil {
			w.cheap = map[cheapKey][]slotIdx{}
		}
		w.cheap[key] = out
	}
	return out
}

type cheapKey struct {
	allowed uint64
	count   int
}

// pickCheapest is cheapest without the cache; mask, when not nil, limits
// it to the cells a job may use.
func (g *grid) pickCheapest(w *window, count int, allowed, mask []bool) []slotIdx {
	total := 0
	for k := range g.types {
		if allowed[k] {
			total += w.typeFree[k]
		}
	}
	if mask != nil {
		total = 0
		for n := range g.nodes {
			for k := range g.types {
				if allowed[k] && mask[n*len(g.types)+k] {
					total += w.free(n, k)
				}
			}
		}
	}
	if total < count {
		return nil
	}
	nk := len(g.nodes) * len(g.types)
	if cap(g.taken) < nk {
		g.taken = make([]int, nk)
	}
	taken := g.taken[:nk]
	clear(taken)
	rackUsed := map[string]bool{}
	for range count {
		pn, pk, pickCost := -1, -1, math.Inf(1)
		for n := range g.nodes {
			for k := range g.types {
				q := taken[n*len(g.types)+k]
				if !allowed[k] || w.free(n, k)-q == 0 || mask != nil && !mask[n*len(g.types)+k] {
					continue
				}
				cost := w.price(n, k)
				better := cost < pickCost*(1-1e-12)
				if !better && cost <= pickCost*(1+1e-12) && pn >= 0 {
					pq := taken[pn*len(g.types)+pk]
					ra, rb := rackUsed[g.racks[n]], rackUsed[g.racks[pn]]
					better = q > pq || (q == pq && ra && !rb) ||
						(q == pq && ra == rb && w.free(n, k)-q > w.free(pn, pk)-pq)
				}
				if better {
					pn, pk, pickCost = n, k, cost
				}
			}
		}
		taken[pn*len(g.types)+pk]++
		rackUsed[g.racks[pn]] = true
	}
	var out []slotIdx
	for n := range g.nodes {
		for k := range g.types {
			if c := taken[n*len(g.types)+k]; c > 0 {
				out = append(out, slotIdx{n, k, c})
			}
		}
	}
	return out
}

// costAt is the price of take in slot t.
func (g *grid) costAt(t int, take []slotIdx) float64 {
	c := 0.0
	for _, sl := range take {
		c += float64(sl.count) * g.price(t, sl.n, sl.k)
	}
	return c
}

func (g *grid) unit(take []slotIdx) planner.Unit {
	u := planner.Unit{Slots: make([]planner.Slot, 0, len(take))}
	for _, sl := range take {
		u.Slots = append(u.Slots, planner.Slot{Node: g.nodes[sl.n], Type: g.types[sl.k], Count: sl.count})
	}
	return u
}

// starts lists the slots from which a schedule may start: from itself and
// every later slot where GPUs are released (a commitment ends), since
// starting anywhere else gains nothing over the release before it.
func (g *grid) starts(from int) []int {
	out := []int{from}
	for t := from + 1; t < g.horizon(); t++ {
		for k := range g.types {
			if g.typeUsed[t][k] < g.typeUsed[t-1][k] {
				out = append(out, t)
				break
			}
		}
	}
	return out
}

// sortedIDs lists a map's keys in order, so that replaying commitments is
// deterministic (snapshots must resume exactly).
func sortedIDs(m map[string]*record) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		ra, rb := m[a], m[b]
		if ra.Seq != rb.Seq {
			if ra.Seq < rb.Seq {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		if a > b {
			return 1
		}
		return 0
	})
	return ids
}
