package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/state"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// agentStateV1 is the agent's own bookkeeping in the saved state (beside
// the engine's snapshot), version 1 with state.Version.
type agentStateV1 struct {
	Jobs    []jobBook    `json:"jobs"`
	History []wire.Event `json:"history"`
	Rounds  int          `json:"rounds"`
	Next    time.Time    `json:"next_round"`
}

// jobBook is what the agent knows of an admitted job that the engine does
// not: its contract as admitted (the engine's model key of a job that
// declares its own throughputs must be known before the engine restores),
// and its counters.
type jobBook struct {
	Spec     jobspec.Spec `json:"spec"`
	Version  uint64       `json:"version"`
	Units    int          `json:"units"`
	Failures int          `json:"failures"`
	Refusals int          `json:"refusals"`
}

// openState opens the configured store and, when it holds a state,
// restores the engine and the bookkeeping from it. A state it cannot read
// stops the sidecar: it never plans on half-loaded state.
func (a *Agent) openState(ctx context.Context, store state.Store) error {
	a.ledger.store = store
	if store == nil {
		return nil
	}
	saved, err := store.Load(ctx)
	if err != nil {
		return err
	}
	if saved == nil {
		a.log.Info("no saved state: starting from Nomad alone", "store", store.Where())
		return nil
	}
	var st agentStateV1
	if err := round.StrictUnmarshal(saved.Agent, &st); err != nil {
		return fmt.Errorf("%w: %s: agent state: %v (move it aside to start afresh from Nomad)", state.ErrUnreadable, store.Where(), err)
	}
	if err := a.sameLearning(saved.Engine); err != nil {
		return fmt.Errorf("%w: %s: %v", state.ErrUnreadable, store.Where(), err)
	}
	// The job profile must know the jobs' own figures before the engine
	// recomputes their throughputs.
	jobs := map[watch.JobKey]*managed{}
	for _, b := range st.Jobs {
		k := watch.JobKey{Namespace: b.Spec.Namespace, ID: b.Spec.JobID}
		jobs[k] = &managed{key: k, id: engineID(k), spec: b.Spec, version: b.Version, model: a.declare(b.Spec),
			units: b.Units, failures: b.Failures, refusals: b.Refusals}
	}
	eng, est, err := a.core.build(saved.Engine)
	if err != nil {
		for _, mj := range jobs {
			a.prof.Forget(mj.model)
		}
		return fmt.Errorf("%w: %s: %v (move it aside to start afresh from Nomad)", state.ErrUnreadable, store.Where(), err)
	}
	for k, mj := range jobs {
		if _, ok := eng.Job(mj.id); !ok {
			a.prof.Forget(mj.model)
			delete(jobs, k)
			continue
		}
		a.net.SetSensitivity(mj.id, mj.spec.Sensitivity)
	}
	if ahead := a.mono.runFrom(eng.Now()); ahead > 0 {
		// Saved while the wall clock was ahead (or by a host whose clock
		// is): the engine's time never goes back, so it runs on from the
		// saved time rather than waiting for the wall clock.
		a.log.Warn("saved state's engine time is ahead of this host's clock: engine time runs on from it", "ahead", time.Duration(ahead*float64(time.Second)).String())
	}
	a.core.adopt(eng, est)
	a.roster.restore(jobs)
	nodes, drained := eng.Nodes()
	a.cluster.restore(nodes, drained)
	for _, n := range nodes {
		a.net.SetNode(belief.Node{ID: n.ID, Rack: n.Rack, GPUs: n.GPUs})
	}
	a.record.restore(st.History, st.Rounds)
	a.pace.planAt(st.Next)
	a.ledger.restored(saved.JournalSeq)
	a.log.Info("state restored", "store", store.Where(), "saved_at", saved.At, "jobs", len(jobs), "nodes", len(nodes), "rounds", st.Rounds)
	return nil
}

// save writes the engine's snapshot and the bookkeeping to the store.
func (a *Agent) save(ctx context.Context, index uint64) error {
	if a.ledger.store == nil {
		return nil
	}
	eng, err := a.core.eng.Snapshot()
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	st := agentStateV1{History: a.record.history, Rounds: a.record.rounds, Next: a.pace.nextRound()}
	for _, k := range a.roster.keys() {
		mj := a.roster.job(k)
		st.Jobs = append(st.Jobs, jobBook{Spec: mj.spec, Version: mj.version, Units: mj.units, Failures: mj.failures, Refusals: mj.refusals})
	}
	raw, err := jsonMarshal(st)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return a.ledger.store.Save(ctx, &state.Saved{Engine: eng, Agent: raw, At: a.clock(), Index: index, JournalSeq: a.ledger.journalSeq(), Leader: a.leaderID(), Generation: a.generation()})
}

// journal records a write in the store's journal (apply.Config.Journal).
func (a *Agent) journal(ctx context.Context, w apply.Write) error {
	planned := a.ledger.planIndex.Load()
	if idx, ok := ctx.Value(plannedKey{}).(uint64); ok {
		planned = idx // a write that went out in the background
	}
	e := state.Entry{Time: a.clock(), Job: w.Job.String(), Kind: w.Kind, PlannedIndex: planned, ReadIndex: w.ReadIndex,
		Applied: w.Applied, JobModifyIndex: w.JobModifyIndex, Leader: a.leaderID(), Generation: generationOf(ctx)}
	for _, u := range w.Units {
		e.Units = append(e.Units, u.Planner())
	}
	seq, err := a.ledger.store.Append(ctx, e)
	if err != nil {
		return err
	}
	a.ledger.appended(seq)
	return nil
}

// generationOf is the generation of the lease a write was decided under (0
// without an election).
func generationOf(ctx context.Context) uint64 {
	if l := leaseOf(ctx); l != nil {
		return l.Generation
	}
	return 0
}

// recheckJournal compares the writes journaled after the restored state
// with what Nomad shows, once, after the first sync: an intent without its
// applied entry is applied if the job carries that placement, else it was
// not made; either way nothing is re-applied (the engine follows Nomad).
func (a *Agent) recheckJournal(ctx context.Context, snap *watch.Snapshot) {
	from, ok := a.ledger.takeRecheck()
	if !ok {
		return
	}
	es, err := a.ledger.store.Journal(ctx, from)
	if err != nil {
		a.log.Warn("journal unreadable: relying on Nomad alone", "store", a.ledger.store.Where(), "error", err)
		return
	}
	applied := map[string]bool{}
	for _, e := range es {
		if e.Applied {
			applied[fmt.Sprintf("%s@%d", e.Job, e.ReadIndex)] = true
		}
	}
	recognised, lost := 0, 0
	for _, e := range es {
		if e.Applied || applied[fmt.Sprintf("%s@%d", e.Job, e.ReadIndex)] {
			continue
		}
		if a.carries(snap, e) {
			recognised++
		} else {
			lost++
		}
	}
	a.log.Info("journal re-checked against Nomad", "entries_after_state", len(es), "unconfirmed_writes_found_in_nomad", recognised, "unconfirmed_writes_not_made", lost)
}

// carries reports whether the job in snap is written with e's placement.
func (a *Agent) carries(snap *watch.Snapshot, e state.Entry) bool {
	for _, j := range snap.ManagedJobs() {
		if engineID(j.Key()) != e.Job || j.Raw == nil || j.Spec == nil {
			continue
		}
		us, err := j.Units, j.UnitsErr
		if err != nil || len(us) != len(e.Units) {
			return false
		}
		var p planner.Placement
		for _, u := range us {
			p.Units = append(p.Units, u.Planner())
		}
		return samePlacement(p, planner.Placement{Units: e.Units})
	}
	return false
}
