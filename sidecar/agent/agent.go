// Package agent is the hadar sidecar's lifecycle: it watches a Nomad
// cluster (sidecar/watch), keeps the round engine (planner/engine) in step
// with what Nomad runs, plans every round and at once when jobs arrive or
// complete or nodes change, and carries decisions out through
// sidecar/apply. The engine does all the deciding and all the round
// bookkeeping; the agent only translates between Nomad and the engine.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/feasible"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/state"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Agent is one sidecar.
type Agent struct {
	cfg config.Config
	id  string // this replica's ID (journal, leader election)
	log hclog.Logger
	// collaborators are the Nomad client, the watcher, the applier, the
	// feasibility cache, the beliefs and the GPU types (collab.go).
	collaborators
	clock func() time.Time
	// mono is the engine's clock (now): monotonic within the process.
	mono *monoClock

	mu sync.Mutex // guards the rest; HTTP handlers read under it
	// core is the round engine and its estimates (core.go).
	core core
	// roster is the managed jobs: admitted, refused, and the GPUs each gives
	// up while its write is in flight (registry.go).
	roster roster
	// cluster mirrors the nodes the engine was told of (mirror.go).
	cluster mirror
	// record is what the agent decided (record.go).
	record record
	// learning is the overlay file reloaded and the gaps warned of (overlay.go).
	learning learnState
	queues   queueState // the team queues (queues.go)
	// pace is when the next boundary is due, the warnings silenced, and
	// who is told of each cycle (pace.go).
	pace  pacer
	ports *apply.Ports
	// ahead is how progress is read, and ReadAhead's state (readahead.go).
	ahead readAhead
	// out holds the job writes going out in the background (act) until
	// collectWrites records how they went.
	out *outbox

	// ledger is the state store and where the agent stands in it.
	ledger ledger

	// lead is this replica's part in the election.
	lead
}

// managed is a job admitted to the engine.
type managed struct {
	key      watch.JobKey
	id       string // engine job ID
	spec     jobspec.Spec
	version  uint64 // the job version its spec was read from
	model    string
	arrival  time.Time
	failures int
	// lastFailure is the reason of the last failed run, sameFailures how
	// many runs in a row failed for it, failedVersion the job version of
	// the last failure counted.
	lastFailure   string
	sameFailures  int
	failedVersion uint64
	units         int // highest unit number ever seen + 1
	// refusals counts placements in a row Nomad refused or rolled back.
	refusals int
	// feas is where it may run, as last told to the engine.
	feas feasible.Result
}

type invalidJob struct {
	err   error
	index uint64
	// noted is the JobModifyIndex at which the error was written onto the
	// job (or found there).
	noted uint64
	// admission: the spec parsed but the engine refused the job (its
	// profile); such a refusal lasts until an admission succeeds.
	admission bool
	// held: a valid job whose workers failed on every start (failedRun),
	// with the spec it failed on; it stays held until stillHeld says not.
	held bool
	spec jobspec.Spec
}

// New builds an agent on a Nomad client from a resolved configuration
// (config.Config.Resolve); it does not contact Nomad yet.
func New(cfg config.Config, client *api.Client, logger hclog.Logger) (*Agent, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	host, _ := os.Hostname()
	portLow, portHigh, _ := cfg.RendezvousPorts.Bounds() // validated with the config
	a := &Agent{
		id: fmt.Sprintf("%s-%d", host, os.Getpid()), cfg: cfg, log: logger,
		clock: time.Now, roster: newRoster(),
		ports: apply.NewPorts(portLow, portHigh),
		out:   newOutbox(writers),
	}
	var err error
	if a.collaborators, err = newCollaborators(cfg, client, logger, a.loadOverlay); err != nil {
		return nil, err
	}
	a.mono = newMonoClock(a.clock())
	a.ahead.init(a.watcher.Progress, progressEvery)
	a.core.build = a.buildEngine
	if err := a.core.start(); err != nil {
		return nil, err
	}
	store, err := openStore(cfg, client)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.openState(ctx, store); err != nil {
		if store != nil {
			store.Close()
		}
		return nil, err
	}
	if a.lock, err = newLock(cfg, client, a.id, a); err != nil {
		return nil, err
	}
	acfg := apply.Config{GangTimeout: cfg.GangTimeout.Duration(), StopTimeout: cfg.StopTimeout.Duration(), DryRun: cfg.DryRun, Logger: logger.Named("apply"), Journal: a.fence, Guard: a.guard,
		Form: formOptions(cfg)}
	a.applier = apply.New(client.Jobs(), acfg)
	return a, nil
}

// fence is called before and after every write: a replica that is not the
// leader makes none, and every write is journaled with the generation of
// the lease it was decided under.
func (a *Agent) fence(ctx context.Context, w apply.Write) error {
	if !w.Applied {
		if err := a.guard(ctx); err != nil {
			return err
		}
	}
	if a.ledger.store == nil {
		return nil
	}
	return a.journal(ctx, w)
}

// openStore opens the configured state store (nil for "none").
func openStore(cfg config.Config, client *api.Client) (state.Store, error) {
	switch cfg.State.Store {
	case "file":
		return state.OpenBolt(cfg.State.Path, 10*time.Second)
	case "nomad":
		return state.NewVariables(client, cfg.State.Namespace, cfg.State.Prefix), nil
	}
	return nil, nil
}

// Close saves the state one last time and closes the store.
func (a *Agent) Close() error {
	// The writes still going out return first (their context ended with
	// Run's), so the state saved says how each went.
	a.settleWrites()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ledger.store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if a.acting() {
		// Only the acting replica writes the state: a follower's view must
		// never overwrite the leader's in a shared store.
		err = a.save(ctx, a.watcher.Stats().Index)
	}
	if cerr := a.ledger.store.Close(); err == nil {
		err = cerr
	}
	a.ledger.store = nil
	return err
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// leaderID and generation name this replica and its lock generation in
// the journal (without an election: its ID, generation 0).
func (a *Agent) leaderID() string { return a.id }

// buildEngine builds the estimates, the scheduler with its placement
// policy, and an engine over them: a fresh one, or (snapshot not nil) one
// restored from a snapshot. It is the core's build.
func (a *Agent) buildEngine(snapshot []byte) (*engine.Engine, *engine.Estimates, error) {
	est, err := engine.NewEstimates(a.prof, a.learnConfig())
	if err != nil {
		return nil, nil, err
	}
	model := speed.Model{Profile: est, Network: a.net}
	sched, err := a.scheduler(model)
	if err != nil {
		return nil, nil, err
	}
	cfg := engine.Config{Round: a.cfg.Round.Duration().Seconds(), Speed: model, MinRunTime: a.cfg.MinRunTime.Duration().Seconds(), MaxMinRunTime: a.cfg.MaxMinRunTime.Duration().Seconds(), StartsReported: true}
	if snapshot != nil {
		e, err := engine.Restore(snapshot, cfg, sched)
		return e, est, err
	}
	e, err := engine.New(cfg, sched)
	return e, est, err
}

// plan plans on the engine when this replica acts, else (a dry run, a
// follower) on a copy of it (core.plan), and keeps the queues' status of
// the engine it planned on.
func (a *Agent) plan(ctx context.Context, now float64, kind engine.Kind, acting bool) (engine.Decision, error) {
	d, on, err := a.core.plan(ctx, now, kind, acting)
	if on != nil {
		a.noteQueues(on)
	}
	return d, err
}

// now is the engine time of the process's monotonic clock (monoClock),
// never before the engine's own clock: a time taken before a write that
// deferred a job must not make the engine refuse the round. Called under
// a.mu.
func (a *Agent) now() float64 {
	return a.core.now(a.mono.now())
}

// OnCycle registers f to be told each cycle's kind (Fill or Boundary) and
// how long it took (telemetry's round duration). f runs under the agent's
// lock: it must not call back into the agent.
func (a *Agent) OnCycle(f func(engine.Kind, time.Duration)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pace.report(f)
}

// Watcher exposes the watcher (status, metrics).
func (a *Agent) Watcher() *watch.Watcher { return a.watcher }

// Applier exposes the applier (status, metrics).
func (a *Agent) Applier() *apply.Applier { return a.applier }

// stepInterval is how often operations in flight are advanced.
const stepInterval = time.Second

// Run runs the sidecar until ctx ends. A leader shuts down in the order
// that lets the next one start at once and from the latest state: its
// writes settle, it saves the state under its lease, then it releases the
// lock (a follower waits only the lock delay, not the lease's TTL).
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var campaigning sync.WaitGroup
	defer func() {
		cancel()
		campaigning.Wait()
		if err := a.Close(); err != nil {
			a.log.Error("saving the state at shutdown failed", "error", err)
		}
		a.resign()
	}()
	werr := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { werr <- a.watcher.Run(wctx) }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-werr:
		return watcherEnded(ctx, err)
	case <-a.watcher.Ready():
	}
	ahead := make(chan struct{})
	defer func() { stop(); <-ahead }()
	go func() { defer close(ahead); a.ReadAhead(wctx) }()
	a.log.Info("sidecar started", "policy", a.cfg.Policy, "placement", a.cfg.Placement, "round", a.cfg.Round.Duration(), "dry_run", a.cfg.DryRun, "replica", a.id)
	if a.lock != nil {
		a.log.Info("following until it holds the leader lock", "lock", a.lock.Where())
		campaigning.Add(1)
		go func() { defer campaigning.Done(); a.campaign(ctx) }()
	}
	a.mu.Lock()
	a.pace.planAt(a.clock())
	a.mu.Unlock()
	tick := time.NewTicker(stepInterval)
	defer tick.Stop()
	for {
		if err := a.Cycle(ctx, false); err != nil && !errors.Is(err, context.Canceled) {
			a.log.Error("cycle failed; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-werr:
			return watcherEnded(ctx, err)
		case <-a.watcher.Changes():
		case <-a.out.wake():
		case <-tick.C:
		}
	}
}

// formOptions is how worker groups are written: the storage block's
// shared storage, or none without one.
func formOptions(cfg config.Config) jobform.Options {
	st := cfg.Storage
	if st == nil {
		return jobform.Options{NoSharedStorage: true}
	}
	return jobform.Options{CheckpointVolume: st.CheckpointVolume, MergeVolume: st.MergeVolume, MountDir: st.MountDir,
		CheckpointMeta: st.CheckpointMeta, MergeMeta: st.MergeMeta, KillTimeout: st.KillTimeout.Duration()}
}

// watcherEnded is what Run returns when the watcher stopped: nothing when
// the sidecar is stopping (the watcher's nil and ctx.Done race in a
// select), else why it stopped.
func watcherEnded(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("stopped without an error while the sidecar runs")
	}
	return fmt.Errorf("watcher: %w", err)
}

// Cycle brings the engine in step with the cluster, advances the writes
// in flight, and plans: a boundary when the round is due (or force), else
// a fill, which does nothing when nothing changed. A boundary plans on the
// progress ReadAhead read just before it, or, when nothing reads ahead,
// reads every running job's progress first.
func (a *Agent) Cycle(ctx context.Context, force bool) error {
	return a.cycleOn(ctx, a.watcher.Snapshot(), force)
}

// cycleOn is Cycle on a given view of the cluster.
func (a *Agent) cycleOn(ctx context.Context, snap *watch.Snapshot, force bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := a.clock()
	a.ledger.planIndex.Store(snap.Index)
	a.record.cycle()
	a.collectWrites()
	var stepped []apply.Outcome
	if sctx, cancel, ok := a.underLease(ctx); ok {
		stepped = a.applier.Step(sctx, clusterView{a, snap})
		cancel()
	}
	for _, o := range stepped {
		a.outcome(o, snap)
	}
	// After the outcomes: a failed one defers its job at the current time.
	now := a.now()
	if err := a.sync(snap, now); err != nil {
		return err
	}
	a.cluster.synced(snap)
	acting := a.acting()
	if acting {
		a.recheckJournal(ctx, snap)
		a.noteRefusals(ctx, snap)
	}
	boundary := force || a.pace.due(a.clock())
	if boundary && !a.ahead.running() {
		a.applyProgress(a.readProgress(ctx, a.progressReads(snap)))
		now = a.now()
	}
	kind := engine.Fill
	if boundary {
		kind = engine.Boundary
	}
	a.reloadOverlay()
	d, err := a.plan(ctx, now, kind, acting)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if a.pace.reporting() {
		defer func() { a.pace.cycled(kind, a.clock().Sub(start)) }()
	}
	if boundary {
		a.record.round()
		a.pace.planned(a.clock(), a.cfg.Round.Duration())
		a.ahead.passed()
	}
	a.noteRepairs(d, acting)
	a.warnGaps(acting)
	if d.Kind != engine.None {
		a.record.decided(d)
		if acting {
			a.act(ctx, snap, d)
		}
	}
	if acting && (d.Kind != engine.None || boundary || len(stepped) > 0) {
		if err := a.save(ctx, snap.Index); err != nil {
			if a.ledger.saved(err) {
				a.log.Error("saving the state failed: a restart now would rebuild from Nomad alone", "store", a.ledger.store.Where(), "error", err)
			}
		} else {
			a.ledger.saved(nil)
		}
	}
	return nil
}

// noteRepairs logs and counts what the engine mended in the scheduler's
// answer: the plan went ahead without those parts.
func (a *Agent) noteRepairs(d engine.Decision, acting bool) {
	if !acting {
		return
	}
	for _, r := range d.Repairs {
		kind := wire.RepairPlacement
		if r.Job == "" {
			kind = wire.RepairFallback
		}
		a.record.repaired(kind)
		a.log.Warn("the scheduler's plan was repaired; the other jobs go ahead", "policy", a.cfg.Policy, "kind", kind, "job", r.Job, "why", r.Why)
	}
}

// outcome records how an operation ended.
func (a *Agent) outcome(o apply.Outcome, snap *watch.Snapshot) {
	mj := a.roster.job(o.Key)
	switch o.Phase {
	case apply.Failed:
		a.note(wire.Event{Time: a.clock(), Job: o.Key.String(), Result: "failed: " + o.Err.Error()})
		if errors.Is(o.Err, apply.ErrFinished) {
			// Finished as it was moved: complete once Nomad reports it
			// dead (finished, doneOnItsOwn), no back-off.
			a.log.Info("placement change stopped: the job finished as it was moved", "job", o.Key.String(), "error", o.Err)
			break
		}
		if errors.Is(o.Err, apply.ErrConflict) || errors.Is(o.Err, apply.ErrNotManaged) || errors.Is(o.Err, apply.ErrNotVisible) {
			// Someone else changed the job: decided anew on what they
			// wrote, no back-off.
			a.log.Info("placement change stopped: the job changed under it", "job", o.Key.String(), "error", o.Err)
			break
		}
		a.log.Warn("placement change failed", "job", o.Key.String(), "error", o.Err)
		if mj != nil {
			a.backOff(mj, o.Err)
			// A gang rolled back because a worker failed to start (the
			// driver refused the task): a failed run, as if Nomad had
			// reported the job dead, which it does not once the rollback
			// holds it again.
			if al := newestFailed(snap, o.Key); al != nil {
				a.failedRun(snap, mj, al.JobVersion, fmt.Sprintf("allocation %s %s (%s)", shortID(al.ID), al.ClientStatus, al.ClientDescription), a.now())
			}
		}
	case apply.Done:
		if mj != nil {
			mj.refusals = 0
			if o.Started {
				// Run time counts from here: task setup is not run time.
				if err := a.core.eng.Started(mj.id, a.now()); err != nil {
					a.log.Debug("started", "job", mj.id, "error", err)
				}
			}
		}
	}
}

// note records ev in the agent's history.
func (a *Agent) note(ev wire.Event) { a.record.note(ev) }

// engineID is the engine's job ID of a Nomad job.
func engineID(k watch.JobKey) string { return k.String() }

// sortedKeys lists map keys sorted.
func sortedKeys[V any](m map[watch.JobKey]V) []watch.JobKey {
	out := make([]watch.JobKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// PlanOnce syncs with the cluster once and plans a round boundary on a
// copy of the engine, writing nothing: `hadar plan`.
func (a *Agent) PlanOnce(ctx context.Context) (wire.PlanView, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	werr := make(chan error, 1)
	go func() { werr <- a.watcher.Run(wctx) }()
	select {
	case <-ctx.Done():
		return wire.PlanView{}, fmt.Errorf("waiting for Nomad: %w", ctx.Err())
	case err := <-werr:
		if ctx.Err() != nil {
			return wire.PlanView{}, fmt.Errorf("waiting for Nomad: %w", ctx.Err())
		}
		return wire.PlanView{}, watcherEnded(ctx, err)
	case <-a.watcher.Ready():
	}
	dry := a.cfg.DryRun
	a.cfg.DryRun = true
	defer func() { a.cfg.DryRun = dry }()
	if err := a.Cycle(ctx, true); err != nil {
		return wire.PlanView{}, err
	}
	return a.Plan(), nil
}
