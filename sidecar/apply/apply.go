// Package apply carries the engine's decisions out on Nomad: each change
// of a job's placement becomes the smallest number of job registrations,
// each one checked first and written with check-and-set.
//
//   - Before a write, Nomad plans it (Jobs().PlanOpts): a write that would
//     restart a worker hadar means to keep (a destructive update of a kept
//     group) or that Nomad cannot place (failed allocations for a new
//     group) is not made, and the operation fails with Nomad's reason.
//   - A write carries the job's JobModifyIndex as read (EnforceIndex): if
//     a person changed the job meanwhile, Nomad refuses it and hadar reads
//     the job again instead of overwriting the edit.
//   - A move is two writes: the units that leave are removed first, and
//     the new ones are added only once the old workers have checkpointed
//     and ended (or StopTimeout passed), so a resumed worker never reads a
//     checkpoint that is still being written.
//   - A start is all or nothing (gang): if any worker of a new unit cannot
//     be placed, or is not running within GangTimeout of Nomad placing
//     them all, every new worker is removed again and the operation
//     fails. The clock starts at placement: a write waiting in Nomad's
//     evaluation queue is not a gang that failed to start (rolling it
//     back would only queue more work), so it waits up to
//     placeWaitFactor times GangTimeout for Nomad to place it. A job with
//     hadar.gang = false is written even when Nomad cannot place every
//     worker yet, and never rolled back: each worker starts when Nomad
//     places it.
package apply

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// Jobs is the part of the Nomad API apply writes through.
type Jobs interface {
	Info(jobID string, q *api.QueryOptions) (*api.Job, *api.QueryMeta, error)
	PlanOpts(job *api.Job, opts *api.PlanOptions, q *api.WriteOptions) (*api.JobPlanResponse, *api.WriteMeta, error)
	RegisterOpts(job *api.Job, opts *api.RegisterOptions, q *api.WriteOptions) (*api.JobRegisterResponse, *api.WriteMeta, error)
}

// Evaluator is the optional part of Jobs that asks Nomad to evaluate a
// job again (the Nomad API client has it).
type Evaluator interface {
	EvaluateWithOpts(jobID string, opts api.EvalOptions, q *api.WriteOptions) (string, *api.WriteMeta, error)
}

// Job is what apply needs of a managed job as last read from Nomad.
type Job struct {
	Key  watch.JobKey
	Raw  *api.Job
	Spec jobspec.Spec
	// JobModifyIndex is the index the next write must be made against.
	JobModifyIndex uint64
}

// Group is the state of a generated group's allocations.
type Group struct {
	// Running: an allocation of it runs. Placed: Nomad placed an
	// allocation of it (running, not yet, or ended since). Ended: every
	// allocation of it is terminal (or it has none). Failed: Nomad
	// reports it cannot be placed (a blocked evaluation's failed
	// allocations name it).
	Running, Placed, Ended bool
	Failed                 string
	// Done: its rank-0 worker ended with its run's work done (by the
	// training contract): a move that took the group away must not start
	// the job again, which would rerun a finished run.
	Done bool
}

// placeWaitFactor bounds, in gang timeouts, how long a gang start waits
// for Nomad to place its workers at all (its evaluation queued behind
// others on a busy server) before it is rolled back.
const placeWaitFactor = 4

// Cluster is what apply reads of the watched cluster.
type Cluster interface {
	// Job returns the managed job as last read, nil if it is gone.
	Job(k watch.JobKey) *Job
	// Group returns the state of a job's task group.
	Group(k watch.JobKey, group string) Group
	// Leaving reports whether job k has an allocation on node that was
	// asked to stop and still holds its GPUs (its workers checkpoint within
	// their kill_timeout): Nomad places nothing new on those GPUs until it
	// ends ("no devices match request").
	Leaving(k watch.JobKey, node string) bool
}

// Config of an Applier.
type Config struct {
	GangTimeout time.Duration
	StopTimeout time.Duration
	// DryRun makes every write a no-op that succeeds.
	DryRun bool
	Logger hclog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Journal, when set, records each write before it is made (applied
	// false) and after it succeeded (applied true, with the job's new
	// index). A write whose intent cannot be recorded is not made.
	Journal func(ctx context.Context, w Write) error
	// Form is how generated worker groups are written: the storage and
	// kill timeout of tasks on Nomad's own drivers (zero: jobform's
	// defaults).
	Form jobform.Options
	// Guard, when set, is asked right before each registration goes out
	// (after the plan and the journal, which may take a while): a write
	// it refuses is not made. The sidecar's checks its leader lease here.
	Guard func(ctx context.Context) error
}

// Write is one registration, as the journal records it.
type Write struct {
	Job  watch.JobKey
	Kind string
	// Units is the placement written; empty for the held form.
	Units []jobform.Unit
	// ReadIndex is the JobModifyIndex the write is made against.
	ReadIndex uint64
	Applied   bool
	// JobModifyIndex is the job's index after the write (applied only).
	JobModifyIndex uint64
}

// Applier tracks the operations in flight, one per job at most.
type Applier struct {
	jobs Jobs
	cfg  Config
	mu   sync.Mutex
	ops  map[watch.JobKey]*Op
	// Writes counts registrations made (dry runs included), by kind.
	writes map[string]int
	// own is, per job, the JobModifyIndex of hadar's last write: a
	// decision planned on a view from before that write still stands on
	// it (the engine assumed the write).
	own map[watch.JobKey]uint64
}

// New returns an Applier writing through jobs.
func New(jobs Jobs, cfg Config) *Applier {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Applier{jobs: jobs, cfg: cfg, ops: map[watch.JobKey]*Op{}, writes: map[string]int{}, own: map[watch.JobKey]uint64{}}
}

// Phase of an operation.
type Phase string

// Phases.
const (
	// Stopping: units that leave were removed; waiting for their workers
	// to end before the new ones are added.
	Stopping Phase = "stopping"
	// Waiting: the new units wait, unwritten, for other jobs' workers to
	// leave the GPUs they take. Under time-slicing a round swaps jobs on
	// the same GPUs, and a start written while the leaving job's workers
	// still checkpoint finds the GPUs held: Nomad would refuse it.
	Waiting Phase = "awaiting-gpus"
	// Writing: the operation's first write is going out (Reserve, then
	// BeginAfter on another goroutine).
	Writing Phase = "writing"
	// Starting: new units were added; waiting for all their workers to run.
	Starting Phase = "starting"
	Done     Phase = "done"
	Failed   Phase = "failed"
)

// Op is one change of a job's placement in flight.
type Op struct {
	Key watch.JobKey
	// Target is the placement being reached (empty: the job is held).
	Target []jobform.Unit
	// Keep are the units that run on through the change.
	Keep     []jobform.Unit
	Phase    Phase
	Deadline time.Time
	// Added are the generated groups of the new units.
	Added []string
	// Removed are the generated groups being stopped.
	Removed []string
	// After are the jobs whose stopping workers hold GPUs the new units
	// take: the new units are written once those have ended.
	After   []watch.JobKey
	Err     error
	Started time.Time
	// stopped: the removed workers have ended (a move may still wait on
	// other jobs before it starts its new units).
	stopped bool
	// written is when the new units' write was made; placed, when Nomad
	// had placed every new worker (the gang clock starts then).
	written, placed time.Time
	// refused is when Nomad's plan first refused the new units, retryAt
	// when they are asked again (placeLater).
	refused, retryAt time.Time
	// index is the job version the operation stands on: the one its
	// decision was planned on, then the one its own last write made. A
	// later write finding any other version is not made (ErrConflict).
	index uint64
	// spec is the job's spec the decision was planned on.
	spec jobspec.Spec
}

// Outcome is an operation that ended, reported by Step.
type Outcome struct {
	Key   watch.JobKey
	Phase Phase // Done or Failed
	Err   error
	// Target is what runs now: the target when Done, the kept units (or
	// nothing) when Failed.
	Running []jobform.Unit
	// Started: Done because every worker the operation added runs (not a
	// stop, nor a start that left workers for Nomad to place).
	Started bool
}

// ErrFinished is returned (wrapped) when a worker the write keeps has
// already finished: the job is completing, and a write would run that
// worker again.
var ErrFinished = errors.New("a kept worker already finished")

// ErrConflict is returned (wrapped) when someone else changed the job since
// the decision was planned (or since it was read): the write was not made,
// or Nomad's check-and-set refused it.
var ErrConflict = errors.New("the job changed since it was read")

// ErrNotManaged is returned (wrapped) when the job is no longer hadar's to
// write: its hadar.* meta was removed (a person took it over) or it became
// a launcher. The write is not made.
var ErrNotManaged = errors.New("the job is no longer managed by hadar")

// ErrNotVisible is returned (wrapped) when Nomad answers 404 for a job
// the watcher saw: just submitted, the read reached a server that has not
// applied the registration yet (or it was purged meanwhile). Nothing was
// written; the next cycle decides on the view then.
var ErrNotVisible = errors.New("the job is not visible in Nomad yet")

// ErrUnplaceable is returned (wrapped) when Nomad's plan cannot place a
// gang start's new workers: nothing is written.
var ErrUnplaceable = errors.New("nomad cannot place the new workers")

func (a *Applier) count(kind string) {
	a.mu.Lock()
	a.writes[kind]++
	a.mu.Unlock()
}

// Writes returns the registrations made so far, by kind.
func (a *Applier) Writes() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int, len(a.writes))
	for k, v := range a.writes {
		out[k] = v
	}
	return out
}

// Own returns the JobModifyIndex of hadar's last write of the job (0:
// none since the start).
func (a *Applier) Own(k watch.JobKey) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.own[k]
}

// InFlight returns the job's operation, nil when none.
func (a *Applier) InFlight(k watch.JobKey) *Op {
	a.mu.Lock()
	defer a.mu.Unlock()
	if op := a.ops[k]; op != nil {
		c := *op
		return &c
	}
	return nil
}

// Ops returns the operations in flight, by job.
func (a *Applier) Ops() []Op {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Op
	for _, op := range a.ops {
		out = append(out, *op)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}

// Begin starts moving job j to the target units (empty: hold it). keep
// lists the target units that run already (same number, same workers);
// the others are new. It makes the first write: the removal of the units
// that leave when some leave and some arrive (a move: the new ones follow
// in Step), else the whole change. A change that needs no write (the job
// is already in that form) is Done at once.
func (a *Applier) Begin(ctx context.Context, j *Job, target []jobform.Unit) (*Op, error) {
	return a.BeginAfter(ctx, j, target, nil)
}

// BeginAfter is Begin for a change whose new units take GPUs that the
// jobs in after are giving up in the same round: the new units are
// written only once those jobs' stopping workers have ended, or their
// StopTimeout passed (then the start is tried anyway, and Nomad's plan
// says whether it fits).
func (a *Applier) BeginAfter(ctx context.Context, j *Job, target []jobform.Unit, after []watch.JobKey) (*Op, error) {
	return a.BeginReserved(ctx, a.Reserve(j.Key), j, target, after)
}

// Reserve marks the job's operation as being written, so that it shows
// in flight, and other jobs' starts wait on it, before BeginReserved runs
// (on another goroutine): it replaces any operation of the job.
func (a *Applier) Reserve(k watch.JobKey) *Op {
	a.mu.Lock()
	defer a.mu.Unlock()
	op := &Op{Key: k, Phase: Writing, Started: a.cfg.Now()}
	a.ops[k] = op
	return op
}

// BeginReserved is BeginAfter on the reservation r of job j. If r was
// cancelled meanwhile (a lost lease), the write may still be made but the
// operation is not followed: Nomad is the truth.
func (a *Applier) BeginReserved(ctx context.Context, r *Op, j *Job, target []jobform.Unit, after []watch.JobKey) (*Op, error) {
	op, err := a.begin(ctx, j, target, after)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ops[j.Key] == r {
		if err != nil || op.Phase == Done {
			delete(a.ops, j.Key)
		} else {
			a.ops[j.Key] = op
		}
	}
	return op, err
}

func (a *Applier) begin(ctx context.Context, j *Job, target []jobform.Unit, after []watch.JobKey) (*Op, error) {
	planned := []uint64{j.JobModifyIndex}
	a.mu.Lock()
	if own := a.own[j.Key]; own > j.JobModifyIndex {
		planned = append(planned, own)
	}
	a.mu.Unlock()
	j, err := a.fresh(ctx, j, j.Spec, planned...)
	if err != nil {
		return nil, err
	}
	current, err := jobform.Units(j.Raw, j.Spec)
	if err != nil {
		return nil, err
	}
	op := &Op{Key: j.Key, Target: target, Started: a.cfg.Now(), After: slices.DeleteFunc(slices.Clone(after), func(k watch.JobKey) bool { return k == j.Key }),
		index: j.JobModifyIndex, spec: j.Spec}
	for _, u := range target {
		if c := find(current, u.ID); c != nil && sameUnit(*c, u) {
			op.Keep = append(op.Keep, u)
		}
	}
	for _, c := range current {
		if t := find(target, c.ID); t == nil || !sameUnit(c, *t) {
			op.Removed = append(op.Removed, groups(j.Spec.Group, c)...)
		}
	}
	for _, u := range target {
		if c := find(current, u.ID); c == nil || !sameUnit(*c, u) {
			op.Added = append(op.Added, groups(j.Spec.Group, u)...)
		}
	}
	switch {
	case len(op.Removed) == 0 && len(op.Added) == 0:
		op.Phase = Done
		return op, nil
	case len(op.Removed) > 0 && len(op.Added) > 0:
		// Phase 1 of a move: only the kept units stay.
		if err := a.writeRead(ctx, j, op.Keep, "stop", op); err != nil {
			return nil, err
		}
		op.Phase, op.Deadline = Stopping, a.cfg.Now().Add(a.cfg.StopTimeout)
	case len(op.Added) > 0 && len(op.After) > 0:
		op.Phase, op.Deadline = Waiting, a.cfg.Now().Add(a.cfg.StopTimeout)
		a.cfg.Logger.Debug("start waits for the jobs leaving its GPUs", "job", j.Key.String(), "after", fmt.Sprint(op.After))
	case len(op.Added) > 0:
		if err := a.writeRead(ctx, j, target, "start", op); err != nil {
			return nil, err
		}
		now := a.cfg.Now()
		op.Phase, op.Deadline, op.written = Starting, now.Add(a.cfg.GangTimeout), now
	default:
		if err := a.writeRead(ctx, j, target, "stop", op); err != nil {
			return nil, err
		}
		op.Phase, op.Deadline = Stopping, a.cfg.Now().Add(a.cfg.StopTimeout)
	}
	return op, nil
}

func find(us []jobform.Unit, id int) *jobform.Unit {
	for i := range us {
		if us[i].ID == id {
			return &us[i]
		}
	}
	return nil
}

func sameUnit(a, b jobform.Unit) bool {
	if len(a.Workers) != len(b.Workers) || a.Port != b.Port {
		return false
	}
	for i := range a.Workers {
		if a.Workers[i].Node != b.Workers[i].Node || a.Workers[i].Type != b.Workers[i].Type {
			return false
		}
	}
	return true
}

func groups(tmpl string, u jobform.Unit) []string {
	out := make([]string, len(u.Workers))
	for r := range u.Workers {
		out[r] = groupname.Format(tmpl, u.ID, r)
	}
	return out
}

// fresh re-reads the job before a write and refuses to write on any
// version other than one of want (the version the decision was planned on,
// or the one hadar's own last write made): a person's edit made since is
// kept (ErrConflict), one made after this read is caught by check-and-set.
// The job read is parsed again: it must still be managed (ErrNotManaged)
// with the spec the decision was planned on (ErrConflict).
func (a *Applier) fresh(ctx context.Context, j *Job, spec jobspec.Spec, want ...uint64) (*Job, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if a.cfg.DryRun {
		return j, nil
	}
	raw, _, err := a.jobs.Info(j.Key.ID, (&api.QueryOptions{Namespace: j.Key.Namespace}).WithContext(ctx))
	if isNotFound(err) {
		return nil, fmt.Errorf("job %s: reading it before writing: %w: not written (%v)", j.Key, ErrNotVisible, err)
	}
	if err != nil {
		return nil, fmt.Errorf("job %s: reading it before writing: %w", j.Key, err)
	}
	if raw.Stop != nil && *raw.Stop {
		return nil, fmt.Errorf("job %s was stopped by its owner: not written", j.Key)
	}
	if !jobspec.IsManaged(raw) {
		return nil, fmt.Errorf("job %s: %w (no hadar.* job meta, or a launcher): not written", j.Key, ErrNotManaged)
	}
	index := deref(raw.JobModifyIndex)
	if !slices.Contains(want, index) {
		return nil, fmt.Errorf("job %s: %w: the decision was planned on version index %v, Nomad has %d: not written, decided anew", j.Key, ErrConflict, want, index)
	}
	now, err := jobspec.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w: its spec no longer parses (%v): not written", j.Key, ErrConflict, err)
	}
	if !now.Same(spec) {
		return nil, fmt.Errorf("job %s: %w: its spec changed since the decision was planned: not written, decided anew", j.Key, ErrConflict)
	}
	return &Job{Key: j.Key, Raw: raw, Spec: now, JobModifyIndex: index}, nil
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// write registers the job with exactly the given units, on the version op
// stands on, after Nomad's plan agrees: groups of kept units untouched,
// new groups placeable.
func (a *Applier) write(ctx context.Context, j *Job, units []jobform.Unit, kind string, op *Op) error {
	j, err := a.fresh(ctx, j, op.spec, op.index)
	if err != nil {
		return err
	}
	return a.writeRead(ctx, j, units, kind, op)
}

// writeRead is write on a job just read from Nomad (fresh): BeginAfter
// reads it to work out the units and writes at once, and the
// registration's check-and-set on its index catches any change between.
func (a *Applier) writeRead(ctx context.Context, j *Job, units []jobform.Unit, kind string, op *Op) error {
	var (
		job *api.Job
		err error
	)
	if len(units) == 0 {
		job, err = jobform.Held(j.Raw, j.Spec)
	} else {
		job, err = jobform.PlacedWith(j.Raw, j.Spec, units, a.cfg.Form)
	}
	if err != nil {
		return err
	}
	if a.cfg.DryRun {
		a.count(kind)
		return nil
	}
	wo := (&api.WriteOptions{Namespace: j.Key.Namespace}).WithContext(ctx)
	plan, _, err := a.jobs.PlanOpts(job, &api.PlanOptions{}, wo)
	if err != nil {
		return fmt.Errorf("job %s: planning the %s write: %w", j.Key, kind, err)
	}
	kept := map[string]bool{}
	for _, u := range op.Keep {
		for _, g := range groups(j.Spec.Group, u) {
			kept[g] = true
		}
	}
	if plan.Annotations != nil {
		for g, du := range plan.Annotations.DesiredTGUpdates {
			if kept[g] && du != nil && (du.DestructiveUpdate > 0 || du.Stop > 0) {
				return fmt.Errorf("job %s: the %s write would restart running group %s (%d destructive, %d stopped): not written", j.Key, kind, g, du.DestructiveUpdate, du.Stop)
			}
			// A kept worker that already finished: Nomad places a batch
			// allocation finished under an older job version again, so
			// the write would run it a second time (the job is completing
			// and the sidecar has not seen it yet).
			if kept[g] && du != nil && du.Place > 0 {
				return fmt.Errorf("job %s: %w: the %s write would run group %s again (%d to place): not written", j.Key, ErrFinished, kind, g, du.Place)
			}
		}
	}
	var unplaceable []string
	for g, m := range plan.FailedTGAllocs {
		// A job that asked for no gang (hadar.gang = false) is written
		// anyway: each worker starts when Nomad can place it.
		if slices.Contains(op.Added, g) && kind == "start" && j.Spec.Gang {
			unplaceable = append(unplaceable, fmt.Sprintf("%s: %s", g, Explain(m)))
		}
	}
	if len(unplaceable) > 0 {
		sort.Strings(unplaceable)
		return fmt.Errorf("job %s: %w (%s): not written", j.Key, ErrUnplaceable, strings.Join(unplaceable, "; "))
	}
	if a.cfg.Journal != nil {
		if err := a.cfg.Journal(ctx, Write{Job: j.Key, Kind: kind, Units: units, ReadIndex: j.JobModifyIndex}); err != nil {
			return fmt.Errorf("job %s: journaling the %s write: %w: not written", j.Key, kind, err)
		}
	}
	if a.cfg.Guard != nil {
		if err := a.cfg.Guard(ctx); err != nil {
			return fmt.Errorf("job %s: the %s write: %w: not written", j.Key, kind, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("job %s: the %s write: %w: not written", j.Key, kind, context.Cause(ctx))
	}
	resp, _, err := a.jobs.RegisterOpts(job, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: j.JobModifyIndex}, wo)
	if err != nil {
		if IsIndexConflict(err) {
			return fmt.Errorf("job %s: %w (%v)", j.Key, ErrConflict, err)
		}
		return fmt.Errorf("job %s: registering the %s write: %w", j.Key, kind, err)
	}
	a.count(kind)
	a.mu.Lock()
	a.own[j.Key] = resp.JobModifyIndex
	a.mu.Unlock()
	op.index = resp.JobModifyIndex
	if a.cfg.Journal != nil {
		if err := a.cfg.Journal(ctx, Write{Job: j.Key, Kind: kind, Units: units, ReadIndex: j.JobModifyIndex, Applied: true, JobModifyIndex: resp.JobModifyIndex}); err != nil {
			a.cfg.Logger.Warn("write made but not journaled: a restart recognises it from Nomad", "job", j.Key.String(), "error", err)
		}
	}
	j.JobModifyIndex = resp.JobModifyIndex
	if len(units) > 0 && heldTemplate(j.Raw, j.Spec) {
		a.requeue(ctx, j.Key)
	}
	a.cfg.Logger.Debug("job written", "job", j.Key.String(), "kind", kind, "units", len(units), "eval", resp.EvalID, "index", resp.JobModifyIndex)
	return nil
}

// heldTemplate tells whether job, as read before a write, is in the held
// form: its template group counts 1.
func heldTemplate(job *api.Job, spec jobspec.Spec) bool {
	if job == nil {
		return false
	}
	t, err := template(job, spec)
	return err == nil && (t.Count == nil || *t.Count > 0)
}

// template returns the job's template group.
func template(job *api.Job, spec jobspec.Spec) (*api.TaskGroup, error) {
	for _, g := range job.TaskGroups {
		if g != nil && g.Name != nil && *g.Name == spec.Group {
			return g, nil
		}
	}
	return nil, fmt.Errorf("job %q: template group %q is missing", spec.JobID, spec.Group)
}

// requeue asks Nomad to evaluate a job just placed from its held form once
// more. Nomad sets a group's Queued count in the job summary only from an
// evaluation that lists the group: the held form's blocked evaluation left
// the template at Queued 1, and the placing evaluation lists only the
// groups it places, so `nomad job status` would show the template queued
// for the job's whole life (issue 33). An evaluation that has nothing to
// place sets every group's count to 0; Nomad runs a job's evaluations in
// order, so this one runs after the placing one. Best effort: a failure
// leaves only the count wrong.
func (a *Applier) requeue(ctx context.Context, k watch.JobKey) {
	ev, ok := a.jobs.(Evaluator)
	if !ok {
		return
	}
	wo := (&api.WriteOptions{Namespace: k.Namespace}).WithContext(ctx)
	if _, _, err := ev.EvaluateWithOpts(k.ID, api.EvalOptions{}, wo); err != nil {
		a.cfg.Logger.Warn("could not evaluate a placed job again: nomad job status may show its template group queued", "job", k.String(), "error", err)
	}
}

func isNotFound(err error) bool {
	var e api.UnexpectedResponseError
	return errors.As(err, &e) && e.StatusCode() == http.StatusNotFound
}

// IsTransient reports an error of the Nomad API that says nothing of the
// write itself: a 5xx answer (but a check-and-set conflict), a 429, or no
// answer at all. The same write may well pass a moment later.
func IsTransient(err error) bool {
	if err == nil || IsIndexConflict(err) {
		return false
	}
	code := nomadclient.StatusCode(err)
	if code == 0 {
		var ne net.Error
		return errors.As(err, &ne)
	}
	return code >= 500 || code == http.StatusTooManyRequests
}

// IsIndexConflict reports a registration Nomad refused by check-and-set:
// the job's modify index was not the one given (its message is the only
// mark: Nomad answers 500).
func IsIndexConflict(err error) bool {
	return err != nil && strings.Contains(err.Error(), "conflicting job modify index")
}

// Explain renders Nomad's reason for a failed placement in one line.
func Explain(m *api.AllocationMetric) string {
	if m == nil {
		return "no reason given"
	}
	var parts []string
	add := func(what string, counts map[string]int) {
		var keys []string
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %q on %d nodes", what, k, counts[k]))
		}
	}
	add("filtered by", m.ConstraintFiltered)
	add("exhausted", m.DimensionExhausted)
	if m.NodesEvaluated == 0 && len(parts) == 0 {
		return "no node was evaluated"
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d nodes evaluated, none fit", m.NodesEvaluated)
	}
	return strings.Join(parts, ", ")
}

// Step advances every operation in flight against the cluster as now
// seen, and returns those that ended.
func (a *Applier) Step(ctx context.Context, c Cluster) []Outcome {
	a.mu.Lock()
	ops := make([]*Op, 0, len(a.ops))
	for _, op := range a.ops {
		ops = append(ops, op)
	}
	a.mu.Unlock()
	sort.Slice(ops, func(i, j int) bool { return ops[i].Key.String() < ops[j].Key.String() })
	var out []Outcome
	for _, op := range ops {
		if o, ended := a.step(ctx, c, op); ended {
			a.mu.Lock()
			delete(a.ops, op.Key)
			a.mu.Unlock()
			out = append(out, o)
		}
	}
	return out
}

func (a *Applier) step(ctx context.Context, c Cluster, op *Op) (Outcome, bool) {
	if op.Phase == Writing {
		return Outcome{}, false // BeginAfter is writing it
	}
	j := c.Job(op.Key)
	if j == nil {
		return Outcome{Key: op.Key, Phase: Failed, Err: fmt.Errorf("job %s is gone", op.Key)}, true
	}
	now := a.cfg.Now()
	switch op.Phase {
	case Stopping:
		// One look at each group left: whether it ended, and whether it
		// ended with its run done.
		ended, done := a.cfg.DryRun, ""
		if !ended {
			ended = true
			for _, g := range op.Removed {
				gr := c.Group(op.Key, g)
				ended = ended && gr.Ended
				if gr.Done && done == "" {
					done = g
				}
			}
		}
		if !ended && now.Before(op.Deadline) {
			return Outcome{}, false
		}
		if !ended {
			a.cfg.Logger.Warn("evicted workers did not end in time; going on", "job", op.Key.String(), "timeout", a.cfg.StopTimeout)
		}
		if len(op.Added) == 0 {
			return Outcome{Key: op.Key, Phase: Done, Running: op.Target}, true
		}
		if done != "" {
			// The job finished as it was moved (the stop was decided on
			// progress a few seconds old): its new units would run a
			// finished run again from its first step.
			return Outcome{Key: op.Key, Phase: Failed, Running: op.Keep,
				Err: fmt.Errorf("job %s: %w: group %s ended with its run done while it was moved: the start not written", op.Key, ErrFinished, done)}, true
		}
		if ended {
			a.mu.Lock()
			op.stopped = true
			a.mu.Unlock()
			if a.waits(op, c, now) {
				return Outcome{}, false
			}
		}
		return a.writeStart(ctx, j, op, now)
	case Waiting:
		if a.waits(op, c, now) {
			return Outcome{}, false
		}
		return a.writeStart(ctx, j, op, now)
	case Starting:
		running, placed, failed := true, true, ""
		if !a.cfg.DryRun {
			for _, g := range op.Added {
				st := c.Group(op.Key, g)
				running = running && st.Running
				placed = placed && (st.Placed || st.Running)
				if st.Failed != "" && failed == "" {
					failed = g + ": " + st.Failed
				}
			}
		}
		if running {
			return Outcome{Key: op.Key, Phase: Done, Running: op.Target, Started: len(op.Added) > 0}, true
		}
		if placed && op.placed.IsZero() {
			// The gang clock starts when Nomad placed every worker.
			op.placed = now
			op.Deadline = later(op.Deadline, now.Add(a.cfg.GangTimeout))
		}
		if failed == "" && now.Before(op.Deadline) {
			return Outcome{}, false
		}
		unplaced := failed == "" && !placed
		if unplaced && now.Before(op.written.Add(placeWaitFactor*a.cfg.GangTimeout)) {
			// Nomad has not evaluated the write yet (nothing placed,
			// nothing refused): its queue, not the gang.
			return Outcome{}, false
		}
		if !op.spec.Gang {
			// No gang: the workers not running yet stay, for Nomad to
			// place; nothing is rolled back.
			a.cfg.Logger.Info("start without gang: some workers not running yet stay for Nomad to place", "job", op.Key.String(), "waiting", failed)
			return Outcome{Key: op.Key, Phase: Done, Running: op.Target}, true
		}
		// All or nothing: the new workers go again.
		reason := fmt.Errorf("gang start of job %s rolled back: not every worker was running within %v of being placed", op.Key, a.cfg.GangTimeout)
		if unplaced {
			reason = fmt.Errorf("gang start of job %s rolled back: Nomad had not placed every worker within %v of the write", op.Key, placeWaitFactor*a.cfg.GangTimeout)
		}
		if failed != "" {
			reason = fmt.Errorf("gang start of job %s rolled back: Nomad cannot place %s", op.Key, failed)
		}
		rb := &Op{Key: op.Key, Keep: op.Keep, Removed: op.Added, index: op.index, spec: op.spec}
		if err := a.write(ctx, j, op.Keep, "rollback", rb); err != nil {
			reason = fmt.Errorf("%w; the rollback write failed too: %v", reason, err)
		}
		return Outcome{Key: op.Key, Phase: Failed, Err: reason, Running: op.Keep}, true
	}
	return Outcome{Key: op.Key, Phase: op.Phase, Err: op.Err, Running: op.Target}, true
}

// writeStart writes the new units of op, which waited for GPUs to be
// left (its own old workers, or other jobs'): the op then starts, is
// asked again later (placeLater), or fails.
func (a *Applier) writeStart(ctx context.Context, j *Job, op *Op, now time.Time) (Outcome, bool) {
	if now.Before(op.retryAt) {
		return Outcome{}, false
	}
	if err := a.write(ctx, j, op.Target, "start", op); err != nil {
		if a.placeLater(op, err, now) {
			return Outcome{}, false
		}
		return Outcome{Key: op.Key, Phase: Failed, Err: err, Running: op.Keep}, true
	}
	op.Phase, op.Deadline, op.written = Starting, now.Add(a.cfg.GangTimeout), now
	return Outcome{}, false
}

// A start that waited for GPUs to be left and that Nomad's plan refused
// is asked again every placeEvery for placeRetry (within stop_timeout).
const (
	placeRetry = 15 * time.Second
	placeEvery = time.Second
)

// placeLater says whether such a start (err its refusal) is asked again
// later. The workers that left have ended as the watcher sees them, yet
// Nomad's plan has refused such a start for a moment (make test run 79:
// a move's start refused with "no devices match request" 0.4 s after its
// old workers ended, and the job lost its move and a round; why was not
// traced, as Nomad's device accounting skips allocations the client
// reported ended); a start refused for good fails placeRetry later, the
// plan asked once a second meanwhile.
func (a *Applier) placeLater(op *Op, err error, now time.Time) bool {
	if !errors.Is(err, ErrUnplaceable) {
		return false
	}
	if op.refused.IsZero() {
		op.refused = now
	}
	if !now.Before(op.Deadline) || !now.Before(op.refused.Add(placeRetry)) {
		return false
	}
	op.retryAt = now.Add(placeEvery)
	a.cfg.Logger.Debug("Nomad does not place the new workers yet; asking again", "job", op.Key.String(), "in", placeEvery, "error", err)
	return true
}

// waits says whether op's new units must wait on: one of the jobs it
// comes after is still stopping (or its first write still going out), or
// still has an allocation asked to stop on a node the new units take (its
// operation ended, or was another sidecar's), and op's deadline has not
// passed.
func (a *Applier) waits(op *Op, c Cluster, now time.Time) bool {
	nodes := addedNodes(op)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range op.After {
		o := a.ops[k]
		busy := o != nil && (o.Phase == Stopping && !o.stopped || o.Phase == Writing)
		for _, n := range nodes {
			busy = busy || c.Leaving(k, n)
		}
		if busy {
			if now.Before(op.Deadline) {
				return true
			}
			a.cfg.Logger.Warn("the jobs leaving these GPUs did not stop in time; starting anyway", "job", op.Key.String(), "after", k.String(), "timeout", a.cfg.StopTimeout)
			return false
		}
	}
	return false
}

// addedNodes are the nodes of op's new units' workers.
func addedNodes(op *Op) []string {
	var out []string
	for _, u := range op.Target {
		if find(op.Keep, u.ID) != nil {
			continue
		}
		for _, w := range u.Workers {
			if !slices.Contains(out, w.Node) {
				out = append(out, w.Node)
			}
		}
	}
	return out
}

// CancelAll forgets every operation in flight (the leader lost its lease:
// the next leader decides anew from Nomad).
func (a *Applier) CancelAll() {
	a.mu.Lock()
	a.ops = map[watch.JobKey]*Op{}
	a.mu.Unlock()
}

// Cancel forgets the job's operation (a newer decision replaces it).
func (a *Applier) Cancel(k watch.JobKey) {
	a.mu.Lock()
	delete(a.ops, k)
	a.mu.Unlock()
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
