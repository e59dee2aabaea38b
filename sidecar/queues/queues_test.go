package queues

import (
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// status plans team nlp borrowing every GPU, then team vision (namespace
// cv) waiting for its guarantee back, and returns the queues' status.
func status(t *testing.T) (queue.Status, queue.Config) {
	t.Helper()
	cfg, err := queue.Parse("q.hcl", []byte(`
queue "vision" {
  namespaces = ["cv"]
  guarantee  = { v100 = 4 }
  limit      = { v100 = 6 }
}
`))
	if err != nil {
		t.Fatal(err)
	}
	m := speed.Model{Profile: profile.Default()}
	s, err := registry.BuildQueues(cfg, "fifo", placement.Pack, registry.Options{Types: []planner.GPUType{"v100"}, Speed: m}, placement.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Round: 360, Speed: m}, s)
	if err != nil {
		t.Fatal(err)
	}
	e.SetNodes([]planner.Node{{ID: "a", GPUs: map[planner.GPUType]int{"v100": 4}}, {ID: "b", GPUs: map[planner.GPUType]int{"v100": 4}}}, 0)
	admit := func(id, q string, now float64) {
		if err := e.Admit(planner.Job{ID: id, Model: "ResNet-18 (batch size 16)", ScaleFactor: 4, TotalSteps: 1e9, Weight: 1, Queue: q, Arrival: now}, now); err != nil {
			t.Fatal(err)
		}
	}
	admit("nlp/x", "nlp", 0)
	admit("nlp/y", "nlp", 0)
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	admit("cv/z", "vision", 10)
	if _, err := e.Plan(context.Background(), 10, engine.Fill); err != nil {
		t.Fatal(err)
	}
	return s.Status(), cfg
}

func TestFilterShowsACallerItsNamespacesOnly(t *testing.T) {
	st, cfg := status(t)
	all := Filter(st, cfg, nil)
	if len(all.Queues) != 2 || all.Queues[0].Name != "vision" || all.Queues[1].Name != "nlp" || len(all.Queues[1].Jobs) != 2 {
		t.Fatalf("everything: %+v", all)
	}
	cv := Filter(st, cfg, func(ns string) bool { return ns == "cv" })
	if len(cv.Queues) != 1 || cv.Queues[0].Name != "vision" || len(cv.Queues[0].Jobs) != 1 || cv.Queues[0].Jobs[0].ID != "cv/z" {
		t.Fatalf("a cv reader sees %+v", cv)
	}
	if j := cv.Queues[0].Jobs[0]; j.Code != queue.ReasonReclaim || j.Running {
		t.Fatalf("cv/z: %+v, want waiting for reclaim", j)
	}
	if !slices.Equal(cv.Queues[0].Namespaces, []string{"cv"}) {
		t.Fatalf("namespaces %v", cv.Queues[0].Namespaces)
	}
	// A reader of nlp sees its implicit queue, not vision (no namespace
	// of vision's, no job of its own there).
	nlp := Filter(st, cfg, func(ns string) bool { return ns == "nlp" })
	if len(nlp.Queues) != 1 || nlp.Queues[0].Name != "nlp" {
		t.Fatalf("an nlp reader sees %+v", nlp)
	}
	if none := Filter(st, cfg, func(string) bool { return false }); len(none.Queues) != 0 {
		t.Fatalf("a reader of nothing sees %+v", none)
	}
}

func TestGaugesAndCounters(t *testing.T) {
	st, _ := status(t)
	got := map[string]float64{}
	for _, s := range Gauges(st) {
		key := s.Name
		for _, l := range s.Labels {
			key += "," + l[0] + "=" + l[1]
		}
		got[key] = s.Value
	}
	for key, want := range map[string]float64{
		"hadar_queue_pending_jobs,queue=vision,reason=waiting_for_reclaim": 1,
		"hadar_queue_admitted_jobs,queue=nlp":                              2,
		"hadar_queue_guaranteed_gpus,queue=vision,gpu_type=v100":           4,
		"hadar_queue_limit_gpus,queue=vision,gpu_type=v100":                6,
		"hadar_queue_used_gpus,queue=nlp,gpu_type=v100":                    8,
		"hadar_queue_borrowed_gpus,queue=nlp,gpu_type=v100":                8,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v (all: %v)", key, got[key], want, got)
		}
	}
	for _, s := range Gauges(st) {
		if !slices.ContainsFunc(Defs, func(d Def) bool { return d.Name == s.Name }) {
			t.Fatalf("sample of %s, a family Defs lacks", s.Name)
		}
	}
	prev := map[CounterKey]uint64{{"nlp", ReasonReclaim}: 1}
	cur := map[CounterKey]uint64{{"nlp", ReasonReclaim}: 3, {"nlp", ReasonFairSharing}: 0, {"vision", ReasonReclaim}: 2}
	inc := Increments(prev, cur)
	if len(inc) != 2 || inc[CounterKey{"nlp", ReasonReclaim}] != 2 || inc[CounterKey{"vision", ReasonReclaim}] != 2 {
		t.Fatalf("increments %v", inc)
	}
	if c := Counters(st); len(c) != 4 || c[CounterKey{"nlp", ReasonReclaim}] != 0 {
		t.Fatalf("counters %v", c)
	}
}

// The conversion to the wire carries every field of a queue and a job
// (a field the planner gained fails here: decide whether the API shows
// it), and keeps a missing map null as the API always wrote it.
func TestFilterCarriesEveryField(t *testing.T) {
	gpus := map[planner.GPUType]int{"v100": 1}
	q := queue.QueueStatus{Name: "q", Policy: "fifo", Weight: 1, Guarantee: gpus, Scaled: true, Limit: gpus, Share: gpus, Used: gpus,
		Borrowed: gpus, Pending: 1, Admitted: 2, Reclaimed: 3, FairSharePreempted: 4}
	js := queue.JobStatus{Queue: "q", Priority: 1, Weight: 2, Clamped: true, Running: true, Reason: queue.Reason{Code: queue.ReasonBorrowing, Why: "lent"}}
	for _, v := range []any{q, js, js.Reason} {
		for _, f := range reflect.VisibleFields(reflect.TypeOf(v)) {
			if reflect.ValueOf(v).FieldByIndex(f.Index).IsZero() {
				t.Fatalf("the test's %T leaves %s zero", v, f.Name)
			}
		}
	}
	// Fields of the planner's types, embedded Reason's counted as the
	// job's own, against the wire's (less the view's own additions).
	if n, m := reflect.TypeOf(q).NumField(), reflect.TypeOf(wire.Queue{}).NumField()-2; n != m {
		t.Errorf("queue.QueueStatus has %d fields, wire.Queue %d besides Namespaces and Jobs", n, m)
	}
	if n, m := reflect.TypeOf(js).NumField()-1+reflect.TypeOf(js.Reason).NumField(), reflect.TypeOf(wire.QueueJob{}).NumField()-1; n != m {
		t.Errorf("queue.JobStatus has %d fields, wire.QueueJob %d besides ID", n, m)
	}
	v := Filter(queue.Status{Time: 1, Static: true, Queues: []queue.QueueStatus{q}, Jobs: map[string]queue.JobStatus{"ns/j": js}},
		queue.Config{Queues: []queue.Queue{{Name: "q", Namespaces: []string{"ns"}}}}, nil)
	for _, w := range []any{v, v.Queues[0], v.Queues[0].Jobs[0]} {
		for _, f := range reflect.VisibleFields(reflect.TypeOf(w)) {
			if reflect.ValueOf(w).FieldByIndex(f.Index).IsZero() {
				t.Errorf("%T.%s is not carried over", w, f.Name)
			}
		}
	}
	if got := Filter(queue.Status{Queues: []queue.QueueStatus{{Name: "q"}}}, queue.Config{}, nil).Queues[0]; got.Guarantee != nil || got.Used != nil {
		t.Errorf("a missing map became %v: the API writes null for it", got)
	}
}
