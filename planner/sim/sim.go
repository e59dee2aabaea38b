// Package sim is hadar's trace-driven cluster simulator. It replays jobs
// through a round.Scheduler with the same round mechanism the sidecar
// uses, and reports makespan, job completion times and utilization.
//
// Two fidelities: the default (improved) one lets arrivals and completions
// take effect when they happen (waiting jobs are placed on idle GPUs at
// once), charges a restart cost whenever a job's GPUs change, and applies
// placement-dependent throughput; the Gavel one reproduces Gavel's
// published simulator (arrivals and completions only acted on at round
// boundaries, allocation recomputed at most every 1920 s, no restart cost,
// no placement effect).
package sim

import (
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Fidelity selects the simulator's behaviour.
type Fidelity string

// Fidelities.
const (
	Improved Fidelity = "improved"
	Gavel    Fidelity = "gavel"
)

// ParseFidelity reads a --fidelity flag value.
func ParseFidelity(s string) (Fidelity, error) {
	switch Fidelity(s) {
	case Improved, "":
		return Improved, nil
	case Gavel:
		return Gavel, nil
	}
	return "", fmt.Errorf("fidelity %q: want %q or %q", s, Improved, Gavel)
}

// Config is one simulation.
type Config struct {
	Cluster planner.Cluster
	Jobs    []planner.Job
	Speed   speed.Model
	// Round is the round length in seconds (default 360).
	Round float64
	// RestartCost is the seconds of progress a job loses each time it
	// starts on new GPUs (checkpoint restore and warm-up). Ignored in Gavel
	// fidelity.
	RestartCost float64
	// MergeCost is the seconds every unit of a forked job (HadarE copies)
	// spends merging parameters at each round boundary. Ignored in Gavel
	// fidelity.
	MergeCost float64
	Fidelity  Fidelity
	// Progress, when set, is called after every round.
	Progress func(now float64, done, total int)
	// MaxTime aborts a run whose simulated time passes it (0 = 10 years),
	// turning a scheduler that starves a job into an error, not a hang.
	MaxTime float64
}

// JobResult is one job's outcome.
type JobResult struct {
	ID       string
	Model    string
	SF       int
	Arrival  float64
	Start    float64 // first time it held GPUs; -1 if never
	Finish   float64
	JCT      float64
	Restarts int
	// GPUSeconds is the GPU time the job held.
	GPUSeconds float64
	// CommSeconds is the job's time spent communicating (0 without a
	// CommNetwork).
	CommSeconds float64
}

// CommNetwork is a speed.Network that can also say which fraction of a
// unit's step time is communication not hidden behind compute; when the
// speed model's network implements it, Run fills Result.CommOverhead.
type CommNetwork interface {
	CommFraction(job planner.Job, u planner.Unit, now float64) float64
}

// Sample is cluster utilization over one round.
type Sample struct {
	Time float64
	// Busy is the fraction of each type's GPUs held, averaged over the
	// round, in the order of Result.Types.
	Busy []float64
}

// Result of a simulation.
type Result struct {
	Scheduler string
	Types     []planner.GPUType
	Jobs      []JobResult
	Makespan  float64
	AvgJCT    float64
	P99JCT    float64
	// Utilization is GPU time held divided by GPUs times makespan.
	Utilization float64
	Completed   int
	Total       int
	Samples     []Sample
	Rounds      int
	// CommOverhead is the time jobs spent communicating, summed over
	// jobs, when the speed model has a network (0 otherwise).
	CommOverhead float64
}

type jobState struct {
	view round.JobView
	idx  int
	// One entry per unit of the placement: its speed and the seconds of
	// restart or merging left before it makes progress.
	rates      []float64
	delays     []float64
	comm       []float64 // communication share of each unit's step time
	commTime   float64
	started    bool
	done       bool
	start      float64
	finish     float64
	restarts   int
	gpuSeconds float64
}

// Run simulates cfg with sched until every job completes.
func Run(ctx context.Context, cfg Config, sched round.Scheduler) (Result, error) {
	if cfg.Round <= 0 {
		cfg.Round = 360
	}
	if cfg.MaxTime <= 0 {
		cfg.MaxTime = 10 * 365 * 24 * 3600
	}
	if cfg.Fidelity == "" {
		cfg.Fidelity = Improved
	}
	gavel := cfg.Fidelity == Gavel
	if gavel {
		cfg.RestartCost = 0
		cfg.MergeCost = 0
		cfg.Speed.IgnoreSpread = true
	}
	types := cfg.Cluster.Types()
	if len(types) == 0 {
		return Result{}, fmt.Errorf("simulation: the cluster has no GPUs")
	}
	capacity := make([]float64, len(types))
	totalGPUs := 0.0
	for j, t := range types {
		capacity[j] = float64(cfg.Cluster.Capacity(t))
		totalGPUs += capacity[j]
	}
	typeIndex := map[planner.GPUType]int{}
	for j, t := range types {
		typeIndex[t] = j
	}

	widest := map[planner.GPUType]int{}
	for _, n := range cfg.Cluster.Nodes {
		for t, k := range n.GPUs {
			widest[t] = max(widest[t], k)
		}
	}
	jobs := make([]*jobState, len(cfg.Jobs))
	for i, jb := range cfg.Jobs {
		if err := jb.Validate(); err != nil {
			return Result{}, fmt.Errorf("simulation: %w", err)
		}
		tp := make([]float64, len(types))
		runnable := false
		for j, t := range types {
			// A job wider than any server of the type is always spread:
			// plan with the speed it will actually get.
			spread := !cfg.Speed.IgnoreSpread && jb.ScaleFactor > widest[t]
			v, err := cfg.Speed.Profile.Throughput(jb.Model, jb.ScaleFactor, t, spread)
			if err != nil {
				return Result{}, fmt.Errorf("simulation: job %s: %w", jb.ID, err)
			}
			tp[j] = v
			runnable = runnable || (v > 0 && float64(jb.ScaleFactor) <= capacity[j])
		}
		if !runnable {
			return Result{}, fmt.Errorf("simulation: job %s (%s, %d GPUs) cannot run on any GPU type of the cluster: remove it from the trace or add a type it runs on", jb.ID, jb.Model, jb.ScaleFactor)
		}
		jobs[i] = &jobState{idx: i, view: round.JobView{Job: jb, Remaining: jb.TotalSteps, Throughput: tp, Received: make([]float64, len(types))}}
	}
	// Arrival order; ties keep trace order.
	order := make([]*jobState, len(jobs))
	copy(order, jobs)
	sort.SliceStable(order, func(a, b int) bool { return order[a].view.Arrival < order[b].view.Arrival })

	// Rates (and communication shares) are recomputed for every running
	// unit at each round boundary, so time-varying congestion reaches
	// running jobs within a round.
	cn, _ := cfg.Speed.Network.(CommNetwork)
	res := Result{Scheduler: sched.Name(), Types: types, Total: len(jobs)}
	if len(jobs) == 0 {
		return res, nil
	}
	var active []*jobState
	nextArrival := 0
	now := 0.0
	if gavel {
		// Gavel's rounds start at the first arrival.
		now = order[0].view.Arrival
	}
	done := 0
	roundBusy := make([]float64, len(types))

	admit := func(upTo float64) {
		for nextArrival < len(order) && order[nextArrival].view.Arrival <= upTo+1e-9 {
			active = append(active, order[nextArrival])
			nextArrival++
		}
	}
	view := func(mid bool, pool *round.Pool) *round.View {
		v := &round.View{Now: now, Round: cfg.Round, MidRound: mid, Types: types, Capacity: capacity, Cluster: cfg.Cluster, Pool: pool}
		for _, s := range active {
			v.Jobs = append(v.Jobs, &s.view)
		}
		return v
	}
	// freePool offers every GPU at a round boundary and only the idle ones
	// mid-round.
	freePool := func(mid bool) *round.Pool {
		pool := round.NewPool(cfg.Cluster)
		for _, s := range active {
			if mid && s.view.Running {
				for _, u := range s.view.Placement.Units {
					pool.Take(u)
				}
			}
		}
		return pool
	}
	// apply installs new placements; jobs whose GPUs changed pay the
	// restart cost.
	apply := func(v *round.View, ps []planner.Placement) error {
		if len(ps) != len(v.Jobs) {
			return fmt.Errorf("scheduler %s returned %d placements for %d jobs", sched.Name(), len(ps), len(v.Jobs))
		}
		check := freePool(v.MidRound)
		for i, s := range active {
			if v.MidRound && s.view.Running {
				continue
			}
			p := ps[i]
			for _, u := range p.Units {
				if !check.Fits(u) {
					return fmt.Errorf("t=%.0fs: scheduler %s placed job %s on GPUs that are not free (%v)", now, sched.Name(), s.view.ID, u.Slots)
				}
				check.Take(u)
			}
			if err := validPlacement(s.view.Job, p); err != nil {
				return fmt.Errorf("t=%.0fs: scheduler %s: %w", now, sched.Name(), err)
			}
			if len(p.Units) == 0 {
				s.view.Running = false
				s.view.Placement = planner.Placement{}
				s.rates, s.delays, s.comm = nil, nil, nil
				continue
			}
			// A unit that keeps exactly its GPUs keeps running; any other
			// unit (re)starts and pays the restart cost.
			rates := make([]float64, len(p.Units))
			delays := make([]float64, len(p.Units))
			comm := make([]float64, len(p.Units))
			restarted := false
			for k, u := range p.Units {
				kept := -1
				if s.view.Running {
					for q, old := range s.view.Placement.Units {
						if old.Equal(u) {
							kept = q
							break
						}
					}
				}
				if kept >= 0 {
					delays[k] = s.delays[kept]
				} else {
					delays[k] = cfg.RestartCost
					restarted = true
				}
				if len(p.Units) > 1 && !v.MidRound {
					delays[k] += cfg.MergeCost
				}
				r, err := cfg.Speed.UnitRate(s.view.Job, u, now)
				if err != nil {
					return err
				}
				if r <= 0 {
					return fmt.Errorf("t=%.0fs: scheduler %s placed job %s where it cannot run (speed 0 on %v)", now, sched.Name(), s.view.ID, u.Slots)
				}
				rates[k] = r
				if cn != nil {
					comm[k] = cn.CommFraction(s.view.Job, u, now)
				}
			}
			if restarted && s.started {
				s.restarts++
			}
			if !s.started {
				s.started, s.start = true, now
			}
			s.view.Placement = p
			s.view.Running = true
			s.rates, s.delays, s.comm = rates, delays, comm
		}
		return nil
	}
	schedule := func(mid bool) error {
		v := view(mid, freePool(mid))
		ps, err := sched.Schedule(v)
		if err != nil {
			return err
		}
		return apply(v, ps)
	}

	for done < len(jobs) {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if now > cfg.MaxTime {
			return res, fmt.Errorf("simulation passed %.0f s with %d of %d jobs done: scheduler %s starves a job", cfg.MaxTime, done, len(jobs), sched.Name())
		}
		// Idle cluster: jump to the next arrival (on the round grid in
		// Gavel fidelity).
		if len(active) == 0 {
			next := order[nextArrival].view.Arrival
			if gavel {
				next = now + math.Ceil((next-now)/cfg.Round-1e-9)*cfg.Round
			}
			now = math.Max(now, next)
		}
		admit(now)
		roundStart := now
		roundEnd := now + cfg.Round
		if err := schedule(false); err != nil {
			return res, err
		}
		res.Rounds++
		for j := range roundBusy {
			roundBusy[j] = 0
		}
		for now < roundEnd-1e-9 {
			// Next event inside this round.
			next := roundEnd
			if !gavel && nextArrival < len(order) {
				next = math.Min(next, order[nextArrival].view.Arrival)
			}
			for _, s := range active {
				if s.view.Running {
					next = math.Min(next, now+timeToFinish(s.view.Remaining, s.rates, s.delays))
				}
			}
			next = math.Max(next, now)
			dt := next - now
			finished := false
			for _, s := range active {
				if !s.view.Running {
					continue
				}
				gpus := 0
				for _, u := range s.view.Placement.Units {
					for _, sl := range u.Slots {
						gpus += sl.Count
						roundBusy[typeIndex[sl.Type]] += float64(sl.Count) * dt
						s.view.Received[typeIndex[sl.Type]] += dt * float64(sl.Count) / float64(u.GPUs()) / float64(len(s.view.Placement.Units))
					}
				}
				s.gpuSeconds += float64(gpus) * dt
				for k, r := range s.rates {
					if s.comm != nil {
						s.commTime += s.comm[k] * math.Max(0, dt-s.delays[k])
					}
					s.view.Remaining -= r * math.Max(0, dt-s.delays[k])
					s.delays[k] = math.Max(0, s.delays[k]-dt)
				}
				if s.view.Remaining <= 1e-9*s.view.TotalSteps {
					s.view.Remaining = 0
					s.done, s.finish = true, next
					s.view.Running = false
					finished = true
				}
			}
			now = next
			if finished {
				kept := active[:0]
				for _, s := range active {
					if s.done {
						done++
					} else {
						kept = append(kept, s)
					}
				}
				active = kept
			}
			arrived := false
			if !gavel {
				before := nextArrival
				admit(now)
				arrived = nextArrival > before
			}
			if !gavel && (finished || arrived) && now < roundEnd-1e-9 && len(active) > 0 {
				if err := schedule(true); err != nil {
					return res, err
				}
			}
			if len(active) == 0 && done < len(jobs) && !gavel {
				break // idle until the next arrival: start a new round then
			}
			if done == len(jobs) {
				break
			}
		}
		length := now - roundStart
		if length > 0 {
			smp := Sample{Time: roundStart, Busy: make([]float64, len(types))}
			for j := range types {
				smp.Busy[j] = roundBusy[j] / (capacity[j] * length)
			}
			res.Samples = append(res.Samples, smp)
		}
		if gavel && len(active) == 0 && nextArrival < len(order) {
			now = roundEnd
		}
		if cfg.Progress != nil {
			cfg.Progress(now, done, len(jobs))
		}
	}
	return summarize(res, jobs, totalGPUs), nil
}

// timeToFinish is when units running at rates, each after its delay, have
// together made rem steps.
func timeToFinish(rem float64, rates, delays []float64) float64 {
	type ev struct{ at, rate float64 }
	evs := make([]ev, len(rates))
	for k := range rates {
		evs[k] = ev{delays[k], rates[k]}
	}
	sort.Slice(evs, func(a, b int) bool { return evs[a].at < evs[b].at })
	t, rate := 0.0, 0.0
	for _, e := range evs {
		if rate > 0 && t+rem/rate <= e.at {
			return t + rem/rate
		}
		rem -= rate * (e.at - t)
		t = e.at
		rate += e.rate
	}
	if rate <= 0 {
		return math.Inf(1)
	}
	return t + math.Max(0, rem)/rate
}

// validPlacement checks that every unit holds a positive number of GPUs
// and that a single-unit placement holds exactly the job's scale factor
// (copies may be smaller).
func validPlacement(j planner.Job, p planner.Placement) error {
	for _, u := range p.Units {
		if u.GPUs() <= 0 {
			return fmt.Errorf("job %s: a unit with no GPUs", j.ID)
		}
		if u.GPUs() > j.ScaleFactor {
			return fmt.Errorf("job %s: a unit of %d GPUs exceeds its scale factor %d", j.ID, u.GPUs(), j.ScaleFactor)
		}
	}
	if len(p.Units) == 1 && p.Units[0].GPUs() != j.ScaleFactor {
		return fmt.Errorf("job %s: placed on %d GPUs, want its scale factor %d", j.ID, p.Units[0].GPUs(), j.ScaleFactor)
	}
	return nil
}

func summarize(res Result, jobs []*jobState, totalGPUs float64) Result {
	first, last := math.Inf(1), 0.0
	var jcts []float64
	busy := 0.0
	for _, s := range jobs {
		jr := JobResult{ID: s.view.ID, Model: s.view.Model, SF: s.view.ScaleFactor, Arrival: s.view.Arrival, Start: -1, Restarts: s.restarts, GPUSeconds: s.gpuSeconds, CommSeconds: s.commTime}
		res.CommOverhead += s.commTime
		if s.started {
			jr.Start = s.start
		}
		first = math.Min(first, s.view.Arrival)
		busy += s.gpuSeconds
		if s.done {
			jr.Finish = s.finish
			jr.JCT = s.finish - s.view.Arrival
			jcts = append(jcts, jr.JCT)
			last = math.Max(last, s.finish)
			res.Completed++
		}
		res.Jobs = append(res.Jobs, jr)
	}
	if len(jcts) > 0 {
		res.Makespan = last - first
		sum := 0.0
		for _, v := range jcts {
			sum += v
		}
		res.AvgJCT = sum / float64(len(jcts))
		sort.Float64s(jcts)
		res.P99JCT = jcts[int(math.Ceil(0.99*float64(len(jcts))))-1]
		if res.Makespan > 0 {
			res.Utilization = busy / (totalGPUs * res.Makespan)
		}
	}
	return res
}
