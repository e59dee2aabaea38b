// Package placement holds hadar's placement policies: where the GPUs a
// scheduler granted a job sit. They plug into Gavel's round mechanism
// (round.Placer) and filter Hadar's own candidate placements (Allow), so
// every allocation policy can be combined with every placement policy.
// docs/placement.md describes them and the measured results.
package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Placement policy names.
const (
	Pack          = "pack"
	Consolidate   = "consolidate"
	Spread        = "spread"
	Delay         = "delay"
	DelayAutotune = "delay-autotune"
)

// Names lists the placement policies.
func Names() []string { return []string{Pack, Consolidate, Spread, Delay, DelayAutotune} }

// Defaults of Config; docs/placement.md explains each choice.
const (
	DefaultScale          = 0.25
	DefaultMaxWait        = 24 * 3600.0
	DefaultMaxPreemptions = 2
	DefaultMinRunTime     = 1800.0
	DefaultMargin         = 1.5
	DefaultSensitive      = 1.2
)

// Config parameterises a placement policy; zero values take the defaults.
type Config struct {
	// Speed prices placements: with a Network its slowdowns come from the
	// topology, else from the profile's spread throughputs.
	Speed speed.Model
	// Seed drives spread's random node order and the tuner's exploration.
	Seed int64
	// Scale sets delay's timers: a job waiting for its tightest level
	// accepts a placement of slowdown s once it has waited
	// Scale*(s-1)*T, T its remaining consolidated run time, capped at
	// MaxWait (default DefaultScale; negative means 0: no waiting).
	Scale   float64
	MaxWait float64
	// MaxPreemptions bounds how often one job is moved or evicted for a
	// sensitive job (delay policies; default 2; negative disables
	// preemption). MinRunTime is the least time a job runs on its GPUs
	// before it may be preempted (0: default 1800 s; negative: none).
	MaxPreemptions int
	MinRunTime     float64
	// Margin: a preemption happens only when the waiting job's gain
	// exceeds Margin times the victims' loss (default 1.5).
	Margin float64
	// Sensitive is the least slowdown of the best spread placement at
	// which a waiting job may preempt others (default 1.2).
	Sensitive float64
	// RestartCost is what a moved or evicted job loses, in seconds (the
	// simulator's restart cost).
	RestartCost float64
	Tuner       TunerConfig
}

// Placer is a placement policy: a round.Placer for Gavel's round mechanism
// and a filter for schedulers that place jobs themselves (Hadar, HadarE),
// which call Allow on each candidate unit and drop the vetoed ones.
type Placer interface {
	round.Placer
	Allow(v *round.View, jb *round.JobView, u planner.Unit) bool
}

// New builds the named placement policy. Every simulation needs its own:
// the delay policies keep per-job timers.
func New(name string, cfg Config) (*Policy, error) {
	name = strings.ToLower(strings.TrimSpace(name))
	if !slices.Contains(Names(), name) {
		return nil, fmt.Errorf("unknown placement %q: want one of %s", name, strings.Join(Names(), ", "))
	}
	if cfg.Speed.Profile == nil {
		return nil, fmt.Errorf("placement %s: the speed model has no throughput profile", name)
	}
	if math.IsNaN(cfg.Scale) || cfg.MaxWait < 0 || cfg.Margin < 0 || cfg.RestartCost < 0 {
		return nil, fmt.Errorf("placement %s: scale %v, max wait %v, min run time %v, margin %v, restart cost %v: want numbers >= 0",
			name, cfg.Scale, cfg.MaxWait, cfg.MinRunTime, cfg.Margin, cfg.RestartCost)
	}
	if cfg.Scale == 0 {
		cfg.Scale = DefaultScale
	}
	cfg.Scale = math.Max(0, cfg.Scale)
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.MaxPreemptions == 0 {
		cfg.MaxPreemptions = DefaultMaxPreemptions
	}
	switch {
	case cfg.MinRunTime == 0:
		cfg.MinRunTime = DefaultMinRunTime
	case cfg.MinRunTime < 0:
		// None, spelled as registry.Options spells it: an operator's
		// min_run_time = "0s" holds no job to a minimum here either.
		cfg.MinRunTime = 0
	}
	if cfg.Margin == 0 {
		cfg.Margin = DefaultMargin
	}
	if cfg.Sensitive == 0 {
		cfg.Sensitive = DefaultSensitive
	}
	src := rand.NewPCG(uint64(cfg.Seed), 0x73707264)
	p := &Policy{name: name, cfg: cfg, src: src, rng: rand.New(src), jobs: map[string]*jobState{}}
	if name == DelayAutotune {
		if cfg.Tuner.Seed == 0 {
			cfg.Tuner.Seed = cfg.Seed
		}
		if cfg.Tuner.StartScale == 0 {
			// Start from the fixed scale; negative tells the tuner 0.
			cfg.Tuner.StartScale = cfg.Scale
			if cfg.Scale == 0 {
				cfg.Tuner.StartScale = -1
			}
		}
		t, err := NewTuner(cfg.Tuner)
		if err != nil {
			return nil, fmt.Errorf("placement %s: %w", name, err)
		}
		p.tuner = t
	}
	return p, nil
}

// Policy is one placement policy instance (see the constants for names).
type Policy struct {
	name  string
	cfg   Config
	src   *rand.PCG // rng's source, saved in the engine snapshot
	rng   *rand.Rand
	tuner *Tuner
	jobs  map[string]*jobState
	// last is the view observe last ran on: Place is called once per GPU
	// type of the same view.
	last       *round.View
	preempts   []Preemption
	tightCache map[tightKey]Level
	// tightEpoch is the cluster epoch tightCache was filled for.
	tightEpoch uint64
}

type tightKey struct {
	t     planner.GPUType
	count int
}

// jobState is what the policy remembers of one active job.
type jobState struct {
	waitSince   float64 // when it began waiting for a placement; -1 = not waiting
	lastStart   float64 // when it last started on new GPUs
	preemptions int
	// Auto-tuner bookkeeping: the grid index of the current wait's timer
	// scale (-1 = none) and the job's class and consolidated run time.
	arm, class int
	idealS     float64
}

// Preemption records one job moved or evicted to let another consolidate.
type Preemption struct {
	Time    float64
	Victim  string
	For     string
	Evicted bool
	// Count is the victim's preemptions so far, this one included;
	// RanFor how long it had run on the GPUs it lost.
	Count  int
	RanFor float64
	Gain   float64
	Loss   float64
}

// Name implements round.Placer.
func (p *Policy) Name() string { return p.name }

// Preemptions lists the preemptions so far (a copy).
func (p *Policy) Preemptions() []Preemption { return slices.Clone(p.preempts) }

// Tuner returns the auto-tuner (nil unless the policy is delay-autotune).
func (p *Policy) Tuner() *Tuner { return p.tuner }

func (p *Policy) state(id string) *jobState {
	st := p.jobs[id]
	if st == nil {
		st = &jobState{waitSince: -1, arm: -1, lastStart: math.Inf(-1)}
		p.jobs[id] = st
	}
	return st
}

func (p *Policy) tightest(v *round.View, t planner.GPUType, count int) Level {
	if p.tightCache == nil || p.tightEpoch != v.Epoch {
		p.tightCache, p.tightEpoch = map[tightKey]Level{}, v.Epoch
	}
	k := tightKey{t, count}
	if l, ok := p.tightCache[k]; ok {
		return l
	}
	l := Tightest(v.Cluster, t, count)
	p.tightCache[k] = l
	return l
}

// slowdown of unit u for job at now: netmodel's with a network, else the
// profile's consolidated over spread throughput.
func (p *Policy) slowdown(job planner.Job, u planner.Unit, now float64) float64 {
	if u.Nodes() <= 1 {
		return 1
	}
	r, err := p.cfg.Speed.UnitRate(job, u, now)
	if err != nil || !(r > 0) {
		return math.Inf(1)
	}
	best := 0.0
	for _, t := range u.Types() {
		c, err := p.cfg.Speed.Profile.Throughput(job.Model, u.GPUs(), t, false)
		if err == nil {
			best = math.Max(best, c)
		}
	}
	return math.Max(1, best/r)
}

// remaining is the job's remaining run time consolidated on type t.
func (p *Policy) remaining(jb *round.JobView, t planner.GPUType) float64 {
	c, err := p.cfg.Speed.Profile.Throughput(jb.Model, jb.ScaleFactor, t, false)
	if err != nil || !(c > 0) {
		return 0
	}
	return jb.Remaining / c
}

// Timer is how long job jb must have waited before delay accepts a
// placement of slowdown s on type t.
func (p *Policy) Timer(jb *round.JobView, t planner.GPUType, s float64) float64 {
	scale := p.cfg.Scale
	if p.tuner != nil {
		if st := p.jobs[jb.ID]; st != nil && st.arm >= 0 {
			scale = p.tuner.Scale(st.arm)
		}
	}
	return math.Min(p.cfg.MaxWait, scale*math.Max(0, s-1)*p.remaining(jb, t))
}

// observe runs once per view: it notices jobs that started running
// (placed by a scheduler that only asked Allow) and forgets jobs that left.
func (p *Policy) observe(v *round.View) {
	if v == p.last {
		return
	}
	p.last = v
	present := make(map[string]bool, len(v.Jobs))
	for _, jb := range v.Jobs {
		present[jb.ID] = true
		if st := p.jobs[jb.ID]; st != nil && st.waitSince >= 0 && jb.Running && len(jb.Placement.Units) > 0 {
			p.placed(v, jb, st, jb.Placement.Units[0])
		}
	}
	for id := range p.jobs {
		if !present[id] {
			delete(p.jobs, id)
		}
	}
}

// placed ends a job's wait. With the tuner, the wait is an outcome of the
// job's timer scale: its cost is the time it waited plus the time the
// placement it got will lose it at the slowdown observed now (slowdown - 1
// times its remaining run time), over its whole consolidated run time.
// Both are known at placement, so the tuner learns without waiting for
// long jobs to finish.
func (p *Policy) placed(v *round.View, jb *round.JobView, st *jobState, u planner.Unit) {
	if p.tuner != nil && st.arm >= 0 && len(u.Slots) > 0 {
		lost := (p.slowdown(jb.Job, u, v.Now) - 1) * p.remaining(jb, u.Slots[0].Type)
		p.tuner.Observe(v.Now, st.class, st.arm, (v.Now-st.waitSince+lost)/math.Max(1, st.idealS))
		st.arm = -1
	}
	st.waitSince = -1
}

// Place implements round.Placer.
func (p *Policy) Place(v *round.View, t planner.GPUType, jobs []int) []planner.Unit {
	p.observe(v)
	units := make([]planner.Unit, len(jobs))
	placed := make([]bool, len(jobs))
	// Lease extension first, for every policy: keeping GPUs costs no
	// restart, and a job keeps only a placement the policy once chose.
	for k, i := range jobs {
		if u, ok := round.Keep(v.Pool, v.Jobs[i], t); ok {
			units[k], placed[k] = u, true
		}
	}
	var waiting []int
	for k, i := range jobs {
		if placed[k] {
			continue
		}
		jb := v.Jobs[i]
		undo := v.Pool.Restrict(jb.Eligible)
		u, ok := p.choose(v, jb, t)
		undo()
		if !ok {
			waiting = append(waiting, k)
			continue
		}
		v.Pool.Take(u)
		units[k], placed[k] = u, true
	}
	if !v.MidRound && p.cfg.MaxPreemptions > 0 && (p.name == Delay || p.name == DelayAutotune) {
		for _, k := range waiting {
			// A job restricted to some nodes could be given GPUs it may
			// not use: preemption frees GPUs only for jobs that may run
			// anywhere.
			if v.Jobs[jobs[k]].Eligible == nil {
				p.preempt(v, t, jobs, units, k)
			}
		}
	}
	for k, i := range jobs {
		st := p.state(v.Jobs[i].ID)
		if len(units[k].Slots) == 0 {
			continue
		}
		if st.waitSince >= 0 {
			p.placed(v, v.Jobs[i], st, units[k])
		}
		prev := v.Jobs[i].Placement.Units
		if !v.Jobs[i].Running || len(prev) != 1 || !prev[0].Equal(units[k]) {
			st.lastStart = v.Now
		}
	}
	return units
}

// choose picks the unit for a job that did not keep its GPUs, or ok=false
// to make it wait.
func (p *Policy) choose(v *round.View, jb *round.JobView, t planner.GPUType) (planner.Unit, bool) {
	n := jb.ScaleFactor
	switch p.name {
	case Pack:
		return v.Pool.Pack(t, n)
	case Spread:
		return p.spread(v.Pool, t, n)
	case Consolidate:
		return Candidate(v.Pool, t, n, p.tightest(v, t, n))
	}
	best := p.tightest(v, t, n)
	if u, ok := Candidate(v.Pool, t, n, best); ok {
		return u, true
	}
	st := p.startWaiting(v, jb, t)
	waited := v.Now - st.waitSince
	r := round.Reason{Waited: waited, Why: fmt.Sprintf("waits for %d %s GPUs at %s level: none free there, and no looser placement yet", n, t, best)}
	for lvl := best + 1; lvl <= Anywhere; lvl++ {
		u, ok := Candidate(v.Pool, t, n, lvl)
		if !ok {
			continue
		}
		// A small tolerance: rounds are floats.
		timer := p.Timer(jb, t, p.slowdown(jb.Job, u, v.Now))
		if waited >= timer-1e-6 {
			return u, true
		}
		if r.Timer == 0 || timer < r.Timer {
			r.Timer = timer
			r.Why = fmt.Sprintf("delay scheduling: waits for %d %s GPUs at %s level; accepts %s level after %.0f s (waited %.0f s)", n, t, best, lvl, timer, waited)
		}
	}
	if i := slices.Index(v.Jobs, jb); i >= 0 {
		v.Explain(i, r)
	}
	return planner.Unit{}, false
}

// startWaiting starts the job's timer if it is not running yet, and with
// the tuner, picks the job's timer scale from its sensitivity class.
func (p *Policy) startWaiting(v *round.View, jb *round.JobView, t planner.GPUType) *jobState {
	st := p.state(jb.ID)
	if st.waitSince < 0 {
		st.waitSince = v.Now
	}
	if p.tuner != nil && st.arm < 0 {
		st.class = p.tuner.Class(p.sensitivity(v, jb, t))
		st.arm = p.tuner.Pick(st.class)
		if c, err := p.cfg.Speed.Profile.Throughput(jb.Model, jb.ScaleFactor, t, false); err == nil && c > 0 {
			st.idealS = jb.TotalSteps / c
		}
	}
	return st
}

// sensitivity is the slowdown of the job spread one GPU per node over
// racks (netmodel's SpineSlowdown with a network, else the profile's
// consolidated over spread throughput).
func (p *Policy) sensitivity(v *round.View, jb *round.JobView, t planner.GPUType) float64 {
	if nw, ok := p.cfg.Speed.Network.(*Network); ok {
		if s, ok := nw.Sensitivity(jb.Job, t); ok {
			return s
		}
	}
	c, err1 := p.cfg.Speed.Profile.Throughput(jb.Model, jb.ScaleFactor, t, false)
	s, err2 := p.cfg.Speed.Profile.Throughput(jb.Model, jb.ScaleFactor, t, true)
	if err1 != nil || err2 != nil || !(s > 0) {
		return 1
	}
	return math.Max(1, c/s)
}

// spread is random placement: each GPU of the job is a free GPU of type t
// drawn uniformly at random (so nodes with more free GPUs are likelier),
// the baseline that ignores locality altogether.
func (p *Policy) spread(pool *round.Pool, t planner.GPUType, n int) (planner.Unit, bool) {
	if pool.FreeOfType(t) < n {
		return planner.Unit{}, false
	}
	nodes := pool.Nodes()
	left := make([]int, len(nodes))
	total := 0
	for i, nd := range nodes {
		left[i] = pool.Free(nd, t)
		total += left[i]
	}
	got := make([]int, len(nodes))
	for range n {
		r := p.rng.IntN(total)
		i := 0
		for r >= left[i] {
			r -= left[i]
			i++
		}
		left[i]--
		got[i]++
		total--
	}
	var u planner.Unit
	for i, k := range got {
		if k > 0 {
			u.Slots = append(u.Slots, planner.Slot{Node: nodes[i], Type: t, Count: k})
		}
	}
	return u, true
}

// Allow implements the filter Hadar calls on each candidate unit: a
// single node is always allowed, and a job keeps what it runs on; pack and
// spread allow everything (Hadar's own placement), consolidate nothing
// looser, delay a looser level once the job has waited its timer. Jobs
// wider than any node are not filtered.
func (p *Policy) Allow(v *round.View, jb *round.JobView, u planner.Unit) bool {
	p.observe(v)
	if p.name == Pack || p.name == Spread || len(u.Slots) == 0 {
		return true
	}
	t := u.Slots[0].Type
	best := p.tightest(v, t, u.GPUs())
	if best != SameNode || LevelOf(v.Pool, u) == SameNode {
		// Hadar proposes no per-rack candidates, so a job no node can
		// hold keeps Hadar's own placement (vetoing it would starve it).
		return true
	}
	if jb.Running && len(jb.Placement.Units) > 0 && jb.Placement.Units[0].Equal(u) {
		return true
	}
	if p.name == Consolidate {
		return false
	}
	st := p.startWaiting(v, jb, t)
	return v.Now-st.waitSince >= p.Timer(jb, t, p.slowdown(jb.Job, u, v.Now))-1e-6
}
