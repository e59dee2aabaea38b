// Package hadar implements the Hadar and HadarE schedulers (Sultana et al.,
// IPDPS 2024 / arXiv 2503.10918) as round.Schedulers.
//
// Hadar is task-level heterogeneity-aware: the workers of one job may sit on
// different GPU types and nodes in the same round, and the job then trains
// at the pace the speed model gives (the slowest worker, see planner/speed).
// It schedules online in the OASiS primal-dual framework the paper builds on
// (docs/policies.md lists what is inferred):
//
//   - A calendar of time slots (one per round) over a horizon holds the
//     schedules committed to admitted jobs: which GPUs of which nodes each
//     job holds in which slot. It persists across rounds.
//   - Prices p[t][n][g] per (slot t, node n, GPU type g) follow from the
//     commitments: p = L * (U/L)^(committed/capacity), with L and U derived
//     from the workload (params.go).
//   - The dual subroutine chooses, for one job, the schedule (a start slot
//     and the GPUs it holds from then on) that maximizes the utility of its
//     progress minus the prices of the GPUs; the job is admitted when that
//     payoff is positive, and its schedule is committed, raising the prices
//     later jobs see. Admission stands; schedules are revised only by the
//     rules of revise (calendar shifts, early finishes, lost capacity).
//   - Each round executes the commitments of its slot. Backfill gives the
//     GPUs no commitment holds to jobs the subroutine found no paying
//     schedule for, for that round only; a job it postponed is never
//     started early.
//
// HadarE additionally forks a job into copies on other nodes, whose
// progress adds up and whose parameters are merged at round boundaries.
package hadar

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sia"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Utility names what the scheduler optimizes.
type Utility string

// Utilities.
const (
	// AvgJCT values a job's completion by w * D / (completion - now), D
	// its remaining time at its best speed: the inverse of its slowdown.
	// Per GPU-second, short jobs are worth most (shortest remaining
	// first), and delaying a job costs in proportion to its length.
	AvgJCT Utility = "jct"
	// Makespan is AvgJCT for most jobs, plus the jobs that decide the
	// total time duration: a job whose remaining time at its best speed
	// reaches Critical of the remaining makespan's lower bound is worth
	// more than any price, so it runs at its best placement every round.
	Makespan Utility = "makespan"
)

const defaultCritical = 0.9

// criticalBand is how far, as a share of the time left, a critical job's
// remaining time may fall below Config.Critical before it stops being
// critical (value). Measured: docs/results.md, "Restarts at the critical
// threshold".
const criticalBand = 0.002

// DefaultMinRunTime is Config.MinRunTime's default: the engine's default
// as the sidecar and hadar sim configure it (30 minutes).
const DefaultMinRunTime = 1800.0

// Config holds Hadar's parameters; zero values take the defaults noted.
type Config struct {
	Speed   speed.Model
	Utility Utility // default Makespan
	// Horizon fixes the number of slots (rounds) of the calendar; 0 derives
	// it from the workload (params.go) within [MinHorizon, MaxHorizon]
	// (defaults 2 and 16).
	Horizon, MinHorizon, MaxHorizon int
	// Blocking is the share of a typical job's utility that waiting behind
	// commitments may cost it: the derived horizon is Blocking times the
	// typical job's duration (default 0.05).
	Blocking float64
	// FloorRatio sets the lowest price L to the smallest job value per
	// GPU-round divided by FloorRatio (default 4, OASiS's 1/(4 eta) with
	// eta = 1).
	FloorRatio float64
	// Critical is the share of the remaining makespan's lower bound from
	// which a job is critical under the makespan utility (default 0.9).
	Critical float64
	// RestartCost is the seconds a job loses when its GPUs change (the
	// simulator's restart cost); it makes keeping a placement worth more.
	RestartCost float64
	// MinRunTime is the least time in seconds a job holds the GPUs it
	// starts on before the engine lets any decision take them (its own
	// JobView MinRunTime overrides it): every start is planned as held
	// that long, and a job within it keeps its GPUs. 0 takes
	// DefaultMinRunTime (the sidecar's and hadar sim's default); negative
	// means none.
	MinRunTime float64
	// NoMixing restricts every job to one GPU type (job-level, like Gavel),
	// for ablations.
	NoMixing bool
	// NoBackfill leaves GPUs idle that no commitment holds.
	NoBackfill bool
	// Eager drops the restart-aware decisions (an ablation): a running
	// job's GPUs go to whichever job plans first in the dual order, and
	// running jobs move wherever their plan pays most, with no test of
	// gain against restart. Hadar is eager anyway where a preemption
	// costs nothing (RestartCost 0 and no minimum run time, as in Gavel's
	// fidelity).
	Eager bool
	// PricedPlacement chooses a guided job's GPUs by value minus price,
	// as the template does, instead of the fastest on its guided types
	// (an ablation).
	PricedPlacement bool
	// FlatPrices charges L for every GPU whatever the commitments (U = L):
	// the ablation that shows what prices do.
	FlatPrices bool
	// NodePrices makes a GPU's price follow its node's committed share
	// instead of its type's (an ablation: it spreads jobs over nodes).
	NodePrices bool
	// Filter, when set, vetoes candidate placements (planner/placement's
	// locality policies: consolidation, delay scheduling); nil allows all.
	Filter Filter
	// NoFluidGuide turns off the fluid warm start: by default, with the
	// makespan utility, each job's placements are restricted to the GPU
	// types the fluid relaxation (Gavel's min-makespan LP over the active
	// jobs) gives it time on, so types go to the jobs with the comparative
	// advantage on them; Hadar's dual subroutine then decides the concrete
	// task-level placement, slots and admission.
	NoFluidGuide bool

	// NoProgram plans rounds with elastic jobs by the primal-dual too
	// (an ablation): by default such a round is the configuration
	// program's (program.go).
	NoProgram bool
	// NoDrain plans a backlog by the primal-dual (an ablation): by
	// default, a backlog's rounds with an elastic job are Sia's
	// program's, weighted toward short jobs until its drain (program.go,
	// backlogPlan).
	NoDrain bool

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
	if c.MinHorizon <= 0 {
		c.MinHorizon = 2
	}
	if c.MaxHorizon <= 0 {
		c.MaxHorizon = 16
	}
	c.MaxHorizon = max(c.MaxHorizon, c.MinHorizon)
	if c.FloorRatio <= 1 {
		c.FloorRatio = 4
	}
	if c.Critical <= 0 || c.Critical > 1 {
		c.Critical = defaultCritical
	}
	if c.Blocking <= 0 {
		c.Blocking = 0.05
	}
	if c.MaxCopies <= 0 {
		c.MaxCopies = 4
	}
	if c.MergeCost == 0 {
		c.MergeCost = 10
	}
	switch {
	case c.MinRunTime == 0:
		c.MinRunTime = DefaultMinRunTime
	case c.MinRunTime < 0:
		c.MinRunTime = 0
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
	if math.IsNaN(c.MinRunTime) || math.IsInf(c.MinRunTime, 0) {
		return fmt.Errorf("hadar: min run time %v s: want seconds (0 = the default, negative = none)", c.MinRunTime)
	}
	if c.MergeCost < 0 || c.RestartCost < 0 {
		return fmt.Errorf("hadar: merge cost %v and restart cost %v: want seconds >= 0", c.MergeCost, c.RestartCost)
	}
	if c.Horizon < 0 || c.MinHorizon < 0 || c.MaxHorizon < 0 {
		return fmt.Errorf("hadar: horizon %d, min %d, max %d: want slots >= 0", c.Horizon, c.MinHorizon, c.MaxHorizon)
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
	// fluidRate is each job's throughput in the fluid solution: the
	// remaining makespan of that solution is the largest remaining steps
	// over it (value uses it to find the critical jobs).
	fluidRate map[string]float64
	// fluidUse is the GPUs of each type the fluid solution keeps busy
	// (time shares times the width each job is posed at).
	fluidUse []float64

	// The primal-dual state, saved in snapshots (state.go).
	// cur is the absolute number of the current slot, started at base.
	cur     int64
	base    float64
	started bool
	seq     int64
	bounds  bounds
	// target is the makespan the makespan utility aims at (value).
	target    float64
	hasTarget bool
	jobs      map[string]*record
	// lastCall is the time of the previous plan (hasLast once there was
	// one): a placement first seen now started then.
	lastCall float64
	hasLast  bool

	// Per plan: the slots each job within its minimum run time keeps its
	// GPUs for, and the copies (units after the first) it keeps with them.
	pins    map[string]int
	copies  map[string][]planner.Unit
	tenants map[string]*tenancy
	// displaced says why, for the running jobs a preemption stopped.
	displaced map[string]string
	minWeight float64
	rs        *releases
	// backlog says a round had more than backlogJobs active jobs and
	// fewer than resumeJobs have not been seen since (programRound).
	backlog bool
	// held is the configuration program's tail at its last round
	// boundary (tailHold), none after a round of the primal-dual.
	held []string
	// sia plans a backlog's rounds with an elastic job (backlogPlan); its
	// restart counts are part of the snapshot.
	sia *sia.Scheduler
}

// New returns a Hadar scheduler.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	d, err := sia.New(sia.Config{RestartCost: cfg.RestartCost, Backfill: !cfg.NoBackfill, FreeGrowth: true})
	if err != nil {
		return nil, fmt.Errorf("hadar: the drain's Sia: %w", err)
	}
	return &Scheduler{cfg: cfg, jobs: map[string]*record{}, sia: d}, nil
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
	return name + s.variant()
}

// variant names the ablations switched on, as the registry spells them.
func (s *Scheduler) variant() string {
	v := ""
	for _, f := range []struct {
		on   bool
		name string
	}{{s.cfg.FlatPrices, "flat"}, {s.cfg.NodePrices, "nodeprices"}, {s.cfg.NoBackfill, "nobackfill"}, {s.cfg.NoFluidGuide, "noguide"},
		{s.cfg.Eager, "eager"}, {s.cfg.PricedPlacement, "pricedplace"}, {s.cfg.NoProgram, "noprogram"}, {s.cfg.NoDrain, "nodrain"}} {
		if f.on {
			v += ":" + f.name
		}
	}
	if s.cfg.Horizon > 0 {
		v += fmt.Sprintf(":h%d", s.cfg.Horizon)
	}
	if s.cfg.Critical != defaultCritical {
		v += ":crit" + strconv.FormatFloat(s.cfg.Critical, 'g', -1, 64)
	}
	return v
}

// Bounds returns the price function's L and U and the template's alpha,
// as derived from the jobs seen so far.
func (s *Scheduler) Bounds() (lo, hi, alpha float64) {
	lo, hi = s.bounds.priceRange(s.cfg)
	return lo, hi, s.bounds.Alpha(s.cfg)
}

// option is one placement of a job held over some slots.
type option struct {
	unit planner.Unit
	take []slotIdx
	rate float64 // steps/s once started
	keep bool    // the GPUs it holds now: no restart
}

type slotIdx struct{ n, k, count int }

// schedule is the dual subroutine's answer for one job: opt held over the
// slots [start, end) of the horizon.
type schedule struct {
	opt        *option
	start, end int
	pay        float64 // value minus price over the schedule
	value      float64
	cost       float64
}

// jobInfo caches per-job figures for one planning pass.
type jobInfo struct {
	view     *round.JobView
	idx      int
	tp       []float64 // steps/s per type, as JobView.Throughput
	allowed  []bool    // types the fluid guide lets the job use (nil = all)
	spread   []float64 // steps/s per type when spread over servers
	best     float64   // best steps/s over allowed types
	remTime  float64   // remaining seconds at the best speed
	valueSec float64   // utility per step
	density  float64   // dual value: value per GPU-round at its best
	base     float64   // density before the critical boost (price bounds)
	critical bool
	// protected: its remaining time at the width it holds reaches the
	// makespan's share (Config.Critical): no other job preempts it or
	// shrinks it. Every critical job is protected; an elastic job may be
	// protected and not critical (value).
	protected bool
	// mask is the grid's cells the job may use (grid.mask of its
	// Eligible), built on first use; masked says it was.
	mask   []bool
	masked bool
	// width is the GPUs the job is planned at: its scale factor, or for
	// an elastic job the width being weighed (width.go); tp, spread and
	// best are its figures at that width. 0 means the scale factor.
	width int
	// at caches an elastic job's figures per width (width.go).
	at map[int]*widthFigures
	// wmax is the widest width an elastic job is planned or grown at
	// while the cluster is contested (effCap; 0: any).
	wmax int
}

// sf is the number of GPUs (workers) the job is planned at.
func (ji *jobInfo) sf() int {
	if ji.width > 0 {
		return ji.width
	}
	return ji.view.ScaleFactor
}

// cells is the job's mask on g (nil: every cell).
func (ji *jobInfo) cells(g *grid) []bool {
	if !ji.masked {
		ji.mask, ji.masked = g.mask(ji.view.Eligible), true
	}
	return ji.mask
}

// Schedule implements round.Scheduler.
func (s *Scheduler) Schedule(v *round.View) ([]planner.Placement, error) {
	if s.programRound(v) {
		return s.program(v)
	}
	s.held = nil
	if s.backlogRound(v) {
		return s.backlogPlan(v)
	}
	out := make([]planner.Placement, len(v.Jobs))
	infos := s.jobInfos(v)
	if err := s.guide(v, infos); err != nil {
		return nil, err
	}
	s.value(v, infos)
	for _, ji := range infos {
		if _, ok := s.jobs[ji.view.ID]; !ok {
			s.jobs[ji.view.ID] = &record{Seq: s.seq, Density: ji.base}
			s.seq++
			s.bounds.see(ji.base, ji.remTime/v.Round)
		}
	}
	s.advance(v)
	s.track(v)
	h := s.bounds.horizon(s.cfg)
	g := s.newGrid(v, h)
	s.setPins(v)
	s.replay(v, g, infos)
	s.tenants = map[string]*tenancy{}
	// Tenancy is reserved once the jobs critical for the makespan have
	// planned (they come first in the dual order): a tenant only avoids a
	// restart, while any delay of a critical job is the makespan's.
	tenantsDue := s.restartAware()
	if len(infos) == 0 || s.bounds.Jobs == 0 {
		return out, nil
	}
	lo, hi := s.bounds.priceRange(s.cfg)
	g.setPrices(lo, hi, s.cfg.NodePrices)
	s.effCap(v, g, infos)
	// The dual order: jobs in decreasing value per GPU-round.
	slices.SortFunc(infos, func(a, b *jobInfo) int {
		return cmp.Or(cmp.Compare(b.density, a.density), cmp.Compare(b.remTime, a.remTime), cmp.Compare(a.idx, b.idx))
	})
	var rejected []*jobInfo
	s.displaced, s.minWeight = map[string]string{}, math.Inf(1)
	for _, ji := range infos {
		s.minWeight = math.Min(s.minWeight, jobWeight(ji))
	}
	s.rs = nil
	if !v.MidRound && s.restartAware() {
		s.rs = s.releases(v, g, infos, nil)
	}
	ahead := 0
	for _, ji := range infos {
		if tenantsDue && !ji.critical {
			tenantsDue = false
			s.reserveTenants(v, g, infos)
		}
		if v.MidRound && ji.view.Running {
			continue
		}
		ok := s.plan(v, g, ji)
		if s.rs != nil && s.displace(v, g, ji, infos, s.rs, ahead) {
			ok = true
		} else if s.rs != nil && s.shrink(v, g, ji, infos, s.rs, ahead) {
			ok = true
		}
		if !ok {
			rejected = append(rejected, ji)
		}
		if _, now := s.jobs[ji.view.ID].holds(s.cur); !now && !holding(v, ji.view) {
			ahead += ji.sf()
		}
	}
	// Execute slot 0 of every commitment.
	for _, ji := range infos {
		if v.MidRound && ji.view.Running {
			continue
		}
		if u, ok := s.jobs[ji.view.ID].holds(s.cur); ok {
			out[ji.idx] = planner.Placement{Units: append([]planner.Unit{u}, s.copies[ji.view.ID]...)}
		}
	}
	if !s.cfg.NoBackfill {
		s.backfill(v, g, rejected, out)
		s.startWaiting(v, g, infos, out)
		s.upgrade(v, g, infos, out)
	} else {
		for id := range s.tenants {
			s.vacate(g, id)
		}
	}
	if s.cfg.Fork {
		s.fork(v, g, infos, out)
	}
	for _, ji := range infos {
		if why, ok := s.displaced[ji.view.ID]; ok {
			if len(out[ji.idx].Units) > 0 && v.Reasons != nil {
				if strings.HasPrefix(why, "shrinks") {
					why += "; " + v.Reasons[ji.idx].Why
				} else {
					why += "; runs elsewhere: " + v.Reasons[ji.idx].Why
				}
			}
			v.Explain(ji.idx, round.Reason{Why: why})
		}
	}
	// Hand the GPUs out of the view's pool so callers see them taken.
	for _, p := range out {
		for _, u := range p.Units {
			v.Pool.Take(u)
		}
	}
	return out, nil
}

// advance moves the calendar to the current round and forgets jobs that
// left. At a round boundary the current slot moves by the rounds elapsed
// since the last boundary; commitments of past slots expire.
func (s *Scheduler) advance(v *round.View) {
	active := make(map[string]bool, len(v.Jobs))
	for _, jb := range v.Jobs {
		active[jb.ID] = true
	}
	for id := range s.jobs {
		if !active[id] {
			delete(s.jobs, id) // finished (or failed): its commitments are released
		}
	}
	if v.MidRound {
		return
	}
	if !s.started {
		s.started, s.base = true, v.Now
		return
	}
	elapsed := int64(math.Round((v.Now - s.base) / v.Round))
	if elapsed > 0 {
		s.cur += elapsed
		s.base = v.Now
	}
	for _, r := range s.jobs {
		r.clip(s.cur, math.MaxInt64)
	}
}

// replay writes the commitments into the grid, applying the revision rules
// that keep them true to the cluster and the estimates (docs/policies.md,
// "Revisions"):
//
//   - a commitment on GPUs the cluster no longer has (node lost, drained,
//     GPUs gone) is dropped from the first slot it does not fit, latest
//     admitted first; the job plans again this round;
//   - a job's commitment beyond the slots its estimated remaining work
//     needs at its committed speed is released (it finishes early);
//   - commitments beyond the horizon are dropped (a shorter horizon).
//
// Mid-round, slot 0 is the pool's and a running job's GPUs are already
// busy there; a waiting job's commitment for slot 0 stands only if its
// GPUs are idle.
func (s *Scheduler) replay(v *round.View, g *grid, infos []*jobInfo) {
	byID := make(map[string]*jobInfo, len(infos))
	for _, ji := range infos {
		byID[ji.view.ID] = ji
	}
	h := int64(g.horizon())
	// Pinned jobs first: the engine keeps them where they are, so their
	// GPUs are taken whatever was committed on them.
	ids := sortedIDs(s.jobs)
	slices.SortStableFunc(ids, func(a, b string) int { return cmp.Compare(s.pins[b], s.pins[a]) })
	for _, id := range ids {
		r := s.jobs[id]
		r.clip(s.cur, s.cur+h)
		ji := byID[id]
		if ji == nil {
			r.Segs = nil // cannot run now (no runnable type)
			continue
		}
		if n := s.pins[id]; n > 0 {
			s.replayCopies(v, g, ji, n)
		}
		// Estimated slots still needed, counted from the first slot of
		// the commitment.
		left := ji.view.Remaining
		var kept []segment
		for _, sg := range r.Segs {
			take, ok := g.resolve(sg.Unit)
			ok = ok && ji.view.Eligible.AllowsUnit(sg.Unit)
			rate := 0.0
			if ok {
				rate = s.rate(v, ji, sg.Unit)
			}
			if !ok || rate <= 0 || left <= 0 {
				break
			}
			to := sg.From
			for t := sg.From; t < sg.To && left > 0; t++ {
				rel := int(t - s.cur)
				if rel == 0 && v.MidRound && ji.view.Running {
					left -= rate * v.Round // already busy in the pool
					to = t + 1
					continue
				}
				if !g.fitsAt(rel, take) {
					break
				}
				g.commit(rel, rel+1, take)
				left -= rate * v.Round
				to = t + 1
			}
			if to > sg.From {
				kept = append(kept, segment{From: sg.From, To: to, Unit: sg.Unit})
			}
			if to < sg.To {
				break
			}
		}
		r.Segs = kept
	}
}

// replayCopies takes the GPUs of a pinned job's copies in its pinned slots
// (mid-round, slot 0 is busy already); a copy whose GPUs are gone is
// dropped.
func (s *Scheduler) replayCopies(v *round.View, g *grid, ji *jobInfo, n int) {
	var kept []planner.Unit
	for _, u := range s.copies[ji.view.ID] {
		take, ok := g.resolve(u)
		if !ok {
			continue
		}
		from := 0
		if v.MidRound {
			from = 1
		}
		to := min(n, g.horizon())
		fits := true
		for t := from; t < to; t++ {
			fits = fits && g.fitsAt(t, take)
		}
		if !fits {
			continue
		}
		g.commit(from, to, take)
		kept = append(kept, u)
	}
	s.copies[ji.view.ID] = kept
}

// plan runs the dual subroutine for one job and commits what it chooses.
// It reports whether the job holds a commitment afterwards (running now or
// postponed); false means no schedule pays its prices.
func (s *Scheduler) plan(v *round.View, g *grid, ji *jobInfo) bool {
	r := s.jobs[ji.view.ID]
	h := g.horizon()
	cur, holdsNow := r.holds(s.cur)
	ten := s.vacate(g, ji.view.ID)
	switch {
	case holdsNow:
		if s.restartAware() && s.pins[ji.view.ID] == 0 && holding(v, ji.view) && !cur.Equal(ji.view.Placement.Units[0]) {
			cur = s.stayOrMove(v, g, ji, r, cur)
		}
		// Running under its commitment: extend it to the slots it opened
		// (the horizon moved) if it needs them and they pay.
		end := int(r.end() - s.cur)
		need := ji.view.Remaining - s.committedSteps(v, ji, r)
		if end < h && need > 0 {
			last := r.Segs[len(r.Segs)-1].Unit
			if sc := s.dual(v, g, ji, end, s.keepFrom(v, g, ji, last), need); sc != nil {
				s.commit(g, r, sc)
			} else if ten != nil {
				s.reoccupy(g, ji.view.ID, ten)
			}
		}
		s.explainCommitted(v, g, ji, cur)
		return true
	case len(r.Segs) > 0 && holding(v, ji.view):
		// Running, committed only from a later slot (it started early on
		// idle GPUs): it goes on where it is until then, when it moves to
		// its committed GPUs if that pays (stayOrMove). Where its GPUs are
		// not free that long, it plans again from now: stopping it to
		// start it later is no schedule to choose.
		here := ji.view.Placement.Units[0]
		from := int(r.Segs[0].From - s.cur)
		if take, ok := g.resolve(here); ok && ji.view.Eligible.AllowsUnit(here) {
			fits := true
			for t := range from {
				fits = fits && g.fitsAt(t, take)
			}
			if fits && s.rate(v, ji, here) > 0 {
				g.commit(0, from, take)
				r.Segs = append([]segment{{From: s.cur, To: s.cur + int64(from), Unit: here}}, r.Segs...)
				v.Explain(ji.idx, round.Reason{Why: fmt.Sprintf("runs where it started early until its committed schedule starts in %d round(s)", from)})
				return true
			}
		}
		s.release(v, g, ji, r)
	case len(r.Segs) > 0:
		// Postponed: plan again against today's prices; the new schedule
		// replaces the old one only if it pays more (so admission stands:
		// the old one is kept even if prices rose since).
		saved := slices.Clone(r.Segs)
		oldPay := s.release(v, g, ji, r)
		sc := s.dual(v, g, ji, 0, s.keepNow(v, g, ji), ji.view.Remaining)
		if sc == nil || sc.pay <= oldPay {
			s.recommit(g, r, saved)
			v.Explain(ji.idx, round.Reason{Why: fmt.Sprintf("postponed: its committed schedule starts in %d round(s)", r.Segs[0].From-s.cur)})
			return true
		}
		s.commit(g, r, sc)
		s.explainPlan(v, ji, sc)
		return true
	}
	sc := s.dual(v, g, ji, 0, s.keepNow(v, g, ji), ji.view.Remaining)
	if sc == nil {
		if ten != nil {
			s.reoccupy(g, ji.view.ID, ten)
		}
		if r.Admitted {
			v.Explain(ji.idx, round.Reason{Why: "admitted earlier; no schedule over the horizon pays today's prices, so it waits"})
		} else {
			v.Explain(ji.idx, round.Reason{Why: "no schedule over the horizon pays its prices: not admitted yet"})
		}
		return false
	}
	r.Admitted = true
	s.commit(g, r, sc)
	s.explainPlan(v, ji, sc)
	return true
}

// release takes a postponed job's commitments off the grid and returns
// what they pay at today's prices (possibly negative: prices may have
// risen since they were committed).
func (s *Scheduler) release(v *round.View, g *grid, ji *jobInfo, r *record) float64 {
	pay := 0.0
	for _, sg := range r.Segs {
		take, ok := g.resolve(sg.Unit)
		if !ok {
			continue
		}
		from, to := int(sg.From-s.cur), int(sg.To-s.cur)
		rate := s.rate(v, ji, sg.Unit)
		g.uncommit(from, to, take)
		for t := from; t < to; t++ {
			secs := v.Round
			if t == from {
				secs -= s.cfg.RestartCost
			}
			pay += ji.valueSec*rate*math.Max(0, secs)*discount(ji, t, v.Round) - g.costAt(t, take)
		}
	}
	r.Segs = nil
	return pay
}

// recommit puts released commitments back as they were.
func (s *Scheduler) recommit(g *grid, r *record, segs []segment) {
	for _, sg := range segs {
		if take, ok := g.resolve(sg.Unit); ok {
			g.commit(int(sg.From-s.cur), int(sg.To-s.cur), take)
			r.Segs = append(r.Segs, sg)
		}
	}
}

func (s *Scheduler) commit(g *grid, r *record, sc *schedule) {
	if sc == nil {
		return
	}
	g.commit(sc.start, sc.end, sc.opt.take)
	r.add(s.cur+int64(sc.start), s.cur+int64(sc.end), sc.opt.unit)
}

// committedSteps is the progress the job's commitments provide.
func (s *Scheduler) committedSteps(v *round.View, ji *jobInfo, r *record) float64 {
	steps := 0.0
	for _, sg := range r.Segs {
		steps += s.rate(v, ji, sg.Unit) * v.Round * float64(sg.To-sg.From)
	}
	return steps
}

// keepNow is the job's current GPUs as an option from slot 0, when it runs
// (or ran last round) on one unit of its full width.
func (s *Scheduler) keepNow(v *round.View, g *grid, ji *jobInfo) *option {
	prev := ji.view.Placement.Units
	if len(prev) == 0 || v.MidRound && !ji.view.Running {
		return nil
	}
	return s.keepFrom(v, g, ji, prev[0])
}

// keepFrom is unit u as an option continuing without a restart.
func (s *Scheduler) keepFrom(v *round.View, g *grid, ji *jobInfo, u planner.Unit) *option {
	if !ji.view.AllowsWidth(u.GPUs()) || !ji.view.Eligible.AllowsUnit(u) {
		return nil
	}
	take, ok := g.resolve(u)
	if !ok {
		return nil
	}
	rate := s.rate(v, ji, u)
	if rate <= 0 {
		return nil
	}
	return &option{unit: u, take: take, rate: rate, keep: true}
}

// backfill gives the GPUs of slot 0 that no commitment holds to jobs the
// dual subroutine found no paying schedule for, for this round only.
// Restart-aware, a running job keeps its GPUs (its tenancy) and moves only
// where it gains more than its restart; the others take the fastest
// placement free for as long as a start holds its GPUs (the minimum run
// time), the fluid guide's types first. Eager, a running job keeps its
// GPUs only when they are on its guided types. Postponed jobs are not
// among them.
func (s *Scheduler) backfill(v *round.View, g *grid, rejected []*jobInfo, out []planner.Placement) {
	place := func(ji *jobInfo, o *option) {
		s.finish(g, o)
		g.commit(0, 1, o.take)
		out[ji.idx] = planner.Placement{Units: []planner.Unit{o.unit}}
		v.Explain(ji.idx, round.Reason{Why: "backfilled onto GPUs no commitment holds this round"})
	}
	aware := s.restartAware()
	for _, ji := range rejected {
		if !aware {
			if s.tenants[ji.view.ID] != nil {
				s.vacate(g, ji.view.ID)
			}
			continue
		}
		if s.tenants[ji.view.ID] != nil {
			// Its GPUs are reserved for it already.
			o := s.keepNow(v, g, ji)
			s.finish(g, o)
			out[ji.idx] = planner.Placement{Units: []planner.Unit{o.unit}}
			v.Explain(ji.idx, round.Reason{Why: "keeps its GPUs this round: no schedule pays today's prices, and no job gains more than a restart costs it by taking them"})
			continue
		}
		if o := s.keepNow(v, g, ji); o != nil && g.fitsAt(0, o.take) && s.allowed(v, g, ji, o) {
			if alt := s.bestOption(v, g, ji, g.window(0, s.startWindow(v, g, ji, 0)), true, false); alt != nil && s.moveGain(ji, o.rate, alt.rate) > 0 {
				o = alt
			}
			place(ji, o)
		}
	}
	// The fluid guide's types first, for every job: backfill must not
	// spend a type on a job without the comparative advantage there while
	// a job with it fits; then any type.
	for _, anyType := range []bool{false, true} {
		for _, ji := range rejected {
			if g.freeTotal(0) == 0 {
				return
			}
			if len(out[ji.idx].Units) == 0 {
				s.fitWidth(v, g, ji)
			}
			if len(out[ji.idx].Units) > 0 || !g.fits(0, ji) || anyType && ji.allowed == nil {
				continue
			}
			var o *option
			if !aware {
				o = s.keepNow(v, g, ji)
				if o != nil && (!g.fitsAt(0, o.take) || !s.allowed(v, g, ji, o) || !anyType && !ji.allows(o.take)) {
					o = nil
				}
			}
			if o == nil {
				o = s.bestOption(v, g, ji, g.window(0, s.startWindow(v, g, ji, 0)), true, anyType)
			}
			if o != nil {
				place(ji, o)
			}
		}
	}
}

// startWindow is the end of the slots a start of the job in slot t holds
// its GPUs for: its minimum run time, within the horizon and the slots
// its remaining work needs at its best speed.
func (s *Scheduler) startWindow(v *round.View, g *grid, ji *jobInfo, t int) int {
	need := max(1, int(math.Ceil(ji.view.Remaining/(ji.best*v.Round))))
	return min(g.horizon(), t+min(need, s.lockSlots(v, ji.view, t, s.startAt(v, t))))
}

// allows reports whether the fluid guide lets the job use every type of
// take.
func (ji *jobInfo) allows(take []slotIdx) bool {
	for _, sl := range take {
		if ji.allowed != nil && !ji.allowed[sl.k] {
			return false
		}
	}
	return true
}

// fits reports whether slot t has enough free GPUs of the job's runnable
// types for all its workers.
func (g *grid) fits(t int, ji *jobInfo) bool {
	return g.freeOfTypes(t, func(k int) bool { return ji.tp[k] > 0 }) >= ji.sf()
}

func (s *Scheduler) explainCommitted(v *round.View, g *grid, ji *jobInfo, u planner.Unit) {
	take, ok := g.resolve(u)
	if !ok {
		return
	}
	r := s.jobs[ji.view.ID]
	rate := s.rate(v, ji, u)
	val := ji.valueSec * rate * v.Round
	cost := g.costAt(0, take)
	why := fmt.Sprintf("runs under its committed schedule (%d more round(s)); its progress this round is worth %.3g against a price of %.3g", r.end()-s.cur-1, val, cost)
	if here := ji.view.Placement.Units; ji.at != nil && holding(v, ji.view) && u.GPUs() != here[0].GPUs() {
		why += "; " + s.resizeWhy(v, ji, u, rate, s.moveGain(ji, s.rate(v, ji, here[0]), rate), "")
	}
	v.Explain(ji.idx, round.Reason{Price: cost, Utility: val, Why: why})
}

func (s *Scheduler) explainPlan(v *round.View, ji *jobInfo, sc *schedule) {
	if sc == nil {
		return
	}
	why := fmt.Sprintf("admitted: its schedule over %d round(s) is worth %.3g against a price of %.3g", sc.end-sc.start, sc.value, sc.cost)
	if sc.start > 0 {
		why = fmt.Sprintf("postponed: its schedule starts in %d round(s), where it pays most (worth %.3g against a price of %.3g)", sc.start, sc.value, sc.cost)
	}
	if ji.critical {
		why += "; critical for the makespan"
	}
	if here := ji.view.Placement.Units; sc.start == 0 && holding(v, ji.view) && !sc.opt.unit.Equal(here[0]) {
		// A running job moves: say what the move gains against its
		// restart (restart-aware, only moves that gain are planned).
		from, to := s.rate(v, ji, here[0]), sc.opt.rate
		gain := s.moveGain(ji, from, to)
		if resize := s.resizeWhy(v, ji, sc.opt.unit, to, gain, ""); resize != "" {
			v.Explain(ji.idx, round.Reason{Price: sc.cost, Utility: sc.value, Why: why + "; " + resize})
			return
		}
		verb := "a gain of"
		if gain <= 0 {
			verb, gain = "a loss of", -gain
		}
		why += fmt.Sprintf("; moves to %s: done in about %s instead of %s where it ran, %s %s over its %s restart",
			unitString(sc.opt.unit), hours(s.cfg.RestartCost+ji.view.Remaining/to), hours(ji.view.Remaining/from), verb, hours(gain), hours(s.cfg.RestartCost))
	}
	v.Explain(ji.idx, round.Reason{Price: sc.cost, Utility: sc.value, Why: why})
}

func (s *Scheduler) jobInfos(v *round.View) []*jobInfo {
	var infos []*jobInfo
	for i, jb := range v.Jobs {
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
		s.initWidth(v, ji)
		infos = append(infos, ji)
	}
	return infos
}

// value sets each job's utility per step and dual value. A job's best
// speed and remaining time count only the types it may use, so a job the
// fluid guide confines to slow GPUs is seen as the longer job it is.
func (s *Scheduler) value(v *round.View, infos []*jobInfo) {
	maxRem, work, gpus := 0.0, 0.0, 0.0
	for _, c := range v.Capacity {
		gpus += c
	}
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
		work += ji.remTime * float64(ji.sf())
	}
	// The remaining makespan: that of the fluid solution when there is one
	// (its jobs' remaining steps over their fluid throughputs), else a
	// lower bound: the longest remaining job, and the whole work spread
	// over every GPU.
	bound := math.Max(maxRem, work/math.Max(gpus, 1))
	if len(s.fluidRate) > 0 {
		fluid := 0.0
		for _, ji := range infos {
			if r := s.fluidRate[ji.view.ID]; r > 0 {
				fluid = math.Max(fluid, ji.view.Remaining/r)
			}
		}
		if fluid > 0 {
			bound = math.Max(maxRem, fluid)
		}
	}
	for _, ji := range infos {
		ji.valueSec = ji.view.WeightOr1() / ji.view.Remaining
		ji.density = ji.valueSec * ji.best * v.Round / float64(ji.sf())
		ji.base = ji.density
	}
	if s.cfg.Utility == Makespan {
		// The makespan target: now plus the remaining makespan when jobs
		// arrive, and never later than that afterwards, so that a
		// schedule falling behind its fluid plan makes more jobs critical
		// instead of moving the target.
		arrived := false
		for _, ji := range infos {
			if _, ok := s.jobs[ji.view.ID]; !ok {
				arrived = true
			}
		}
		if arrived || !s.hasTarget {
			s.target, s.hasTarget = v.Now+bound, true
		} else {
			s.target = math.Min(s.target, v.Now+bound)
		}
		left := math.Max(s.target-v.Now, 0)
		for _, ji := range infos {
			// A critical job at its best speed spends a round of its
			// remaining time each round, as the time left does, so its
			// share slips just under Config.Critical after one round;
			// judged afresh it would be preempted (or wait), fall
			// behind and be readmitted, a restart an hour for weeks
			// (docs/results.md, "Restarts at the critical threshold").
			// Once critical it stays so until criticalBand of the time
			// left ahead: the same share of time over the long run, in
			// spells of hours instead of minutes.
			r := s.jobs[ji.view.ID]
			share := s.cfg.Critical
			if r != nil && r.Critical {
				share -= criticalBand
			}
			ji.critical = ji.remTime >= share*left
			if r != nil {
				r.Critical = ji.critical
			}
			// A job this long is never a victim. An elastic one is
			// critical only when it would miss the target even at its
			// fastest width (width.go, remainingFastest): one that can
			// still make it by resizing competes at its own value.
			ji.protected = ji.critical
			if ji.critical && ji.at != nil {
				ji.critical = s.remainingFastest(v, ji) >= s.cfg.Critical*left
			}
		}
		s.guardTail(v, infos, left)
	}
	// Critical jobs are worth twice the highest value of any job, so they
	// pay any price below U: they run every round at their best placement.
	top := s.bounds.Hi
	for _, ji := range infos {
		if !ji.critical {
			top = math.Max(top, ji.density)
		}
	}
	if top == 0 {
		// No bounds yet (the first call) and every job critical: twice the
		// highest of their own values, not zero.
		for _, ji := range infos {
			top = math.Max(top, ji.density)
		}
	}
	for _, ji := range infos {
		if ji.critical {
			scale := 2 * top / ji.density
			ji.valueSec *= scale
			ji.density *= scale
		}
	}
}

// discount is the share of the utility that progress made t slots from now
// keeps: with completion utility w*D/(completion-now), starting t rounds
// later scales it by D/(D + t*Round).
func discount(ji *jobInfo, t int, round float64) float64 {
	if t == 0 {
		return 1
	}
	return ji.remTime / (ji.remTime + float64(t)*round)
}

// dual is the dual subroutine: the schedule of one job from slot from on
// (a start slot and the GPUs it holds until it has made need steps or the
// horizon ends) with the largest payoff, or nil when none is positive.
// keep, when set, is its current GPUs (no restart if it continues there
// from slot from).
func (s *Scheduler) dual(v *round.View, g *grid, ji *jobInfo, from int, keep *option, need float64) *schedule {
	if ji.at == nil {
		return s.dualAt(v, g, ji, from, keep, need)
	}
	return s.dualWidths(v, g, ji, from, keep, need)
}

// dualAt is the dual subroutine at the job's planned width (ji.sf()).
func (s *Scheduler) dualAt(v *round.View, g *grid, ji *jobInfo, from int, keep *option, need float64) *schedule {
	h := g.horizon()
	if from >= h || need <= 0 {
		return nil
	}
	// No price is lower than the cheapest GPU of the job's types in the
	// window: a job worth less cannot pay anywhere.
	if !s.mayPay(v, g, ji, from) {
		return nil
	}
	var best *schedule
	try := func(o *option, start int, end int) {
		if o == nil {
			return
		}
		if sc := s.evaluate(v, g, ji, o, start, end, need); sc != nil && (best == nil || sc.pay > best.pay) {
			best = sc
		}
	}
	for _, st := range g.starts(from) {
		if st > from && holding(v, ji.view) {
			// A running job either goes on now or is stopped: waiting
			// for a later slot is a stop and a restart, never planned.
			break
		}
		if g.freeOfTypes(st, func(k int) bool { return ji.tp[k] > 0 }) < ji.sf() {
			continue
		}
		end := min(h, st+int(math.Ceil(need/(ji.best*v.Round))))
		w := g.window(st, max(end, st+1))
		// On the fluid guide's types, the fastest placement: the guide
		// already chose the types by comparative advantage, and prices
		// within them would send a long job to slower GPUs for the rest of
		// its run to save a round's price (docs/policies.md).
		o := s.bestOption(v, g, ji, w, ji.allowed != nil && !s.cfg.PricedPlacement, false)
		if keep != nil && st == from {
			try(keep, st, h)
			if o != nil {
				s.finish(g, o)
				o.keep = o.unit.Equal(keep.unit)
				// A running job moves only when the move saves it more
				// than the restart costs.
				if !o.keep && holding(v, ji.view) && s.restartAware() && g.fitsAt(st, keep.take) && s.moveGain(ji, keep.rate, o.rate) <= 0 {
					o = nil
				}
			}
		}
		try(o, st, h)
	}
	if best == nil && ji.critical && ji.allowed != nil && from == 0 {
		// A critical job runs somewhere rather than wait for the types
		// the fluid guide gave it.
		w := g.window(0, 1)
		o := s.bestOption(v, g, ji, w, false, true)
		// A running elastic job resizes only when that saves it more
		// than the restart costs, as above: at its last round, a
		// critical elastic job that finishes within the round at any
		// width found no other schedule paying and was shrunk here,
		// losing more than the restart (TestSimElasticJobs). A move at
		// the same width is left as it was.
		if o != nil && ji.at != nil && keep != nil && o.unit.GPUs() != keep.unit.GPUs() && holding(v, ji.view) && s.restartAware() && s.moveGain(ji, keep.rate, o.rate) <= 0 {
			o = nil
		}
		try(o, 0, h)
	}
	if best == nil || best.pay <= 0 {
		return nil
	}
	s.finish(g, best.opt)
	return best
}

// mayPay reports whether the job's value per GPU-round beats the lowest
// price of a GPU of its types somewhere in [from, horizon).
func (s *Scheduler) mayPay(v *round.View, g *grid, ji *jobInfo, from int) bool {
	if ji.critical {
		return true
	}
	perGPU := ji.valueSec * ji.best * v.Round / float64(ji.sf())
	for t := from; t < g.horizon(); t++ {
		for k := range g.types {
			if ji.tp[k] <= 0 || g.typeCap[k] == g.typeUsed[t][k] {
				continue
			}
			lowest := g.prices.table[k][min(g.typeUsed[t][k], g.typeCap[k])]
			if g.prices.node {
				lowest = g.prices.lo
			}
			if perGPU*discount(ji, t, v.Round) > lowest {
				return true
			}
		}
	}
	return false
}

// evaluate prices option o held from slot start until the job has made
// need steps, the horizon (or end) is reached, o's GPUs are taken, or a
// slot's progress is worth less than its price.
func (s *Scheduler) evaluate(v *round.View, g *grid, ji *jobInfo, o *option, start, end int, need float64) *schedule {
	sc := &schedule{opt: o, start: start}
	left := need
	t := start
	// A start holds its GPUs for the job's minimum run time: those slots
	// are part of the schedule whatever they pay.
	locked := start
	if !o.keep {
		locked = start + s.lockSlots(v, ji.view, start, s.startAt(v, start))
	}
	for ; t < min(end, g.horizon()) && left > 0; t++ {
		if !g.fitsAt(t, o.take) {
			if t < locked {
				return nil
			}
			break
		}
		secs := v.Round
		if t == start && !o.keep {
			secs = math.Max(0, v.Round-s.cfg.RestartCost)
		}
		steps := math.Min(left, o.rate*secs)
		val := ji.valueSec * steps * discount(ji, t, v.Round)
		cost := g.costAt(t, o.take)
		if val <= cost && t >= locked {
			break
		}
		sc.value += val
		sc.cost += cost
		left -= steps
	}
	sc.end = t
	sc.pay = sc.value - sc.cost
	if sc.end == start {
		return nil
	}
	return sc
}

// allowed applies the placement filter.
func (s *Scheduler) allowed(v *round.View, g *grid, ji *jobInfo, o *option) bool {
	if s.cfg.Filter == nil {
		return true
	}
	s.finish(g, o)
	return s.cfg.Filter.Allow(v, ji.view, o.unit)
}

// bestOption finds the placement of the job's ScaleFactor workers free
// throughout window w with the largest value minus summed price (or, with
// free set for backfill, the fastest). Candidates: each single-node
// single-type fit (best fit), and, for each pace type, the cheapest GPUs
// among types at least that fast (task-level mixing across types and
// nodes). An option on the GPUs of keep is marked as such.
func (s *Scheduler) bestOption(v *round.View, g *grid, ji *jobInfo, w *window, free, anyType bool) *option {
	sf := ji.sf()
	slots := float64(w.e - w.s)
	var best *option
	bestScore := math.Inf(-1)
	consider := func(o *option, cost float64) {
		if o == nil || o.rate <= 0 || !s.allowed(v, g, ji, o) {
			return
		}
		sc := o.rate
		if !free {
			sc = ji.valueSec*o.rate*v.Round*slots - cost
		}
		if sc > bestScore {
			best, bestScore = o, sc
		}
	}
	// Single node, single type: every node of a type free through the
	// window has the same type-level price: take the best fit (fewest
	// free GPUs), which keeps large holes for wide jobs.
	bn, bk, bScore := -1, -1, bestScore
	var bRate, bCost float64
	for k := range g.types {
		if ji.tp[k] <= 0 || (!anyType && ji.allowed != nil && !ji.allowed[k]) {
			continue
		}
		n := w.bestFitFor(ji, g, k, sf)
		if n < 0 {
			continue
		}
		c := float64(sf) * w.price(n, k)
		r := ji.tp[k]
		sc := r
		if !free {
			sc = ji.valueSec*r*v.Round*slots - c
		}
		if sc > bScore {
			bn, bk, bScore, bRate, bCost = n, k, sc, r, c
		}
	}
	if bn >= 0 {
		take := []slotIdx{{bn, bk, sf}}
		o := &option{take: take, rate: bRate}
		if s.cfg.Speed.Network != nil {
			o.rate = s.takeRate(v, g, ji, take)
		}
		consider(o, bCost)
	}
	if sf > 1 {
		// Spread or mixed: per pace type, the cheapest GPUs among types at
		// least as fast for this job.
		allowed := make([]bool, len(g.types))
		for pace := range g.types {
			if ji.tp[pace] <= 0 || (!anyType && ji.allowed != nil && !ji.allowed[pace]) {
				continue
			}
			for k := range g.types {
				if s.cfg.NoMixing {
					allowed[k] = k == pace
				} else {
					allowed[k] = ji.tp[k] >= ji.tp[pace] && (anyType || ji.allowed == nil || ji.allowed[k])
				}
			}
			take := g.cheapestFor(ji, w, sf, allowed)
			if take == nil {
				continue
			}
			cost := 0.0
			for _, sl := range take {
				cost += float64(sl.count) * w.price(sl.n, sl.k)
			}
			consider(&option{take: take, rate: s.takeRate(v, g, ji, take)}, cost)
		}
	}
	return best
}

// finish builds the unit of a chosen option.
func (s *Scheduler) finish(g *grid, o *option) {
	if o != nil && o.unit.Slots == nil {
		o.unit = g.unit(o.take)
	}
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

func (s *Scheduler) rate(v *round.View, ji *jobInfo, u planner.Unit) float64 {
	r, err := s.cfg.Speed.UnitRate(ji.view.Job, u, v.Now)
	if err != nil {
		return 0
	}
	return r
}

// guide sets each job's allowed types from the fluid relaxation.
func (s *Scheduler) guide(v *round.View, infos []*jobInfo) error {
	if s.cfg.NoFluidGuide {
		return nil
	}
	// Mid-round the boundary's solve stands for the jobs it covered, unless
	// the cluster changed since: its rows index the types it was solved
	// for.
	key := round.JobSetKey(v)
	stale := s.fluid != nil && (!round.SameCluster(key, s.fluidKey) || !s.fluidFits(len(v.Types)))
	// A job that arrived since (mid-round) has no row: solve again, or it
	// would be placed without the guide (on the prices alone).
	for _, ji := range infos {
		if _, ok := s.fluid[ji.view.ID]; !ok && v.MidRound && !ji.view.Running {
			stale = true
			break
		}
	}
	if !v.MidRound || stale {
		if key != s.fluidKey || s.fluid == nil || stale {
			in, a, err := s.fluidInput(v)
			if err != nil {
				return fmt.Errorf("hadar fluid guide: %w", err)
			}
			s.fluid = make(map[string][]bool, len(v.Jobs))
			s.fluidRate = make(map[string]float64, len(v.Jobs))
			s.fluidUse = make([]float64, len(v.Types))
			for i, j := range v.Jobs {
				row := make([]bool, len(v.Types))
				any, thr := false, 0.0
				for k, x := range a.X[i] {
					row[k] = x > 1e-6
					any = any || row[k]
					thr += x * in.Jobs[i].Throughput[k]
					s.fluidUse[k] += x * float64(in.Jobs[i].ScaleFactor)
				}
				// Every job solved for has a row (all false: the LP gave
				// it nothing, and it is not guided).
				s.fluid[j.ID] = row
				if any {
					s.fluidRate[j.ID] = thr
				}
			}
			s.fluidKey = key
		}
	}
	for _, ji := range infos {
		if row := s.fluid[ji.view.ID]; slices.Contains(row, true) {
			ji.allowed = row
		}
	}
	return nil
}

// fluidFits reports whether the cached fluid rows have one entry per type
// of a view with n types.
func (s *Scheduler) fluidFits(n int) bool {
	for _, row := range s.fluid {
		if len(row) != n {
			return false
		}
	}
	return true
}
