package status

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

type queueFake struct {
	fake
	st  queue.Status
	cfg queue.Config
	ok  bool
}

func (f *queueFake) Queues() (queue.Status, queue.Config, bool) { return f.st, f.cfg, f.ok }

func TestQueuesEndpoint(t *testing.T) {
	cfg := queue.Config{Queues: []queue.Queue{
		{Name: "vision", Namespaces: []string{"cv"}, Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 4}},
		{Name: "nlp", Namespaces: []string{"nlp"}, Weight: 1},
	}}
	st := queue.Status{Time: 10, Queues: []queue.QueueStatus{
		{Name: "vision", Guarantee: map[planner.GPUType]int{"v100": 4}, Used: map[planner.GPUType]int{"v100": 4}, Admitted: 1},
		{Name: "nlp", Used: map[planner.GPUType]int{"v100": 0}, Pending: 1, Reclaimed: 2},
	}, Jobs: map[string]queue.JobStatus{
		"cv/a":  {Queue: "vision", Running: true, Weight: 10, Clamped: true},
		"nlp/b": {Queue: "nlp", Reason: queue.Reason{Code: queue.ReasonReclaim, Why: "waits for reclaim"}},
	}}
	get := func(src Source, acc *Access, query string) (int, wire.Queues) {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/v1/queues"+query, nil)
		if acc != nil {
			r = r.WithContext(context.WithValue(r.Context(), scopeKey{}, scopeOf(r, *acc)))
		}
		w := httptest.NewRecorder()
		New(src, Options{}).mux.ServeHTTP(w, r)
		var v wire.Queues
		if w.Code == http.StatusOK {
			if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
				t.Fatal(err)
			}
		}
		return w.Code, v
	}

	// An operator sees every queue and job.
	src := &queueFake{st: st, cfg: cfg, ok: true}
	code, v := get(src, nil, "")
	if code != http.StatusOK || len(v.Queues) != 2 || len(v.Queues[0].Jobs) != 1 || !v.Queues[0].Jobs[0].Clamped || v.Queues[1].Jobs[0].Code != queue.ReasonReclaim {
		t.Fatalf("operator: %d %+v", code, v)
	}
	// A caller of namespace nlp sees its queue and its jobs only.
	nlp := Access{namespace: func(ns string) bool { return ns == "nlp" }}
	if code, v = get(src, &nlp, ""); code != http.StatusOK || len(v.Queues) != 1 || v.Queues[0].Name != "nlp" || len(v.Queues[0].Jobs) != 1 || v.Queues[0].Reclaimed != 2 {
		t.Fatalf("namespace nlp: %d %+v", code, v)
	}
	// ?namespace= narrows an operator's view.
	all := everything()
	if code, v = get(src, &all, "?namespace=cv"); code != http.StatusOK || len(v.Queues) != 1 || v.Queues[0].Name != "vision" {
		t.Fatalf("?namespace=cv: %d %+v", code, v)
	}
	// No queue configured: 404 saying so.
	if code, _ = get(&queueFake{}, nil, ""); code != http.StatusNotFound {
		t.Fatalf("no queues: got %d, want 404", code)
	}
	// A source without queues serves no such endpoint.
	if code, _ = get(&fake{}, nil, ""); code != http.StatusNotFound {
		t.Fatalf("a source without queues: got %d, want 404", code)
	}
	// /v1/status says whether there are queues: the page asks
	// /v1/queues only then (a 404 in the browser's console otherwise).
	for _, tc := range []struct {
		src  Source
		want bool
	}{{src, true}, {&queueFake{}, false}, {&fake{}, false}} {
		w := httptest.NewRecorder()
		New(tc.src, Options{}).mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/status", nil))
		var st wire.Status
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != http.StatusOK {
			t.Fatalf("/v1/status: %d %v", w.Code, err)
		}
		if st.Sidecar.TeamQueues != tc.want {
			t.Errorf("%T: team_queues %v, want %v", tc.src, st.Sidecar.TeamQueues, tc.want)
		}
	}
}
