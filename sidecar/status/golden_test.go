package status

import (
	"bytes"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// update rewrites testdata/golden from what the API answers now: run it
// only for a change of the API meant to be seen by every client.
var update = flag.Bool("update", false, "rewrite the status API's golden answers in testdata/golden")

// goldenSource is a source with every field of every answer set, so that
// a renamed or dropped JSON field changes a golden file: a field left at
// its zero value with omitempty would be absent from the golden answer
// and its rename unseen.
type goldenSource struct {
	obs  wire.Observation
	hist []wire.Event
}

func (g *goldenSource) Plan() wire.PlanView       { return g.obs.Plan }
func (g *goldenSource) History() []wire.Event     { return g.hist }
func (g *goldenSource) Observe() wire.Observation { return g.obs }
func (g *goldenSource) WatchStats() watch.Stats   { return watch.Stats{} }
func (g *goldenSource) Health() wire.Health {
	return wire.Health{OK: true, Synced: now.Add(-2 * time.Second), Index: 4711, LastPlan: now.Add(-time.Second), Rounds: 3, Cycles: 120,
		Jobs: 4, Refused: 1, InFlight: 2, Writes: map[string]int{"start": 3, "stop": 1}, Repairs: map[string]int{wire.RepairPlacement: 1, wire.RepairFallback: 2},
		DryRun: true, Leader: true, Replica: "r-1", Generation: 7, LeaderGained: 2, LeaderLost: 1, Problem: "Nomad answered 500 once"}
}

func (g *goldenSource) Learned(ref planner.GPUType) wire.Learned {
	if ref == "" {
		ref = "v100"
	}
	return wire.Learned{Time: now, Learning: true, Reference: string(ref), TypeSpeeds: map[string]float64{"v100": 1, "h100": 3.1},
		Figures: []wire.LearnedFigure{{Model: "resnet50", SF: 2, Type: "v100", Profile: 20, Factor: 0.9, Rate: 18, Applied: true, Seconds: 600, Jobs: 3}},
		Gaps:    []wire.Gap{{Model: "resnet50", Type: "b200", Why: "nothing is known of b200"}}}
}

func (g *goldenSource) ExportProfile(planner.GPUType) ([]byte, error) {
	return []byte(`{"format":"hadar-profile/v1"}`), nil
}

func (g *goldenSource) Queues() (queue.Status, queue.Config, bool) {
	cfg := queue.Config{Static: true, Queues: []queue.Queue{
		{Name: "vision", Namespaces: []string{"default"}, Weight: 2, Guarantee: map[planner.GPUType]int{"v100": 4}},
		{Name: "nlp", Namespaces: []string{"team"}, Weight: 1},
	}}
	st := queue.Status{Time: 1800, Static: true, Queues: []queue.QueueStatus{
		{Name: "vision", Policy: "fifo", Weight: 2, Guarantee: map[planner.GPUType]int{"v100": 4}, Scaled: true, Limit: map[planner.GPUType]int{"v100": 8},
			Share: map[planner.GPUType]int{"v100": 4}, Used: map[planner.GPUType]int{"v100": 2}, Borrowed: map[planner.GPUType]int{"v100": 1},
			Pending: 2, Admitted: 1, Reclaimed: 3, FairSharePreempted: 4},
		{Name: "nlp", Policy: "hadar", Weight: 1, Guarantee: map[planner.GPUType]int{}, Share: map[planner.GPUType]int{"v100": 2},
			Used: map[planner.GPUType]int{"v100": 0}, Borrowed: map[planner.GPUType]int{}, Pending: 1},
	}, Jobs: map[string]queue.JobStatus{
		"default/a": {Queue: "vision", Priority: 5, Weight: 1.5, Clamped: true, Running: true, Reason: queue.Reason{Code: queue.ReasonBorrowing, Why: "runs on lent GPUs"}},
		"default/b": {Queue: "vision", Priority: 1, Weight: 1, Reason: queue.Reason{Code: queue.ReasonAtLimit, Why: "the queue is at its limit"}},
		"team/c":    {Queue: "nlp", Priority: 2, Weight: 1, Reason: queue.Reason{Code: queue.ReasonReclaim, Why: "waits for default/a to give the GPUs back"}},
	}}
	return st, cfg, true
}

func goldenScenario() *goldenSource {
	reason := func(why string) wire.Reason {
		return wire.Reason{Share: []float64{0.5, 0.25}, Priority: 1.25, Price: 3.5, Utility: 4.5, Timer: 60, Waited: 30, Why: why}
	}
	age := 12.5
	a := wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: "default/a", Namespace: "default", Job: "a", Model: "resnet50", Workers: 2, Widths: []int{2, 4, 8}, Weight: 1.5},
		JobDecision: wire.JobDecision{State: "running", Action: "move", Units: []wire.UnitView{{Slots: []wire.SlotView{{Node: "n1", Rack: "r1", Type: "v100", Count: 2}}}}, Position: -1, Reason: reason("faster on v100"), Nomad: "train: 1 node exhausted"},
		JobProgress: wire.JobProgress{StepsDone: 250, Steps: 1000, ProgressAgeS: &age, Rate: 5, ETA: 150, WaitingS: 5},
		JobHold:     wire.JobHold{MinRunTimeS: 600, MinRunTimeCap: "max_min_run_time"}, JobQueue: wire.JobQueue{TeamQueue: "vision", QueueReason: queue.ReasonBorrowing}, StalledS: 420},
		Pending: wire.PendingHeld, Arrival: now.Add(-2 * time.Hour), WaitingSince: now.Add(-time.Hour), Throughput: map[string]float64{"v100": 5, "k80": 1}}
	b := wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: "default/b", Namespace: "default", Job: "b", Model: "bert", Workers: 4, Weight: 1},
		JobDecision: wire.JobDecision{State: "waiting", Action: "wait", Position: 1, Reason: reason("delay scheduling: waits for 4 v100 GPUs at node level (preempted for team/c)"), Nomad: "train: 2 nodes exhausted"},
		JobProgress: wire.JobProgress{StepsDone: 10, Steps: 500, ProgressAgeS: &age, Rate: 2, ETA: 250, WaitingS: 40},
		JobHold:     wire.JobHold{MinRunTimeS: 300, MinRunTimeCap: "max_min_run_time"}, JobQueue: wire.JobQueue{TeamQueue: "vision", QueueReason: queue.ReasonAtLimit}, StalledS: 1},
		Pending: wire.PendingHeld, Arrival: now.Add(-time.Hour), WaitingSince: now.Add(-40 * time.Second), Throughput: map[string]float64{"v100": 40, "k80": 10}}
	c := wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: "team/c", Namespace: "team", Job: "c", Model: "gpt", Workers: 8, Weight: 2},
		JobDecision: wire.JobDecision{State: "waiting", Action: "stop", Position: 0, Reason: reason("not placed this round: the policy gave the GPUs it can use to default/a"), Nomad: "train: 4 nodes exhausted"},
		JobProgress: wire.JobProgress{StepsDone: 1, Steps: 100, ProgressAgeS: &age, Rate: 1, ETA: 99, WaitingS: 80},
		JobHold:     wire.JobHold{MinRunTimeS: 60, MinRunTimeCap: "max_min_run_time"}, JobQueue: wire.JobQueue{TeamQueue: "nlp", QueueReason: queue.ReasonReclaim}, StalledS: 2},
		Pending: wire.PendingNoCapacity, Arrival: now.Add(-30 * time.Minute), WaitingSince: now.Add(-80 * time.Second), Throughput: map[string]float64{"v100": 80}}
	late := wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: "default/late", Namespace: "default", Job: "late", Model: "bert", Workers: 1, Weight: 1},
		JobDecision: wire.JobDecision{State: "waiting", Action: "wait", Position: -1, Reason: reason("arrived after the plan")},
		JobProgress: wire.JobProgress{StepsDone: 0, Steps: 10, WaitingS: 1}},
		Pending: wire.PendingHeld, Arrival: now.Add(-time.Second), WaitingSince: now.Add(-time.Second), Throughput: map[string]float64{"k80": 3}}
	o := wire.Observation{Time: now, Leader: true,
		Plan: wire.PlanView{Time: now.Add(-time.Second), Kind: "round", Policy: "hadar", Placement: "delay", DryRun: true, Round: 3, NextRound: now.Add(time.Minute),
			Refused: []wire.RefusedJob{{Job: "default/bad", Error: `meta hadar.steps = "lots": want a positive integer`}, {Job: "team/worse", Error: "no GPU type"}}},
		Jobs: []wire.JobObservation{a, b, c, late},
		Nodes: []wire.NodeObservation{
			{ID: "n1", Name: "v100-a", Rack: "r1", Status: "ready", Schedulable: true, Planned: true,
				GPUs: []wire.GPUObservation{{Type: "v100", Models: []string{"Tesla V100-SXM2-16GB"}, Total: 4, Healthy: 4,
					Holders: []wire.Holder{{Job: "default/a", Count: 2, Managed: true}, {Job: "team/plain", Count: 1}}}}},
			{ID: "n2", Name: "k80-a", Rack: "r2", Status: "ready", Schedulable: true, Planned: true,
				GPUs: []wire.GPUObservation{{Type: "k80", Models: []string{"Tesla K80"}, Total: 4, Healthy: 3},
					{Type: "", Models: []string{"Quadro P400"}, Total: 1, Healthy: 1, Holders: []wire.Holder{{Job: "default/plain", Count: 1}}}}},
			{ID: "n3", Name: "k80-b", Rack: "r2", Status: "down", Schedulable: false, Planned: false, GPUs: []wire.GPUObservation{}},
		}}
	for _, j := range o.Jobs {
		o.Plan.Jobs = append(o.Plan.Jobs, j.JobView)
	}
	to := func(node, typ string, n int) []wire.Unit {
		return []wire.Unit{{Slots: []wire.Slot{{Node: node, Type: typ, Count: n}}}}
	}
	hist := []wire.Event{
		{Time: now.Add(-time.Hour), Job: "default/a", Action: "start", To: to("n2", "k80", 2), Why: "its turn", Result: "placed", Kind: "round", Reason: reason("its turn")},
		{Time: now.Add(-time.Minute), Job: "default/a", Action: "move", To: to("n1", "v100", 2), Why: "faster on v100", Result: "placed", Kind: "round", Reason: reason("faster on v100")},
		{Time: now.Add(-50 * time.Second), Job: "team/c", Action: "stop", Why: "preempted for default/a", Result: "stopped", Kind: "round", Reason: reason("preempted for default/a")},
		{Time: now.Add(-30 * time.Second), Job: "default/done", Action: "start", To: to("n1", "v100", 1), Why: "idle GPUs", Result: "placed", Kind: "fill", Reason: reason("idle GPUs")},
		{Time: now.Add(-10 * time.Second), Job: "default/done", Result: "complete"},
	}
	return &goldenSource{obs: o, hist: hist}
}

// goldenCase is one answer of the API: a route (as server.go registers
// it) asked for path, by a caller with access (nil: the API without
// authentication, which lets everyone see everything).
type goldenCase struct {
	name   string
	route  string
	path   string
	access *Access
	code   int
}

// routesWithoutGolden are the routes that serve no JSON of their own.
var routesWithoutGolden = map[string]string{
	"GET /metrics":           "Prometheus text, checked by sidecar/telemetry's tests",
	"GET /ui/":               "the page's own files",
	"GET /{$}":               "the page",
	"GET /v1/profile/export": "the profile file format (docs/formats.md), written by planner/profile and tested there",
}

func goldenCases() []goldenCase {
	team := &Access{Nodes: true, namespace: func(ns string) bool { return ns == "team" }}
	noNodes := &Access{namespace: func(ns string) bool { return ns == "default" }}
	return []goldenCase{
		{"health", "GET /v1/health", "/v1/health", nil, 200},
		{"leader", "GET /v1/leader", "/v1/leader", nil, 200},
		{"status", "GET /v1/status", "/v1/status", nil, 200},
		{"status_ns_default", "GET /v1/status", "/v1/status?namespace=default", nil, 200},
		{"status_team_token", "GET /v1/status", "/v1/status", team, 200},
		{"status_no_node_read", "GET /v1/status", "/v1/status", noNodes, 200},
		{"plan", "GET /v1/plan", "/v1/plan", nil, 200},
		{"plan_ns_team", "GET /v1/plan", "/v1/plan?namespace=team", nil, 200},
		{"plan_team_token", "GET /v1/plan", "/v1/plan", team, 200},
		{"jobs", "GET /v1/jobs", "/v1/jobs", nil, 200},
		{"jobs_team_token", "GET /v1/jobs", "/v1/jobs", team, 200},
		{"job_running", "GET /v1/jobs/{id...}", "/v1/jobs/default/a", nil, 200},
		{"job_waiting_by_name", "GET /v1/jobs/{id...}", "/v1/jobs/b", nil, 200},
		{"job_gone", "GET /v1/jobs/{id...}", "/v1/jobs/done", nil, 200},
		{"job_refused", "GET /v1/jobs/{id...}", "/v1/jobs/default/bad", nil, 200},
		{"job_unknown", "GET /v1/jobs/{id...}", "/v1/jobs/nope", nil, 404},
		{"job_team_token", "GET /v1/jobs/{id...}", "/v1/jobs/team/c", team, 200},
		{"job_team_token_hidden", "GET /v1/jobs/{id...}", "/v1/jobs/default/a", team, 404},
		{"decisions", "GET /v1/decisions", "/v1/decisions", nil, 200},
		{"decisions_team_token", "GET /v1/decisions", "/v1/decisions", team, 200},
		{"learned", "GET /v1/learned", "/v1/learned", nil, 200},
		{"learned_reference", "GET /v1/learned", "/v1/learned?reference=h100", nil, 200},
		{"learned_bad_reference", "GET /v1/learned", "/v1/learned?reference=not%20a%20type", nil, 400},
		{"learned_no_node_read", "GET /v1/learned", "/v1/learned", noNodes, 403},
		{"queues", "GET /v1/queues", "/v1/queues", nil, 200},
		{"queues_ns_team", "GET /v1/queues", "/v1/queues?namespace=team", nil, 200},
		{"queues_team_token", "GET /v1/queues", "/v1/queues", team, 200},
	}
}

// TestGoldenAnswers holds every JSON answer of the status API to a file
// under testdata/golden: the API is what the CLI, the page, the demo and
// other people's tools decode, so a change of it (a renamed field, a
// planner type's rename leaking through) must be seen and meant. Run with
// -update to rewrite the files after a deliberate change.
func TestGoldenAnswers(t *testing.T) {
	src := goldenScenario()
	tel, err := telemetry.New(src, telemetry.Options{Policy: "hadar"})
	if err != nil {
		t.Fatal(err)
	}
	// Two samples a step apart make one utilisation point.
	src.obs.Time = now.Add(-10 * time.Second)
	tel.Sample()
	src.obs.Time = now
	tel.Sample()
	s := New(src, Options{Telemetry: tel})
	h := s.Handler()
	dir := filepath.Join("testdata", "golden")
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range goldenCases() {
		r := httptest.NewRequest(http.MethodGet, c.path, nil)
		var code int
		var body []byte
		if c.access == nil {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			code, body = w.Code, w.Body.Bytes()
		} else {
			// What Handler does once a caller's credentials gave it access.
			rec := s.scoped(r, scopeOf(r, *c.access))
			code, body = rec.code, rec.body.Bytes()
		}
		if code != c.code {
			t.Errorf("%s: GET %s answered %d, want %d: %s", c.name, c.path, code, c.code, body)
		}
		file := filepath.Join(dir, c.name+".json")
		if *update {
			if err := os.WriteFile(file, body, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("%s: %v (run go test ./sidecar/status -run TestGoldenAnswers -update)", c.name, err)
			continue
		}
		if !bytes.Equal(body, want) {
			t.Errorf("%s: GET %s differs from %s (a change of the status API: if meant, rerun with -update and say so in CHANGELOG.md):\n%s", c.name, c.path, file, lineDiff(string(want), string(body)))
		}
	}
}

// lineDiff is the first lines where got and want differ, for the failure.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := 0; i < max(len(w), len(g)) && len(out) < 20; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			out = append(out, "- "+wl, "+ "+gl)
		}
	}
	return strings.Join(out, "\n")
}

// TestGoldenCoversEveryRoute fails for a route added to the server
// without a golden answer (or a reason it has none).
func TestGoldenCoversEveryRoute(t *testing.T) {
	re := regexp.MustCompile(`\.Handle(?:Func)?\("(GET [^"]+)"`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, c := range goldenCases() {
		covered[c.route] = true
	}
	var routes []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			routes = append(routes, m[1])
		}
	}
	sort.Strings(routes)
	if len(routes) < 8 {
		t.Fatalf("found only the routes %v: the pattern no longer matches server.go's registrations", routes)
	}
	for _, r := range routes {
		if !covered[r] && routesWithoutGolden[r] == "" {
			t.Errorf("route %q has no golden answer in goldenCases", r)
		}
	}
}
