package nodesim

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"
)

// world is the simulated cluster's truth about training: each job's steps
// done, its units and their workers. The nodes tell it what Nomad runs
// (start, stop, forget); it decides when work completes and tells the
// workers' nodes (report). One lock: events come at most a few hundred a
// second, and every computation under it is small.
//
// The model is hadar-train's, compressed in time (docs/training-contract.md):
//
//   - A unit is the workers that train together: for a job hadar placed,
//     the allocations whose task env names the same HADAR_UNIT, WORLD_SIZE
//     of them; for a plain Nomad job, the allocations of one task group,
//     its count of them.
//   - A unit makes no progress until all its workers run (the rendezvous
//     of distributed training), then none for the restart delay
//     (checkpoint restore and warm-up), then it makes the job's steps at
//     the throughput of its slowest worker's GPU model (the spread figure
//     when its workers sit on several nodes) times the compression.
//   - The units of a job add up (HadarE copies); the job completes when
//     its steps are done: every worker exits 0.
//   - A worker Nomad stops ends at once (complete); its unit stops, and the
//     job keeps its steps (a checkpoint on the way out). A unit that lost
//     a worker waits for a full rendezvous again.
//   - A worker that waits at the rendezvous longer than the rendezvous
//     timeout fails (exit 1), as torch.distributed's store does (30 min by
//     default): Nomad places a gang's workers one by one as GPUs free up
//     and never all or nothing, so without it a cluster of half-placed
//     gangs would wait forever.
type world struct {
	mu       sync.Mutex
	now      func() time.Time
	after    func(time.Duration, func()) timer
	compress float64
	restart  time.Duration // wall time a unit spends restoring before it makes progress
	rdv      time.Duration // wall time a worker waits at the rendezvous; 0: forever
	log      *eventLog
	jobs     map[jobKey]*job
	tasks    map[string]*task // by allocation ID
	closed   bool
}

// timer is what world needs of a time.Timer (tests fake it).
type timer interface{ Stop() bool }

type jobKey struct {
	Namespace, ID string
	// Create is the job's CreateIndex: a job purged and submitted again
	// under the same ID is another job with no progress.
	Create uint64
}

type job struct {
	key   jobKey
	total float64
	done  float64   // steps done as of at
	at    time.Time // when done was last brought up to date
	units map[string]*unit
	// finished: its steps are done and its workers told to complete.
	finished bool
	timer    timer
}

type unit struct {
	id      string
	size    int
	workers map[string]*task
	running bool      // the rendezvous is complete
	from    time.Time // progress starts (rendezvous + restart delay)
	rate    float64   // steps per wall second
}

// task is one worker: a simulated task of one allocation.
type task struct {
	alloc, node, group string
	job                *job
	unit               *unit
	model              string             // its GPU's model, "" when it got none
	rates, spread      map[string]float64 // steps per simulated second by model
	report             func(status, desc string)
	ended              bool
	waiting            timer // the rendezvous timeout while it waits
}

// taskInfo is what a node knows of a new allocation's training task.
type taskInfo struct {
	Alloc, Node, Group string
	Job                jobKey
	// Unit and Size name the worker's unit and how many workers it has.
	Unit  string
	Size  int
	Model string
	// TotalSteps is the job's work; Rates and Spread its throughput per GPU
	// model (steps per simulated second), consolidated and spread.
	TotalSteps    float64
	Rates, Spread map[string]float64
	// Report tells Nomad the allocation's client status (running, complete).
	Report func(status, desc string)
}

func newWorld(compress float64, restart, rendezvous time.Duration, log *eventLog) *world {
	return &world{
		now:      time.Now,
		after:    func(d time.Duration, f func()) timer { return time.AfterFunc(d, f) },
		compress: compress,
		restart:  time.Duration(float64(restart) / compress),
		rdv:      time.Duration(float64(rendezvous) / compress),
		log:      log,
		jobs:     map[jobKey]*job{},
		tasks:    map[string]*task{},
	}
}

// start runs a new allocation's task: it joins its unit and reports running;
// a full unit starts training.
func (w *world) start(ti taskInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.tasks[ti.Alloc]; ok {
		return
	}
	now := w.now()
	j := w.jobs[ti.Job]
	if j == nil {
		j = &job{key: ti.Job, total: ti.TotalSteps, at: now, units: map[string]*unit{}}
		w.jobs[ti.Job] = j
	}
	t := &task{alloc: ti.Alloc, node: ti.Node, group: ti.Group, job: j, model: ti.Model, rates: ti.Rates, spread: ti.Spread, report: ti.Report}
	w.tasks[ti.Alloc] = t
	w.log.write(event{Event: "placed", Job: j.key.ID, Namespace: j.key.Namespace, Alloc: ti.Alloc, Node: ti.Node, Group: ti.Group, Unit: ti.Unit, Model: ti.Model})
	if j.finished {
		// Resumed from a checkpoint that holds every step: nothing to do.
		t.ended = true
		t.report("complete", "all steps were done already")
		return
	}
	t.report("running", "")
	u := j.units[ti.Unit]
	if u == nil {
		u = &unit{id: ti.Unit, size: max(ti.Size, 1), workers: map[string]*task{}}
		j.units[ti.Unit] = u
	}
	t.unit = u
	u.workers[t.alloc] = t
	if u.running {
		// A worker joining a unit already training (more workers than
		// its size say): it trains along.
		return
	}
	if len(u.workers) < u.size {
		w.wait(t)
		return
	}
	for _, x := range u.workers {
		x.stopWaiting()
	}
	w.advance(j, now)
	u.running = true
	u.from = now.Add(w.restart)
	u.rate = w.unitRate(u)
	w.log.write(event{Event: "running", Job: j.key.ID, Namespace: j.key.Namespace, Unit: u.id, Workers: len(u.workers), Rate: u.rate / w.compress, Steps: j.done})
	if u.rate <= 0 {
		w.log.write(event{Event: "stalled", Job: j.key.ID, Namespace: j.key.Namespace, Unit: u.id, Model: w.models(u)})
	}
	w.schedule(j, now)
}

// stop ends a task Nomad stopped: it completes at once, and its unit
// stops training with the job's steps kept.
func (w *world) stop(alloc string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.tasks[alloc]
	if t == nil || t.ended {
		return
	}
	w.leave(t, "stopped by Nomad; checkpointed")
}

// forget drops a task whose allocation Nomad no longer lists for its node
// (garbage-collected): like stop, without a report.
func (w *world) forget(alloc string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.tasks[alloc]
	if t == nil {
		return
	}
	if !t.ended {
		t.report = func(string, string) {}
		w.leave(t, "")
	}
	delete(w.tasks, alloc)
}

// leave takes an ending task out of its unit.
func (w *world) leave(t *task, desc string) {
	now := w.now()
	j, u := t.job, t.unit
	t.ended = true
	t.stopWaiting()
	t.report("complete", desc)
	if u == nil {
		return
	}
	delete(u.workers, t.alloc)
	if u.running {
		w.advance(j, now)
		u.running, u.rate = false, 0
		w.log.write(event{Event: "stopped", Job: j.key.ID, Namespace: j.key.Namespace, Unit: u.id, Steps: j.done})
		// The others are back at the rendezvous.
		for _, x := range u.workers {
			w.wait(x)
		}
	}
	if len(u.workers) == 0 {
		delete(j.units, u.id)
	}
	w.schedule(j, now)
}

// wait starts the rendezvous timeout of a worker whose unit is not full.
func (w *world) wait(t *task) {
	t.stopWaiting()
	if w.rdv <= 0 {
		return
	}
	alloc := t.alloc
	t.waiting = w.after(w.rdv, func() { w.timeout(alloc) })
}

func (t *task) stopWaiting() {
	if t.waiting != nil {
		t.waiting.Stop()
		t.waiting = nil
	}
}

// timeout fails a worker that waited at the rendezvous too long.
func (w *world) timeout(alloc string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.tasks[alloc]
	if w.closed || t == nil || t.ended || t.unit == nil || t.unit.running {
		return
	}
	u, j := t.unit, t.job
	t.ended, t.waiting = true, nil
	w.log.write(event{Event: "timeout", Job: j.key.ID, Namespace: j.key.Namespace, Alloc: alloc, Node: t.node, Unit: u.id, Workers: len(u.workers)})
	t.report("failed", fmt.Sprintf("rendezvous timed out: %d of %d workers arrived", len(u.workers), u.size))
	delete(u.workers, alloc)
	if len(u.workers) == 0 {
		delete(j.units, u.id)
	}
}

// unitRate is a full unit's steps per wall second: the slowest worker's
// model sets the pace of synchronous training.
func (w *world) unitRate(u *unit) float64 {
	nodes := map[string]bool{}
	for _, t := range u.workers {
		nodes[t.node] = true
	}
	rate := math.Inf(1)
	for _, t := range u.workers {
		r, ok := t.rates[t.model]
		if s, spread := t.spread[t.model]; len(nodes) > 1 && spread {
			r, ok = s, true
		}
		if !ok || t.model == "" {
			r = 0
		}
		rate = math.Min(rate, r)
	}
	if math.IsInf(rate, 1) {
		return 0
	}
	return rate * w.compress
}

func (w *world) models(u *unit) string {
	var ms []string
	for _, t := range u.workers {
		ms = append(ms, fmt.Sprintf("%q", t.model))
	}
	sort.Strings(ms)
	return fmt.Sprint(ms)
}

// advance brings a job's steps done up to now.
func (w *world) advance(j *job, now time.Time) {
	j.done = w.doneAt(j, now)
	j.at = now
}

// doneAt is the job's steps done at time now (>= j.at).
func (w *world) doneAt(j *job, now time.Time) float64 {
	done := j.done
	for _, u := range j.units {
		if !u.running {
			continue
		}
		from := u.from
		if j.at.After(from) {
			from = j.at
		}
		if now.After(from) {
			done += u.rate * now.Sub(from).Seconds()
		}
	}
	return math.Min(done, j.total)
}

// schedule sets the job's timer to when it finishes, or to the next time
// a unit starts making progress if that comes first.
func (w *world) schedule(j *job, now time.Time) {
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
	if j.finished || w.closed {
		return
	}
	rem := j.total - j.done
	if rem <= 0 {
		w.finish(j)
		return
	}
	rate := 0.0
	next := time.Time{}
	for _, u := range j.units {
		switch {
		case !u.running || u.rate <= 0:
		case !u.from.After(now):
			rate += u.rate
		case next.IsZero() || u.from.Before(next):
			next = u.from
		}
	}
	if rate > 0 {
		// Rounded up: a timer that fires a sliver early would find a
		// sliver of steps left and fire again.
		done := now.Add(time.Duration(math.Ceil(rem/rate*float64(time.Second))) + time.Microsecond)
		if next.IsZero() || done.Before(next) {
			next = done
		}
	}
	if next.IsZero() {
		return // nothing runs: it waits for Nomad
	}
	key := j.key
	j.timer = w.after(next.Sub(now), func() { w.tick(key) })
}

// close stops every timer: the simulation is over.
func (w *world) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, j := range w.jobs {
		if j.timer != nil {
			j.timer.Stop()
		}
	}
	for _, t := range w.tasks {
		t.stopWaiting()
	}
}

// tick is a job's timer: progress up to now, then finish or schedule
// again.
func (w *world) tick(k jobKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	j := w.jobs[k]
	if w.closed || j == nil || j.finished {
		return
	}
	now := w.now()
	w.advance(j, now)
	// Within a nanosecond of a step: timers fire late, never early, but
	// float rounding may leave a sliver.
	if j.done >= j.total*(1-1e-12) {
		w.finish(j)
		return
	}
	w.schedule(j, now)
}

// finish completes a job whose steps are done: every worker exits 0.
func (w *world) finish(j *job) {
	j.done, j.finished = j.total, true
	w.log.write(event{Event: "complete", Job: j.key.ID, Namespace: j.key.Namespace, Steps: j.done})
	for _, u := range j.units {
		for _, t := range u.workers {
			t.ended = true
			t.report("complete", "training done")
		}
	}
	j.units = map[string]*unit{}
}

// progress is the training progress file of the allocation's task
// (docs/training-contract.md), as hadar-train would have written it now.
func (w *world) progress(alloc string) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.tasks[alloc]
	if t == nil {
		return nil, fmt.Errorf("allocation %s: no simulated task on this node", alloc)
	}
	now := w.now()
	j := t.job
	p := progressFile{TotalSteps: int64(j.total), Updated: now.UTC(), State: "waiting"}
	p.StepsDone = int64(w.doneAt(j, now))
	switch {
	case j.finished:
		p.State = "done"
	case t.unit != nil && t.unit.running && !now.Before(t.unit.from):
		p.State, p.StepsPerSec = "running", t.unit.rate
	case t.unit != nil && t.unit.running:
		p.State = "restoring"
	case t.ended:
		p.State = "stopped"
	}
	return json.Marshal(p)
}

// progressFile is hadar-train's progress file (the fields hadar reads).
type progressFile struct {
	StepsDone   int64     `json:"steps_done"`
	TotalSteps  int64     `json:"total_steps"`
	StepsPerSec float64   `json:"steps_per_sec"`
	Updated     time.Time `json:"updated"`
	State       string    `json:"state"`
}
