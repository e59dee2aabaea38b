package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// JobRow is one job as the demo shows it.
type JobRow struct {
	ID, Kind string
	// State: queued (not submitted yet), waiting, starting, running,
	// stopping, partial (Nomad started some workers only), done, failed.
	State string
	// Position in hadar's queue (0 first) while waiting; -1 otherwise.
	Position int
	Why      string // why it waits, one line
	// Where its running workers are (sorted, distinct), and its units
	// (HadarE copies) when more than one.
	Types, Nodes, Racks []string
	Units               int
	Workers, Running    int
	Done, Total         float64
	Merges              int
	// JCT is submit to completion, once done.
	JCT time.Duration
}

// Snapshot is what one poll saw.
type Snapshot struct {
	Elapsed   time.Duration
	Jobs      []JobRow
	Busy      map[planner.GPUType]int
	Round     int
	NextRound time.Time
	Events    []string
	AllDone   bool
}

// monitor polls Nomad (jobs, allocations, progress files) and, in the
// hadar run, the sidecar's /v1/plan and /v1/decisions.
type monitor struct {
	nomad   *api.Client
	sidecar string // status API base URL; "" for Nomad's own placement
	http    *http.Client
	start   time.Time
	subs    []Submission
	info    map[string]JobInfo

	nodeName, nodeRack map[string]string // node ID ->

	submitted map[string]time.Time
	finished  map[string]time.Time
	failed    map[string]string
	final     map[string]contract.Progress // terminal allocation -> its last progress
	lastRead  map[string]contract.Progress // running allocation -> last read
	readAt    time.Time
	decisions int // decisions already turned into events
	seenEvent map[string]bool
	events    []string

	// Counters of what happened, for the summary.
	Preemptions, Forks, Unforks, Resumes, Checkpoints int
}

func newMonitor(c *api.Client, sidecar string, subs []Submission, infos []JobInfo) *monitor {
	m := &monitor{nomad: c, sidecar: sidecar, http: &http.Client{Timeout: 5 * time.Second}, subs: byArrival(subs),
		info: map[string]JobInfo{}, nodeName: map[string]string{}, nodeRack: map[string]string{},
		submitted: map[string]time.Time{}, finished: map[string]time.Time{}, failed: map[string]string{},
		final: map[string]contract.Progress{}, lastRead: map[string]contract.Progress{}, seenEvent: map[string]bool{}}
	for _, ji := range infos {
		m.info[ji.ID] = ji
	}
	return m
}

func (m *monitor) event(format string, args ...any) {
	el := time.Since(m.start)
	m.events = append(m.events, fmt.Sprintf("%s  %s", clock(el), fmt.Sprintf(format, args...)))
}

func clock(d time.Duration) string {
	s := int(d.Round(time.Second).Seconds())
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

// nodes reads the cluster's node names and racks.
func (m *monitor) nodes(ctx context.Context) error {
	ns, _, err := m.nomad.Nodes().List((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range ns {
		m.nodeName[n.ID] = n.Name
		node, _, err := m.nomad.Nodes().Info(n.ID, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		m.nodeRack[n.ID] = node.Meta["rack"]
	}
	return nil
}

// poll reads everything once and builds the snapshot.
func (m *monitor) poll(ctx context.Context) (Snapshot, error) {
	snap := Snapshot{Elapsed: time.Since(m.start), Busy: map[planner.GPUType]int{}}
	q := (&api.QueryOptions{Namespace: "*"}).WithContext(ctx)
	jobs, _, err := m.nomad.Jobs().List(q)
	if err != nil {
		return snap, fmt.Errorf("list jobs: %w", err)
	}
	status := map[string]string{}
	for _, j := range jobs {
		status[j.ID] = j.Status
	}
	rq := (&api.QueryOptions{Namespace: "*", Params: map[string]string{"resources": "true", "task_states": "true"}}).WithContext(ctx)
	allocs, _, err := m.nomad.Allocations().List(rq)
	if err != nil {
		return snap, fmt.Errorf("list allocations: %w", err)
	}
	byJob := map[string][]*api.AllocationListStub{}
	for _, a := range allocs {
		byJob[a.JobID] = append(byJob[a.JobID], a)
	}
	var plan wire.PlanView
	if m.sidecar != "" {
		if err := m.get(ctx, "/v1/plan", &plan); err != nil {
			// The sidecar may be between rounds or restarting: show Nomad's
			// side alone this time.
			plan = wire.PlanView{}
		}
		snap.Round, snap.NextRound = plan.Round, plan.NextRound
		m.decisionEvents(ctx)
	}
	views := map[string]wire.JobView{}
	for _, jv := range plan.Jobs {
		views[jv.Job] = jv
	}
	readProgress := time.Since(m.readAt) >= 2*time.Second
	if readProgress {
		m.readAt = time.Now()
	}
	snap.AllDone = true
	for _, s := range m.subs {
		row := m.row(ctx, s, status[s.ID], byJob[s.ID], views, readProgress)
		for t, n := range busyOf(byJob[s.ID]) {
			snap.Busy[t] += n
		}
		if row.State != "done" && row.State != "failed" {
			snap.AllDone = false
		}
		snap.Jobs = append(snap.Jobs, row)
	}
	snap.Events = m.events
	return snap, nil
}

// row builds one job's row.
func (m *monitor) row(ctx context.Context, s Submission, status string, allocs []*api.AllocationListStub, views map[string]wire.JobView, readProgress bool) JobRow {
	ji := m.info[s.ID]
	r := JobRow{ID: s.ID, Kind: s.Kind, Position: -1, State: "queued", Total: ji.Steps, Workers: ji.GPUs}
	sub, ok := m.submitted[s.ID]
	if !ok {
		r.Why = "submits at " + clock(s.At)
		return r
	}
	types, nodes, racks, units := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	var last time.Time
	var failed string
	for _, a := range allocs {
		p := m.progressOf(ctx, a, readProgress)
		r.Done = max(r.Done, float64(p.StepsDone))
		r.Merges = max(r.Merges, p.Merges)
		m.taskEvents(s.ID, a)
		switch a.ClientStatus {
		case api.AllocClientStatusRunning, api.AllocClientStatusPending:
			if a.DesiredStatus != api.AllocDesiredStatusRun {
				continue
			}
			if a.ClientStatus == api.AllocClientStatusRunning {
				r.Running++
			}
			for t := range busyOf([]*api.AllocationListStub{a}) {
				types[string(t)] = true
			}
			nodes[a.NodeName] = true
			if rack := m.nodeRack[a.NodeID]; rack != "" {
				racks[rack] = true
			}
			if w, gen := groupname.Parse(a.TaskGroup); gen {
				units[fmt.Sprint(w.Unit)] = true
			}
		case api.AllocClientStatusFailed:
			failed = failure(a)
		}
		for _, ts := range a.TaskStates {
			if ts.FinishedAt.After(last) {
				last = ts.FinishedAt
			}
		}
	}
	r.Types, r.Nodes, r.Racks, r.Units = keys(types), keys(nodes), keys(racks), len(units)
	jv, planned := views[s.ID]
	switch {
	case status == "dead":
		if _, ok := m.finished[s.ID]; !ok {
			if last.IsZero() || last.Before(sub) {
				last = time.Now()
			}
			m.finished[s.ID] = last
			if failed != "" && r.Running == 0 {
				m.failed[s.ID] = failed
				m.event("FAILED   %s: %s", s.ID, failed)
			} else {
				m.event("done     %s in %s", s.ID, (last.Sub(sub)).Round(time.Second))
			}
		}
		r.State, r.JCT = "done", m.finished[s.ID].Sub(sub)
		if f, ok := m.failed[s.ID]; ok {
			r.State, r.Why = "failed", f
		}
	case planned:
		r.State, r.Position = jv.State, jv.Position
		if jv.State == "waiting" {
			r.Why = jv.Reason.Why
			if jv.Nomad != "" {
				r.Why = "Nomad: " + jv.Nomad
			}
		}
	case r.Running > 0:
		r.State = "running"
	case len(nodes) > 0:
		r.State = "starting"
	default:
		r.State = "waiting"
		if ji.Managed && m.sidecar != "" {
			r.Why = "submitted; the sidecar has not planned it yet"
		} else {
			r.Why = "Nomad: no free GPU fits"
		}
	}
	return r
}

// failure says why an allocation failed: the first event that explains
// it (a refused config, a driver failure, an exit code), else Nomad's
// description.
func failure(a *api.AllocationListStub) string {
	for task, ts := range a.TaskStates {
		for _, ev := range ts.Events {
			switch {
			case ev.Type == api.TaskFailedValidation, ev.Type == api.TaskDriverFailure, ev.Type == api.TaskSetupFailure:
				return fmt.Sprintf("task %s: %s: %s", task, ev.Type, ev.DisplayMessage)
			case ev.Type == api.TaskTerminated && (ev.ExitCode != 0 || ev.Signal != 0):
				return fmt.Sprintf("task %s: %s", task, ev.DisplayMessage)
			}
		}
	}
	return a.ClientDescription
}

// progressOf returns an allocation's last progress: read anew (every
// other poll) while it runs, once when it has ended.
func (m *monitor) progressOf(ctx context.Context, a *api.AllocationListStub, read bool) contract.Progress {
	if p, ok := m.final[a.ID]; ok {
		return p
	}
	terminal := a.ClientStatus == api.AllocClientStatusComplete || a.ClientStatus == api.AllocClientStatusFailed || a.ClientStatus == api.AllocClientStatusLost
	if !read && !terminal {
		return m.lastRead[a.ID]
	}
	if a.ClientStatus == api.AllocClientStatusPending {
		return contract.Progress{}
	}
	p, err := m.readProgress(ctx, a)
	if err != nil {
		return m.lastRead[a.ID]
	}
	m.lastRead[a.ID] = p
	if terminal {
		m.final[a.ID] = p
	}
	return p
}

func (m *monitor) readProgress(ctx context.Context, a *api.AllocationListStub) (contract.Progress, error) {
	var p contract.Progress
	task := ""
	for t := range a.TaskStates {
		task = t
	}
	if task == "" {
		return p, fmt.Errorf("alloc %s: no task yet", a.ID)
	}
	q := (&api.QueryOptions{Namespace: a.Namespace, Params: map[string]string{"path": strings.ReplaceAll(contract.ProgressAllocPath, "{task}", task)}}).WithContext(ctx)
	rc, err := m.nomad.Raw().Response("/v1/client/fs/cat/"+url.PathEscape(a.ID), q)
	if err != nil {
		return p, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, contract.MaxProgressBytes+1))
	if err != nil {
		return p, err
	}
	read, err := contract.ParseProgress(b)
	if err != nil {
		return p, err
	}
	return *read, nil
}

// taskEvents turns the driver's task events into demo events: a worker
// resumed from a checkpoint, a checkpoint saved on a stop.
func (m *monitor) taskEvents(job string, a *api.AllocationListStub) {
	for _, ts := range a.TaskStates {
		for _, ev := range ts.Events {
			if ev.Type != api.TaskDriverMessage {
				continue
			}
			key := fmt.Sprintf("%s/%d", a.ID, ev.Time)
			if m.seenEvent[key] {
				continue
			}
			msg := ev.DisplayMessage
			switch {
			case strings.HasPrefix(msg, "resumed from checkpoint"):
				m.seenEvent[key] = true
				m.Resumes++
				m.event("resume   %s (%s on %s): %s", job, a.TaskGroup, a.NodeName, trimPath(msg))
			case strings.HasPrefix(msg, "checkpoint saved") && a.DesiredStatus == api.AllocDesiredStatusStop:
				m.seenEvent[key] = true
				m.Checkpoints++
				m.event("ckpt     %s (%s on %s): %s", job, a.TaskGroup, a.NodeName, trimPath(msg))
			}
		}
	}
}

// trimPath shortens a message's checkpoint path to its file name.
func trimPath(msg string) string {
	f := strings.Fields(msg)
	for i, w := range f {
		if strings.HasPrefix(w, "/") {
			f[i] = w[strings.LastIndex(w, "/")+1:]
		}
	}
	return strings.TrimSuffix(strings.Join(f, " "), ":")
}

// decisionEvents turns the sidecar's new decisions into demo events.
func (m *monitor) decisionEvents(ctx context.Context) {
	var evs []wire.Event
	if err := m.get(ctx, "/v1/decisions", &evs); err != nil {
		return
	}
	if len(evs) < m.decisions {
		m.decisions = 0 // the history was trimmed or restarted
	}
	for _, ev := range evs[m.decisions:] {
		job := ev.Job[strings.LastIndex(ev.Job, "/")+1:]
		where := m.unitsText(ev.To)
		switch {
		case ev.Result != "":
			m.event("sidecar  %s: %s", job, ev.Result)
		case ev.Action == wire.ActionStart && len(ev.To) > 1:
			m.Forks++
			m.event("FORK     %s: starts as %d HadarE copies: %s", job, len(ev.To), where)
		case ev.Action == wire.ActionStart:
			m.event("start    %s on %s", job, where)
		case ev.Action == wire.ActionStop:
			m.Preemptions++
			m.event("PREEMPT  %s: stopped through its checkpoint, waits (%s)", job, ev.Why)
		case ev.Action == wire.ActionMove:
			m.Preemptions++
			m.event("PREEMPT  %s: moved through its checkpoint to %s", job, where)
		case ev.Action == wire.ActionFork:
			m.Forks++
			m.event("FORK     %s: HadarE runs %d copies: %s", job, len(ev.To), where)
		case ev.Action == wire.ActionUnfork:
			m.Unforks++
			m.event("unfork   %s: down to %d copies (the others merge and stop): %s", job, len(ev.To), where)
		}
	}
	m.decisions = len(evs)
}

// unitsText says where units run: "2xv100@v100-a + 1xk80@k80-a", units
// separated by " | ".
func (m *monitor) unitsText(units []wire.Unit) string {
	var us []string
	for _, u := range units {
		var ss []string
		for _, s := range u.Slots {
			name := m.nodeName[s.Node]
			if name == "" {
				name = s.Node
			}
			ss = append(ss, fmt.Sprintf("%dx%s@%s", s.Count, s.Type, name))
		}
		us = append(us, strings.Join(ss, "+"))
	}
	return strings.Join(us, " | ")
}

func (m *monitor) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.sidecar+path, nil)
	if err != nil {
		return err
	}
	resp, err := m.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// busyOf counts the GPUs running allocations hold, per type.
func busyOf(allocs []*api.AllocationListStub) map[planner.GPUType]int {
	out := map[planner.GPUType]int{}
	for _, a := range allocs {
		if a.ClientStatus != api.AllocClientStatusRunning || a.AllocatedResources == nil {
			continue
		}
		for _, tr := range a.AllocatedResources.Tasks {
			for _, d := range tr.Devices {
				out[TypeOf(d.Name)] += len(d.DeviceIDs)
			}
		}
	}
	return out
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
