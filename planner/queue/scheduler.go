package queue

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// Factory builds the inner scheduler of a queue from a policy name (the
// names of planner/registry): one new scheduler per call, since each
// queue's scheduler keeps its own state.
type Factory func(policy string) (round.Scheduler, error)

// Options of a Scheduler.
type Options struct {
	// Default is the policy of queues that name none, and of the queues
	// of namespaces no block lists.
	Default string
	// Factory builds the inner schedulers.
	Factory Factory
	// MinRunTime is the engine's minimum run time in seconds (a job's
	// own overrides it; 0: none): the scheduler leaves jobs within it
	// running, as the engine will, and preempts others first.
	MinRunTime float64
	// PlansMinRun reports whether an inner scheduler plans with the
	// minimum run time itself (Hadar does). The jobs within it of a queue
	// whose scheduler does not keep their GPUs and are left out of its
	// view, so that it plans the rest with what is really free; nil: no
	// scheduler does.
	PlansMinRun func(round.Scheduler) bool
}

// Scheduler is the queue-aware round.Scheduler: each plan it works out
// every queue's share of the GPUs (guarantee first, then what is left by
// weight, within limits), hands each queue's inner scheduler a view of
// that queue's jobs and a pool of its share, merges their placements and
// lends GPUs a queue left idle to queues that have no room. It is not safe
// for concurrent use (the engine serialises plans).
type Scheduler struct {
	cfg   Config
	opt   Options
	inner map[string]*innerQueue
	// since is when each running job started on the placement it holds,
	// as this scheduler placed it: the minimum run time counts from there.
	since map[string]placedAt
	// reclaims counts, per queue, its jobs preempted to give a guarantee
	// back.
	reclaims map[string]counters
	// bounds are the minimum run times bounded by reclaim in the last
	// plan (MinRunBound).
	bounds map[string]float64
	// caps are the jobs' own minimum run times cut to their queue's
	// max_min_run_time in the last plan (MinRunBound): the engine holds
	// them to no more.
	caps   map[string]float64
	status Status
}

type innerQueue struct {
	q      Queue
	policy string
	sched  round.Scheduler
	// epoch is the Epoch its views carry: it changes when the engine's
	// does or when the queue's share does, so that what the inner
	// scheduler derived from its capacity is recomputed.
	epoch uint64
	key   string
}

type placedAt struct {
	p  planner.Placement
	at float64
}

// New builds the scheduler and the inner scheduler of every queue of cfg.
func New(cfg Config, opt Options) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opt.Factory == nil {
		return nil, fmt.Errorf("queues: no factory for the queues' schedulers")
	}
	if strings.TrimSpace(opt.Default) == "" {
		return nil, fmt.Errorf("queues: no default policy: want the policy of queues that name none")
	}
	if !(opt.MinRunTime >= 0) || math.IsInf(opt.MinRunTime, 0) {
		return nil, fmt.Errorf("queues: min run time %v s: want seconds >= 0", opt.MinRunTime)
	}
	// The default policy is built once here so that a typo fails now, not
	// when a job of an unconfigured queue first comes.
	if _, err := opt.Factory(opt.Default); err != nil {
		return nil, fmt.Errorf("queues: default policy: %w", err)
	}
	s := &Scheduler{cfg: cfg, opt: opt, inner: map[string]*innerQueue{}, since: map[string]placedAt{}, reclaims: map[string]counters{}}
	for _, q := range cfg.Queues {
		if _, err := s.queue(q.Name); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Name implements round.Scheduler: the default policy inside queues (or
// inside static partitions). The queues themselves may change between a
// snapshot and its restore (LoadState says what it keeps).
func (s *Scheduler) Name() string {
	if s.cfg.Static {
		return "static(" + s.opt.Default + ")"
	}
	return "queues(" + s.opt.Default + ")"
}

// Config is the scheduler's queue configuration.
func (s *Scheduler) Config() Config { return s.cfg }

// queue returns the inner queue of that name, built on first use: a
// configured queue with its policy, any other with the defaults.
func (s *Scheduler) queue(name string) (*innerQueue, error) {
	if iq := s.inner[name]; iq != nil {
		return iq, nil
	}
	q, ok := s.cfg.Find(name)
	if !ok {
		q = Queue{Name: name, Weight: 1}
	}
	policy := q.Policy
	if policy == "" {
		policy = s.opt.Default
	}
	sched, err := s.opt.Factory(policy)
	if err != nil {
		return nil, fmt.Errorf("queue %q: policy: %w", name, err)
	}
	iq := &innerQueue{q: q, policy: policy, sched: sched}
	s.inner[name] = iq
	return iq, nil
}

// MinRunBound implements the engine's bound on the minimum run time of
// the jobs the last plan preempted to give a queue its guarantee back:
// the reclaiming queue's reclaim_after.
func (s *Scheduler) MinRunBound(job string) (float64, bool) {
	b, ok := s.bounds[job]
	if c, capped := s.caps[job]; capped && (!ok || c < b) {
		return c, true
	}
	return b, ok
}

// member is one job of a queue in one plan.
type member struct {
	i    int // index into the view's jobs
	jb   *round.JobView
	prio int
	held []int
	ran  float64 // seconds on its current placement (running jobs)
	// victim: a running job left out of its queue's share, preempted
	// unless the GPUs stay free; protected: one within its minimum run
	// time, which keeps them.
	victim, protected bool
	// carved: the queue's pool holds GPUs for it; reserved: those are the
	// GPUs it runs on now.
	carved, reserved bool
}

// plan is one queue in one plan.
type plan struct {
	iq      *innerQueue
	acct    *account
	members []*member
	pool    *round.Pool
	// carved is the pool as carved, before its scheduler took from it.
	carved *round.Pool
	// visible are the jobs its scheduler is shown; reason the queue's
	// reasons by job index; used the GPUs per type its jobs hold after
	// the plan (lend).
	visible []*member
	reason  map[int]Reason
	used    []int
}

// Schedule implements round.Scheduler.
func (s *Scheduler) Schedule(v *round.View) ([]planner.Placement, error) {
	s.bounds = map[string]float64{}
	s.caps = map[string]float64{}
	nt := len(v.Types)
	tidx := make(map[planner.GPUType]int, nt)
	for k, t := range v.Types {
		tidx[t] = k
	}
	out := make([]planner.Placement, len(v.Jobs))

	// The queues of this plan, configured ones first, then by name.
	byName := map[string]*plan{}
	var plans []*plan
	for i, jb := range v.Jobs {
		name := jb.Queue
		if name == "" {
			name = DefaultName
		}
		p := byName[name]
		if p == nil {
			iq, err := s.queue(name)
			if err != nil {
				return nil, err
			}
			p = &plan{iq: iq, reason: map[int]Reason{}}
			byName[name] = p
			plans = append(plans, p)
		}
		m := &member{i: i, jb: jb, prio: jb.Priority}
		if c := capMinRun(p.iq.q, jb.MinRunTime); c < jb.MinRunTime {
			s.caps[jb.ID] = c
		}
		if m.prio == 0 {
			m.prio = DefaultPriority
		}
		if jb.Running {
			m.held = make([]int, nt)
			for _, u := range jb.Placement.Units {
				for _, sl := range u.Slots {
					if k, ok := tidx[sl.Type]; ok {
						m.held[k] += sl.Count
					}
				}
			}
			m.ran = s.ran(jb, v.Now)
		}
		p.members = append(p.members, m)
	}
	order := func(name string) int {
		if k := slices.IndexFunc(s.cfg.Queues, func(q Queue) bool { return q.Name == name }); k >= 0 {
			return k
		}
		return len(s.cfg.Queues)
	}
	slices.SortStableFunc(plans, func(a, b *plan) int {
		return cmp.Or(cmp.Compare(order(a.iq.q.Name), order(b.iq.q.Name)), strings.Compare(a.iq.q.Name, b.iq.q.Name))
	})

	// What there is to share: the GPUs offered, and mid-round those the
	// running jobs hold too.
	base := make([]int, nt)
	for k, t := range v.Types {
		base[k] = v.Pool.FreeOfType(t)
	}
	if v.MidRound {
		for _, p := range plans {
			for _, m := range p.members {
				if m.held != nil {
					addTo(base, m.held)
				}
			}
		}
	}
	guar := make([][]int, len(plans))
	for q, p := range plans {
		guar[q] = make([]int, nt)
		for k, t := range v.Types {
			guar[q][k] = p.iq.q.Guarantee[t]
		}
	}
	scaled := scaleGuarantees(guar, base)

	accts := make([]*account, len(plans))
	for q, p := range plans {
		// Counting order: running jobs first, longest running first (the
		// last started is the first preempted), then by priority and
		// arrival.
		slices.SortStableFunc(p.members, func(a, b *member) int {
			if (a.held != nil) != (b.held != nil) {
				if a.held != nil {
					return -1
				}
				return 1
			}
			if a.held != nil {
				return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(b.ran, a.ran), cmp.Compare(a.i, b.i))
			}
			return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(a.i, b.i))
		})
		limit := make([]int, nt)
		for k, t := range v.Types {
			limit[k] = -1
			if l, ok := p.iq.q.Limit[t]; ok {
				limit[k] = max(l, guar[q][k])
			}
		}
		ds := make([]demand, len(p.members))
		for k, m := range p.members {
			ds[k] = demand{held: m.held, sf: m.jb.ScaleFactor, tp: m.jb.Throughput, fixed: v.MidRound && m.held != nil}
		}
		accts[q] = newAccount(nt, guar[q], limit, p.iq.q.Weight, ds)
		p.acct = accts[q]
	}
	share(accts, base, s.cfg.Static)
	if !s.cfg.Static {
		spread(accts, base)
	}

	// Running jobs left out: preempted, unless within their minimum run
	// time (bounded by reclaim_after where a guarantee waits for them).
	idle := v.Pool.Clone()
	if !v.MidRound {
		for _, p := range plans {
			for _, m := range p.members {
				if m.held != nil {
					takeFitting(idle, m.jb.Placement)
				}
			}
		}
	}
	reclaimBound := s.pressure(v, plans, idle)
	if !v.MidRound {
		for _, p := range plans {
			for k, m := range p.members {
				if m.held == nil || p.acct.claims[k].counted {
					continue
				}
				bound, reclaim := s.minRun(p.iq.q, m.jb), false
				for t, n := range m.held {
					if n > 0 && reclaimBound[t] >= 0 && reclaimBound[t] < bound {
						bound, reclaim = reclaimBound[t], true
					}
				}
				if m.ran < bound-1e-6 {
					m.protected = true
					addTo(p.acct.bo, m.held)
					continue
				}
				m.victim = true
				if reclaim {
					s.bounds[m.jb.ID] = bound
				}
			}
		}
	}

	// Carve each queue's pool: the GPUs of the running jobs it keeps, then
	// for each job counted in its share GPUs packed for it, idle ones
	// first, then those of preempted jobs.
	s.carve(v, plans)

	// Each queue's scheduler plans its jobs in its pool.
	for _, p := range plans {
		p.carved = p.pool.Clone()
		if err := s.runInner(v, p, out); err != nil {
			return nil, err
		}
	}

	s.hold(v, plans, out)
	// GPUs left idle: preempted jobs keep theirs if no one took them, then
	// jobs of queues with no room left borrow them.
	if !s.cfg.Static {
		s.lend(v, plans, out, tidx, base)
	}
	s.explain(v, plans, out, tidx, scaled, base)
	s.track(v, out)
	return out, nil
}

// ran is how long job jb has run on its current placement, as far as this
// scheduler knows (a placement it did not make counts from now).
func (s *Scheduler) ran(jb *round.JobView, now float64) float64 {
	rec, ok := s.since[jb.ID]
	if !ok || !samePlacement(rec.p, jb.Placement) {
		s.since[jb.ID] = placedAt{p: clonePlacement(jb.Placement), at: now}
		return 0
	}
	return now - rec.at
}

// minRun is the minimum run time of a job of queue q: its own within the
// queue's MaxMinRunTime, else the engine's.
func (s *Scheduler) minRun(q Queue, jb *round.JobView) float64 {
	if jb.MinRunTime > 0 {
		return capMinRun(q, jb.MinRunTime)
	}
	return s.opt.MinRunTime
}

// capMinRun is a job's own minimum run time m within queue q's cap.
func capMinRun(q Queue, m float64) float64 {
	if q.MaxMinRunTime > 0 && m > q.MaxMinRunTime {
		return q.MaxMinRunTime
	}
	return m
}

// pressure finds the types on which queues' guarantees wait for GPUs:
// their jobs counted within the guarantee and not running need more than
// the idle GPUs. The returned bound per type is the least reclaim_after
// of those queues (-1 where there is no pressure).
func (s *Scheduler) pressure(v *round.View, plans []*plan, idle *round.Pool) []float64 {
	nt := len(v.Types)
	need := make([]int, nt)
	bound := make([]float64, nt)
	for t := range bound {
		bound[t] = math.Inf(1)
	}
	for _, p := range plans {
		for k, c := range p.acct.claims {
			if c.counted && c.guaranteed && c.typ >= 0 && p.members[k].held == nil {
				need[c.typ] += p.members[k].jb.ScaleFactor
				bound[c.typ] = min(bound[c.typ], p.iq.q.ReclaimAfter)
			}
		}
	}
	for t, ty := range v.Types {
		if need[t] == 0 || need[t] <= idle.FreeOfType(ty) {
			bound[t] = -1
		}
	}
	return bound
}

// carve builds each queue's pool.
func (s *Scheduler) carve(v *round.View, plans []*plan) {
	nodes := planner.Cluster{}
	for _, n := range v.Pool.Nodes() {
		nodes.Nodes = append(nodes.Nodes, planner.Node{ID: n, Rack: v.Pool.Rack(n), GPUs: map[planner.GPUType]int{}})
	}
	free := v.Pool.Clone()          // not yet in any queue's pool
	victims := round.NewPool(nodes) // GPUs of preempted jobs, in free too
	for _, p := range plans {
		p.pool = round.NewPool(nodes)
	}
	if !v.MidRound {
		for _, p := range plans {
			for k, m := range p.members {
				if m.held == nil {
					continue
				}
				if p.acct.claims[k].counted || m.protected {
					if free.FitsPlacement(m.jb.Placement) {
						for _, u := range m.jb.Placement.Units {
							free.Take(u)
							p.pool.Release(u)
						}
						m.carved, m.reserved = true, true
					}
				} else {
					// Only what is offered: a drained node is not.
					for _, u := range m.jb.Placement.Units {
						for _, sl := range u.Slots {
							if victims.Has(sl.Node) {
								victims.Release(planner.Unit{Slots: []planner.Slot{sl}})
							}
						}
					}
				}
			}
		}
	}
	type want struct {
		p *plan
		m *member
		c claim
		q int
	}
	var wants []want
	for q, p := range plans {
		for k, m := range p.members {
			c := p.acct.claims[k]
			if !c.counted || m.carved || v.MidRound && m.held != nil {
				continue // mid-round, running jobs hold their GPUs already
			}
			if c.typ < 0 {
				// A running job counted but not on GPUs still offered
				// (a drained node): room on the type it mostly holds.
				best := 0
				for t, n := range m.held {
					if n > m.held[best] {
						best = t
					}
				}
				c.typ = best
			}
			wants = append(wants, want{p, m, c, q})
		}
	}
	// Guarantees first, then the widest jobs (which fragment worst),
	// then queue and counting order.
	sort.SliceStable(wants, func(a, b int) bool {
		wa, wb := wants[a], wants[b]
		if wa.c.guaranteed != wb.c.guaranteed {
			return wa.c.guaranteed
		}
		if wa.m.jb.ScaleFactor != wb.m.jb.ScaleFactor {
			return wa.m.jb.ScaleFactor > wb.m.jb.ScaleFactor
		}
		return wa.q < wb.q
	})
	for _, w := range wants {
		t := v.Types[w.c.typ]
		sf := w.m.jb.ScaleFactor
		// Idle GPUs first: the free pool without the preempted jobs'.
		onlyIdle := free.Clone()
		for _, n := range victims.Nodes() {
			if k := victims.Free(n, t); k > 0 {
				onlyIdle.Take(planner.Unit{Slots: []planner.Slot{{Node: n, Type: t, Count: min(k, onlyIdle.Free(n, t))}}})
			}
		}
		u, ok := pack(onlyIdle, w.m.jb.Eligible, t, sf)
		if !ok {
			u, ok = pack(free, w.m.jb.Eligible, t, sf)
		}
		if !ok {
			continue
		}
		free.Take(u)
		// What came from preempted jobs' GPUs is theirs no longer.
		for _, sl := range u.Slots {
			fromIdle := onlyIdle.Free(sl.Node, sl.Type)
			if extra := sl.Count - fromIdle; extra > 0 {
				victims.Take(planner.Unit{Slots: []planner.Slot{{Node: sl.Node, Type: sl.Type, Count: min(extra, victims.Free(sl.Node, sl.Type))}}})
			}
		}
		w.p.pool.Release(u)
		w.m.carved = true
	}
	// The spare GPUs spread to a queue: idle ones, node by node.
	for _, p := range plans {
		for k, t := range v.Types {
			need := p.acct.extra[k]
			for _, n := range free.Nodes() {
				if need <= 0 {
					break
				}
				idle := free.Free(n, t) - victims.Free(n, t)
				if c := min(need, idle); c > 0 {
					u := planner.Unit{Slots: []planner.Slot{{Node: n, Type: t, Count: c}}}
					free.Take(u)
					p.pool.Release(u)
					need -= c
				}
			}
		}
	}
}

func pack(pool *round.Pool, el round.Eligible, t planner.GPUType, n int) (planner.Unit, bool) {
	undo := pool.Restrict(el)
	defer undo()
	return pool.Pack(t, n)
}

// runInner runs one queue's scheduler on its view and copies its answer.
func (s *Scheduler) runInner(v *round.View, p *plan, out []planner.Placement) error {
	nt := len(v.Types)
	ent := p.acct.entitled()
	// Jobs within their minimum run time keep their GPUs whatever a
	// policy answers (the engine holds them): a policy that does not plan
	// with it would hand their GPUs to other jobs, to be refused, and
	// leave GPUs idle. Unless it does, they keep their GPUs here and
	// leave its view.
	rest := p.members
	if !v.MidRound && !s.plansMinRun(p) {
		rest = nil
		for _, m := range p.members {
			if min := s.minRun(p.iq.q, m.jb); m.reserved && m.ran < min-1e-6 {
				out[m.i] = clonePlacement(m.jb.Placement)
				takeAll(p.pool, m.jb.Placement)
				for t, k := range m.held {
					ent[t] -= k
				}
				p.reason[m.i] = Reason{Why: fmt.Sprintf("keeps its GPUs: it has run %s of its minimum run time %s", secs(m.ran), secs(min))}
				continue
			}
			rest = append(rest, m)
		}
	}
	// Priority inside the queue: jobs below the priority that fills the
	// queue's share sit out (mid-round, running jobs stay in the view).
	total := 0
	for _, k := range ent {
		total += k
	}
	byPrio := slices.Clone(rest)
	slices.SortStableFunc(byPrio, func(a, b *member) int { return cmp.Compare(b.prio, a.prio) })
	cut, sum := math.MinInt, 0
	for _, m := range byPrio {
		sum += m.jb.ScaleFactor
		if sum >= total {
			cut = m.prio
			break
		}
	}
	// The view lists jobs by priority, then arrival.
	slices.SortStableFunc(byPrio, func(a, b *member) int { return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(a.i, b.i)) })
	p.visible = p.visible[:0]
	for _, m := range byPrio {
		if m.prio >= cut || v.MidRound && m.held != nil {
			p.visible = append(p.visible, m)
		} else {
			p.reason[m.i] = Reason{Code: ReasonPriority, Why: fmt.Sprintf("queue %s: jobs of priority above %d fill its share (%s): this one (priority %d) waits", p.iq.q.Name, m.prio, gpus(v.Types, ent), m.prio)}
		}
	}
	if len(p.visible) == 0 {
		return nil
	}
	capacity := make([]float64, nt)
	for t, k := range ent {
		capacity[t] = float64(k)
	}
	key := strconv.FormatUint(v.Epoch, 10) + ":" + fmt.Sprint(v.Types, ent)
	if key != p.iq.key {
		p.iq.key = key
		p.iq.epoch++
	}
	sub := &round.View{Now: v.Now, Round: v.Round, MidRound: v.MidRound, Types: v.Types, Capacity: capacity, Cluster: v.Cluster,
		Pool: p.pool, Epoch: p.iq.epoch, Jobs: make([]*round.JobView, len(p.visible))}
	if v.Reasons != nil {
		sub.Reasons = make([]round.Reason, len(p.visible))
	}
	for k, m := range p.visible {
		c := *m.jb // the engine's view is not ours to change
		if w := p.iq.q.MaxJobWeight; w > 0 && c.Weight > w {
			c.Weight = w
		}
		c.MinRunTime = capMinRun(p.iq.q, c.MinRunTime)
		sub.Jobs[k] = &c
	}
	ps, err := p.iq.sched.Schedule(sub)
	if err != nil {
		return fmt.Errorf("queue %s: %s: %w", p.iq.q.Name, p.iq.sched.Name(), err)
	}
	if len(ps) != len(sub.Jobs) {
		return fmt.Errorf("queue %s: %s returned %d placements for %d jobs", p.iq.q.Name, p.iq.sched.Name(), len(ps), len(sub.Jobs))
	}
	for k, m := range p.visible {
		out[m.i] = ps[k]
		if sub.Reasons != nil {
			v.Explain(m.i, sub.Reasons[k])
		}
	}
	return nil
}

// plansMinRun reports whether p's scheduler plans with the minimum run
// time itself (Options.PlansMinRun).
func (s *Scheduler) plansMinRun(p *plan) bool {
	return s.opt.PlansMinRun != nil && s.opt.PlansMinRun(p.iq.sched)
}

// hold does to the merged answer what the engine will do: a running job
// within its minimum run time (bounded where a reclaim bounds it) keeps its
// GPUs whatever its queue's policy answered, and a placement on GPUs so
// kept is dropped (a running job then keeps its own GPUs if they are
// free). A policy that time-slices moves and stops jobs the engine will
// not let go; lending must see the GPUs that will really be idle.
func (s *Scheduler) hold(v *round.View, plans []*plan, out []planner.Placement) {
	if v.MidRound {
		return
	}
	check := v.Pool.Clone()
	kept := map[int]bool{}
	owner := map[int]*plan{}
	for _, p := range plans {
		for _, m := range p.members {
			owner[m.i] = p
			if m.held == nil || keepsAll(m.jb.Placement, out[m.i]) {
				continue
			}
			min := s.minRun(p.iq.q, m.jb)
			if b, ok := s.bounds[m.jb.ID]; ok && b < min {
				min = b
			}
			if m.ran < min-1e-6 && check.FitsPlacement(m.jb.Placement) {
				out[m.i] = clonePlacement(m.jb.Placement)
				takeAll(check, out[m.i])
				kept[m.i] = true
				m.victim = false
				delete(s.bounds, m.jb.ID)
				p.reason[m.i] = Reason{Code: p.reason[m.i].Code, Why: fmt.Sprintf("keeps its GPUs: it has run %s of its minimum run time %s", secs(m.ran), secs(min))}
			}
		}
	}
	var dropped []int
	for i, jb := range v.Jobs {
		if kept[i] || len(out[i].Units) == 0 {
			continue
		}
		if check.FitsPlacement(out[i]) {
			takeAll(check, out[i])
			continue
		}
		out[i] = planner.Placement{}
		what := "it waits"
		if jb.Running && check.FitsPlacement(jb.Placement) {
			out[i] = clonePlacement(jb.Placement)
			takeAll(check, out[i])
			what = "it keeps its GPUs"
		} else {
			dropped = append(dropped, i)
		}
		if p := owner[i]; p != nil {
			p.reason[i] = Reason{Code: ReasonMinRun, Why: fmt.Sprintf("queue %s: the GPUs its policy gave it are kept by a job within its minimum run time: %s", p.iq.q.Name, what)}
		}
	}
	// A job so dropped takes GPUs of its queue's share left free, if any
	// fit it: the share is the queue's, and its policy did mean the job
	// to run.
	for _, i := range dropped {
		p, jb := owner[i], v.Jobs[i]
		if p == nil || p.carved == nil || s.plansMinRun(p) {
			continue
		}
		own := check.Clone()
		for _, n := range own.Nodes() {
			for _, t := range v.Types {
				if d := own.Free(n, t) - p.carved.Free(n, t); d > 0 {
					own.Take(planner.Unit{Slots: []planner.Slot{{Node: n, Type: t, Count: d}}})
				}
			}
		}
		var pick planner.Unit
		rate := 0.0
		for t, ty := range v.Types {
			if jb.Throughput[t] > rate {
				if u, ok := pack(own, jb.Eligible, ty, jb.ScaleFactor); ok {
					pick, rate = u, jb.Throughput[t]
				}
			}
		}
		if rate > 0 {
			out[i] = planner.Placement{Units: []planner.Unit{pick}}
			check.Take(pick)
			p.reason[i] = Reason{Why: fmt.Sprintf("queue %s: the GPUs its policy gave it are kept by a job within its minimum run time; runs on other GPUs of its share", p.iq.q.Name)}
		}
	}
}

// keepsAll reports whether placement to keeps every unit of from.
func keepsAll(from, to planner.Placement) bool {
	for _, u := range from.Units {
		if !slices.ContainsFunc(to.Units, u.Equal) {
			return false
		}
	}
	return true
}

func takeAll(pool *round.Pool, p planner.Placement) {
	for _, u := range p.Units {
		pool.Take(u)
	}
}

// lend gives GPUs no queue used: first back to the preempted jobs that
// held them (they go on), then to waiting jobs of queues whose own pool
// had no room for them, the queue borrowing least first, within limits.
func (s *Scheduler) lend(v *round.View, plans []*plan, out []planner.Placement, tidx map[planner.GPUType]int, base []int) {
	left := v.Pool.Clone()
	for i, jb := range v.Jobs {
		if v.MidRound && jb.Running {
			continue
		}
		if left.FitsPlacement(out[i]) {
			for _, u := range out[i].Units {
				left.Take(u)
			}
		}
	}
	if !v.MidRound {
		for _, p := range plans {
			for _, m := range p.members {
				if m.victim && len(out[m.i].Units) == 0 && left.FitsPlacement(m.jb.Placement) {
					out[m.i] = clonePlacement(m.jb.Placement)
					for _, u := range m.jb.Placement.Units {
						left.Take(u)
					}
					m.victim = false
					delete(s.bounds, m.jb.ID)
					p.reason[m.i] = Reason{Code: ReasonBorrowing, Why: fmt.Sprintf("queue %s: beyond its share, keeps its GPUs: no queue needs them this round", p.iq.q.Name)}
				}
			}
		}
	}
	// Usage per queue after the plan, for limits and borrowed shares.
	for _, p := range plans {
		p.used = make([]int, len(v.Types))
		for _, m := range p.members {
			pl := out[m.i]
			if v.MidRound && m.held != nil {
				pl = m.jb.Placement
			}
			addTo(p.used, held(pl, tidx, len(v.Types)))
		}
	}
	type cand struct {
		p *plan
		m *member
	}
	var cands []cand
	for _, p := range plans {
		if s.plansMinRun(p) {
			// It plans every start in its own calendar: a job it did not
			// place is not placed behind its back.
			continue
		}
		for k, m := range p.members {
			if len(out[m.i].Units) > 0 || v.MidRound && m.held != nil || p.acct.claims[k].atLimit {
				continue
			}
			if hasRoom(p.pool, m.jb, v.Types) {
				continue // its own scheduler chose to leave it waiting
			}
			cands = append(cands, cand{p, m})
		}
	}
	if len(cands) == 0 {
		return
	}
	shareOf := func(p *plan) float64 {
		s := 0.0
		for t, k := range p.used {
			if over := k - p.acct.guar[t]; over > 0 && base[t] > 0 {
				s += float64(over) / float64(base[t])
			}
		}
		return s / p.iq.q.Weight
	}
	for len(cands) > 0 {
		// The candidate of the queue borrowing least, then priority and
		// arrival.
		best := 0
		for k := 1; k < len(cands); k++ {
			a, b := cands[k], cands[best]
			sa, sb := shareOf(a.p), shareOf(b.p)
			if sa < sb || sa == sb && (a.m.prio > b.m.prio || a.m.prio == b.m.prio && a.m.i < b.m.i) {
				best = k
			}
		}
		c := cands[best]
		cands = slices.Delete(cands, best, best+1)
		jb := c.m.jb
		var pick planner.Unit
		rate := 0.0
		for t, ty := range v.Types {
			if !(jb.Throughput[t] > rate) {
				continue
			}
			if lim := c.p.acct.limit[t]; lim >= 0 && c.p.used[t]+jb.ScaleFactor > lim {
				continue
			}
			if u, ok := pack(left, jb.Eligible, ty, jb.ScaleFactor); ok {
				pick, rate = u, jb.Throughput[t]
			}
		}
		if rate == 0 {
			continue
		}
		left.Take(pick)
		out[c.m.i] = planner.Placement{Units: []planner.Unit{pick}}
		addTo(c.p.used, held(out[c.m.i], tidx, len(v.Types)))
		c.p.reason[c.m.i] = Reason{Code: ReasonBorrowing, Why: fmt.Sprintf("queue %s: no room left in its share; borrows idle %s GPUs (given back when their queue wants them)", c.p.iq.q.Name, pick.Slots[0].Type)}
	}
}

// hasRoom reports whether pool still has free GPUs of a type jb runs on,
// enough for it.
func hasRoom(pool *round.Pool, jb *round.JobView, types []planner.GPUType) bool {
	for t, ty := range types {
		if jb.Throughput[t] > 0 {
			undo := pool.Restrict(jb.Eligible)
			n := pool.FreeOfType(ty)
			undo()
			if n >= jb.ScaleFactor {
				return true
			}
		}
	}
	return false
}

// track records when each job started on the placement it gets, and
// forgets jobs that left.
func (s *Scheduler) track(v *round.View, out []planner.Placement) {
	active := make(map[string]bool, len(v.Jobs))
	for i, jb := range v.Jobs {
		active[jb.ID] = true
		if v.MidRound && jb.Running {
			continue
		}
		p := out[i]
		switch {
		case len(p.Units) == 0:
			delete(s.since, jb.ID)
		case jb.Running && samePlacement(p, jb.Placement):
			// Goes on: since is kept.
		default:
			s.since[jb.ID] = placedAt{p: clonePlacement(p), at: v.Now}
		}
	}
	for id := range s.since {
		if !active[id] {
			delete(s.since, id)
		}
	}
}

func held(p planner.Placement, tidx map[planner.GPUType]int, nt int) []int {
	out := make([]int, nt)
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			if k, ok := tidx[sl.Type]; ok {
				out[k] += sl.Count
			}
		}
	}
	return out
}

// takeFitting takes p's GPUs from pool where they are offered.
func takeFitting(pool *round.Pool, p planner.Placement) {
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			if pool.Has(sl.Node) {
				pool.Take(planner.Unit{Slots: []planner.Slot{{Node: sl.Node, Type: sl.Type, Count: min(sl.Count, pool.Free(sl.Node, sl.Type))}}})
			}
		}
	}
}

func samePlacement(a, b planner.Placement) bool {
	if len(a.Units) != len(b.Units) {
		return false
	}
	for k := range a.Units {
		if !a.Units[k].Equal(b.Units[k]) {
			return false
		}
	}
	return true
}

func clonePlacement(p planner.Placement) planner.Placement {
	if len(p.Units) == 0 {
		return planner.Placement{}
	}
	out := planner.Placement{Units: make([]planner.Unit, len(p.Units))}
	for i, u := range p.Units {
		out.Units[i] = planner.Unit{Slots: slices.Clone(u.Slots)}
	}
	return out
}

// gpus writes per-type counts as "v100 8, k80 4" (types with none left
// out; "none" when all are 0).
func gpus(types []planner.GPUType, n []int) string {
	var parts []string
	for t, k := range n {
		if k > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", types[t], k))
		}
	}
	if len(parts) == 0 {
		return "no GPUs"
	}
	return strings.Join(parts, ", ")
}
