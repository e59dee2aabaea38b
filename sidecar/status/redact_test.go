package status

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/sidecar/wire"
)

// A caller limited to its namespaces learns nothing of other namespaces'
// job names, not even from the reasons of its own jobs ("preempts
// default/a", "preempted for default/b"): on /v1/plan, /v1/jobs,
// /v1/jobs/..., /v1/status and /v1/decisions the names are replaced. A
// caller who may read both namespaces sees them.
func TestReasonsNameNoHiddenJob(t *testing.T) {
	src := scenario()
	why := "preempts default/a, default/b: a gain of 2h (team/c is fine; xdefault/a is not a job)"
	for i := range src.obs.Jobs {
		if src.obs.Jobs[i].ID == "team/c" {
			src.obs.Jobs[i].Reason = wire.Reason{Why: why}
		}
	}
	for i := range src.obs.Plan.Jobs {
		if src.obs.Plan.Jobs[i].ID == "team/c" {
			src.obs.Plan.Jobs[i].Reason = wire.Reason{Why: why}
		}
	}
	src.hist = append(src.hist, wire.Event{Time: now, Job: "team/c", Why: "preempted for default/done", Reason: wire.Reason{Why: "preempted for default/done"}})
	srv := New(src, Options{})
	team := scope{access: Access{namespace: func(ns string) bool { return ns == "team" }}}
	both := scope{access: Access{namespace: func(ns string) bool { return ns == "team" || ns == "default" }}}
	for _, path := range []string{"/v1/plan", "/v1/jobs", "/v1/jobs/team/c", "/v1/status", "/v1/decisions"} {
		rec := srv.scoped(httptest.NewRequest(http.MethodGet, path, nil), team)
		body := rec.body.String()
		if rec.code != http.StatusOK || !strings.Contains(body, "team/c") {
			t.Fatalf("GET %s as team: %d %.300s", path, rec.code, body)
		}
		for _, hidden := range []string{"default/a", "default/b", "default/done"} {
			if strings.Contains(strings.ReplaceAll(body, "xdefault/a", ""), hidden) {
				t.Errorf("GET %s as team: the answer names %s: %.600s", path, hidden, body)
			}
		}
		if path != "/v1/decisions" && !strings.Contains(body, "xdefault/a") {
			t.Errorf("GET %s as team: text that only looks like a job's name was changed: %.600s", path, body)
		}
		rec = srv.scoped(httptest.NewRequest(http.MethodGet, path, nil), both)
		if path != "/v1/decisions" && !strings.Contains(rec.body.String(), "preempts default/a, default/b") {
			t.Errorf("GET %s as a caller of both namespaces: the names are hidden: %.600s", path, rec.body.String())
		}
	}
}
