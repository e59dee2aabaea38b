package agent

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Plan returns the view of the last plan.
func (a *Agent) Plan() wire.PlanView {
	snap := a.watcher.Snapshot()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.planView(snap)
}

func (a *Agent) planView(snap *watch.Snapshot) wire.PlanView {
	last := a.record.last
	v := wire.PlanView{Time: time.Unix(0, int64(last.Time*1e9)), Kind: wireKind(last.Kind), Policy: a.cfg.Policy, Placement: a.cfg.Placement,
		DryRun: a.cfg.DryRun, Round: a.record.rounds, NextRound: a.pace.nextRound(), Jobs: []wire.JobView{}, Refused: []wire.RefusedJob{}}
	decided := map[string]engine.JobDecision{}
	for _, jd := range last.Jobs {
		decided[jd.Job] = jd
	}
	now := a.now()
	for _, st := range a.core.eng.Jobs() {
		jv := wire.JobView{
			JobIdentity: wire.JobIdentity{ID: st.Job.ID, Workers: st.Job.ScaleFactor, Widths: st.Job.Widths, Weight: st.Job.Weight, Model: st.Job.Model},
			JobDecision: wire.JobDecision{Reason: wireReason(st.Reason), Position: -1},
			JobProgress: wire.JobProgress{StepsDone: st.Done, Steps: st.Job.TotalSteps, Rate: st.Rate, ETA: st.ETA},
			StalledS:    st.StalledS}
		if st.ReportedAt > 0 {
			age := math.Max(0, now-st.ReportedAt)
			jv.ProgressAgeS = &age
		}
		a.queueView(&jv, st.Job.Queue)
		var mj *managed
		for m := range a.roster.all() {
			if m.id == st.Job.ID {
				mj = m
			}
		}
		if mj != nil {
			jv.Namespace, jv.Job = mj.key.Namespace, mj.key.ID
			if mj.spec.Model != "" {
				jv.Model = mj.spec.Model
			}
			jv.MinRunTimeS, jv.MinRunTimeCap = a.minRunView(mj.spec.MinRunTime, st.Job.Queue)
		}
		if jd, ok := decided[st.Job.ID]; ok {
			jv.Action = wireAction(jd.Action)
			if !st.Running {
				jv.Position = jd.Position
			}
		}
		jv.State = "waiting"
		if st.Running {
			jv.State = "running"
			for _, u := range st.Placement.Units {
				jv.Units = append(jv.Units, a.unitView(u))
			}
		} else {
			jv.WaitingS = now - st.WaitingSince
		}
		if mj != nil {
			if op := a.applier.InFlight(mj.key); op != nil {
				jv.State = string(op.Phase)
			}
			jv.Nomad = nomadReason(snap, mj.key)
		}
		v.Jobs = append(v.Jobs, jv)
	}
	for _, k := range a.roster.refused() {
		iv, _ := a.roster.refusal(k)
		v.Refused = append(v.Refused, wire.RefusedJob{Job: k.String(), Error: iv.err.Error()})
	}
	return v
}

// minRunView is the minimum run time a job is held to, in seconds, given
// its own hadar.min_run_time (0: none) and its queue, and, when the
// operator's cap cut its own, which cap did (the sidecar's
// max_min_run_time, or its queue's).
func (a *Agent) minRunView(own time.Duration, queueName string) (float64, string) {
	if own <= 0 {
		return a.cfg.MinRunTime.Duration().Seconds(), ""
	}
	got, capped := own, ""
	if c := a.cfg.MaxMinRunTime.Duration(); c > 0 && got > c {
		got, capped = c, fmt.Sprintf("hadar.min_run_time %v capped to %v (the sidecar's max_min_run_time)", own, c)
	}
	if q, ok := a.cfg.QueueConfig.Find(queueName); ok && q.MaxMinRunTime > 0 {
		if c := time.Duration(q.MaxMinRunTime * float64(time.Second)); got > c {
			got, capped = c, fmt.Sprintf("hadar.min_run_time %v capped to %v (queue %s's max_min_run_time)", own, c, q.Name)
		}
	}
	return got.Seconds(), capped
}

func (a *Agent) unitView(u planner.Unit) wire.UnitView {
	var uv wire.UnitView
	for _, sl := range u.Slots {
		n, _ := a.cluster.node(sl.Node)
		uv.Slots = append(uv.Slots, wire.SlotView{Node: sl.Node, Rack: n.Rack, Type: string(sl.Type), Count: sl.Count})
	}
	return uv
}

// nomadReason summarises why Nomad cannot place the job's groups, from
// its blocked evaluations, leaving out the gate (that one is hadar's own
// hold, explained by the planner's reason).
func nomadReason(snap *watch.Snapshot, k watch.JobKey) string {
	var parts []string
	for _, ev := range snap.BlockedEvalsOf(k) {
		groups := make([]string, 0, len(ev.FailedTGAllocs))
		for g := range ev.FailedTGAllocs {
			groups = append(groups, g)
		}
		sort.Strings(groups)
		for _, g := range groups {
			m := ev.FailedTGAllocs[g]
			if m == nil {
				continue
			}
			gated := false
			for c := range m.ConstraintFiltered {
				gated = gated || strings.Contains(c, jobspec.GateAttribute)
			}
			if gated && len(m.DimensionExhausted) == 0 {
				continue
			}
			parts = append(parts, fmt.Sprintf("%s: %s", g, apply.Explain(m)))
		}
	}
	return strings.Join(parts, "; ")
}

// Job returns one job's view and its recent decisions.
func (a *Agent) Job(id string) (wire.JobView, []wire.Event, bool) {
	p := a.Plan()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, jv := range p.Jobs {
		if jv.ID == id || jv.Job == id {
			return jv, a.record.eventsOf(jv.ID), true
		}
	}
	return wire.JobView{}, nil, false
}

// History returns the recent decisions, newest last.
func (a *Agent) History() []wire.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.record.events()
}

// Health reports whether the sidecar is synced with Nomad and planning.
func (a *Agent) Health() wire.Health {
	st := a.watcher.Stats()
	snap := a.watcher.Snapshot()
	a.mu.Lock()
	defer a.mu.Unlock()
	h := wire.Health{Synced: snap.Synced, Index: st.Index, LastPlan: time.Unix(0, int64(a.record.last.Time*1e9)), Rounds: a.record.rounds, Cycles: a.record.cycles,
		Jobs: a.roster.count(), Refused: a.roster.refusedCount(), InFlight: len(a.applier.Ops()), Writes: a.applier.Writes(), Repairs: a.record.repairCounts(), DryRun: a.cfg.DryRun,
		Leader: a.leading(), Replica: a.id, Generation: a.generation(), LeaderGained: int(a.gained.Load()), LeaderLost: int(a.lost.Load())}
	switch {
	case snap.Synced.IsZero():
		h.Problem = "not yet synced with Nomad"
	case a.record.rounds == 0:
		h.Problem = "no round planned yet"
	case a.ledger.saveErr != nil:
		h.Problem = "the state cannot be saved: " + a.ledger.saveErr.Error()
	default:
		h.OK = true
	}
	return h
}
