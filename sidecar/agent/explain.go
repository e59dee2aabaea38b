package agent

import (
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// PlanView is what the last plan decided, per job, with why: the policy's
// numbers, where each job runs or why it waits (the planner's reason and
// Nomad's, from the job's blocked evaluation), and its place in the queue.
type PlanView struct {
	Time      time.Time    `json:"time"`
	Kind      engine.Kind  `json:"kind"`
	Policy    string       `json:"policy"`
	Placement string       `json:"placement"`
	DryRun    bool         `json:"dry_run"`
	Round     int          `json:"round"`
	NextRound time.Time    `json:"next_round"`
	Jobs      []JobView    `json:"jobs"`
	Refused   []RefusedJob `json:"refused"`
}

// JobView is one managed job in the plan.
type JobView struct {
	ID        string  `json:"id"`
	Namespace string  `json:"namespace"`
	Job       string  `json:"job"`
	Model     string  `json:"model"`
	Workers   int     `json:"workers"`
	Weight    float64 `json:"weight"`
	// State: running, waiting, starting, stopping.
	State  string        `json:"state"`
	Action engine.Action `json:"action"`
	// Units are where it runs (or is being placed), with racks.
	Units []UnitView `json:"units,omitempty"`
	// Position is its place among waiting jobs (0 first); -1 if running.
	Position int          `json:"position"`
	Reason   round.Reason `json:"reason"`
	// Nomad is Nomad's reason the job's groups cannot be placed, from its
	// blocked evaluations (the gate aside).
	Nomad     string  `json:"nomad,omitempty"`
	StepsDone float64 `json:"steps_done"`
	Steps     float64 `json:"steps"`
	Rate      float64 `json:"rate"`
	ETA       float64 `json:"eta_s"`
	WaitingS  float64 `json:"waiting_s,omitempty"`
}

// UnitView is one unit of a placement.
type UnitView struct {
	Slots []SlotView `json:"slots"`
}

// SlotView is GPUs of one type on one node.
type SlotView struct {
	Node  string          `json:"node"`
	Rack  string          `json:"rack"`
	Type  planner.GPUType `json:"type"`
	Count int             `json:"count"`
}

// RefusedJob is a managed job hadar will not plan, and why.
type RefusedJob struct {
	Job   string `json:"job"`
	Error string `json:"error"`
}

// Plan returns the view of the last plan.
func (a *Agent) Plan() PlanView {
	snap := a.watcher.Snapshot()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.planView(snap)
}

func (a *Agent) planView(snap *watch.Snapshot) PlanView {
	v := PlanView{Time: time.Unix(0, int64(a.last.Time*1e9)), Kind: a.last.Kind, Policy: a.cfg.Policy, Placement: a.cfg.Placement,
		DryRun: a.cfg.DryRun, Round: a.rounds, NextRound: a.next, Jobs: []JobView{}, Refused: []RefusedJob{}}
	decided := map[string]engine.JobDecision{}
	for _, jd := range a.last.Jobs {
		decided[jd.Job] = jd
	}
	now := a.now()
	for _, st := range a.eng.Jobs() {
		jv := JobView{ID: st.Job.ID, Workers: st.Job.ScaleFactor, Weight: st.Job.Weight, Model: st.Job.Model,
			StepsDone: st.Done, Steps: st.Job.TotalSteps, Rate: st.Rate, ETA: st.ETA, Reason: st.Reason, Position: -1}
		var mj *managed
		for _, m := range a.jobs {
			if m.id == st.Job.ID {
				mj = m
			}
		}
		if mj != nil {
			jv.Namespace, jv.Job = mj.key.Namespace, mj.key.ID
			if mj.spec.Model != "" {
				jv.Model = mj.spec.Model
			}
		}
		if jd, ok := decided[st.Job.ID]; ok {
			jv.Action = jd.Action
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
	for _, k := range sortedKeys(a.invalid) {
		v.Refused = append(v.Refused, RefusedJob{Job: k.String(), Error: a.invalid[k].err.Error()})
	}
	return v
}

func (a *Agent) unitView(u planner.Unit) UnitView {
	var uv UnitView
	for _, sl := range u.Slots {
		uv.Slots = append(uv.Slots, SlotView{Node: sl.Node, Rack: a.nodes[sl.Node].Rack, Type: sl.Type, Count: sl.Count})
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
func (a *Agent) Job(id string) (JobView, []Event, bool) {
	p := a.Plan()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, jv := range p.Jobs {
		if jv.ID == id || jv.Job == id {
			var evs []Event
			for _, ev := range a.history {
				if ev.Job == jv.ID {
					evs = append(evs, ev)
				}
			}
			return jv, evs, true
		}
	}
	return JobView{}, nil, false
}

// History returns the recent decisions, newest last.
func (a *Agent) History() []Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Event(nil), a.history...)
}

// WriteTable prints a plan for a person: one line per job.
func WriteTable(b *strings.Builder, p PlanView) {
	fmt.Fprintf(b, "%s plan at %s, policy %s, placement %s", p.Kind, p.Time.Format(time.RFC3339), p.Policy, p.Placement)
	if p.DryRun {
		b.WriteString(" (dry run: nothing written)")
	}
	b.WriteString("\n\n")
	fmt.Fprintf(b, "%-28s %-8s %-8s %-26s %s\n", "JOB", "STATE", "ACTION", "GPUS", "WHY")
	for _, jv := range p.Jobs {
		where := "-"
		if len(jv.Units) > 0 {
			var us []string
			for _, u := range jv.Units {
				var ss []string
				for _, s := range u.Slots {
					ss = append(ss, fmt.Sprintf("%dx%s@%s/%s", s.Count, s.Type, s.Node[:min(8, len(s.Node))], s.Rack))
				}
				us = append(us, strings.Join(ss, "+"))
			}
			where = strings.Join(us, " | ")
		}
		why := jv.Reason.Why
		if jv.Position >= 0 {
			why = fmt.Sprintf("#%d in queue: %s", jv.Position+1, why)
		}
		if jv.Nomad != "" {
			why += " (Nomad: " + jv.Nomad + ")"
		}
		fmt.Fprintf(b, "%-28s %-8s %-8s %-26s %s\n", jv.ID, jv.State, jv.Action, where, why)
	}
	for _, r := range p.Refused {
		fmt.Fprintf(b, "%-28s %-8s %-8s %-26s %s\n", r.Job, "refused", "-", "-", r.Error)
	}
}

// Health is the sidecar's state for /v1/health.
type Health struct {
	OK bool `json:"ok"`
	// Synced is when the view of Nomad was last fully re-listed; Index
	// the Nomad index it reflects.
	Synced time.Time `json:"synced"`
	Index  uint64    `json:"index"`
	// LastPlan is when the engine last planned; Rounds how many round
	// boundaries it planned.
	LastPlan time.Time `json:"last_plan"`
	Rounds   int       `json:"rounds"`
	// Cycles counts the sidecar's cycles (sync, plan, act) since it
	// started: every second, and at once on events.
	Cycles   int            `json:"cycles"`
	Jobs     int            `json:"jobs"`
	Refused  int            `json:"refused"`
	InFlight int            `json:"in_flight"`
	Writes   map[string]int `json:"writes"`
	// Repairs counts the plans' parts the engine replaced so the rest
	// could go ahead, by kind (RepairPlacement, RepairFallback).
	Repairs map[string]int `json:"repairs,omitempty"`
	DryRun  bool           `json:"dry_run"`
	// Leader: this replica acts (always, without an election); Replica
	// names it and Generation is its lock generation.
	Leader     bool   `json:"leader"`
	Replica    string `json:"replica"`
	Generation uint64 `json:"generation"`
	Problem    string `json:"problem,omitempty"`
}

// Health reports whether the sidecar is synced with Nomad and planning.
func (a *Agent) Health() Health {
	st := a.watcher.Stats()
	snap := a.watcher.Snapshot()
	a.mu.Lock()
	defer a.mu.Unlock()
	h := Health{Synced: snap.Synced, Index: st.Index, LastPlan: time.Unix(0, int64(a.last.Time*1e9)), Rounds: a.rounds, Cycles: a.cycles,
		Jobs: len(a.jobs), Refused: len(a.invalid), InFlight: len(a.applier.Ops()), Writes: a.applier.Writes(), Repairs: maps.Clone(a.repairs), DryRun: a.cfg.DryRun,
		Leader: a.leading(), Replica: a.id, Generation: a.generation()}
	switch {
	case snap.Synced.IsZero():
		h.Problem = "not yet synced with Nomad"
	case a.rounds == 0:
		h.Problem = "no round planned yet"
	case a.saveErr != nil:
		h.Problem = "the state cannot be saved: " + a.saveErr.Error()
	default:
		h.OK = true
	}
	return h
}
