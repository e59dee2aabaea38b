package status

import (
	"sort"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Status is GET /v1/status: the cluster as hadar sees it, for the status
// page and `hadar status`.
type Status struct {
	Time    time.Time     `json:"time"`
	Sidecar SidecarStatus `json:"sidecar"`
	// GPUs sums the cluster's GPUs per type (nodes the planner plans on).
	GPUs []TypeSummary `json:"gpus"`
	// Racks are every node by rack, with its GPUs per type and the jobs
	// on them.
	Racks []Rack `json:"racks"`
	// Queue are the waiting jobs, first in line first.
	Queue []QueueEntry `json:"queue"`
	// Running are the jobs holding GPUs, in arrival order.
	Running []RunningEntry    `json:"running"`
	Refused []wire.RefusedJob `json:"refused"`
	// Decisions are the most recent decisions, newest last.
	Decisions []wire.Event `json:"decisions"`
	// Utilisation is GPUs in use per type over time, oldest first.
	Utilisation []telemetry.UtilPoint `json:"utilisation"`
}

// SidecarStatus is the sidecar itself.
type SidecarStatus struct {
	Policy    string    `json:"policy"`
	Placement string    `json:"placement"`
	DryRun    bool      `json:"dry_run"`
	Leader    bool      `json:"leader"`
	Replica   string    `json:"replica"`
	Round     int       `json:"round"`
	NextRound time.Time `json:"next_round"`
	LastPlan  time.Time `json:"last_plan"`
	OK        bool      `json:"ok"`
	Problem   string    `json:"problem,omitempty"`
}

// TypeSummary is one GPU type across the cluster.
type TypeSummary struct {
	Type string `json:"type"`
	telemetry.GPUUse
}

// Rack is the nodes of one rack.
type Rack struct {
	Rack  string                 `json:"rack"`
	Nodes []wire.NodeObservation `json:"nodes"`
}

// QueueEntry is a waiting job.
type QueueEntry struct {
	ID string `json:"id"`
	// Position is its place in the queue, 1 first.
	Position int `json:"position"`
	// Waits is held (hadar holds it though GPUs it can run on are free)
	// or no_capacity (every GPU it can run on is taken).
	Waits string `json:"waits"`
	// Why is the planner's reason, Nomad Nomad's (when it cannot place
	// the job's groups).
	Why      string  `json:"why"`
	Nomad    string  `json:"nomad,omitempty"`
	State    string  `json:"state"`
	WaitingS float64 `json:"waiting_s"`
	Workers  int     `json:"workers"`
	Model    string  `json:"model"`
	Weight   float64 `json:"weight"`
	// RunsOn are the GPU types it can run on.
	RunsOn    []string `json:"runs_on"`
	StepsDone float64  `json:"steps_done"`
	Steps     float64  `json:"steps"`
}

// RunningEntry is a job holding GPUs.
type RunningEntry struct {
	ID      string          `json:"id"`
	State   string          `json:"state"`
	Action  string          `json:"action,omitempty"`
	Units   []wire.UnitView `json:"units"`
	Workers int             `json:"workers"`
	Model   string          `json:"model"`
	// Progress is steps done over steps declared, 0..1.
	Progress  float64 `json:"progress"`
	StepsDone float64 `json:"steps_done"`
	Steps     float64 `json:"steps"`
	// Rate is the engine's estimate of steps/s where it runs; ETA when it
	// completes at that rate (absent when unknown).
	Rate float64    `json:"rate"`
	ETAS float64    `json:"eta_s"`
	ETA  *time.Time `json:"eta,omitempty"`
	Why  string     `json:"why"`
}

// JobDetail is GET /v1/jobs/<id>.
type JobDetail struct {
	// Job is the job in the plan; nil once it left the plan (finished,
	// stopped by its owner), when only its decisions remain.
	Job   *wire.JobObservation `json:"job"`
	ID    string               `json:"id"`
	State string               `json:"state"`
	// Waits, QueuePosition (1 first) and QueueLength for a waiting job.
	Waits         string `json:"waits,omitempty"`
	QueuePosition int    `json:"queue_position,omitempty"`
	QueueLength   int    `json:"queue_length,omitempty"`
	Why           string `json:"why"`
	Nomad         string `json:"nomad,omitempty"`
	// Progress, and the engine's ETA, for a running job.
	Progress float64    `json:"progress"`
	ETA      *time.Time `json:"eta,omitempty"`
	// Placements are where it ran, oldest first: each decision that
	// placed, moved, forked or stopped it, with racks.
	Placements []Placement `json:"placements"`
	// Decisions are every recorded decision about it, newest last.
	Decisions []wire.Event `json:"decisions"`
	// NodeNames names the nodes its units and placements name by ID.
	NodeNames map[string]string `json:"node_names"`
}

// Placement is one change of where a job runs.
type Placement struct {
	Time   time.Time       `json:"time"`
	Action string          `json:"action"`
	Units  []wire.UnitView `json:"units"`
	Why    string          `json:"why"`
	Result string          `json:"result,omitempty"`
}

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

// buildStatus assembles /v1/status from one observation.
func buildStatus(o wire.Observation, h wire.Health, hist []wire.Event, util []telemetry.UtilPoint) Status {
	s := Status{Time: o.Time, Sidecar: SidecarStatus{Policy: o.Plan.Policy, Placement: o.Plan.Placement, DryRun: o.Plan.DryRun, Leader: o.Leader,
		Replica: h.Replica, Round: o.Plan.Round, NextRound: o.Plan.NextRound, LastPlan: o.Plan.Time, OK: h.OK, Problem: h.Problem},
		GPUs: []TypeSummary{}, Racks: []Rack{}, Queue: []QueueEntry{}, Running: []RunningEntry{}, Refused: o.Plan.Refused,
		Decisions: []wire.Event{}, Utilisation: util}
	if s.Refused == nil {
		s.Refused = []wire.RefusedJob{}
	}
	if s.Utilisation == nil {
		s.Utilisation = []telemetry.UtilPoint{}
	}
	for typ, racks := range telemetry.GPUs(o) {
		ts := TypeSummary{Type: typ}
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
			s.Racks = append(s.Racks, Rack{Rack: n.Rack})
		}
		r := &s.Racks[len(s.Racks)-1]
		r.Nodes = append(r.Nodes, n)
	}
	for _, j := range o.Jobs {
		if len(j.Units) > 0 {
			s.Running = append(s.Running, RunningEntry{ID: j.ID, State: j.State, Action: string(j.Action), Units: j.Units, Workers: j.Workers, Model: j.Model,
				Progress: progress(j.StepsDone, j.Steps), StepsDone: j.StepsDone, Steps: j.Steps, Rate: j.Rate, ETAS: j.ETA, ETA: eta(o.Time, j.ETA), Why: j.Reason.Why})
			continue
		}
		q := QueueEntry{ID: j.ID, Position: j.Position, Waits: j.Pending, Why: j.Reason.Why, Nomad: j.Nomad, State: j.State, WaitingS: j.WaitingS,
			Workers: j.Workers, Model: j.Model, Weight: j.Weight, RunsOn: []string{}, StepsDone: j.StepsDone, Steps: j.Steps}
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
func buildJob(o wire.Observation, st Status, hist []wire.Event, id string) (JobDetail, bool) {
	j, inPlan := findJob(o, id)
	d := JobDetail{ID: id, Placements: []Placement{}, Decisions: []wire.Event{}, NodeNames: map[string]string{}}
	if inPlan {
		d.ID, d.Job, d.State, d.Why, d.Nomad = j.ID, &j, j.State, j.Reason.Why, j.Nomad
		d.Progress = progress(j.StepsDone, j.Steps)
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
		if ev.Action == "" || ev.Action == "keep" || ev.Action == "wait" {
			continue
		}
		p := Placement{Time: ev.Time, Action: string(ev.Action), Units: []wire.UnitView{}, Why: ev.Why, Result: ev.Result}
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
