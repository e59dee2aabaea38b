// Package engine is hadar's round engine: the one mechanism that both the
// simulator (planner/sim) and the sidecar drive. It owns all round
// bookkeeping — the active jobs and what a scheduler may know of them
// (estimated throughputs, declared steps minus reported progress, the
// time each job received on each GPU type), the cluster's capacity as it
// changes, the pool of GPUs a plan may hand out (all of them at a round
// boundary, the idle ones between boundaries), validation of what the
// scheduler returns, and the diff against the previous placement — and it
// answers each plan with a Decision: for every job start, keep, stop,
// move, fork, unfork or wait, with the target placement and the policy's
// reason. docs/engine.md is the page a sidecar author reads.
//
// The engine is not safe for concurrent use; its callers serialise calls
// (the simulator is single-threaded, the sidecar holds a lock).
package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/estimate"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Kind is what a plan may change.
type Kind string

// Kinds of plans.
const (
	// Boundary is a round boundary: every job may be re-placed.
	Boundary Kind = "round"
	// Fill places waiting jobs on idle GPUs between boundaries; running
	// jobs keep theirs.
	Fill Kind = "fill"
	// None is the kind of an empty decision: a fill that had nothing to do.
	None Kind = "none"
)

// Action is what a decision does to one job.
type Action string

// Actions.
const (
	Start  Action = "start"  // was waiting, now runs
	Keep   Action = "keep"   // runs on exactly the GPUs it had
	Stop   Action = "stop"   // ran, now waits (preempted or evicted)
	Move   Action = "move"   // runs on other GPUs: some units restart
	Fork   Action = "fork"   // keeps its units and gains copies (HadarE)
	Unfork Action = "unfork" // keeps some of its units and loses others
	Wait   Action = "wait"   // waited and still waits
)

// Changes reports whether the action needs anything done on the cluster.
func (a Action) Changes() bool { return a != Keep && a != Wait }

// DefaultRound is the round length when Config.Round is 0 (Gavel's).
const DefaultRound = 360.0

// DefaultOverrun is Config.Overrun's default.
const DefaultOverrun = 0.05

// DefaultStallAfter is Config.StallAfter's default: five minutes with no
// step is far beyond a start-up, a checkpoint or a slow step of any job
// the contract allows (a step is reported at least every round).
const DefaultStallAfter = 300.0

// Config of an Engine.
type Config struct {
	// Round is the round length in seconds (default DefaultRound).
	Round float64
	// NoFills turns off mid-round fills (Gavel's simulator acts only at
	// round boundaries).
	NoFills bool
	// Speed is the model the schedulers plan with; its Profile should be
	// an *Estimates for the engine to learn throughputs into it. It gives
	// each job's per-type throughput and checks that a placement runs.
	Speed speed.Model
	// Overrun is the fraction of its declared steps a job that ran past
	// them is assumed still to need (default DefaultOverrun): the engine
	// never shows a scheduler an active job with nothing left.
	Overrun float64
	// MinRunTime is the least time in seconds a job runs on its GPUs
	// before a decision may take any of them (stop, move, unfork); a job's
	// own MinRunTime overrides it. 0: none. The engine holds to it
	// whatever the scheduler answers, so the simulator and the sidecar
	// agree.
	MinRunTime float64
	// MaxMinRunTime caps a job's own MinRunTime in seconds (0: no cap):
	// its author sets it, the operator bounds it, or one job could opt
	// out of every preemption but reclaim by asking for a month. Applied
	// at Admit and Restore, so what the schedulers see and the snapshot
	// keeps is the capped value.
	MaxMinRunTime float64
	// StallAfter is how long in seconds a running job may report no step,
	// from its placement or its last step, before its state says it
	// stalled (default DefaultStallAfter). A stall is a fact about that
	// job (a hang, a deadlock, a broken node) shown to the operator; it is
	// never learned as its model's speed.
	StallAfter float64
	// StartsReported says the caller calls Started when every worker a
	// decision added runs (the sidecar; the simulator starts a placement
	// at its decision). A job stopped or moved before then, or before its
	// first step after it, says so in its reason: it was stopped before
	// it started, or before it trained.
	StartsReported bool
}

// Engine is the round engine. Build one with New; feed it what happens
// (Admit, Progress, Complete, Fail, Interrupt, SetNode, Drain, RemoveNode)
// and ask it to Plan.
type Engine struct {
	cfg   Config
	sched round.Scheduler
	est   *Estimates

	nodes   []planner.Node
	drained map[string]bool
	// held are GPUs of the cluster in use by work the engine does not
	// plan (a person's jobs): never offered, but still capacity.
	held  map[string]map[planner.GPUType]int
	epoch uint64
	// Derived from nodes and drained by refresh.
	cluster  planner.Cluster // schedulable nodes only
	types    []planner.GPUType
	capacity []float64
	widest   map[planner.GPUType]int

	jobs []*job // arrival (admission) order
	byID map[string]*job

	now   float64
	dirty bool
	// tputGen is the (epoch, estimates generation) the jobs' throughputs
	// were computed for.
	tputEpoch, tputGen uint64
}

type job struct {
	view round.JobView
	rem  float64 // declared steps minus steps done (may go <= 0)
	done float64
	// placedAt is when the current placement started (learning skips a
	// warm-up after it); since is when the job last started or stopped.
	placedAt float64
	// lastAt/lastDone: the previous progress report while running on the
	// current placement (learning); lastAt < 0 when none.
	lastAt, lastDone float64
	// reportedAt is when Progress last accepted a report (0: none);
	// trustedDone and trustedAt the last report taken as written, or the
	// job's admission (the bound on reports grows from there).
	reportedAt             float64
	trustedDone, trustedAt float64
	// progressAt is when the job last made a step (0: never);
	// trainedAt when it made its first step on its current placement,
	// -1 while it has made none there (a decision's placement resets it;
	// Started does not: a step seen before the sidecar saw every worker
	// running still counts).
	progressAt, trainedAt float64
	// setup: the current placement's new workers do not all run yet (a
	// decision placed them, Started has not been called since); only with
	// Config.StartsReported.
	setup        bool
	reason       round.Reason
	waitingSince float64
	// ineligible says why the job can run nowhere, when its eligibility
	// (SetEligible) allows no node.
	ineligible string
	// eligible is what SetEligible set (nil: everywhere); view.Eligible
	// is it less the types the job stalled on, so that neither the
	// sidecar's rules nor the engine's exclusion overwrites the other.
	eligible round.Eligible
	// stalledOn holds the GPU types the job's own ledger showed a stall
	// on (MinEvidence seconds running there past its warm-up without a
	// step) and when that was seen. The job is not planned there again
	// for its life: the schedulers price a type through the model's
	// estimates, which one job's stall may not move while other jobs of
	// its model run, and a retry costs a restart and MinEvidence of
	// nothing each time (a rerun is a new job and starts fresh).
	stalledOn map[planner.GPUType]float64
	// stallNote says, for its reasons, where its stalls keep it off.
	stallNote string
	// deferUntil keeps a waiting job out of plans until then (Defer);
	// deferWhy says why.
	deferUntil float64
	deferWhy   string
	// firmBest is the job's fastest throughput over the types whose
	// estimate is firm (a figure or a measurement): what its progress
	// reports are bounded by (0: none firm, reports are not bounded).
	firmBest float64
}

// New returns an engine at time 0 with an empty cluster.
func New(cfg Config, sched round.Scheduler) (*Engine, error) {
	if sched == nil {
		return nil, fmt.Errorf("engine: no scheduler")
	}
	if cfg.Speed.Profile == nil {
		return nil, fmt.Errorf("engine: the speed model has no throughput profile")
	}
	if cfg.Round == 0 {
		cfg.Round = DefaultRound
	}
	if !(cfg.Round > 0) || math.IsInf(cfg.Round, 0) {
		return nil, fmt.Errorf("engine: round %v s: want a positive number of seconds", cfg.Round)
	}
	if cfg.Overrun == 0 {
		cfg.Overrun = DefaultOverrun
	}
	if cfg.StallAfter == 0 {
		cfg.StallAfter = DefaultStallAfter
	}
	if !(cfg.StallAfter > 0) || math.IsInf(cfg.StallAfter, 0) {
		return nil, fmt.Errorf("engine: stall after %v s: want a positive number of seconds", cfg.StallAfter)
	}
	if !(cfg.Overrun > 0) || cfg.Overrun > 1 {
		return nil, fmt.Errorf("engine: overrun %v: want a fraction in (0, 1]", cfg.Overrun)
	}
	if !(cfg.MinRunTime >= 0) || math.IsInf(cfg.MinRunTime, 0) {
		return nil, fmt.Errorf("engine: min run time %v s: want seconds >= 0", cfg.MinRunTime)
	}
	if !(cfg.MaxMinRunTime >= 0) || math.IsInf(cfg.MaxMinRunTime, 0) {
		return nil, fmt.Errorf("engine: max min run time %v s: want seconds >= 0 (0: no cap)", cfg.MaxMinRunTime)
	}
	e := &Engine{cfg: cfg, sched: sched, drained: map[string]bool{}, byID: map[string]*job{}}
	e.est, _ = cfg.Speed.Profile.(*Estimates)
	e.refresh()
	return e, nil
}

// Scheduler is the scheduler the engine runs.
func (e *Engine) Scheduler() round.Scheduler { return e.sched }

// Round is the round length in seconds.
func (e *Engine) Round() float64 { return e.cfg.Round }

// Now is the time of the latest call.
func (e *Engine) Now() float64 { return e.now }

// Estimates is the estimator the engine learns into (nil when the speed
// model's profile is not one).
func (e *Engine) Estimates() *Estimates { return e.est }

// Cluster returns the schedulable cluster (drained nodes left out).
func (e *Engine) Cluster() planner.Cluster { return cloneCluster(e.cluster) }

// Nodes returns every node the engine knows (drained ones too) and which
// are drained.
func (e *Engine) Nodes() ([]planner.Node, map[string]bool) {
	ns := make([]planner.Node, len(e.nodes))
	for i, n := range e.nodes {
		ns[i] = cloneNode(n)
	}
	d := make(map[string]bool, len(e.drained))
	for k, v := range e.drained {
		d[k] = v
	}
	return ns, d
}

// Types are the GPU types of the schedulable cluster, sorted.
func (e *Engine) Types() []planner.GPUType { return slices.Clone(e.types) }

// Active is the number of active jobs.
func (e *Engine) Active() int { return len(e.jobs) }

// advance moves the clock to now, charging the time since the previous
// call to the running jobs' received time per type.
func (e *Engine) advance(now float64) error {
	if math.IsNaN(now) || math.IsInf(now, 0) {
		return fmt.Errorf("engine: time %v: want a finite number of seconds", now)
	}
	if now < e.now {
		return fmt.Errorf("engine: time %.3f s is before the engine's clock %.3f s: times must not go backwards", now, e.now)
	}
	dt := now - e.now
	if dt > 0 {
		idx := e.typeIndex()
		for _, j := range e.jobs {
			if !j.view.Running {
				continue
			}
			units := float64(len(j.view.Placement.Units))
			for _, u := range j.view.Placement.Units {
				g := float64(u.GPUs())
				for _, sl := range u.Slots {
					if k, ok := idx[sl.Type]; ok {
						j.view.Received[k] += dt * float64(sl.Count) / g / units
					}
				}
			}
		}
	}
	e.now = now
	return nil
}

func (e *Engine) typeIndex() map[planner.GPUType]int {
	m := make(map[planner.GPUType]int, len(e.types))
	for k, t := range e.types {
		m[t] = k
	}
	return m
}

// Admit adds a job at time now (its Arrival is when it was submitted,
// now or earlier). Its TotalSteps are the declared steps. A job that no
// GPU type of the cluster can run is admitted and waits, with that
// reason, until capacity it can use joins.
func (e *Engine) Admit(jb planner.Job, now float64) error {
	if err := e.advance(now); err != nil {
		return err
	}
	if err := jb.Validate(); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if jb.Arrival > now+1e-9 {
		return fmt.Errorf("engine: job %s arrives at %.0f s, after now (%.0f s): admit it when it arrives", jb.ID, jb.Arrival, now)
	}
	if _, ok := e.byID[jb.ID]; ok {
		return fmt.Errorf("engine: job %s is already active", jb.ID)
	}
	jb.MinRunTime = e.capMinRunTime(jb.MinRunTime)
	j := &job{view: round.JobView{Job: jb, Remaining: jb.TotalSteps, Received: make([]float64, len(e.types))}, rem: jb.TotalSteps, lastAt: -1, waitingSince: now, trustedAt: now}
	if err := e.throughputs(j); err != nil {
		return err
	}
	e.jobs = append(e.jobs, j)
	e.byID[jb.ID] = j
	e.dirty = true
	return nil
}

// Runnable reports whether jb can run on some GPU type of the cluster now.
func (e *Engine) Runnable(jb planner.Job) (bool, error) {
	j := &job{view: round.JobView{Job: jb}}
	if err := e.throughputs(j); err != nil {
		return false, err
	}
	for k, v := range j.view.Throughput {
		if planner.Runnable(v, jb.ScaleFactor, e.capacity[k]) {
			return true, nil
		}
	}
	return false, nil
}

// throughputs sets the job's estimated throughput on each type: with all
// workers on one type, spread when the job is wider than any schedulable
// server of the type (the speed it will actually get).
func (e *Engine) throughputs(j *job) error {
	tp := make([]float64, len(e.types))
	j.firmBest = 0
	for k, t := range e.types {
		spread := !e.cfg.Speed.IgnoreSpread && j.view.ScaleFactor > e.widest[t]
		v, err := e.cfg.Speed.Profile.Throughput(j.view.Model, j.view.ScaleFactor, t, spread)
		if err != nil {
			return fmt.Errorf("engine: job %s: %w", j.view.ID, err)
		}
		if !j.eligible.AnyOf(t) {
			v = 0 // no node may run it on this type
		}
		tp[k] = v
		if v > 0 && e.firmAt(j, j.view.ScaleFactor, t) {
			j.firmBest = max(j.firmBest, v)
		}
	}
	e.excludeStalled(j, tp)
	j.view.Throughput = tp
	j.view.WidthThroughput = nil
	if len(j.view.Widths) > 0 {
		j.view.WidthThroughput = make([][]float64, len(j.view.Widths))
		for wi, w := range j.view.Widths {
			row := make([]float64, len(e.types))
			for k, t := range e.types {
				if w == j.view.ScaleFactor {
					row[k] = tp[k]
					continue
				}
				if !j.eligible.AnyOf(t) || !j.view.Eligible.AnyOf(t) {
					continue
				}
				spread := !e.cfg.Speed.IgnoreSpread && w > e.widest[t]
				v, err := e.cfg.Speed.Profile.Throughput(j.view.Model, w, t, spread)
				if err != nil || !(v > 0) {
					continue // not profiled at this width: not a width it runs at here
				}
				row[k] = v // the job's steps at any width (planner/speed, "Elastic jobs")
				if e.firmAt(j, w, t) {
					// A wider job reports faster: its bound is its widest speed.
					j.firmBest = max(j.firmBest, v)
				}
			}
			j.view.WidthThroughput[wi] = row
		}
	}
	return nil
}

// firmAt is whether the job's estimate at width w on type t is firm (a
// figure or a measurement; every figure is, without learning).
func (e *Engine) firmAt(j *job, w int, t planner.GPUType) bool {
	if e.est == nil {
		return true
	}
	ke, err := e.est.Estimate(j.view.Model, w, t)
	return err == nil && ke.firm()
}

// excludeStalled sets the job's effective eligibility: the sidecar's,
// less the types it stalled on (their throughput in tp set to 0). When
// it stalled on every type it could run on, the fastest of them stays
// (a job that hangs everywhere still runs somewhere; its stall is
// shown), and the note says so.
func (e *Engine) excludeStalled(j *job, tp []float64) {
	j.view.Eligible, j.stallNote = j.eligible, ""
	if len(j.stalledOn) == 0 {
		return
	}
	keep := -1
	for k, t := range e.types {
		if _, s := j.stalledOn[t]; tp[k] > 0 && !s {
			keep = -2 // a type it did not stall on: exclude every stall
			break
		}
		if tp[k] > 0 && (keep < 0 || tp[k] > tp[keep]) {
			keep = k
		}
	}
	excluded := map[planner.GPUType]bool{}
	var off []string
	for k, t := range e.types {
		if _, s := j.stalledOn[t]; s && k != keep {
			excluded[t] = true
			off = append(off, string(t))
			tp[k] = 0
		}
	}
	var notes []string
	if len(off) > 0 {
		notes = append(notes, fmt.Sprintf("stalled on %s: not planned there", strings.Join(off, ", ")))
	}
	if keep >= 0 {
		notes = append(notes, fmt.Sprintf("stalled on %s too, the last type it can run on: still planned there", e.types[keep]))
	}
	j.stallNote = strings.Join(notes, "; ")
	if len(excluded) == 0 {
		return
	}
	el := round.Eligible{}
	for _, n := range e.nodes {
		for t, c := range n.GPUs {
			if c > 0 && !excluded[t] && j.eligible.Allows(n.ID, t) {
				if el[n.ID] == nil {
					el[n.ID] = map[planner.GPUType]bool{}
				}
				el[n.ID][t] = true
			}
		}
	}
	j.view.Eligible = el
}

// noteStalls records, for every active job, the types of the cluster its
// own ledgers (at any width up to its own, for HadarE's copies) show a
// stall on since it was submitted; it reports whether any is new.
func (e *Engine) noteStalls() bool {
	if e.est == nil || !e.est.learn.On {
		return false
	}
	added := false
	for _, j := range e.jobs {
		for _, t := range e.types {
			if _, ok := j.stalledOn[t]; ok {
				continue
			}
			for w := 1; w <= j.view.ScaleFactor; w++ {
				if e.est.stalledSince(estKey{j.view.Model, w, t}, j.view.ID, j.view.Arrival) {
					if j.stalledOn == nil {
						j.stalledOn = map[planner.GPUType]float64{}
					}
					j.stalledOn[t] = e.now
					added = true
					break
				}
			}
		}
	}
	return added
}

// explore lets the estimates decide which uncertain keys to try, for the
// active jobs, before a plan (Estimates.Explore).
func (e *Engine) explore() {
	if e.est == nil {
		return
	}
	e.est.prune(e.now)
	e.est.setLive(e.liveByModel())
	e.est.Refresh()
	jobs := make([]ExploreJob, 0, len(e.jobs))
	for _, j := range e.jobs {
		ts := make([]planner.GPUType, 0, len(e.types))
		for _, t := range e.types {
			if j.view.Eligible.AnyOf(t) {
				ts = append(ts, t)
			}
		}
		jobs = append(jobs, ExploreJob{Model: j.view.Model, SF: j.view.ScaleFactor, Remaining: max(j.rem, e.cfg.Overrun*j.view.TotalSteps), Types: ts})
	}
	// A trial lasts at least until the next boundary, and until the key
	// holds the evidence that replaces the estimate.
	l := e.est.learn
	e.est.Explore(jobs, max(e.cfg.Round, l.Warmup+l.FirstEvidence))
}

// liveByModel lists the active jobs per model key.
func (e *Engine) liveByModel() map[string][]string {
	out := map[string][]string{}
	for _, j := range e.jobs {
		out[j.view.Model] = append(out[j.view.Model], j.view.ID)
	}
	return out
}

// estimateNotes says, for a job's decision, which GPU types it is tried on
// without a measurement and which it has no estimate on ("" when none).
func (e *Engine) estimateNotes(j *job, p planner.Placement) string {
	if e.est == nil {
		return ""
	}
	var notes []string
	tried := map[estKey]bool{}
	for _, u := range p.Units {
		for _, t := range u.Types() {
			k := estKey{j.view.Model, u.GPUs(), t}
			if _, ok := e.est.explore[k]; ok && !tried[k] {
				tried[k] = true
				ke := e.est.tableEstimate(k)
				what := "nothing is known of the type"
				if ke.source != estimate.NoData {
					what = fmt.Sprintf("estimated %.3g steps/s, typically %.0f %% off (%s)", ke.value, 100*(math.Exp(ke.sigma)-1), ke.source)
				}
				notes = append(notes, fmt.Sprintf("trying %s: %s x%d has no measurement there (%s)", t, j.view.Model, u.GPUs(), what))
			}
		}
	}
	for k, t := range e.types {
		if k < len(j.view.Throughput) && j.view.Throughput[k] > 0 {
			if why := e.est.gap(j.view.Model, t); why != "" {
				if _, ok := e.est.explore[estKey{j.view.Model, j.view.ScaleFactor, t}]; !ok {
					notes = append(notes, why)
				}
			}
		}
	}
	return strings.Join(notes, "; ")
}

func (e *Engine) job(id string) (*job, error) {
	j := e.byID[id]
	if j == nil {
		return nil, fmt.Errorf("engine: no active job %q", id)
	}
	return j, nil
}

// Progress reports that job id has done `done` steps in all (as measured:
// from its progress file, or the simulator's truth). Progress may go back
// when a job restarts from an older checkpoint.
//
// The count comes from the job's own progress file, so it is not trusted:
// it is capped at the job's declared steps; it may go back only when the
// job stopped or (re)started since the last report (back to its
// checkpoint), else the report is ignored; and it may not grow faster than MaxFactor
// twice over the job's fastest estimated speed (per unit, for a forked job)
// allows since the last report, else it is cut to that. A report changed or
// ignored returns an error wrapping ErrImplausible after taking what it
// could.
func (e *Engine) Progress(id string, done, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if math.IsNaN(done) || math.IsInf(done, 0) || done < 0 {
		return fmt.Errorf("engine: job %s: steps done %v: want a finite number >= 0", id, done)
	}
	// Past its declared steps a job is shown as needing Overrun more
	// (JobState.Remaining): the count beyond them changes nothing.
	done = min(done, j.view.TotalSteps)
	restarted := !j.view.Running || j.placedAt >= j.reportedAt
	if done < j.done && !restarted {
		if err := e.advance(now); err != nil {
			return err
		}
		return fmt.Errorf("engine: job %s: %w: steps done went back from %.0f to %.0f without a restart: ignored", id, ErrImplausible, j.done, done)
	}
	var why string
	if limit, ok := e.progressLimit(j, now); ok && done > limit {
		why = fmt.Sprintf("%.0f steps done is more than its fastest speed allows since the last report: counted as %.0f", done, limit)
		done = limit
	}
	if err := e.addProgress(j, done-j.done, done, now); err != nil {
		return err
	}
	j.reportedAt = now
	if why == "" {
		// A cut report does not move the anchor: the bound keeps growing
		// with time, so a job that really is that far catches up.
		j.trustedDone, j.trustedAt = done, now
	}
	if why != "" {
		return fmt.Errorf("engine: job %s: %w: %s", id, ErrImplausible, why)
	}
	return nil
}

// ErrImplausible marks a progress report the engine did not take as is.
var ErrImplausible = errors.New("implausible progress report")

// progressGrace is added to the time a report's bound allows: clocks of
// the job's node and the sidecar differ, and a first report may come
// right after a start.
const progressGrace = 60.0

// progressLimit is the most steps done a report at now may claim: the
// steps of the last report taken as written (or 0 at admission) plus
// MaxFactor twice the job's fastest estimated rate (at any of its widths,
// for an elastic job; per unit, for a forked job) over the time since it,
// and progressGrace. Only firm estimates (a
// figure or a measurement) count; ok is false when the job has none to
// bound it by (a model no one measured: its own reports are all there is).
func (e *Engine) progressLimit(j *job, now float64) (float64, bool) {
	// Only a firm estimate bounds a report (a guess may be far off); an
	// elastic job's is its fastest over every width it may run at.
	best := j.firmBest
	if !(best > 0) {
		// No estimate to go by: still no step of any GPU is that fast,
		// and a report claiming all steps at once is not a speed.
		widest := j.view.ScaleFactor
		if n := len(j.view.Widths); n > 0 {
			widest = j.view.Widths[n-1] // ascending, the scale factor among them
		}
		best = MaxRatePerGPU * float64(max(1, widest)) / (2 * MaxFactor)
	}
	units := max(1, len(j.view.Placement.Units))
	return j.trustedDone + 2*MaxFactor*best*float64(units)*(max(0, now-j.trustedAt)+progressGrace), true
}

// AddProgress reports that job id made `steps` more steps (negative: it
// lost them, restarting from a checkpoint). The simulator reports this
// way so the arithmetic is the one it always did.
func (e *Engine) AddProgress(id string, steps, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if math.IsNaN(steps) || math.IsInf(steps, 0) {
		return fmt.Errorf("engine: job %s: steps %v: want a finite number", id, steps)
	}
	return e.addProgress(j, steps, j.done+steps, now)
}

func (e *Engine) addProgress(j *job, steps, done, now float64) error {
	if err := e.advance(now); err != nil {
		return err
	}
	j.rem -= steps
	j.done = done
	if steps > 0 {
		if j.trainedAt < 0 {
			j.trainedAt = now
		}
		j.progressAt = now
	}
	e.learn(j, now)
	return nil
}

// learn feeds the estimator with the job's progress since its previous
// report, when it ran on the same GPUs throughout and past its warm-up:
// every placement, through the speed model. Each unit's share of the steps
// is its share of the job's estimated speed; it counts for the key of its
// width and of the type its speed rests on (the slowest of a mixed unit),
// with the exposure the speed model gives a consolidated figure of 1
// steps/s there (spread, network, mixed-type slowdowns).
func (e *Engine) learn(j *job, now float64) {
	if e.est == nil || !e.est.learn.On || !j.view.Running {
		return
	}
	defer func() { j.lastAt, j.lastDone = now, j.done }()
	if j.lastAt < 0 || j.lastAt < j.placedAt+e.est.learn.Warmup || now <= j.lastAt {
		return
	}
	type part struct {
		k          estKey
		rate, cons float64
	}
	units := j.view.Placement.Units
	parts := make([]part, 0, len(units))
	total := 0.0
	for _, u := range units {
		r, err := e.cfg.Speed.UnitRate(j.view.Job, u, now)
		if err != nil || !(r > 0) {
			return
		}
		w := u.GPUs()
		spread := u.Nodes() > 1 && !e.cfg.Speed.IgnoreSpread && e.cfg.Speed.Network == nil
		var slow planner.GPUType
		best, cons := math.Inf(1), 0.0
		for _, t := range u.Types() {
			v, err := e.est.Throughput(j.view.Model, w, t, spread)
			if err != nil {
				return
			}
			if v < best {
				best, slow = v, t
				if cons, err = e.est.Throughput(j.view.Model, w, t, false); err != nil {
					return
				}
			}
		}
		if !(cons > 0) {
			return
		}
		parts = append(parts, part{estKey{j.view.Model, w, slow}, r, cons})
		total += r
	}
	dt := now - j.lastAt
	steps := j.done - j.lastDone
	for _, p := range parts {
		e.est.observe(p.k, j.view.ID, steps*p.rate/total, p.rate/p.cons*dt, dt, now)
	}
}

// Started records that every worker of job id's current placement runs
// at now (the sidecar saw all its allocations running): its minimum run
// time, the learning warm-up and the stall clock count from here, not
// from the decision. Task setup (an exec chroot, an image pull, a
// worker still waiting for its GPUs' previous holder) is not run time:
// a job preempted before it ever ran loses a round and makes nothing.
// A job not running changes nothing.
func (e *Engine) Started(id string, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if err := e.advance(now); err != nil {
		return err
	}
	if j.view.Running {
		j.placedAt, j.lastAt = now, -1
		j.setup = false
	}
	return nil
}

// Adopt records that job id runs on p, as observed outside a decision: a
// restarted sidecar that finds the job running in Nomad. The placement must
// be valid for the job and its GPUs free of every other running job.
func (e *Engine) Adopt(id string, p planner.Placement, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if err := ValidPlacement(j.view.Job, p); err != nil {
		return fmt.Errorf("engine: adopt: %w", err)
	}
	if len(p.Units) == 0 {
		return fmt.Errorf("engine: adopt job %s: an empty placement (use Interrupt for a job that does not run)", id)
	}
	all := round.NewPool(planner.Cluster{Nodes: e.nodes})
	for _, o := range e.jobs {
		if o != j && o.view.Running {
			takeKnown(all, o.view.Placement)
		}
	}
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			if !all.Has(sl.Node) {
				return fmt.Errorf("engine: adopt job %s: node %s is not in the cluster", id, sl.Node)
			}
		}
		if !all.Fits(u) {
			return fmt.Errorf("engine: adopt job %s: GPUs %v are held by another job or do not exist", id, u.Slots)
		}
		all.Take(u)
	}
	if err := e.advance(now); err != nil {
		return err
	}
	j.view.Placement, j.view.Running = clonePlacement(p), true
	// Found running: it trained there before, as far as anyone knows.
	j.placedAt, j.lastAt, j.trainedAt = now, -1, now
	j.setup = false
	return nil
}

// Defer keeps waiting job id out of plans until the time until: the
// caller could not carry out its placement (Nomad refused it, a gang was
// rolled back) and backs off before proposing it again. It waits meanwhile,
// with why as its reason; a running job is not affected until it stops.
func (e *Engine) Defer(id string, until float64, why string, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if math.IsNaN(until) || math.IsInf(until, 0) {
		return fmt.Errorf("engine: defer job %s until %v: want a finite time", id, until)
	}
	if err := e.advance(now); err != nil {
		return err
	}
	j.deferUntil, j.deferWhy = until, why
	return nil
}

// Complete removes job id: it finished.
func (e *Engine) Complete(id string, now float64) error { return e.remove(id, now) }

// Fail removes job id: it failed for good.
func (e *Engine) Fail(id string, now float64) error { return e.remove(id, now) }

func (e *Engine) remove(id string, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if err := e.advance(now); err != nil {
		return err
	}
	delete(e.byID, id)
	e.jobs = slices.DeleteFunc(e.jobs, func(x *job) bool { return x == j })
	e.dirty = true
	return nil
}

// Interrupt records that job id stopped running outside a decision (its
// node was lost, its allocation died): it waits until a plan places it.
func (e *Engine) Interrupt(id string, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if err := e.advance(now); err != nil {
		return err
	}
	e.stopped(j, now)
	e.dirty = true
	return nil
}

func (e *Engine) stopped(j *job, now float64) {
	if j.view.Running {
		j.waitingSince = now
	}
	j.view.Running = false
	j.view.Placement = planner.Placement{}
	j.lastAt = -1
	j.setup = false
}

// SetNode adds node n or replaces the node of the same ID (a GPU lost or
// added). Jobs with a unit on it that no longer fits are interrupted; their
// IDs are returned.
func (e *Engine) SetNode(n planner.Node, now float64) ([]string, error) {
	hit, err := e.setNode(n, now)
	if err == nil {
		e.changed()
	}
	return hit, err
}

func (e *Engine) setNode(n planner.Node, now float64) ([]string, error) {
	if n.ID == "" {
		return nil, fmt.Errorf("engine: a node with an empty ID")
	}
	for t, k := range n.GPUs {
		if k < 0 || t == "" {
			return nil, fmt.Errorf("engine: node %s: %d GPUs of type %q: want a named type and a count >= 0", n.ID, k, t)
		}
	}
	if err := e.advance(now); err != nil {
		return nil, err
	}
	n = cloneNode(n)
	i := slices.IndexFunc(e.nodes, func(x planner.Node) bool { return x.ID == n.ID })
	if i < 0 {
		e.nodes = append(e.nodes, n)
	} else {
		e.nodes[i] = n
	}
	// Interrupt the jobs that used more GPUs of a type than the node has
	// now, last admitted first, until the rest fit.
	var hit []string
	used := map[planner.GPUType]int{}
	for _, j := range e.jobs {
		for _, u := range j.view.Placement.Units {
			for _, sl := range u.Slots {
				if sl.Node == n.ID {
					used[sl.Type] += sl.Count
				}
			}
		}
	}
	for q := len(e.jobs) - 1; q >= 0; q-- {
		j := e.jobs[q]
		over := false
		for _, u := range j.view.Placement.Units {
			for _, sl := range u.Slots {
				over = over || (sl.Node == n.ID && used[sl.Type] > n.GPUs[sl.Type])
			}
		}
		if !over {
			continue
		}
		for _, u := range j.view.Placement.Units {
			for _, sl := range u.Slots {
				if sl.Node == n.ID {
					used[sl.Type] -= sl.Count
				}
			}
		}
		e.stopped(j, now)
		hit = append(hit, j.view.ID)
	}
	return hit, nil
}

// SetNodes adds or replaces several nodes at once (one cluster change),
// as SetNode does for each.
func (e *Engine) SetNodes(ns []planner.Node, now float64) ([]string, error) {
	var hit []string
	for _, n := range ns {
		h, err := e.setNode(n, now)
		if err != nil {
			return hit, err
		}
		hit = append(hit, h...)
	}
	e.changed()
	return hit, nil
}

// SetHeld records the GPUs, per node and type, that work the engine does
// not plan holds (jobs hadar does not manage): plans never offer them, but
// they stay the cluster's capacity (that work ends; a rack that holds a
// job when it does is still worth waiting for). It replaces the previous
// holdings; a change makes a fill due.
func (e *Engine) SetHeld(held map[string]map[planner.GPUType]int, now float64) error {
	if err := e.advance(now); err != nil {
		return err
	}
	next := map[string]map[planner.GPUType]int{}
	for n, m := range held {
		for t, k := range m {
			if k < 0 {
				return fmt.Errorf("engine: %d held GPUs of type %s on node %s: want >= 0", k, t, n)
			}
			if k > 0 {
				if next[n] == nil {
					next[n] = map[planner.GPUType]int{}
				}
				next[n][t] = k
			}
		}
	}
	if !sameHeld(e.held, next) {
		e.held = next
		e.dirty = true
	}
	return nil
}

func sameHeld(a, b map[string]map[planner.GPUType]int) bool {
	if len(a) != len(b) {
		return false
	}
	for n, m := range a {
		if len(m) != len(b[n]) {
			return false
		}
		for t, k := range m {
			if b[n][t] != k {
				return false
			}
		}
	}
	return true
}

// SetEligible restricts job id to some GPU types of some nodes (nil: it may
// run anywhere): what Nomad's own placement rules allow it (node pools,
// constraints, resources, device models), as the caller evaluated them.
// why says, for a job no node can run, what excludes them all; it is the
// job's reason while it waits. A running job on GPUs it may no longer use
// moves at the next round boundary. A change makes a fill due. The types
// the job's own stalls keep it off stay excluded whatever el allows.
func (e *Engine) SetEligible(id string, el round.Eligible, why string, now float64) error {
	j, err := e.job(id)
	if err != nil {
		return err
	}
	if err := e.advance(now); err != nil {
		return err
	}
	if el != nil {
		el = cloneEligible(el)
	}
	if maps.EqualFunc(j.eligible, el, maps.Equal) && (j.eligible == nil) == (el == nil) && j.ineligible == why {
		return nil
	}
	j.eligible, j.ineligible = el, why
	e.dirty = true
	return e.throughputs(j)
}

func cloneEligible(el round.Eligible) round.Eligible {
	out := make(round.Eligible, len(el))
	for n, ts := range el {
		c := make(map[planner.GPUType]bool, len(ts))
		for t, ok := range ts {
			if ok {
				c[t] = true
			}
		}
		if len(c) > 0 {
			out[n] = c
		}
	}
	return out
}

// Drain marks node id as draining (on: no new placements; its running
// jobs move at the next round boundary) or schedulable again.
func (e *Engine) Drain(id string, on bool, now float64) error {
	if !slices.ContainsFunc(e.nodes, func(x planner.Node) bool { return x.ID == id }) {
		return fmt.Errorf("engine: no node %q", id)
	}
	if err := e.advance(now); err != nil {
		return err
	}
	if e.drained[id] == on {
		return nil
	}
	if on {
		e.drained[id] = true
	} else {
		delete(e.drained, id)
	}
	e.changed()
	return nil
}

// RemoveNode removes node id (it left or was lost, with the work running
// on it): every job with a unit on it is interrupted, and their IDs are
// returned. The caller reports where their progress went back to (their
// last checkpoint).
func (e *Engine) RemoveNode(id string, now float64) ([]string, error) {
	i := slices.IndexFunc(e.nodes, func(x planner.Node) bool { return x.ID == id })
	if i < 0 {
		return nil, fmt.Errorf("engine: no node %q", id)
	}
	if err := e.advance(now); err != nil {
		return nil, err
	}
	var hit []string
	for _, j := range e.jobs {
		if onNode(j.view.Placement, id) {
			e.stopped(j, now)
			hit = append(hit, j.view.ID)
		}
	}
	e.nodes = slices.Delete(e.nodes, i, i+1)
	delete(e.drained, id)
	e.changed()
	return hit, nil
}

func onNode(p planner.Placement, node string) bool {
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			if sl.Node == node {
				return true
			}
		}
	}
	return false
}

// changed records a cluster change: new epoch, derived figures rebuilt,
// and a fill due.
func (e *Engine) changed() {
	e.epoch++
	e.dirty = true
	e.refresh()
}

// refresh rebuilds the schedulable cluster, its types, capacities and
// widest servers, and re-indexes the jobs' per-type figures when the types
// changed.
func (e *Engine) refresh() {
	old := e.types
	e.cluster = planner.Cluster{}
	for _, n := range e.nodes {
		if !e.drained[n.ID] {
			e.cluster.Nodes = append(e.cluster.Nodes, n)
		}
	}
	e.types = e.cluster.Types()
	e.capacity = make([]float64, len(e.types))
	for k, t := range e.types {
		e.capacity[k] = float64(e.cluster.Capacity(t))
	}
	e.widest = map[planner.GPUType]int{}
	for _, n := range e.cluster.Nodes {
		for t, k := range n.GPUs {
			e.widest[t] = max(e.widest[t], k)
		}
	}
	if !slices.Equal(old, e.types) {
		for _, j := range e.jobs {
			j.view.Received = reindex(j.view.Received, old, e.types)
		}
	}
}

// reindex maps per-type figures from types old to types new; a type that
// left takes its figures with it, one that joined starts at 0.
func reindex(xs []float64, old, new []planner.GPUType) []float64 {
	out := make([]float64, len(new))
	for k, t := range new {
		if i := slices.Index(old, t); i >= 0 && i < len(xs) {
			out[k] = xs[i]
		}
	}
	return out
}

// Plan asks the scheduler for a decision at time now. A Boundary plan may
// re-place every job; a Fill places waiting jobs on idle GPUs and does
// nothing (Kind None) when fills are off, no job arrived, completed or
// stopped and no capacity changed since the last plan, or no job is
// active. The decision is applied to the engine's state before Plan
// returns: the caller carries it out and reports what happens next. On an
// error (a cancelled context, a scheduler error, an invalid placement) the
// engine's state is unchanged.
func (e *Engine) Plan(ctx context.Context, now float64, kind Kind) (Decision, error) {
	if kind != Boundary && kind != Fill {
		return Decision{}, fmt.Errorf("engine: plan kind %q: want %q or %q", kind, Boundary, Fill)
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	if err := e.advance(now); err != nil {
		return Decision{}, err
	}
	if kind == Fill && (e.cfg.NoFills || !e.dirty || len(e.jobs) == 0) {
		return Decision{Time: now, Kind: None}, nil
	}
	e.explore()
	if e.noteStalls() {
		// A job's own stall changes its eligibility, not the estimates.
		e.tputGen = math.MaxUint64
	}
	if err := e.refreshThroughputs(); err != nil {
		return Decision{}, err
	}
	mid := kind == Fill
	pool := e.pool(mid)
	// Deferred waiting jobs sit this plan out.
	planned := make([]*job, 0, len(e.jobs))
	for _, j := range e.jobs {
		if j.view.Running || j.deferUntil <= now {
			planned = append(planned, j)
		}
	}
	v := &round.View{Now: now, Round: e.cfg.Round, MidRound: mid, Types: e.types, Capacity: e.capacity,
		Cluster: e.cluster, Pool: pool.Clone(), Epoch: e.epoch, Reasons: make([]round.Reason, len(planned))}
	v.Jobs = make([]*round.JobView, len(planned))
	for i, j := range planned {
		j.view.Remaining = j.rem
		j.view.Hold = e.minRunTime(j)
		// A job on GPUs it may no longer use (its rules changed, or it
		// stalled there) is not held there by its minimum run time.
		j.view.Pinned = !mid && j.view.Running && len(j.view.Placement.Units) > 0 && e.ran(j, now) < j.view.Hold-1e-6 &&
			!slices.ContainsFunc(j.view.Placement.Units, func(u planner.Unit) bool { return !j.view.Eligible.AllowsUnit(u) })
		if !(j.rem > 0) {
			j.view.Remaining = e.cfg.Overrun * j.view.TotalSteps
		}
		v.Jobs[i] = &j.view
	}
	ps, err := e.sched.Schedule(v)
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	var repairs []Repair
	if err == nil && len(ps) != len(v.Jobs) {
		err = fmt.Errorf("returned %d placements for %d jobs", len(ps), len(v.Jobs))
	}
	if err != nil {
		// One failing solve must not stall every job: running jobs keep
		// their GPUs and waiting ones are placed first come, first served
		// on what is free, until the scheduler plans again.
		why := fmt.Sprintf("scheduler %s failed (%v): fell back to keeping running jobs and placing waiting ones first come, first served", e.sched.Name(), err)
		ps = e.fallback(v, pool)
		repairs = append(repairs, Repair{Why: why})
		for i := range v.Reasons {
			v.Reasons[i] = round.Reason{Why: why}
		}
	}
	repairs = append(repairs, e.repair(v, pool, ps)...)
	d := e.apply(v, planned, ps, kind)
	d.Repairs = repairs
	e.dirty = false
	return d, nil
}

// fallback keeps every running job where it is (at a boundary, where its
// GPUs are still offered) and places waiting jobs in arrival order, each on
// the free type it runs fastest on, packed (round.Pool.Pack).
func (e *Engine) fallback(v *round.View, offered *round.Pool) []planner.Placement {
	free := offered.Clone()
	ps := make([]planner.Placement, len(v.Jobs))
	for i, jb := range v.Jobs {
		if !jb.Running || v.MidRound {
			continue
		}
		if free.FitsPlacement(jb.Placement) {
			ps[i] = clonePlacement(jb.Placement)
			for _, u := range jb.Placement.Units {
				free.Take(u)
			}
		}
	}
	for i, jb := range v.Jobs {
		if jb.Running {
			continue
		}
		best, bestRate := planner.Unit{}, 0.0
		for k, t := range v.Types {
			if k >= len(jb.Throughput) || !(jb.Throughput[k] > bestRate) {
				continue
			}
			undo := free.Restrict(jb.Eligible)
			u, ok := free.Pack(t, jb.ScaleFactor)
			undo()
			if ok {
				best, bestRate = u, jb.Throughput[k]
			}
		}
		if bestRate > 0 {
			ps[i] = planner.Placement{Units: []planner.Unit{best}}
			free.Take(best)
		}
	}
	return ps
}

// refreshThroughputs recomputes the jobs' per-type throughputs when the
// cluster or the estimates changed since they were computed.
func (e *Engine) refreshThroughputs() error {
	gen := uint64(0)
	if e.est != nil {
		gen = e.est.Generation()
	}
	if e.tputEpoch == e.epoch && e.tputGen == gen {
		return nil
	}
	runnableChanged := false
	for _, j := range e.jobs {
		before := j.view.Throughput
		if err := e.throughputs(j); err != nil {
			return err
		}
		for k, v := range j.view.Throughput {
			if k < len(before) && (v > 0) != (before[k] > 0) && len(before) == len(j.view.Throughput) {
				runnableChanged = true
			}
		}
	}
	if runnableChanged && e.tputEpoch == e.epoch {
		// A job can no longer run on a type (or now can), as learned: what
		// schedulers derived for this epoch (an allocation) is stale.
		e.epoch++
	}
	e.tputEpoch, e.tputGen = e.epoch, gen
	return nil
}

// pool offers every GPU of the schedulable cluster at a boundary, and only
// the idle ones mid-round.
func (e *Engine) pool(mid bool) *round.Pool {
	p := round.NewPool(e.cluster)
	for n, m := range e.held {
		if !p.Has(n) {
			continue
		}
		for t, k := range m {
			p.Take(planner.Unit{Slots: []planner.Slot{{Node: n, Type: t, Count: min(k, p.Free(n, t))}}})
		}
	}
	if mid {
		for _, j := range e.jobs {
			if j.view.Running {
				takeKnown(p, j.view.Placement)
			}
		}
	}
	return p
}

// takeKnown takes the slots of p that sit on nodes of the pool (a
// draining node is not in it: nothing there is offered anyway).
func takeKnown(pool *round.Pool, p planner.Placement) {
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			if pool.Has(sl.Node) {
				pool.Take(planner.Unit{Slots: []planner.Slot{sl}})
			}
		}
	}
}

// repair checks the scheduler's placements against the pool offered:
// on free GPUs of schedulable nodes, of valid widths, where the job runs.
// A running job within its minimum run time keeps its GPUs whatever the
// answer (it is checked first, so it keeps them); the others follow in job
// order. A placement that fails is replaced, so one bad answer never
// stalls the other jobs: a running job keeps its GPUs when they are still
// offered and free, anything else waits. Each replacement the scheduler is
// to blame for is returned with the reason; every one becomes the job's
// reason too.
func (e *Engine) repair(v *round.View, offered *round.Pool, ps []planner.Placement) []Repair {
	check := offered.Clone()
	protected := map[int]bool{}
	if !v.MidRound {
		for i, jb := range v.Jobs {
			j := e.byID[jb.ID]
			if !jb.Running || keepsAll(jb.Placement, ps[i]) {
				continue
			}
			min := e.planMinRunTime(j)
			if ran := e.ran(j, v.Now); ran < min-1e-6 && e.check(v, check, jb, jb.Placement) == nil {
				protected[i] = true
				ps[i] = clonePlacement(jb.Placement)
				take(check, ps[i])
				why := fmt.Sprintf("keeps its GPUs: it has run %s of its minimum run time %s", secs(ran), secs(min))
				switch {
				case !e.cfg.StartsReported:
				case j.setup:
					why = fmt.Sprintf("keeps its GPUs: its workers are not all running %s after they were placed, and its minimum run time %s counts from its first step", secs(v.Now-j.placedAt), secs(min))
				case j.trainedAt < 0:
					why = fmt.Sprintf("keeps its GPUs: no step yet %s after its workers started, and its minimum run time %s counts from its first step", secs(v.Now-j.placedAt), secs(min))
				}
				v.Explain(i, round.Reason{Why: why})
			}
		}
	}
	var out []Repair
	for i, jb := range v.Jobs {
		if v.MidRound && jb.Running || protected[i] {
			continue
		}
		err := e.check(v, check, jb, ps[i])
		if err == nil {
			take(check, ps[i])
			continue
		}
		// Refused only for GPUs a job within its minimum run time keeps:
		// the policy's choice, not a fault of the scheduler.
		byMinRun := len(protected) > 0 && e.check(v, offered, jb, ps[i]) == nil
		ps[i] = planner.Placement{}
		what := "it waits"
		if jb.Running && !v.MidRound && e.check(v, check, jb, jb.Placement) == nil {
			ps[i] = clonePlacement(jb.Placement)
			take(check, ps[i])
			what = "it keeps its GPUs"
		}
		if byMinRun {
			v.Explain(i, round.Reason{Why: "the GPUs the policy gave it are kept by a job within its minimum run time: " + what})
			continue
		}
		why := fmt.Sprintf("plan repaired: scheduler %s %v; %s", e.sched.Name(), err, what)
		out = append(out, Repair{Job: jb.ID, Why: why})
		v.Explain(i, round.Reason{Why: why})
	}
	return out
}

// capMinRunTime is a job's own minimum run time m within the operator's
// cap.
func (e *Engine) capMinRunTime(m float64) float64 {
	if c := e.cfg.MaxMinRunTime; c > 0 && m > c {
		return c
	}
	return m
}

// ran is how much of its minimum run time running job j has served at
// now. Where the caller reports starts (live), it counts from the job's
// first step on its GPUs: task setup (a chroot, an image, GPUs still
// held by their previous job) and start-up before training (importing
// torch, loading data, the unit gathering) are not run time, and on a
// loaded node they can outlast a short minimum run time, so that a
// policy time-slicing the GPUs would stop every job before it trained a
// step, round after round. Until its first step a job serves nothing
// unless it is stalled (Config.StallAfter since its placement or its
// start): then it has served its whole time there, so a job that never
// steps is not held on its GPUs. Where starts are not reported (the
// simulator) it counts from the placement.
func (e *Engine) ran(j *job, now float64) float64 {
	since := now - j.placedAt
	switch {
	case !e.cfg.StartsReported:
		return since
	case j.setup || j.trainedAt < 0:
		if since < e.cfg.StallAfter {
			return 0
		}
		return since
	}
	// A first step before Started counts from Started; a snapshot from
	// before trainedAt was kept has 0: the placement.
	return now - max(j.trainedAt, j.placedAt)
}

// minRunTime is job j's minimum run time in seconds.
func (e *Engine) minRunTime(j *job) float64 {
	if j.view.MinRunTime > 0 {
		return j.view.MinRunTime
	}
	return e.cfg.MinRunTime
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

func take(pool *round.Pool, p planner.Placement) {
	for _, u := range p.Units {
		pool.Take(u)
	}
}

func secs(s float64) string { return (time.Duration(s) * time.Second).String() }

// check reports why placement p of job jb cannot run on the free GPUs of
// pool (nil when it can).
func (e *Engine) check(v *round.View, pool *round.Pool, jb *round.JobView, p planner.Placement) error {
	if err := ValidPlacement(jb.Job, p); err != nil {
		return err
	}
	// What the placement needs so far, per node and type: a whole pool
	// copy per job would cost more than the plan at 1,000 jobs.
	need := map[planner.Slot]int{}
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			if !pool.Has(sl.Node) || sl.Count <= 0 {
				return fmt.Errorf("placed job %s on %v: not a schedulable node", jb.ID, sl)
			}
			if !jb.Eligible.Allows(sl.Node, sl.Type) {
				return fmt.Errorf("placed job %s on %v: its placement rules exclude that node or type", jb.ID, sl)
			}
			k := planner.Slot{Node: sl.Node, Type: sl.Type}
			need[k] += sl.Count
			if need[k] > pool.Free(sl.Node, sl.Type) {
				return fmt.Errorf("placed job %s on GPUs that are not free (%v)", jb.ID, u.Slots)
			}
		}
		r, err := e.cfg.Speed.UnitRate(jb.Job, u, v.Now)
		if err != nil {
			return err
		}
		if !(r > 0) {
			return fmt.Errorf("placed job %s where it cannot run (speed 0 on %v)", jb.ID, u.Slots)
		}
	}
	return nil
}

// ValidPlacement checks that every unit holds a positive number of GPUs,
// at most the job's scale factor, and that a single-unit placement holds
// exactly the scale factor (HadarE copies may be narrower) or, for an
// elastic job, one of its widths (planner.Job.Widths).
func ValidPlacement(j planner.Job, p planner.Placement) error {
	if len(p.Units) == 1 && j.AllowsWidth(p.Units[0].GPUs()) {
		return nil
	}
	for _, u := range p.Units {
		if u.GPUs() <= 0 {
			return fmt.Errorf("job %s: a unit with no GPUs", j.ID)
		}
		if u.GPUs() > j.ScaleFactor {
			return fmt.Errorf("job %s: a unit of %d GPUs exceeds its scale factor %d", j.ID, u.GPUs(), j.ScaleFactor)
		}
	}
	if len(p.Units) == 1 {
		if len(j.Widths) > 0 {
			return fmt.Errorf("job %s: placed on %d GPUs, want one of its widths %v", j.ID, p.Units[0].GPUs(), j.Widths)
		}
		return fmt.Errorf("job %s: placed on %d GPUs, want its scale factor %d", j.ID, p.Units[0].GPUs(), j.ScaleFactor)
	}
	return nil
}

// apply installs the validated placements and returns the decision.
func (e *Engine) apply(v *round.View, planned []*job, ps []planner.Placement, kind Kind) Decision {
	d := Decision{Time: v.Now, Kind: kind, Jobs: make([]JobDecision, 0, len(e.jobs))}
	waiting := 0
	at := map[*job]int{}
	for i, j := range planned {
		at[j] = i
	}
	for _, j := range e.jobs {
		i, ok := at[j]
		if !ok {
			jd := JobDecision{Job: j.view.ID, Action: Wait, Position: waiting,
				Reason: round.Reason{Why: fmt.Sprintf("deferred for %.0f s more: %s", j.deferUntil-v.Now, j.deferWhy)}}
			waiting++
			j.reason = jd.Reason
			d.Jobs = append(d.Jobs, jd)
			continue
		}
		prev := j.view.Placement
		was := j.view.Running
		jd := JobDecision{Job: j.view.ID, From: clonePlacement(prev), Reason: v.Reasons[i]}
		if v.MidRound && was {
			jd.Action, jd.To = Keep, clonePlacement(prev)
			jd.KeptFrom = make([]int, len(prev.Units))
			for k := range jd.KeptFrom {
				jd.KeptFrom[k] = k
			}
			if jd.Reason.Why == "" {
				jd.Reason = j.reason
			}
			d.Jobs = append(d.Jobs, jd)
			continue
		}
		p := ps[i]
		jd.To = clonePlacement(p)
		jd.KeptFrom = make([]int, len(p.Units))
		keptAll := true
		for k, u := range p.Units {
			jd.KeptFrom[k] = -1
			if was {
				jd.KeptFrom[k] = slices.IndexFunc(prev.Units, u.Equal)
			}
			keptAll = keptAll && jd.KeptFrom[k] >= 0
		}
		switch {
		case len(p.Units) == 0 && !was:
			jd.Action = Wait
		case len(p.Units) == 0:
			jd.Action = Stop
		case !was:
			jd.Action = Start
		case keptAll && len(p.Units) == len(prev.Units):
			jd.Action = Keep
		case keptAll && len(p.Units) < len(prev.Units):
			jd.Action = Unfork
		case len(p.Units) > len(prev.Units) && keptFirst(prev, p):
			jd.Action = Fork
		default:
			jd.Action = Move
		}
		if jd.Reason.Why == "" {
			jd.Reason.Why = defaultWhy(jd.Action, j, v)
		}
		if why := unrunnable(j, v); why != "" && len(p.Units) == 0 {
			// Whatever the policy says, this is why it waits.
			jd.Reason.Why = why
		}
		if notes := e.estimateNotes(j, p); notes != "" {
			jd.Reason.Why += "; " + notes
		}
		if j.stallNote != "" {
			jd.Reason.Why += "; " + j.stallNote
		}
		if was && (jd.Action == Stop || jd.Action == Move) {
			if note := e.beforeStart(j, v.Now); note != "" {
				jd.Reason.Why += "; " + note
			}
		}
		if len(p.Units) == 0 {
			jd.Position = waiting
			waiting++
			e.stopped(j, v.Now)
		} else {
			if !keptAll || !was {
				j.placedAt, j.lastAt, j.trainedAt = v.Now, -1, -1
				j.setup = e.cfg.StartsReported
			}
			j.view.Placement = clonePlacement(p)
			j.view.Running = true
		}
		j.reason = jd.Reason
		d.Jobs = append(d.Jobs, jd)
	}
	return d
}

// beforeStart says, for the reason of running job j stopped or moved at
// now, that it had not started there: its workers did not all run yet
// (task setup: a chroot, an image, GPUs still held by their previous
// job), or ran without a step since (start-up before training: imports,
// data, the unit gathering). "" when it trained, or when the caller
// does not report starts (Config.StartsReported).
func (e *Engine) beforeStart(j *job, now float64) string {
	switch {
	case !e.cfg.StartsReported:
		return ""
	case j.setup:
		return fmt.Sprintf("stopped before it started: its workers were not all running %s after they were placed", secs(now-j.placedAt))
	case j.trainedAt < 0:
		return fmt.Sprintf("stopped before it trained: no step in the %s since its workers started", secs(now-j.placedAt))
	}
	return ""
}

func keptFirst(prev, p planner.Placement) bool {
	return len(prev.Units) > 0 && len(p.Units) > 0 && slices.ContainsFunc(p.Units, prev.Units[0].Equal)
}

// unrunnable says why job j can run nowhere in the cluster of v ("" when it
// can run somewhere).
func unrunnable(j *job, v *round.View) string {
	for k, tp := range j.view.Throughput {
		if planner.Runnable(tp, j.view.ScaleFactor, v.Capacity[k]) {
			return ""
		}
	}
	if j.ineligible != "" {
		return "no node can run it: " + j.ineligible
	}
	if j.eligible != nil {
		return "no node both has a GPU type it runs on and satisfies its placement rules (constraints, node pool, datacenters, resources, device model)"
	}
	return fmt.Sprintf("no GPU type of the cluster can run it (%d workers of %s)", j.view.ScaleFactor, j.view.Model)
}

func defaultWhy(a Action, j *job, v *round.View) string {
	switch a {
	case Wait, Stop:
		if why := unrunnable(j, v); why != "" {
			return why
		}
		return "not placed this round: the policy gave the GPUs it can use to other jobs"
	case Keep:
		return "keeps its GPUs"
	}
	return string(a)
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

func cloneNode(n planner.Node) planner.Node {
	g := make(map[planner.GPUType]int, len(n.GPUs))
	for t, k := range n.GPUs {
		if k > 0 {
			g[t] = k
		}
	}
	n.GPUs = g
	return n
}

func cloneCluster(c planner.Cluster) planner.Cluster {
	out := planner.Cluster{Nodes: make([]planner.Node, len(c.Nodes))}
	for i, n := range c.Nodes {
		out.Nodes[i] = cloneNode(n)
	}
	return out
}

// Decision is the outcome of one plan.
type Decision struct {
	Time float64 `json:"time"`
	Kind Kind    `json:"kind"`
	// Jobs has one entry per active job, in arrival order (empty for a
	// decision of Kind None).
	Jobs []JobDecision `json:"jobs"`
	// Repairs lists what the engine changed in the scheduler's answer so
	// that it could run: a placement that was invalid or on GPUs not
	// offered (Job set), or a failed solve replaced by the fallback (Job
	// empty). Callers log and count them.
	Repairs []Repair `json:"repairs,omitempty"`
}

// Repair is one change the engine made to a scheduler's answer.
type Repair struct {
	Job string `json:"job,omitempty"`
	Why string `json:"why"`
}

// Changes returns the job decisions that need anything done on the
// cluster.
func (d Decision) Changes() []JobDecision {
	var out []JobDecision
	for _, jd := range d.Jobs {
		if jd.Action.Changes() {
			out = append(out, jd)
		}
	}
	return out
}

// JobDecision is the decision for one job.
type JobDecision struct {
	Job    string            `json:"job"`
	Action Action            `json:"action"`
	From   planner.Placement `json:"from"`
	To     planner.Placement `json:"to"`
	// KeptFrom has one entry per unit of To: the index of the unit of From
	// on exactly the same GPUs (it goes on without a restart), or -1 for a
	// unit that starts.
	KeptFrom []int `json:"kept_from,omitempty"`
	// Position is a waiting job's place among the jobs left waiting by
	// this plan, in arrival order (0 first).
	Position int          `json:"position"`
	Reason   round.Reason `json:"reason"`
}

// JobState is what the engine knows of one active job.
type JobState struct {
	Job        planner.Job        `json:"job"`
	Done       float64            `json:"steps_done"`
	Remaining  float64            `json:"remaining_steps"`
	Running    bool               `json:"running"`
	Placement  planner.Placement  `json:"placement"`
	Received   map[string]float64 `json:"received_s"`
	Throughput map[string]float64 `json:"throughput"`
	// Rate is the estimated steps/s of its current placement (0 waiting).
	Rate float64 `json:"rate"`
	// ETA is the estimated seconds until it completes at Rate (0 when
	// waiting: unknown).
	ETA    float64      `json:"eta_s"`
	Reason round.Reason `json:"reason"`
	// Estimates says, per GPU type of the cluster, what its throughput
	// rests on (a figure, a measurement, or the estimator's source and
	// typical error, explored or not); absent when the speed model's
	// profile is not an *Estimates.
	Estimates map[string]KeyEstimate `json:"estimates,omitempty"`
	// WaitingSince is when it last started waiting (meaningful when not
	// running).
	WaitingSince float64 `json:"waiting_since"`
	// StalledS is how long a running job has made no step, from its
	// placement or its last step, once that is Config.StallAfter or more
	// (0: not stalled).
	StalledS float64 `json:"stalled_s,omitempty"`
	// ReportedAt is when a progress report was last taken (engine time,
	// 0: never): what a view says Done is as of.
	ReportedAt float64 `json:"reported_at,omitempty"`
	// StalledOn lists the GPU types its own stall keeps it off (absent:
	// none), with its reason saying so.
	StalledOn []planner.GPUType `json:"stalled_on,omitempty"`
}

// Jobs returns the active jobs in arrival order.
func (e *Engine) Jobs() []JobState {
	out := make([]JobState, 0, len(e.jobs))
	for _, j := range e.jobs {
		out = append(out, e.state(j))
	}
	return out
}

// Job returns one active job.
func (e *Engine) Job(id string) (JobState, bool) {
	j := e.byID[id]
	if j == nil {
		return JobState{}, false
	}
	return e.state(j), true
}

func (e *Engine) state(j *job) JobState {
	s := JobState{Job: j.view.Job, Done: j.done, Remaining: math.Max(0, j.rem), Running: j.view.Running,
		Placement: clonePlacement(j.view.Placement), Received: map[string]float64{}, Throughput: map[string]float64{},
		Reason: j.reason, WaitingSince: j.waitingSince, ReportedAt: j.reportedAt}
	for k, t := range e.types {
		if k < len(j.view.Received) {
			s.Received[string(t)] = j.view.Received[k]
		}
		if k < len(j.view.Throughput) {
			s.Throughput[string(t)] = j.view.Throughput[k]
		}
	}
	for _, t := range e.types {
		if _, stalled := j.stalledOn[t]; stalled && !j.view.Eligible.AnyOf(t) {
			s.StalledOn = append(s.StalledOn, t)
		}
	}
	if e.est != nil {
		s.Estimates = map[string]KeyEstimate{}
		for _, t := range e.types {
			if ke, err := e.est.Estimate(j.view.Model, j.view.ScaleFactor, t); err == nil {
				s.Estimates[string(t)] = ke
			}
		}
	}
	if j.view.Running {
		if quiet := e.now - max(j.placedAt, j.progressAt); quiet >= e.cfg.StallAfter {
			s.StalledS = quiet
		}
		if r, err := e.cfg.Speed.Rate(j.view.Job, j.view.Placement, e.now); err == nil && r > 0 {
			s.Rate = r
			s.ETA = math.Max(0, j.rem) / r
		}
	}
	return s
}
