// Package sim is hadar's trace-driven cluster simulator: a clock and a
// source of events (arrivals, progress, completions, cluster changes)
// around the round engine (planner/engine), the same engine the sidecar
// drives. The simulator keeps only the truth the engine must not see —
// each job's true steps and speed, restart and merge delays — and the
// measurements (makespan, JCT, utilization); every round decision and its
// bookkeeping is the engine's.
//
// Two fidelities: the default (improved) one lets arrivals and completions
// take effect when they happen (the engine fills idle GPUs at once),
// charges a restart cost whenever a job's GPUs change, and applies
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
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/queue"
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
	// Jobs as they truly are: TotalSteps is the true work.
	Jobs []planner.Job
	// Speed is the true speed model: how fast a placement really runs.
	Speed speed.Model
	// Plan is the model the engine and the scheduler plan with (see
	// EstimatedModel); zero (no profile) means Speed: exact estimates.
	Plan speed.Model
	// Estimate makes declared step counts wrong (StepError); the profile
	// error is in Plan's profile (EstimatedModel).
	Estimate EstimateConfig
	// Events change the cluster during the run (node drain, loss, join).
	Events []Event
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
	// MinRunTime is the least time in seconds a job runs on its GPUs
	// before any preemption (engine.Config.MinRunTime; a job's own
	// MinRunTime overrides it). Ignored in Gavel fidelity.
	MinRunTime float64
	Fidelity   Fidelity
	// Progress, when set, is called after every round.
	Progress func(now float64, done, total int)
	// MaxTime aborts a run whose simulated time passes it (0 = 10 years),
	// turning a scheduler that starves a job into an error, not a hang.
	MaxTime float64
	// Checkpoint, when set, is called at the start of each round with a
	// snapshot from which Resume continues the run exactly; returning
	// stop=true ends the run there (Run returns ErrStopped).
	Checkpoint func(now float64, snapshot []byte) (stop bool, err error)
	// Resume continues the run saved in a snapshot instead of starting.
	Resume []byte
	// Queues is the queue configuration the run is measured against:
	// with it, or when jobs name queues (planner.Job.Queue), the result
	// has one line per queue (Result.Queues). It measures only: the
	// scheduler is what shares the cluster among queues.
	Queues queue.Config
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
	// Queues has one entry per queue (Config.Queues first, then the
	// others by name) when the run has queues; QueueFairness is Jain's
	// index across them of GPU time received over fair GPU time
	// (QueueResult.FairGPUSeconds).
	Queues        []QueueResult `json:",omitempty"`
	QueueFairness float64       `json:",omitempty"`
	// BusyWhileWaiting is the share of the cluster's GPUs held while at
	// least one job waited (measured with queues): work conservation,
	// whatever the makespan's tail.
	BusyWhileWaiting float64 `json:",omitempty"`
}

// jobState is the simulator's truth about one job.
type jobState struct {
	job planner.Job // true steps
	idx int
	rem float64 // true remaining steps
	// ckptRem is the remaining steps at the job's last checkpoint (every
	// round boundary and every stop): where a lost node sends it back.
	ckptRem   float64
	placement planner.Placement
	running   bool
	// One entry per unit of the placement: its speed and the seconds of
	// restart or merging left before it makes progress.
	rates      []float64
	delays     []float64
	comm       []float64 // communication share of each unit's step time
	commTime   float64
	admitted   bool
	started    bool
	done       bool
	start      float64
	finish     float64
	restarts   int
	gpuSeconds float64
	// zeroSince is when the job was last placed where it truly cannot run
	// (the estimates said it could), -1 when it is not.
	zeroSince float64
}

// simulation is one run in progress.
type simulation struct {
	cfg       Config
	eng       *engine.Engine
	sched     round.Scheduler
	gavel     bool
	cn        CommNetwork
	types     []planner.GPUType
	typeIndex map[planner.GPUType]int
	capacity  map[planner.GPUType]float64
	totalGPUs float64

	jobs   []*jobState
	byID   map[string]*jobState
	order  []*jobState // arrival order
	active []*jobState
	events []Event // sorted by time

	nextArrival, nextEvent, done int
	now                          float64
	res                          Result
	roundBusy                    []float64
	// meter measures the queues (nil without any).
	meter *queueMeter
}

// Run simulates cfg with sched until every job completes.
func Run(ctx context.Context, cfg Config, sched round.Scheduler) (Result, error) {
	s, err := newSimulation(cfg, sched)
	if err != nil {
		return Result{}, err
	}
	if cfg.Resume != nil {
		if err := s.restore(cfg.Resume); err != nil {
			return Result{}, err
		}
	}
	return s.run(ctx)
}

// engineConfig is the engine's configuration for the simulation's.
func (s *simulation) engineConfig() engine.Config {
	return engine.Config{Round: s.cfg.Round, NoFills: s.gavel, Speed: s.cfg.Plan, MinRunTime: s.cfg.MinRunTime}
}

func newSimulation(cfg Config, sched round.Scheduler) (*simulation, error) {
	if cfg.Round <= 0 {
		cfg.Round = engine.DefaultRound
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
		cfg.MinRunTime = 0
		cfg.Speed.IgnoreSpread = true
	}
	if cfg.Plan.Profile == nil {
		cfg.Plan = cfg.Speed
	}
	if gavel {
		cfg.Plan.IgnoreSpread = true
	}
	if err := cfg.Estimate.validate(); err != nil {
		return nil, err
	}
	s := &simulation{cfg: cfg, sched: sched, gavel: gavel, byID: map[string]*jobState{}, capacity: map[planner.GPUType]float64{}}
	s.cn, _ = cfg.Speed.Network.(CommNetwork)
	events, err := sortEvents(cfg.Events, cfg.Cluster)
	if err != nil {
		return nil, err
	}
	s.events = events
	// Result types: the cluster's, and any a joining node brings.
	all := cfg.Cluster
	for _, ev := range events {
		if ev.Kind == Join {
			all.Nodes = append(all.Nodes, ev.Node)
		}
	}
	s.types = all.Types()
	if len(cfg.Cluster.Types()) == 0 {
		return nil, fmt.Errorf("simulation: the cluster has no GPUs")
	}
	s.typeIndex = map[planner.GPUType]int{}
	for j, t := range s.types {
		s.typeIndex[t] = j
	}
	for _, t := range s.types {
		s.capacity[t] = float64(cfg.Cluster.Capacity(t))
		s.totalGPUs += s.capacity[t]
	}
	s.roundBusy = make([]float64, len(s.types))
	s.eng, err = engine.New(s.engineConfig(), sched)
	if err != nil {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	if _, err := s.eng.SetNodes(cfg.Cluster.Nodes, 0); err != nil {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	for i, jb := range cfg.Jobs {
		if err := jb.Validate(); err != nil {
			return nil, fmt.Errorf("simulation: %w", err)
		}
		ok, err := s.eng.Runnable(jb)
		if err != nil {
			return nil, fmt.Errorf("simulation: %w", err)
		}
		if !ok {
			return nil, fmt.Errorf("simulation: job %s (%s, %d GPUs) cannot run on any GPU type of the cluster: remove it from the trace or add a type it runs on", jb.ID, jb.Model, jb.ScaleFactor)
		}
		if _, dup := s.byID[jb.ID]; dup {
			return nil, fmt.Errorf("simulation: job ID %s appears twice", jb.ID)
		}
		js := &jobState{job: jb, idx: i, rem: jb.TotalSteps, ckptRem: jb.TotalSteps, zeroSince: -1}
		s.jobs = append(s.jobs, js)
		s.byID[jb.ID] = js
	}
	// Arrival order; ties keep trace order.
	s.order = append([]*jobState(nil), s.jobs...)
	sort.SliceStable(s.order, func(a, b int) bool { return s.order[a].job.Arrival < s.order[b].job.Arrival })
	s.res = Result{Scheduler: sched.Name(), Types: s.types, Total: len(s.jobs)}
	s.meter = newQueueMeter(s)
	if gavel && len(s.order) > 0 {
		// Gavel's rounds start at the first arrival.
		s.now = s.order[0].job.Arrival
	}
	return s, nil
}

// ErrStopped is returned when Config.Checkpoint asked the run to stop.
var ErrStopped = fmt.Errorf("simulation stopped at a checkpoint")

func (s *simulation) run(ctx context.Context) (Result, error) {
	cfg := s.cfg
	if len(s.jobs) == 0 {
		return s.res, nil
	}
	for s.done < len(s.jobs) {
		if err := ctx.Err(); err != nil {
			return s.res, err
		}
		if s.now > cfg.MaxTime {
			return s.res, fmt.Errorf("simulation passed %.0f s with %d of %d jobs done: scheduler %s starves a job", cfg.MaxTime, s.done, len(s.jobs), s.sched.Name())
		}
		if cfg.Checkpoint != nil {
			snap, err := s.snapshot()
			if err != nil {
				return s.res, err
			}
			stop, err := cfg.Checkpoint(s.now, snap)
			if err != nil {
				return s.res, fmt.Errorf("simulation checkpoint at %.0f s: %w", s.now, err)
			}
			if stop {
				return s.res, ErrStopped
			}
		}
		// Idle cluster: jump to the next arrival (on the round grid in
		// Gavel fidelity).
		if len(s.active) == 0 {
			next := s.order[s.nextArrival].job.Arrival
			if s.gavel {
				next = s.now + math.Ceil((next-s.now)/cfg.Round-1e-9)*cfg.Round
			}
			s.now = math.Max(s.now, next)
		}
		if _, err := s.clusterEvents(s.now); err != nil {
			return s.res, err
		}
		if _, err := s.admit(s.now); err != nil {
			return s.res, err
		}
		roundStart := s.now
		roundEnd := s.now + cfg.Round
		// Jobs checkpoint at every round boundary.
		for _, js := range s.active {
			if js.running {
				js.ckptRem = js.rem
			}
		}
		if err := s.plan(ctx, engine.Boundary); err != nil {
			return s.res, err
		}
		s.res.Rounds++
		for j := range s.roundBusy {
			s.roundBusy[j] = 0
		}
		roundCap := make([]float64, len(s.types))
		for j, t := range s.types {
			roundCap[j] = s.capacity[t]
		}
		for s.now < roundEnd-1e-9 {
			// Next event inside this round.
			next := roundEnd
			if !s.gavel && s.nextArrival < len(s.order) {
				next = math.Min(next, s.order[s.nextArrival].job.Arrival)
			}
			if s.nextEvent < len(s.events) {
				next = math.Min(next, s.events[s.nextEvent].Time)
			}
			for _, js := range s.active {
				if js.running {
					next = math.Min(next, s.now+timeToFinish(js.rem, js.rates, js.delays))
				}
			}
			next = math.Max(next, s.now)
			finished, err := s.advance(next)
			if err != nil {
				return s.res, err
			}
			s.now = next
			changed, err := s.clusterEvents(s.now)
			if err != nil {
				return s.res, err
			}
			arrived := false
			if !s.gavel {
				if arrived, err = s.admit(s.now); err != nil {
					return s.res, err
				}
			}
			if (finished || arrived || changed) && s.now < roundEnd-1e-9 && len(s.active) > 0 {
				if err := s.plan(ctx, engine.Fill); err != nil {
					return s.res, err
				}
			}
			if len(s.active) == 0 && s.done < len(s.jobs) && !s.gavel {
				break // idle until the next arrival: start a new round then
			}
			if s.done == len(s.jobs) {
				break
			}
		}
		if length := s.now - roundStart; length > 0 {
			smp := Sample{Time: roundStart, Busy: make([]float64, len(s.types))}
			for j := range s.types {
				if roundCap[j] > 0 {
					smp.Busy[j] = s.roundBusy[j] / (roundCap[j] * length)
				}
			}
			s.res.Samples = append(s.res.Samples, smp)
		}
		if s.gavel && len(s.active) == 0 && s.nextArrival < len(s.order) {
			s.now = roundEnd
		}
		if cfg.Progress != nil {
			cfg.Progress(s.now, s.done, len(s.jobs))
		}
	}
	res := summarize(s.res, s.jobs, s.totalGPUs)
	if s.meter != nil {
		res.Queues, res.QueueFairness, res.BusyWhileWaiting = s.meter.results(s.jobs, res.Makespan)
	}
	return res, nil
}

// admit hands the jobs that arrived by upTo to the engine, with their
// declared (possibly wrong) steps.
func (s *simulation) admit(upTo float64) (bool, error) {
	arrived := false
	for s.nextArrival < len(s.order) && s.order[s.nextArrival].job.Arrival <= upTo+1e-9 {
		js := s.order[s.nextArrival]
		declared := js.job
		declared.TotalSteps = s.cfg.Estimate.declaredSteps(js.job)
		if err := s.eng.Admit(declared, s.now); err != nil {
			return false, fmt.Errorf("simulation: %w", err)
		}
		js.admitted = true
		s.active = append(s.active, js)
		s.nextArrival++
		arrived = true
	}
	return arrived, nil
}

// advance runs the cluster from s.now to next: running jobs make true
// progress, which is reported to the engine as measured; jobs that reach
// their true steps complete.
func (s *simulation) advance(next float64) (bool, error) {
	dt := next - s.now
	finished := false
	if s.meter != nil {
		s.meter.observe(s, dt)
	}
	for _, js := range s.active {
		if !js.running {
			continue
		}
		gpus := 0
		for _, u := range js.placement.Units {
			for _, sl := range u.Slots {
				gpus += sl.Count
				s.roundBusy[s.typeIndex[sl.Type]] += float64(sl.Count) * dt
			}
		}
		js.gpuSeconds += float64(gpus) * dt
		for k, r := range js.rates {
			if js.comm != nil {
				js.commTime += js.comm[k] * math.Max(0, dt-js.delays[k])
			}
			steps := r * math.Max(0, dt-js.delays[k])
			js.rem -= steps
			if err := s.eng.AddProgress(js.job.ID, steps, next); err != nil {
				return false, err
			}
			js.delays[k] = math.Max(0, js.delays[k]-dt)
		}
		if js.rem <= 1e-9*js.job.TotalSteps {
			js.rem = 0
			js.done, js.finish = true, next
			js.running = false
			finished = true
		}
	}
	if !finished {
		return false, nil
	}
	kept := s.active[:0]
	for _, js := range s.active {
		if js.done {
			s.done++
			if err := s.eng.Complete(js.job.ID, next); err != nil {
				return false, err
			}
		} else {
			kept = append(kept, js)
		}
	}
	s.active = kept
	return true, nil
}

// plan asks the engine for a decision and carries it out on the truth.
func (s *simulation) plan(ctx context.Context, kind engine.Kind) error {
	d, err := s.eng.Plan(ctx, s.now, kind)
	if err != nil {
		return err
	}
	// The live sidecar goes on without a repaired part; the simulator
	// is where scheduler bugs are found, so it stops at the first.
	if len(d.Repairs) > 0 {
		return fmt.Errorf("engine: t=%.0fs: the scheduler's answer needed repair: %s", s.now, d.Repairs[0].Why)
	}
	if d.Kind == engine.None {
		return nil
	}
	mid := kind == engine.Fill
	for _, jd := range d.Jobs {
		js := s.byID[jd.Job]
		if mid && js.running {
			continue
		}
		if len(jd.To.Units) == 0 {
			if js.running {
				js.ckptRem = js.rem // a stopped job checkpoints
			}
			js.zeroSince = -1
			js.running = false
			js.placement = planner.Placement{}
			js.rates, js.delays, js.comm = nil, nil, nil
			continue
		}
		// A unit that keeps exactly its GPUs keeps running; any other
		// unit (re)starts and pays the restart cost. Rates are recomputed
		// at every boundary, so time-varying congestion reaches running
		// jobs within a round.
		n := len(jd.To.Units)
		rates, delays, comm := make([]float64, n), make([]float64, n), make([]float64, n)
		restarted := false
		for k, u := range jd.To.Units {
			if from := jd.KeptFrom[k]; from >= 0 && js.running {
				delays[k] = js.delays[from]
			} else {
				delays[k] = s.cfg.RestartCost
				restarted = true
			}
			if n > 1 && !mid {
				delays[k] += s.cfg.MergeCost
			}
			r, err := s.cfg.Speed.UnitRate(js.job, u, s.now)
			if err != nil {
				return err
			}
			if r <= 0 && !s.cfg.Estimate.Learn {
				return fmt.Errorf("t=%.0fs: scheduler %s placed job %s where it cannot run (speed 0 on %v): the estimates say it can, and without --learn nothing corrects them", s.now, s.sched.Name(), js.job.ID, u.Slots)
			}
			// With learning, a unit where the job truly cannot run (the
			// estimates said it could: in a real cluster it fails at
			// start) makes no progress, and the engine learns that.
			rates[k] = r
			if s.cn != nil {
				comm[k] = s.cn.CommFraction(js.job, u, s.now)
			}
		}
		if restarted && js.started {
			js.restarts++
		}
		if err := s.watchZero(js, rates); err != nil {
			return err
		}
		if !js.started {
			js.started, js.start = true, s.now
		}
		js.placement = jd.To
		js.running = true
		js.rates, js.delays, js.comm = rates, delays, comm
	}
	return nil
}

// zeroLimit is how long a job may sit where it truly cannot run before
// the simulation gives up: learning takes it away within a round or two
// unless a known figure, which learning bounds, insists it can.
const zeroLimit = 20 * 3600.0

func (s *simulation) watchZero(js *jobState, rates []float64) error {
	total := 0.0
	for _, r := range rates {
		total += r
	}
	switch {
	case total > 0:
		js.zeroSince = -1
	case js.zeroSince < 0:
		js.zeroSince = s.now
	case s.now-js.zeroSince > zeroLimit:
		return fmt.Errorf("t=%.0fs: job %s has sat for %.0f h where it cannot run (%s): the known profile says it can, and learning bounds a known figure's correction to %gx",
			s.now, js.job.ID, (s.now-js.zeroSince)/3600, js.job.Model, engine.MaxFactor)
	}
	return nil
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

func summarize(res Result, jobs []*jobState, totalGPUs float64) Result {
	first, last := math.Inf(1), 0.0
	var jcts []float64
	busy := 0.0
	res.Jobs, res.Completed, res.CommOverhead = nil, 0, 0
	for _, s := range jobs {
		jr := JobResult{ID: s.job.ID, Model: s.job.Model, SF: s.job.ScaleFactor, Arrival: s.job.Arrival, Start: -1, Restarts: s.restarts, GPUSeconds: s.gpuSeconds, CommSeconds: s.commTime}
		res.CommOverhead += s.commTime
		if s.started {
			jr.Start = s.start
		}
		first = math.Min(first, s.job.Arrival)
		busy += s.gpuSeconds
		if s.done {
			jr.Finish = s.finish
			jr.JCT = s.finish - s.job.Arrival
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
