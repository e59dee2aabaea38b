package telemetry

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// fake is a Source the test scripts.
type fake struct {
	obs     wire.Observation
	h       wire.Health
	hist    []wire.Event
	ws      watch.Stats
	learned wire.Learned
}

func (f *fake) Observe() wire.Observation { return f.obs }
func (f *fake) Health() wire.Health       { return f.h }
func (f *fake) History() []wire.Event     { return append([]wire.Event(nil), f.hist...) }
func (f *fake) WatchStats() watch.Stats   { return f.ws }
func (f *fake) Learned(planner.GPUType) wire.Learned {
	return f.learned
}

var t0 = time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)

func running(id string, units ...wire.Unit) wire.JobObservation {
	j := wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: id, Workers: 1}, JobDecision: wire.JobDecision{State: "running", Position: -1}}, Arrival: t0.Add(-time.Hour)}
	for _, u := range units {
		var uv wire.UnitView
		for _, s := range u.Slots {
			uv.Slots = append(uv.Slots, wire.SlotView{Node: s.Node, Type: s.Type, Count: s.Count})
		}
		j.Units = append(j.Units, uv)
	}
	return j
}

func waiting(id, pending string, since time.Time) wire.JobObservation {
	return wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: id, Workers: 1}, JobDecision: wire.JobDecision{State: "waiting"}}, Pending: pending, WaitingSince: since, Arrival: since}
}

func unit(node string, typ string, n int) wire.Unit {
	return wire.Unit{Slots: []wire.Slot{{Node: node, Type: typ, Count: n}}}
}

// cluster: rack r1 has n1 (4 V100: job a holds 2, a person's job 1);
// rack r2 has n2 (4 K80, draining) and n3 (2 V100, down: not planned).
func cluster(now time.Time, jobs ...wire.JobObservation) wire.Observation {
	o := wire.Observation{Time: now, Leader: true, Plan: wire.PlanView{Policy: "hadar", Time: now.Add(-time.Second)}, Jobs: jobs}
	var v100 []wire.Holder
	for _, j := range jobs {
		for _, u := range j.Units {
			for _, s := range u.Slots {
				if s.Node == "n1" {
					v100 = append(v100, wire.Holder{Job: j.ID, Count: s.Count, Managed: true})
				}
			}
		}
	}
	v100 = append(v100, wire.Holder{Job: "default/plain", Count: 1})
	o.Nodes = []wire.NodeObservation{
		{ID: "n1", Name: "n1", Rack: "r1", Status: "ready", Schedulable: true, Planned: true,
			GPUs: []wire.GPUObservation{{Type: "v100", Total: 4, Healthy: 4, Holders: v100}}},
		{ID: "n2", Name: "n2", Rack: "r2", Status: "ready", Schedulable: false, Planned: true,
			GPUs: []wire.GPUObservation{{Type: "k80", Total: 4, Healthy: 4}}},
		{ID: "n3", Name: "n3", Rack: "r2", Status: "down", GPUs: []wire.GPUObservation{{Type: "v100", Total: 2, Healthy: 2}}},
	}
	return o
}

func gathered(t *testing.T, tel *Telemetry) []*dto.MetricFamily {
	t.Helper()
	mfs, err := tel.gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// value returns a series' value (a histogram's count), -1 when absent.
func value(mfs []*dto.MetricFamily, name string, labels ...string) float64 {
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return -1
}

// want is a series' expected value.
type want struct {
	name   string
	labels []string
	value  float64
}

func check(t *testing.T, m []*dto.MetricFamily, when string, ws []want) {
	t.Helper()
	for _, w := range ws {
		if got := value(m, w.name, w.labels...); got != w.value {
			t.Errorf("%s: %s%v = %v, want %v", when, w.name, w.labels, got, w.value)
		}
	}
}

func histSum(mfs []*dto.MetricFamily, name, label, v string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == v {
					return m.Histogram.GetSampleSum()
				}
			}
		}
	}
	return -1
}

func TestSampleTurnsTheAgentIntoMetrics(t *testing.T) {
	a := running("default/a", unit("n1", "v100", 2))
	a.StalledS = 420 // no step for 7 minutes: counted, as a fact about a
	restored := wire.Event{Time: t0.Add(-time.Hour), Job: "default/old", Action: wire.ActionStart, Why: "restored from the state"}
	f := &fake{h: wire.Health{Rounds: 7, Writes: map[string]int{}}, hist: []wire.Event{restored},
		obs: cluster(t0, a, waiting("default/b", wire.PendingHeld, t0.Add(-30*time.Second)), waiting("default/c", wire.PendingNoCapacity, t0.Add(-time.Minute)))}
	tel, err := New(f, Options{Policy: "hadar", UtilStep: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tel.Sample()
	m := gathered(t, tel)
	check(t, m, "after the first sample", []want{
		{"hadar_pending_jobs", []string{"policy", "hadar", "status", "held"}, 1},
		{"hadar_pending_jobs", []string{"status", "no_capacity"}, 1},
		{"hadar_jobs", []string{"state", "running"}, 1},
		{"hadar_jobs", []string{"state", "waiting"}, 2},
		{"hadar_stalled_jobs", nil, 1},
		{"hadar_gpus_total", []string{"gpu_type", "v100", "rack", "r1"}, 4},
		{"hadar_gpus_allocated", []string{"gpu_type", "v100", "rack", "r1"}, 2},
		{"hadar_gpus_unmanaged", []string{"gpu_type", "v100", "rack", "r1"}, 1},
		{"hadar_gpus_idle", []string{"gpu_type", "v100", "rack", "r1"}, 1},
		{"hadar_gpus_total", []string{"gpu_type", "k80", "rack", "r2"}, 4},
		{"hadar_gpus_idle", []string{"gpu_type", "k80", "rack", "r2"}, 0},    // draining: not idle
		{"hadar_gpus_total", []string{"gpu_type", "v100", "rack", "r2"}, -1}, // n3 is down: not planned
		{"hadar_leader", nil, 1},
		{"hadar_rounds_total", nil, 0},                                                 // the 7 restored rounds are not this process's
		{"hadar_decisions_total", []string{"action", "start", "result", "applied"}, 0}, // the restored start is not counted
		{"hadar_evictions_total", []string{"reason", "node_lost"}, 0},
		{"hadar_last_plan_timestamp_seconds", nil, float64(t0.Add(-time.Second).Unix())},
	})

	// Ten seconds on: b started on the free V100 (it waited 40 s), a
	// person's edit refused a stop of a, c's fork was not applied, two
	// rounds, Nomad API errors, writes, and a follower now.
	t1 := t0.Add(10 * time.Second)
	b := running("default/b", unit("n1", "v100", 1))
	f.hist = append(f.hist,
		wire.Event{Time: t1.Add(-time.Second), Job: "default/b", Action: wire.ActionStart, To: []wire.Unit{unit("n1", "v100", 1)}, Why: "its turn"},
		wire.Event{Time: t1.Add(-time.Second), Job: "default/a", Action: wire.ActionStop, Why: "fairness", Result: "not applied: job default/a: the job changed since it was read (conflict)"},
	)
	f.h.Rounds, f.h.Writes = 9, map[string]int{"start": 1}
	f.ws = watch.Stats{APIErrors: 3, ProgressErrors: 1, Reconnects: 2, Relists: 4}
	f.obs = cluster(t1, a, b, waiting("default/c", wire.PendingNoCapacity, t0.Add(-time.Minute)))
	f.obs.Leader = false
	tel.Sample()
	m = gathered(t, tel)
	check(t, m, "after the second sample", []want{
		{"hadar_decisions_total", []string{"action", "start", "result", "applied"}, 1},
		{"hadar_decisions_total", []string{"action", "stop", "result", "not_applied"}, 1},
		{"hadar_rewrite_conflicts_total", nil, 1},
		{"hadar_preemptions_total", []string{"reason", "preempted"}, 0}, // not applied
		{"hadar_admission_wait_time_seconds", []string{"gpu_type", "v100"}, 1},
		{"hadar_rounds_total", nil, 2},
		{"hadar_nomad_api_errors_total", []string{"source", "watch"}, 3},
		{"hadar_nomad_api_errors_total", []string{"source", "progress"}, 1},
		{"hadar_nomad_reconnects_total", nil, 2},
		{"hadar_nomad_relists_total", nil, 4},
		{"hadar_nomad_writes_total", []string{"kind", "start"}, 1},
		{"hadar_pending_jobs", []string{"status", "held"}, 0},
		{"hadar_gpus_allocated", []string{"gpu_type", "v100", "rack", "r1"}, 3},
		{"hadar_gpus_idle", []string{"gpu_type", "v100", "rack", "r1"}, 0},
		{"hadar_leader", nil, 0},
	})
	if got := histSum(m, "hadar_admission_wait_time_seconds", "gpu_type", "v100"); got != 39 {
		t.Errorf("admission wait of b = %v s, want 39 (waiting since t0-30s, started at t0+9s)", got)
	}

	// a is stopped by the policy (applied), and b stops running with no
	// decision: its node is lost.
	t2 := t1.Add(10 * time.Second)
	f.hist = append(f.hist, wire.Event{Time: t2.Add(-time.Second), Job: "default/a", Action: wire.ActionStop, Why: "fairness"},
		wire.Event{Time: t2.Add(-time.Second), Job: "default/c", Result: "complete"})
	f.h.Writes = map[string]int{"start": 1, "stop": 1, "rollback": 1}
	f.obs = cluster(t2, waiting("default/a", wire.PendingHeld, t2), waiting("default/b", wire.PendingNoCapacity, t2))
	f.obs.Nodes[0].Planned = false // n1 went away
	tel.Sample()
	m = gathered(t, tel)
	check(t, m, "after the third sample", []want{
		{"hadar_preemptions_total", []string{"reason", "preempted"}, 1},
		{"hadar_evictions_total", []string{"reason", "preempted"}, 1},
		{"hadar_evictions_total", []string{"reason", "node_lost"}, 1},
		{"hadar_evictions_total", []string{"reason", "interrupted"}, 0},
		{"hadar_evictions_total", []string{"reason", "rolled_back"}, 1},
		{"hadar_jobs_finished_total", []string{"result", "complete"}, 1},
		{"hadar_decisions_total", []string{"action", "stop", "result", "applied"}, 1},
	})

	pts := tel.Utilisation()
	if len(pts) != 2 {
		t.Fatalf("%d utilisation points, want 2 (one per 1 s step after the first sample)", len(pts))
	}
	if u := pts[0].Types["v100"]; u.Total != 4 || u.Allocated != 2.5 || u.Unmanaged != 1 || u.Busy() != 0.875 { // the mean of 2 and 3 allocated
		t.Errorf("first point's v100: %+v", u)
	}
}

// The history keeps only the agent's last decisions: the cursor finds the
// new ones after a trim, and says so when it lost some.
func TestCursorAcrossTrims(t *testing.T) {
	ev := func(i int) wire.Event {
		return wire.Event{Time: t0.Add(time.Duration(i) * time.Second), Job: "default/j", Action: wire.ActionStart}
	}
	var c cursor
	if fresh, _ := c.after([]wire.Event{ev(0), ev(1)}); len(fresh) != 2 {
		t.Fatalf("first look: %d events, want 2", len(fresh))
	}
	fresh, lost := c.after([]wire.Event{ev(1), ev(2), ev(3)}) // ev(0) trimmed
	if len(fresh) != 2 || !fresh[0].Time.Equal(ev(2).Time) || lost {
		t.Fatalf("after a trim: %d events (lost %v), want ev 2 and 3", len(fresh), lost)
	}
	fresh, lost = c.after([]wire.Event{ev(5), ev(6)}) // ev(4) never seen
	if len(fresh) != 2 || !lost {
		t.Fatalf("after losing some: %d events, lost %v; want 2 and lost", len(fresh), lost)
	}
	if fresh, _ := c.after([]wire.Event{ev(5), ev(6)}); len(fresh) != 0 {
		t.Fatalf("nothing new: %d events", len(fresh))
	}
}

// Every family hadar serves is documented, in Defs and in docs/status.md,
// and everything documented exists.
func TestEveryMetricIsDocumented(t *testing.T) {
	a := running("default/a", unit("n1", "v100", 2))
	f := &fake{h: wire.Health{Writes: map[string]int{}}, obs: cluster(t0, a),
		learned: wire.Learned{Figures: []wire.LearnedFigure{{Model: "resnet50", SF: 1, Type: "v100", Rate: 9, Applied: true}}}}
	tel, err := New(f, Options{Policy: "gavel-maxmin"})
	if err != nil {
		t.Fatal(err)
	}
	tel.Sample()
	tel.ObserveRound(engine.Boundary, 20*time.Millisecond)
	served := map[string]bool{}
	for _, mf := range gathered(t, tel) {
		name := mf.GetName()
		if !strings.HasPrefix(name, "hadar_") {
			continue // go_* and process_*: the client library's own
		}
		served[name] = true
		d, ok := def(name)
		if !ok {
			t.Errorf("%s is served but not in Defs", name)
			continue
		}
		if mf.GetHelp() != d.Help {
			t.Errorf("%s: help %q, want the documented %q", name, mf.GetHelp(), d.Help)
		}
		if got := strings.ToLower(mf.GetType().String()); got != d.Type {
			t.Errorf("%s: type %s, documented %s", name, got, d.Type)
		}
		for _, m := range mf.GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			sort.Strings(names)
			want := append([]string(nil), d.Labels...)
			sort.Strings(want)
			if strings.Join(names, ",") != strings.Join(want, ",") {
				t.Errorf("%s: labels %v, documented %v", name, names, want)
			}
		}
	}
	doc, err := os.ReadFile("../../docs/status.md")
	if err != nil {
		t.Fatal(err)
	}
	inDoc := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(hadar_[a-z_]+)`").FindAllStringSubmatch(string(doc), -1) {
		inDoc[m[1]] = true
	}
	for _, d := range Defs {
		if !inDoc[d.Name] {
			t.Errorf("%s is not in docs/status.md's metrics table", d.Name)
		}
		// The admission histogram has a series once a job started.
		if !served[d.Name] && d.Name != "hadar_admission_wait_time_seconds" {
			t.Errorf("%s is documented but not served", d.Name)
		}
	}
	for name := range inDoc {
		if _, ok := def(name); !ok {
			t.Errorf("docs/status.md documents %s, which does not exist", name)
		}
	}
}

// Leader changes count the agent's lock acquisitions and losses from the
// sidecar's start (a restored or earlier count is not this process's);
// learned figures become gauges once they count, and gaps are counted.
func TestLeaderChangesAndLearnedRates(t *testing.T) {
	f := &fake{h: wire.Health{Writes: map[string]int{}, LeaderGained: 1}, obs: cluster(t0)}
	tel, err := New(f, Options{Policy: "hadar"})
	if err != nil {
		t.Fatal(err)
	}
	tel.Sample()
	check(t, gathered(t, tel), "at start", []want{
		{"hadar_leader_changes_total", []string{"to", "leader"}, 0}, // taken before New: the baseline
		{"hadar_leader_changes_total", []string{"to", "follower"}, 0},
		{"hadar_estimate_gaps", nil, 0},
		{"hadar_learned_rate_steps_per_second", nil, -1}, // nothing learned: no series
	})

	// The lock is lost, taken again, lost and taken again; the estimates
	// learned resnet50 on two V100s, have seen too little of k80 to count,
	// and plan one model on p100 without an estimate.
	f.h.LeaderGained, f.h.LeaderLost = 3, 2
	f.learned = wire.Learned{
		Figures: []wire.LearnedFigure{
			{Model: "resnet50", SF: 2, Type: "v100", Profile: 10, Factor: 1.2, Rate: 12, Applied: true},
			{Model: "resnet50", SF: 2, Type: "k80", Profile: 4, Factor: 1},
		},
		Gaps: []wire.Gap{{Model: "my-llm", Type: "p100"}},
	}
	tel.Sample()
	check(t, gathered(t, tel), "after two failovers", []want{
		{"hadar_leader_changes_total", []string{"policy", "hadar", "to", "leader"}, 2},
		{"hadar_leader_changes_total", []string{"to", "follower"}, 2},
		{"hadar_learned_rate_steps_per_second", []string{"policy", "hadar", "model", "resnet50", "workers", "2", "gpu_type", "v100"}, 12},
		{"hadar_learned_rate_steps_per_second", []string{"gpu_type", "k80"}, -1},
		{"hadar_estimate_gaps", nil, 1},
	})
}
