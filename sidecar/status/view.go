package status

import (
	"sort"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// maxDecisions bounds the decisions /v1/status carries.
const maxDecisions = 50

func progress(done, steps float64) float64 {
	if steps <= 0 {
		return 0
	}
	return min(1, max(0, done/steps))
}

func eta(obs time.Time, s float64) *time.Time {
	if s <= 0 {
		return nil
	}
	t := obs.Add(time.Duration(s * float64(time.Second))).Truncate(time.Second)
	return &t
}

// progressAt is when progress age seconds old at obs was reported.
func progressAt(obs time.Time, age *float64) *time.Time {
	if age == nil {
		return nil
	}
	t := obs.Add(-time.Duration(*age * float64(time.Second))).Truncate(time.Second)
	return &t
}

// buildStatus assembles /v1/status from one observation.
func buildStatus(o wire.Observation, h wire.Health, hist []wire.Event, util []wire.UtilPoint) wire.Status {
	s := wire.Status{Time: o.Time, Sidecar: wire.SidecarStatus{Policy: o.Plan.Policy, Placement: o.Plan.Placement, DryRun: o.Plan.DryRun, Leader: o.Leader,
		Replica: h.Replica, Round: o.Plan.Round, NextRound: o.Plan.NextRound, LastPlan: o.Plan.Time, OK: h.OK, Problem: h.Problem},
		GPUs: []wire.TypeSummary{}, Racks: []wire.Rack{}, Queue: []wire.QueueEntry{}, Running: []wire.RunningEntry{}, Refused: o.Plan.Refused,
		Decisions: []wire.Event{}, Utilisation: util}
	if s.Refused == nil {
		s.Refused = []wire.RefusedJob{}
	}
	if s.Utilisation == nil {
		s.Utilisation = []wire.UtilPoint{}
	}
	for typ, racks := range telemetry.GPUs(o) {
		ts := wire.TypeSummary{Type: typ}
		for _, u := range racks {
			ts.Total += u.Total
			ts.Allocated += u.Allocated
			ts.Unmanaged += u.Unmanaged
			ts.Idle += u.Idle
		}
		s.GPUs = append(s.GPUs, ts)
	}
	sort.Slice(s.GPUs, func(i, j int) bool { return s.GPUs[i].Type < s.GPUs[j].Type })
	for _, n := range o.Nodes {
		if len(s.Racks) == 0 || s.Racks[len(s.Racks)-1].Rack != n.Rack {
			s.Racks = append(s.Racks, wire.Rack{Rack: n.Rack})
		}
		r := &s.Racks[len(s.Racks)-1]
		r.Nodes = append(r.Nodes, n)
	}
	for _, j := range o.Jobs {
		if len(j.Units) > 0 {
			s.Running = append(s.Running, wire.RunningEntry{ID: j.ID, State: j.State, Action: string(j.Action), Units: j.Units, Workers: j.Workers, Widths: j.Widths, Model: j.Model,
				Progress: progress(j.StepsDone, j.Steps), StepsDone: j.StepsDone, Steps: j.Steps, Rate: j.Rate, ETAS: j.ETA, ETA: eta(o.Time, j.ETA), Why: j.Reason.Why, StalledS: j.StalledS,
				ProgressAt: progressAt(o.Time, j.ProgressAgeS)})
			continue
		}
		q := wire.QueueEntry{ID: j.ID, Position: j.Position, Waits: j.Pending, Why: j.Reason.Why, Nomad: j.Nomad, State: j.State, WaitingS: j.WaitingS,
			Workers: j.Workers, Widths: j.Widths, Model: j.Model, Weight: j.Weight, RunsOn: []string{}, StepsDone: j.StepsDone, Steps: j.Steps,
			TeamQueue: j.TeamQueue, QueueReason: j.QueueReason}
		for t := range j.Throughput {
			q.RunsOn = append(q.RunsOn, t)
		}
		sort.Strings(q.RunsOn)
		s.Queue = append(s.Queue, q)
	}
	// The last plan's positions first; jobs that arrived after it (no
	// position yet) after them, in arrival order (o.Jobs is).
	sort.SliceStable(s.Queue, func(i, j int) bool {
		pi, pj := s.Queue[i].Position, s.Queue[j].Position
		if (pi < 0) != (pj < 0) {
			return pi >= 0
		}
		return pi < pj
	})
	for i := range s.Queue {
		s.Queue[i].Position = i + 1
	}
	if len(hist) > maxDecisions {
		hist = hist[len(hist)-maxDecisions:]
	}
	s.Decisions = append(s.Decisions, hist...)
	return s
}

// findJob finds a job of the plan by its ID (namespace/job) or job name.
func findJob(o wire.Observation, id string) (wire.JobObservation, bool) {
	for _, j := range o.Jobs {
		if j.ID == id || j.Job == id {
			return j, true
		}
	}
	return wire.JobObservation{}, false
}

// buildJob assembles /v1/jobs/<id>; ok is false when neither the plan
// nor the history knows the job.
func buildJob(o wire.Observation, st wire.Status, hist []wire.Event, id string) (wire.JobDetail, bool) {
	j, inPlan := findJob(o, id)
	d := wire.JobDetail{ID: id, Placements: []wire.Placement{}, Decisions: []wire.Event{}, NodeNames: map[string]string{}}
	if inPlan {
		d.ID, d.Job, d.State, d.Why, d.Nomad = j.ID, &j, j.State, j.Reason.Why, j.Nomad
		d.Progress = progress(j.StepsDone, j.Steps)
		d.ProgressAt = progressAt(o.Time, j.ProgressAgeS)
		if len(j.Units) > 0 {
			d.ETA = eta(o.Time, j.ETA)
		} else {
			d.Waits = j.Pending
			d.QueueLength = len(st.Queue)
			for _, q := range st.Queue {
				if q.ID == j.ID {
					d.QueuePosition = q.Position
				}
			}
		}
	} else if !strings.Contains(id, "/") {
		// A job name alone: the newest decision about a job of that name
		// in any namespace names it.
		for i := len(hist) - 1; i >= 0; i-- {
			if strings.HasSuffix(hist[i].Job, "/"+id) {
				d.ID = hist[i].Job
				break
			}
		}
	}
	racks, names := map[string]string{}, map[string]string{}
	for _, n := range o.Nodes {
		racks[n.ID], names[n.ID] = n.Rack, n.Name
	}
	d.NodeNames = map[string]string{}
	name := func(units []wire.UnitView) {
		for _, u := range units {
			for _, sl := range u.Slots {
				if n, ok := names[sl.Node]; ok {
					d.NodeNames[sl.Node] = n
				}
			}
		}
	}
	if d.Job != nil {
		name(d.Job.Units)
	}
	for _, ev := range hist {
		if ev.Job != d.ID {
			continue
		}
		d.Decisions = append(d.Decisions, ev)
		if ev.Action == "" || ev.Action == wire.ActionKeep || ev.Action == wire.ActionWait {
			continue
		}
		p := wire.Placement{Time: ev.Time, Action: string(ev.Action), Units: []wire.UnitView{}, Why: ev.Why, Result: ev.Result}
		for _, u := range ev.To {
			var uv wire.UnitView
			for _, sl := range u.Slots {
				uv.Slots = append(uv.Slots, wire.SlotView{Node: sl.Node, Rack: racks[sl.Node], Type: sl.Type, Count: sl.Count})
			}
			p.Units = append(p.Units, uv)
		}
		name(p.Units)
		d.Placements = append(d.Placements, p)
	}
	if !inPlan {
		for _, r := range o.Plan.Refused {
			if r.Job == d.ID {
				d.State, d.Why = "refused", r.Error
				return d, true
			}
		}
		if len(d.Decisions) == 0 {
			return d, false
		}
		d.State, d.Why = "gone", "no longer in the plan (finished, failed for good, or stopped by its owner)"
		if last := d.Decisions[len(d.Decisions)-1]; last.Result != "" {
			d.Why = last.Result
		}
	}
	return d, true
}
