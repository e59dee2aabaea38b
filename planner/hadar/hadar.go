// Package hadar implements the Hadar and HadarE schedulers (Sultana et al.,
// IPDPS 2024 / arXiv 2503.10918) as round.Schedulers.
//
// Hadar is task-level heterogeneity-aware: the workers of one job may sit on
// different GPU types and nodes in the same round, and the job then trains
// at the pace the speed model gives (the slowest worker, see planner/speed).
// It schedules online in a primal-dual framework (the OASiS template the
// paper builds on; docs/policies.md lists what is inferred):
//
//   - Prices p[t][n][g] per (round t of a short horizon, node n, GPU type g)
//     rise exponentially with the GPUs already committed there:
//     p = L * (U/L)^(used/capacity), with U and L the largest and smallest
//     value per GPU-round among the active jobs.
//   - The dual subroutine finds, for one job, the schedule over the horizon
//     (a start round and a task-level placement per round until the job
//     finishes) that maximizes discounted utility minus priced cost.
//   - Jobs are considered in decreasing order of their dual value (value
//     per GPU at their best placement) and admitted when their payoff is
//     positive; commitments raise the prices the next jobs see.
//   - Only the first round of the plan is executed; everything is re-planned
//     every round and on every arrival and completion.
//
// HadarE additionally forks a job into copies on other nodes, whose
// progress adds up and whose parameters are merged at round boundaries.
package hadar

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/policy"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Utility names what the scheduler optimizes.
type Utility string

// Utilities.
const (
	// AvgJCT values progress as the fraction of the job's remaining work
	// done (shortest remaining first), weighted by priority.
	AvgJCT Utility = "jct"
	// Makespan values progress in seconds of best-type work, more for
	// jobs with more remaining time (longest remaining first): the total
	// time duration shrinks when the critical jobs move.
	Makespan Utility = "makespan"
)

// Config holds Hadar's parameters; zero values take the defaults noted.
type Config struct {
	Speed   speed.Model
	Utility Utility // default Makespan
	// Horizon is the number of rounds a job's schedule spans (default 4).
	Horizon int
	// Discount weighs round t's value by Discount^t (default 0.9): later
	// progress is worth less, so a job waits only for a clearly better
	// placement.
	Discount float64
	// FloorRatio sets the lowest price L to the smallest job value per
	// GPU-round divided by FloorRatio (default 4).
	FloorRatio float64
	// LongestFirst is the exponent of the makespan utility's preference for
	// jobs with more remaining time (default 1).
	LongestFirst float64
	// RestartCost is the seconds a job loses when its GPUs change (the
	// simulator's restart cost); it makes keeping a placement worth more.
	RestartCost float64
	// NoMixing restricts every job to one GPU type (job-level, like Gavel),
	// for ablations.
	NoMixing bool
	// NoBackfill leaves GPUs idle that no job had a positive payoff for.
	NoBackfill bool
	// Filter, when set, vetoes candidate placements (planner/placement's
	// locality policies: consolidation, delay scheduling); nil allows all.
	Filter Filter
	// NoFluidGuide turns off the fluid warm start: by default, with the
	// makespan utility, each job's placements are restricted to the GPU
	// types the fluid relaxation (Gavel's min-makespan LP over the active
	// jobs) gives it time on, so types go to the jobs with the comparative
	// advantage on them; Hadar's dual subroutine then decides the concrete
	// task-level placement, rounds and admission.
	NoFluidGuide bool

	// Fork turns on HadarE: idle GPUs after Hadar's plan take copies of
	// running jobs on other nodes.
	Fork bool
	// MaxCopies bounds the units of one job (default 4).
	MaxCopies int
	// MergeCost is the seconds each copy spends per round merging
	// parameters (default 10); a copy is forked only where its added
	// progress beats the merge time it costs every copy.
	MergeCost float64
}

func (c Config) withDefaults() Config {
	if c.Utility == "" {
		c.Utility = Makespan
	}
	if c.Horizon <= 0 {
		c.Horizon = 4
	}
	if c.Discount <= 0 || c.Discount > 1 {
		c.Discount = 0.9
	}
	if c.FloorRatio <= 1 {
		c.FloorRatio = 4
	}
	if c.LongestFirst == 0 {
		c.LongestFirst = 1
	}
	if c.MaxCopies <= 0 {
		c.MaxCopies = 4
	}
	if c.MergeCost == 0 {
		c.MergeCost = 10
	}
	return c
}

// Validate reports the first parameter out of range.
func (c Config) Validate() error {
	switch c.Utility {
	case "", AvgJCT, Makespan:
	default:
		return fmt.Errorf("hadar utility %q: want %q or %q", c.Utility, AvgJCT, Makespan)
	}
	if c.Speed.Profile == nil {
		return fmt.Errorf("hadar: no throughput profile in the speed model")
	}
	if c.MergeCost < 0 || c.RestartCost < 0 {
		return fmt.Errorf("hadar: merge cost %v and restart cost %v: want seconds >= 0", c.MergeCost, c.RestartCost)
	}
	return nil
}

// Filter vetoes a candidate unit of a job (Config.Filter).
type Filter interface {
	Allow(v *round.View, jb *round.JobView, u planner.Unit) bool
}

// Scheduler is Hadar (or HadarE with Config.Fork). One Scheduler serves
// one simulation or sidecar at a time.
type Scheduler struct {
	cfg Config
	// fluid caches the fluid relaxation's support per job, recomputed when
	// the set of active jobs changes at a round boundary.
	fluid    map[string][]bool
	fluidKey string
}

// New returns a Hadar scheduler.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Scheduler{cfg: cfg.withDefaults()}, nil
}

// Name implements round.Scheduler.
func (s *Scheduler) Name() string {
	name := "hadar"
	if s.cfg.Fork {
		name = "hadare"
	}
	if s.cfg.Utility == AvgJCT {
		name += "-jct"
	}
	return name
}

// grid is the planning state: GPUs committed per (round, node, type).
type grid struct {
	nodes    []string
	racks    []string // rack of each node
	types    []planner.GPUType
	capacity [][]int     // [node][type]
	used     [][][]int   // [round][node][type]
	lo, hi   float64     // price bounds L and U
	table    [][]float64 // [type][used]: price of the next GPU
	typeCap  []int
	typeUsed [][]int // [round][type]
	taken    []int   // scratch for cheapest
	// cache of cheapest() per round, dropped when the round's commitments
	// change: jobs with the same type preferences and width share it.
	cache    []map[cheapKey][]slotIdx
	fitCache []map[[2]int]int
}

type cheapKey struct {
	allowed uint64
	count   int
}

func (g *grid) setPrices(lo, hi float64) {
	g.lo, g.hi = lo, hi
	g.table = make([][]float64, len(g.types))
	for k := range g.types {
		c := g.typeCap[k]
		tab := make([]float64, c+1)
		for u := range tab {
			tab[u] = lo * math.Pow(hi/lo, float64(u)/float64(max(c, 1)))
		}
		g.table[k] = tab
	}
}

// price of one GPU of type k in round t at the type's current
// utilization, as in OASiS: a job pays the prices it sees before its own
// allocation raises them. A type's price follows its utilization across
// the cluster, so every node of a type costs the same and packing a job
// onto one node is never dearer than spreading it.
func (g *grid) price(t, k int) float64 {
	return g.table[k][min(g.typeUsed[t][k], g.typeCap[k])]
}

func (g *grid) free(t, n, k int) int { return g.capacity[n][k] - g.used[t][n][k] }

// option is one placement of a job in one round.
type option struct {
	unit planner.Unit
	take []slotIdx
	rate float64
	cost float64
}

type slotIdx struct{ n, k, count int }

// jobInfo caches per-job figures for one planning pass.
type jobInfo struct {
	view     *round.JobView
	idx      int
	tp       []float64 // steps/s per type, as JobView.Throughput
	allowed  []bool    // types the fluid guide lets the job use (nil = all)
	spread   []float64 // steps/s per type when spread over servers
	best     float64   // best steps/s over types
	remTime  float64   // remaining seconds at the best speed
	valueSec float64   // utility per step
	density  float64   // dual value: value per GPU-round at its best
}

// Schedule implements round.Scheduler.
func (s *Scheduler) Schedule(v *round.View) ([]planner.Placement, error) {
	out := make([]planner.Placement, len(v.Jobs))
	g := s.newGrid(v)
	infos := s.jobInfos(v)
	if len(infos) == 0 {
		return out, nil
	}
	if err := s.guide(v, infos); err != nil {
		return nil, err
	}
	s.value(v, infos)
	horizon := s.cfg.Horizon
	if v.MidRound {
		horizon = 1
	}
	// Value per GPU-round bounds the prices.
	lo, hi := math.Inf(1), 0.0
	for _, ji := range infos {
		if ji.density > 0 {
			lo, hi = math.Min(lo, ji.density), math.Max(hi, ji.density)
		}
	}
	if hi == 0 {
		return out, nil
	}
	g.setPrices(lo/s.cfg.FloorRatio, math.Max(hi, lo*1.0001))
	slices.SortFunc(infos, func(a, b *jobInfo) int { return cmp.Or(cmp.Compare(b.density, a.density), cmp.Compare(a.idx, b.idx)) })

	for _, ji := range infos {
		// Only round 0 is executed: once it is full, later jobs' plans
		// for future rounds change nothing that runs now.
		if g.freeTotal(0) == 0 {
			break
		}
		// A job that cannot fit in round 0 at all has nothing to run now;
		// planning its future rounds would only shift later jobs' waits.
		if !g.fits(0, ji) {
			continue
		}
		plan := s.dual(v, g, ji, horizon)
		if plan == nil {
			v.Explain(ji.idx, round.Reason{Why: "no schedule over the horizon pays its prices now"})
			continue
		}
		for t, o := range plan {
			if o == nil {
				continue
			}
			if t == 0 {
				v.Explain(ji.idx, round.Reason{Price: o.cost, Utility: ji.valueSec * o.rate * v.Round,
					Why: fmt.Sprintf("admitted: its progress this round is worth %.3g against a price of %.3g", ji.valueSec*o.rate*v.Round, o.cost)})
			}
			g.commit(t, o)
			if t == 0 {
				out[ji.idx] = planner.Placement{Units: []planner.Unit{o.unit}}
			}
		}
		if plan[0] == nil {
			for t, o := range plan {
				if o != nil {
					v.Explain(ji.idx, round.Reason{Price: o.cost, Utility: ji.valueSec * o.rate * v.Round,
						Why: fmt.Sprintf("scheduled to start in %d round(s), when its prices are lower", t)})
					break
				}
			}
		}
	}
	if !s.cfg.NoBackfill {
		// Work conservation: jobs without a positive payoff, or waiting for
		// a better round, may still use GPUs nobody took this round.
		for _, ji := range infos {
			if len(out[ji.idx].Units) > 0 || g.freeTotal(0) == 0 {
				continue
			}
			if o := s.bestOption(v, g, ji, 0, true); o != nil {
				s.finish(g, o)
				g.commit(0, o)
				out[ji.idx] = planner.Placement{Units: []planner.Unit{o.unit}}
				v.Explain(ji.idx, round.Reason{Why: "backfilled onto GPUs no admitted job took this round"})
			}
		}
	}
	if s.cfg.Fork {
		s.fork(v, g, infos, out)
	}
	// Hand the GPUs out of the view's pool so callers see them taken.
	for _, p := range out {
		for _, u := range p.Units {
			v.Pool.Take(u)
		}
	}
	return out, nil
}

func (s *Scheduler) newGrid(v *round.View) *grid {
	g := &grid{types: v.Types}
	full := round.NewPool(v.Cluster)
	for _, n := range v.Pool.Nodes() {
		g.nodes = append(g.nodes, n)
		g.racks = append(g.racks, v.Pool.Rack(n))
		capRow := make([]int, len(v.Types))
		for k, t := range v.Types {
			capRow[k] = full.Free(n, t)
		}
		g.capacity = append(g.capacity, capRow)
	}
	h := s.cfg.Horizon
	if v.MidRound {
		h = 1
	}
	g.used = make([][][]int, h)
	g.cache = make([]map[cheapKey][]slotIdx, h)
	g.fitCache = make([]map[[2]int]int, h)
	g.typeCap = make([]int, len(v.Types))
	g.typeUsed = make([][]int, h)
	for _, row := range g.capacity {
		for k, c := range row {
			g.typeCap[k] += c
		}
	}
	for t := range h {
		g.used[t] = make([][]int, len(g.nodes))
		for n, name := range g.nodes {
			g.used[t][n] = make([]int, len(v.Types))
			if t == 0 {
				// Round 0 sees only what the pool offers (mid-round: the
				// idle GPUs).
				for k, ty := range v.Types {
					g.used[t][n][k] = g.capacity[n][k] - v.Pool.Free(name, ty)
				}
			}
		}
	}
	for t := range h {
		g.typeUsed[t] = make([]int, len(v.Types))
		for n := range g.nodes {
			for k := range v.Types {
				g.typeUsed[t][k] += g.used[t][n][k]
			}
		}
	}
	return g
}

// bestFit returns the node with the fewest free GPUs of type k that still
// has count free in round t, or -1; cached until round t changes.
func (g *grid) bestFit(t, k, count int) int {
	key := [2]int{k, count}
	if n, ok := g.fitCache[t][key]; ok {
		return n
	}
	best := planner.BestFit(len(g.nodes), func(n int) int { return g.free(t, n, k) }, count)
	if g.fitCache[t] == nil {
		g.fitCache[t] = map[[2]int]int{}
	}
	g.fitCache[t][key] = best
	return best
}

// fits reports whether round t has enough free GPUs of the job's
// runnable types for all its workers.
func (g *grid) fits(t int, ji *jobInfo) bool {
	n := 0
	for k := range g.types {
		if ji.tp[k] > 0 {
			n += g.typeCap[k] - g.typeUsed[t][k]
		}
	}
	return n >= ji.view.ScaleFactor
}

func (g *grid) freeTotal(t int) int {
	n := 0
	for i := range g.nodes {
		for k := range g.types {
			n += g.free(t, i, k)
		}
	}
	return n
}

func (g *grid) commit(t int, o *option) {
	for _, sl := range o.take {
		g.used[t][sl.n][sl.k] += sl.count
		g.typeUsed[t][sl.k] += sl.count
	}
	g.cache[t] = nil
	g.fitCache[t] = nil
}

func (s *Scheduler) jobInfos(v *round.View) []*jobInfo {
	var infos []*jobInfo
	for i, jb := range v.Jobs {
		if v.MidRound && jb.Running {
			continue
		}
		best := 0.0
		for _, x := range jb.Throughput {
			best = math.Max(best, x)
		}
		if best <= 0 || jb.Remaining <= 0 {
			continue
		}
		ji := &jobInfo{view: jb, idx: i, tp: jb.Throughput, best: best, remTime: jb.Remaining / best, spread: make([]float64, len(v.Types))}
		for k, t := range v.Types {
			if jb.Throughput[k] > 0 {
				ji.spread[k], _ = s.cfg.Speed.Profile.Throughput(jb.Model, jb.ScaleFactor, t, true)
			}
		}
		infos = append(infos, ji)
	}
	return infos
}

// value sets each job's utility per step and dual value. A job's best
// speed and remaining time count only the types it may use, so a job the
// fluid guide confines to slow GPUs is seen as the longer job it is.
func (s *Scheduler) value(v *round.View, infos []*jobInfo) {
	maxRem := 0.0
	for _, ji := range infos {
		if ji.allowed != nil {
			best := 0.0
			for k, x := range ji.tp {
				if ji.allowed[k] {
					best = math.Max(best, x)
				}
			}
			if best > 0 {
				ji.best = best
			}
		}
		ji.remTime = ji.view.Remaining / ji.best
		maxRem = math.Max(maxRem, ji.remTime)
	}
	for _, ji := range infos {
		w := ji.view.Weight
		if w <= 0 {
			w = 1
		}
		switch s.cfg.Utility {
		case AvgJCT:
			ji.valueSec = w / ji.view.Remaining
		default:
			ji.valueSec = w / (ji.best * maxRem) * math.Pow(ji.remTime/maxRem, s.cfg.LongestFirst)
		}
		ji.density = ji.valueSec * ji.best * v.Round / float64(ji.view.ScaleFactor)
	}
}

// dual is the dual subroutine: the best schedule of one job over the
// horizon, as one option per round (nil = not running then), or nil when no
// schedule has a positive payoff.
func (s *Scheduler) dual(v *round.View, g *grid, ji *jobInfo, horizon int) []*option {
	// The best placement of each round does not depend on when the
	// schedule starts: find it once per round.
	opts := make([]*option, horizon)
	for t := range horizon {
		opts[t] = s.bestOption(v, g, ji, t, false)
	}
	var best []*option
	bestPay := 0.0
	for start := range horizon {
		plan := make([]*option, horizon)
		pay := 0.0
		left := ji.view.Remaining
		disc := math.Pow(s.cfg.Discount, float64(start))
		for t := start; t < horizon && left > 0; t++ {
			o := opts[t]
			if o == nil {
				break
			}
			steps := math.Min(left, o.rate*v.Round)
			left -= steps
			gain := disc*ji.valueSec*steps - o.cost
			if gain <= 0 {
				break
			}
			pay += gain
			plan[t] = o
			disc *= s.cfg.Discount
		}
		if pay > bestPay {
			best, bestPay = plan, pay
		}
	}
	for _, o := range best {
		if o != nil && o.unit.Slots == nil {
			o.unit = g.unit(o.take)
		}
	}
	return best
}

// bestOption finds the placement of the job's ScaleFactor workers in round
// t with the largest value minus priced cost (ignoring prices when free
// is set, for backfill). Candidates: the previous GPUs (no restart), each
// single-node single-type fit, and, for each pace type, the cheapest GPUs
// among types at least that fast (task-level mixing across types and
// nodes).
func (s *Scheduler) bestOption(v *round.View, g *grid, ji *jobInfo, t int, free bool) *option {
	sf := ji.view.ScaleFactor
	var best *option
	bestScore := math.Inf(-1)
	score := func(o *option) float64 {
		if free {
			return o.rate
		}
		return ji.valueSec*o.rate*v.Round - o.cost
	}
	consider := func(o *option) {
		if o == nil || o.rate <= 0 {
			return
		}
		if s.cfg.Filter != nil {
			s.finish(g, o)
			if !s.cfg.Filter.Allow(v, ji.view, o.unit) {
				return
			}
		}
		if sc := score(o); sc > bestScore {
			best, bestScore = o, sc
		}
	}
	restartLoss := 1.0
	if s.cfg.RestartCost > 0 {
		restartLoss = math.Max(0, 1-s.cfg.RestartCost/v.Round)
	}
	if t == 0 {
		consider(s.keepOption(v, g, ji))
	}
	// Single node, single type: score every cell without allocating, then
	// build the winner.
	bn, bk, bScore := -1, -1, bestScore
	var bRate, bCost float64
	for k := range g.types {
		if ji.tp[k] <= 0 || (!free && ji.allowed != nil && !ji.allowed[k]) {
			continue
		}
		// Prices are per type, so every node of a type with room scores
		// the same: take the best-fit one (fewest free GPUs), which keeps
		// large holes for wide jobs.
		n := g.bestFit(t, k, sf)
		if n < 0 {
			continue
		}
		c := float64(sf) * g.price(t, k)
		r := ji.tp[k] * restartLoss
		sc := r
		if !free {
			sc = ji.valueSec*r*v.Round - c
		}
		if sc > bScore {
			bn, bk, bScore, bRate, bCost = n, k, sc, r, c
		}
	}
	if bn >= 0 {
		take := []slotIdx{{bn, bk, sf}}
		o := &option{take: take, cost: bCost, rate: bRate}
		if s.cfg.Speed.Network != nil {
			o.rate = s.takeRate(v, g, ji, take) * restartLoss
		}
		consider(o)
	}
	if sf == 1 {
		return best
	}
	// Spread or mixed: per pace type, the cheapest GPUs among types at
	// least as fast for this job.
	allowed := make([]bool, len(g.types))
	for pace := range g.types {
		if ji.tp[pace] <= 0 || (!free && ji.allowed != nil && !ji.allowed[pace]) {
			continue
		}
		for k := range g.types {
			if s.cfg.NoMixing {
				allowed[k] = k == pace
			} else {
				allowed[k] = ji.tp[k] >= ji.tp[pace] && (free || ji.allowed == nil || ji.allowed[k])
			}
		}
		take := s.cheapest(g, t, sf, allowed)
		if take == nil {
			continue
		}
		o := &option{take: take, cost: s.cost(g, t, take)}
		o.rate = s.takeRate(v, g, ji, take) * restartLoss
		consider(o)
	}
	return best
}

// finish builds the unit of a chosen option.
func (s *Scheduler) finish(g *grid, o *option) {
	if o != nil && o.unit.Slots == nil {
		o.unit = g.unit(o.take)
	}
}

func (g *grid) unit(take []slotIdx) planner.Unit {
	u := planner.Unit{Slots: make([]planner.Slot, 0, len(take))}
	for _, sl := range take {
		u.Slots = append(u.Slots, planner.Slot{Node: g.nodes[sl.n], Type: g.types[sl.k], Count: sl.count})
	}
	return u
}

// takeRate is the speed of a candidate placement. Without a network model
// it follows planner/speed from the job's cached per-type figures.
func (s *Scheduler) takeRate(v *round.View, g *grid, ji *jobInfo, take []slotIdx) float64 {
	if s.cfg.Speed.Network != nil || s.cfg.Speed.MixedEfficiency != 0 {
		return s.rate(v, ji, g.unit(take))
	}
	multi := false
	for _, sl := range take[1:] {
		multi = multi || sl.n != take[0].n
	}
	spread := multi && !s.cfg.Speed.IgnoreSpread
	r := math.Inf(1)
	for _, sl := range take {
		x := ji.tp[sl.k]
		if spread {
			x = ji.spread[sl.k]
		}
		r = math.Min(r, x)
	}
	return r
}

func (s *Scheduler) cost(g *grid, t int, take []slotIdx) float64 {
	c := 0.0
	for _, sl := range take {
		c += float64(sl.count) * g.price(t, sl.k)
	}
	return c
}

// keepOption is the job's previous placement, if all of it is free in
// round 0.
func (s *Scheduler) keepOption(v *round.View, g *grid, ji *jobInfo) *option {
	prev := ji.view.Placement.Units
	if len(prev) == 0 || !ji.view.Running && v.MidRound {
		return nil
	}
	// A forked job keeps its first unit; copies are re-decided.
	u := prev[0]
	if u.GPUs() != ji.view.ScaleFactor {
		return nil
	}
	var take []slotIdx
	for _, sl := range u.Slots {
		n := slices.Index(g.nodes, sl.Node)
		k := slices.Index(g.types, sl.Type)
		if n < 0 || k < 0 || g.free(0, n, k) < sl.Count {
			return nil
		}
		take = append(take, slotIdx{n, k, sl.Count})
	}
	return &option{unit: u, take: take, cost: s.cost(g, 0, take), rate: s.rate(v, ji, u)}
}

// cheapest picks count GPUs among allowed types with the lowest marginal
// prices, preferring nodes with more free GPUs on ties (fewer servers).
func (s *Scheduler) cheapest(g *grid, t, count int, allowed []bool) []slotIdx {
	key := cheapKey{count: count}
	cacheable := len(g.types) <= 64
	if cacheable {
		for k, a := range allowed {
			if a {
				key.allowed |= 1 << k
			}
		}
		if r, ok := g.cache[t][key]; ok {
			return r
		}
	}
	out := g.cheapest(t, count, allowed)
	if cacheable {
		if g.cache[t] == nil {
			g.cache[t] = map[cheapKey][]slotIdx{}
		}
		g.cache[t][key] = out
	}
	return out
}

func (g *grid) cheapest(t, count int, allowed []bool) []slotIdx {
	nk := len(g.nodes) * len(g.types)
	if cap(g.taken) < nk {
		g.taken = make([]int, nk)
	}
	taken := g.taken[:nk]
	clear(taken)
	total := 0
	for n := range g.nodes {
		for k := range g.types {
			if allowed[k] {
				total += g.free(t, n, k)
			}
		}
	}
	if total < count {
		return nil
	}
	var out []slotIdx
	// Equal prices: stay on a cell in use (fewer servers), then in a rack in
	// use (traffic stays under one switch), then take the cell with the
	// most free GPUs left.
	rackUsed := map[string]bool{}
	for range count {
		pn, pk, pickCost := -1, -1, math.Inf(1)
		for n := range g.nodes {
			for k := range g.types {
				if !allowed[k] || g.free(t, n, k)-taken[n*len(g.types)+k] == 0 {
					continue
				}
				q := taken[n*len(g.types)+k]
				cost := g.price(t, k)
				better := cost < pickCost*(1-1e-12)
				if !better && cost <= pickCost*(1+1e-12) && pn >= 0 {
					pq := taken[pn*len(g.types)+pk]
					ra, rb := rackUsed[g.racks[n]], rackUsed[g.racks[pn]]
					better = q > pq || (q == pq && ra && !rb) ||
						(q == pq && ra == rb && g.free(t, n, k)-q > g.free(t, pn, pk)-pq)
				}
				if better {
					pn, pk, pickCost = n, k, cost
				}
			}
		}
		taken[pn*len(g.types)+pk]++
		rackUsed[g.racks[pn]] = true
	}
	for n := range g.nodes {
		for k := range g.types {
			if c := taken[n*len(g.types)+k]; c > 0 {
				out = append(out, slotIdx{n, k, c})
			}
		}
	}
	return out
}

func (s *Scheduler) rate(v *round.View, ji *jobInfo, u planner.Unit) float64 {
	r, err := s.cfg.Speed.UnitRate(ji.view.Job, u, v.Now)
	if err != nil {
		return 0
	}
	return r
}

// guide sets each job's allowed types from the fluid relaxation.
func (s *Scheduler) guide(v *round.View, infos []*jobInfo) error {
	if s.cfg.NoFluidGuide || s.cfg.Utility != Makespan {
		return nil
	}
	if !v.MidRound {
		key := round.JobSetKey(v)
		if key != s.fluidKey || s.fluid == nil {
			a, err := policy.Makespan{}.Allocate(round.PolicyInput(v, nil))
			if err != nil {
				return fmt.Errorf("hadar fluid guide: %w", err)
			}
			s.fluid = make(map[string][]bool, len(v.Jobs))
			for i, j := range v.Jobs {
				row := make([]bool, len(v.Types))
				any := false
				for k, x := range a.X[i] {
					row[k] = x > 1e-6
					any = any || row[k]
				}
				if any {
					s.fluid[j.ID] = row
				}
			}
			s.fluidKey = key
		}
	}
	for _, ji := range infos {
		ji.allowed = s.fluid[ji.view.ID]
	}
	return nil
}
