// Package telemetry turns what the sidecar knows into Prometheus metrics
// (through hashicorp/go-metrics and its Prometheus sink) and keeps the
// recent utilisation per GPU type for the status page. It samples the
// agent through its read-only accessors once per interval: nothing in the
// scheduling loop waits on it. docs/status.md lists every metric.
package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	metrics "github.com/hashicorp/go-metrics"
	gmprom "github.com/hashicorp/go-metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Source is what telemetry reads: the agent.
type Source interface {
	Observe() wire.Observation
	Health() wire.Health
	History() []wire.Event
	WatchStats() watch.Stats
}

// Options configure sampling.
type Options struct {
	// Policy labels every metric (the sidecar's scheduler).
	Policy string
	// Interval between samples (default 1 s).
	Interval time.Duration
	// UtilStep is the span one utilisation point averages (default 10 s);
	// UtilPoints how many are kept (default 360: an hour).
	UtilStep   time.Duration
	UtilPoints int
	// Expiration drops a gauge series not set for this long (a rack or a
	// GPU type that left the cluster; default 2 min). Counters are kept
	// alive by every sample.
	Expiration time.Duration
	Logger     hclog.Logger
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.UtilStep <= 0 {
		o.UtilStep = 10 * time.Second
	}
	if o.UtilPoints <= 0 {
		o.UtilPoints = 360
	}
	if o.Expiration <= 0 {
		o.Expiration = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return o
}

// Telemetry samples a Source into metrics and a utilisation history.
type Telemetry struct {
	src  Source
	opts Options
	log  hclog.Logger

	reg       *prometheus.Registry
	met       *metrics.Metrics
	policy    metrics.Label
	admission *prometheus.HistogramVec
	rounds    *prometheus.HistogramVec

	mu sync.Mutex // guards what follows
	// seen are the running totals at the previous sample (totals.go).
	seen      totals
	cursor    cursor
	prev      map[string]memo      // jobs at the previous sample, by ID
	explained map[string]time.Time // jobs whose last stop a decision explains
	counters  map[string]counterKey
	util      utilRing
}

// memo is what a sample remembers of a job for the next one.
type memo struct {
	running      bool
	nodes        []string
	waitingSince time.Time
	arrival      time.Time
}

type counterKey struct {
	name   string
	labels []metrics.Label
}

// New builds the metrics over src. It reads src once, so that counters
// count from now (a restored decision history is not counted again).
func New(src Source, opts Options) (*Telemetry, error) {
	opts = opts.withDefaults()
	t := &Telemetry{src: src, opts: opts, log: opts.Logger, reg: prometheus.NewRegistry(), policy: metrics.Label{Name: "policy", Value: opts.Policy},
		prev: map[string]memo{}, explained: map[string]time.Time{}, counters: map[string]counterKey{},
		util: utilRing{max: opts.UtilPoints, step: opts.UtilStep}}
	// The sink registers itself on a registry of its own: /metrics
	// gathers through t.gather, which gives each family its help text
	// (the sink names every series' help after the series).
	sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{Expiration: opts.Expiration, Registerer: prometheus.NewRegistry(), Name: "hadar_go_metrics_sink"})
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus sink: %w", err)
	}
	// No hostname prefix, no service prefix (names carry hadar_), no
	// runtime sampler goroutine (the Go collector below covers it).
	t.met, err = metrics.New(&metrics.Config{FilterDefault: true, TimerGranularity: time.Millisecond}, sink)
	if err != nil {
		return nil, fmt.Errorf("telemetry: go-metrics: %w", err)
	}
	// Durations are histograms, not go-metrics samples: the sink turns
	// samples into 10-second summaries, whose quantiles cannot be summed
	// over replicas or read over an hour. Kueue's admission wait is a
	// histogram too.
	constLabels := prometheus.Labels{"policy": opts.Policy}
	t.admission = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hadar_admission_wait_time_seconds", ConstLabels: constLabels,
		Help:    mustDef("hadar_admission_wait_time_seconds").Help,
		Buckets: []float64{1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400}}, []string{"gpu_type"})
	t.rounds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hadar_round_duration_seconds", ConstLabels: constLabels,
		Help: mustDef("hadar_round_duration_seconds").Help, Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, []string{"kind"})
	for _, k := range []engine.Kind{engine.Boundary, engine.Fill} {
		t.rounds.WithLabelValues(string(k))
	}
	for _, c := range []prometheus.Collector{sink, t.admission, t.rounds, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := t.reg.Register(c); err != nil {
			return nil, fmt.Errorf("telemetry: registering a collector: %w", err)
		}
	}

	h := src.Health()
	t.seen = newTotals(h)
	t.cursor.after(src.History())
	// Counters every operator expects to see from the start, at zero.
	for _, a := range []wire.Action{wire.ActionStart, wire.ActionStop, wire.ActionMove, wire.ActionFork, wire.ActionUnfork} {
		for _, r := range []string{ResultApplied, ResultNotApplied} {
			t.inc("hadar_decisions_total", 0, lbl("action", string(a)), lbl("result", r))
		}
	}
	for _, r := range []string{ReasonPreempted, ReasonMigrated, ReasonUnforked} {
		t.inc("hadar_preemptions_total", 0, lbl("reason", r))
	}
	for _, r := range []string{ReasonPreempted, ReasonMigrated, ReasonUnforked, ReasonRolledBack, ReasonInterrupted, ReasonNodeLost} {
		t.inc("hadar_evictions_total", 0, lbl("reason", r))
	}
	for _, s := range []string{"watch", "progress"} {
		t.inc("hadar_nomad_api_errors_total", 0, lbl("source", s))
	}
	for _, k := range []string{"start", "stop", "rollback"} {
		t.inc("hadar_nomad_writes_total", 0, lbl("kind", k))
	}
	for _, r := range []string{"complete", "failed"} {
		t.inc("hadar_jobs_finished_total", 0, lbl("result", r))
	}
	for _, k := range []string{wire.RepairPlacement, wire.RepairFallback} {
		t.inc("hadar_plan_repairs_total", 0, lbl("kind", k))
	}
	for _, to := range []string{"leader", "follower"} {
		t.inc("hadar_leader_changes_total", 0, lbl("to", to))
	}
	for _, n := range []string{"hadar_rounds_total", "hadar_rewrite_conflicts_total", "hadar_nomad_reconnects_total", "hadar_nomad_relists_total"} {
		t.inc(n, 0)
	}
	return t, nil
}

func mustDef(name string) Def {
	d, ok := def(name)
	if !ok {
		panic("telemetry: metric " + name + " is not documented in Defs")
	}
	return d
}

func lbl(name, value string) metrics.Label { return metrics.Label{Name: name, Value: value} }

// Run samples every interval until ctx ends.
func (t *Telemetry) Run(ctx context.Context) {
	tick := time.NewTicker(t.opts.Interval)
	defer tick.Stop()
	for {
		t.Sample()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Handler serves the metrics in Prometheus' text format, uncompressed: the
// status server scrubs secrets from whole responses, which it cannot do in
// a gzip stream (and the page is small).
func (t *Telemetry) Handler() http.Handler {
	return promhttp.HandlerFor(prometheus.GathererFunc(t.gather), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, DisableCompression: true})
}

// gather collects every family and gives hadar's their documented help.
func (t *Telemetry) gather() ([]*dto.MetricFamily, error) {
	mfs, err := t.reg.Gather()
	for _, mf := range mfs {
		if d, ok := def(mf.GetName()); ok {
			help := d.Help
			mf.Help = &help
		}
	}
	return mfs, err
}

// SetLeader sets the leader gauge at once (the sampler also sets it from
// the agent every interval).
func (t *Telemetry) SetLeader(leading bool) {
	v := 0.0
	if leading {
		v = 1
	}
	t.gauge("hadar_leader", v)
}

// ObserveRound records how long one cycle of the loop took.
func (t *Telemetry) ObserveRound(kind engine.Kind, took time.Duration) {
	t.rounds.WithLabelValues(string(kind)).Observe(took.Seconds())
}

func (t *Telemetry) gauge(name string, v float64, labels ...metrics.Label) {
	t.met.SetPrecisionGaugeWithLabels([]string{name}, v, append([]metrics.Label{t.policy}, labels...))
}

// inc adds n to a counter and remembers it, so that every sample keeps it
// from expiring.
func (t *Telemetry) inc(name string, n int, labels ...metrics.Label) {
	if n < 0 {
		return
	}
	ls := append([]metrics.Label{t.policy}, labels...)
	key := name
	for _, l := range ls {
		key += ";" + l.Name + "=" + l.Value
	}
	t.counters[key] = counterKey{name, ls}
	t.met.IncrCounterWithLabels([]string{name}, float32(n), ls)
}

// Sample reads the source once and updates every metric.
func (t *Telemetry) Sample() {
	obs := t.src.Observe()
	h := t.src.Health()
	ws := t.src.WatchStats()
	evs := t.src.History()
	var learned *wire.Learned
	if ls, ok := t.src.(LearnedSource); ok {
		l := ls.Learned("")
		learned = &l
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sampleJobs(obs)
	t.sampleLearned(learned)
	t.sampleGPUs(obs)
	t.sampleCounts(h, ws)
	t.sampleQueues()
	fresh, lost := t.cursor.after(evs)
	if lost {
		t.log.Warn("more decisions than the history keeps were made within one sampling interval: the decision counters miss some")
	}
	t.sampleEvents(obs, fresh)
	t.sampleInterruptions(obs, fresh)
	t.remember(obs)
	t.util.add(obs)
	for _, c := range t.counters {
		t.met.IncrCounterWithLabels([]string{c.name}, 0, c.labels)
	}
}

func (t *Telemetry) sampleJobs(obs wire.Observation) {
	pending := map[string]int{StatusHeld: 0, StatusNoCapacity: 0}
	states := map[string]int{"running": 0, "writing": 0, "starting": 0, "stopping": 0, "awaiting-gpus": 0, "waiting": 0}
	copies, stalled := 0, 0
	for _, j := range obs.Jobs {
		states[j.State]++
		if j.StalledS > 0 {
			stalled++
		}
		switch j.Pending {
		case wire.PendingHeld:
			pending[StatusHeld]++
		case wire.PendingNoCapacity:
			pending[StatusNoCapacity]++
		}
		copies += max(0, len(j.Units)-1)
	}
	for s, n := range pending {
		t.gauge("hadar_pending_jobs", float64(n), lbl("status", s))
	}
	for s, n := range states {
		t.gauge("hadar_jobs", float64(n), lbl("state", s))
	}
	t.gauge("hadar_refused_jobs", float64(len(obs.Plan.Refused)))
	t.gauge("hadar_stalled_jobs", float64(stalled))
	t.gauge("hadar_fork_copies", float64(copies))
	if !obs.Plan.Time.IsZero() && obs.Plan.Time.Unix() > 0 {
		t.gauge("hadar_last_plan_timestamp_seconds", float64(obs.Plan.Time.UnixNano())/1e9)
	}
	t.SetLeader(obs.Leader)
}

// GPUs sums an observation's GPUs per type and rack, over the nodes the
// planner plans on.
func GPUs(obs wire.Observation) map[string]map[string]wire.GPUUse {
	out := map[string]map[string]wire.GPUUse{}
	for _, n := range obs.Nodes {
		if !n.Planned {
			continue
		}
		for _, g := range n.GPUs {
			if g.Type == "" {
				continue
			}
			t := string(g.Type)
			if out[t] == nil {
				out[t] = map[string]wire.GPUUse{}
			}
			u := out[t][n.Rack]
			mine, others := 0, 0
			for _, h := range g.Holders {
				if h.Managed {
					mine += h.Count
				} else {
					others += h.Count
				}
			}
			u.Total += g.Healthy
			u.Allocated += mine
			u.Unmanaged += others
			if n.Schedulable {
				u.Idle += max(0, g.Healthy-mine-others)
			}
			out[t][n.Rack] = u
		}
	}
	return out
}

func (t *Telemetry) sampleGPUs(obs wire.Observation) {
	for typ, racks := range GPUs(obs) {
		for rack, u := range racks {
			ls := []metrics.Label{lbl("gpu_type", typ), lbl("rack", rack)}
			t.gauge("hadar_gpus_total", float64(u.Total), ls...)
			t.gauge("hadar_gpus_allocated", float64(u.Allocated), ls...)
			t.gauge("hadar_gpus_unmanaged", float64(u.Unmanaged), ls...)
			t.gauge("hadar_gpus_idle", float64(u.Idle), ls...)
		}
	}
}

// sampleCounts turns the agent's running totals into counter increments.
func (t *Telemetry) sampleCounts(h wire.Health, ws watch.Stats) { t.seen.advance(h, ws, t.inc) }

// LearnedSource is a Source that learns throughputs (the agent): its
// figures become gauges.
type LearnedSource interface {
	Learned(ref planner.GPUType) wire.Learned
}

// sampleLearned sets the learned figures' gauges (nil: the source does
// not learn). A figure not yet applied has no series: it does not count
// in plans either. Called under t.mu.
func (t *Telemetry) sampleLearned(l *wire.Learned) {
	if l == nil {
		return
	}
	for _, f := range l.Figures {
		if !f.Applied || !(f.Rate > 0) {
			continue
		}
		t.gauge("hadar_learned_rate_steps_per_second", f.Rate, lbl("model", f.Model), lbl("workers", strconv.Itoa(f.SF)), lbl("gpu_type", string(f.Type)))
	}
	t.gauge("hadar_estimate_gaps", float64(len(l.Gaps)))
}

// sampleEvents counts the decisions made since the previous sample.
func (t *Telemetry) sampleEvents(obs wire.Observation, fresh []wire.Event) {
	now := make(map[string]wire.JobObservation, len(obs.Jobs))
	for _, j := range obs.Jobs {
		now[j.ID] = j
	}
	for _, ev := range fresh {
		switch ev.Action {
		case wire.ActionStart, wire.ActionStop, wire.ActionMove, wire.ActionFork, wire.ActionUnfork:
			applied := ev.Result == ""
			result := ResultApplied
			if !applied {
				result = ResultNotApplied
			}
			t.inc("hadar_decisions_total", 1, lbl("action", string(ev.Action)), lbl("result", result))
			if strings.Contains(ev.Result, apply.ErrConflict.Error()) {
				t.inc("hadar_rewrite_conflicts_total", 1)
			}
			if ev.Action != wire.ActionStart && ev.Action != wire.ActionFork {
				t.explained[ev.Job] = ev.Time
			}
			if !applied {
				continue
			}
			reason := map[wire.Action]string{wire.ActionStop: ReasonPreempted, wire.ActionMove: ReasonMigrated, wire.ActionUnfork: ReasonUnforked}[ev.Action]
			if reason != "" {
				t.inc("hadar_preemptions_total", 1, lbl("reason", reason))
				t.inc("hadar_evictions_total", 1, lbl("reason", reason))
			}
			if ev.Action == wire.ActionStart {
				t.observeAdmission(ev, now[ev.Job])
			}
		default:
			switch {
			case ev.Result == "complete":
				t.inc("hadar_jobs_finished_total", 1, lbl("result", "complete"))
			case strings.HasPrefix(ev.Result, "failed for good"):
				t.inc("hadar_jobs_finished_total", 1, lbl("result", "failed"))
			case strings.HasPrefix(ev.Result, "failed"):
				// A placement change that failed (a gang rolled back):
				// the job stopping after it is explained.
				t.explained[ev.Job] = ev.Time
			}
		}
	}
}

// observeAdmission records how long a started job waited: since it last
// began waiting, as the previous sample saw it, or since it arrived when
// it arrived and started between two samples.
func (t *Telemetry) observeAdmission(ev wire.Event, cur wire.JobObservation) {
	since := time.Time{}
	if m, ok := t.prev[ev.Job]; ok && !m.running {
		since = m.waitingSince
	}
	if since.IsZero() {
		since = cur.Arrival
	}
	if since.IsZero() || ev.Time.Before(since) {
		return
	}
	types := map[string]bool{}
	for _, u := range ev.To {
		for _, s := range u.Slots {
			types[string(s.Type)] = true
		}
	}
	names := make([]string, 0, len(types))
	for n := range types {
		names = append(names, n)
	}
	sort.Strings(names)
	t.admission.WithLabelValues(strings.Join(names, "+")).Observe(ev.Time.Sub(since).Seconds())
}

// sampleInterruptions counts jobs that ran at the previous sample and wait
// now without a decision that explains it: their workers died or were
// stopped by someone else, or their node is gone.
func (t *Telemetry) sampleInterruptions(obs wire.Observation, _ []wire.Event) {
	planned := map[string]bool{}
	for _, n := range obs.Nodes {
		planned[n.ID] = n.Planned
	}
	for _, j := range obs.Jobs {
		was, ok := t.prev[j.ID]
		if !ok || !was.running || len(j.Units) > 0 {
			continue
		}
		if _, ok := t.explained[j.ID]; ok {
			delete(t.explained, j.ID)
			continue
		}
		reason := ReasonInterrupted
		for _, n := range was.nodes {
			if !planned[n] {
				reason = ReasonNodeLost
			}
		}
		t.inc("hadar_evictions_total", 1, lbl("reason", reason))
	}
	// An explanation no stop followed (a decision not applied, a job
	// that kept running) must not excuse a later interruption.
	for id, at := range t.explained {
		if obs.Time.Sub(at) > time.Minute {
			delete(t.explained, id)
		}
	}
}

func (t *Telemetry) remember(obs wire.Observation) {
	prev := make(map[string]memo, len(obs.Jobs))
	for _, j := range obs.Jobs {
		m := memo{running: len(j.Units) > 0, waitingSince: j.WaitingSince, arrival: j.Arrival}
		for _, u := range j.Units {
			for _, s := range u.Slots {
				m.nodes = append(m.nodes, s.Node)
			}
		}
		prev[j.ID] = m
	}
	t.prev = prev
}

// cursor finds the decisions added to the history since the last look.
// The history is bounded (the agent keeps its last 500 decisions), so the
// last event seen is looked for from the end.
type cursor struct {
	set  bool
	last wire.Event
}

func sameEvent(a, b wire.Event) bool {
	return a.Time.Equal(b.Time) && a.Job == b.Job && a.Action == b.Action && a.Result == b.Result && a.Why == b.Why
}

// after returns the events after the last one seen; lost is true when
// that one is no longer in the history (more happened than it keeps).
func (c *cursor) after(evs []wire.Event) (fresh []wire.Event, lost bool) {
	if len(evs) == 0 {
		return nil, false
	}
	defer func() { c.set, c.last = true, evs[len(evs)-1] }()
	if !c.set {
		return evs, false
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if sameEvent(evs[i], c.last) {
			return evs[i+1:], false
		}
	}
	return evs, evs[0].Time.After(c.last.Time)
}
