package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/sidecar/wire"
)

// An elastic job's width (issue 35): hadar status says the width it runs
// at of those it declared, and the policy's reason; a waiting elastic job
// needs its widths; the job's page says both.
func TestHadarStatusElastic(t *testing.T) {
	now := time.Now()
	why := "sia: 2 GPUs of v100, normalized goodput 1.22"
	two := []wire.UnitView{{Slots: []wire.SlotView{{Node: "n1", Rack: "r1", Type: "v100", Count: 2}}}}
	st := wire.Status{Time: now, Sidecar: wire.SidecarStatus{Policy: "sia", Placement: "delay", Leader: true, Round: 4, NextRound: now.Add(time.Minute), OK: true},
		Running: []wire.RunningEntry{{ID: "default/el", State: "running", Units: two, Workers: 1, Widths: []int{1, 2}, Why: why, Steps: 100},
			{ID: "default/rigid", State: "running", Units: two, Workers: 2, Why: "its turn", Steps: 100}},
		Queue: []wire.QueueEntry{{ID: "default/w", Position: 1, Waits: "no_capacity", Why: "sia: left out", Workers: 2, Widths: []int{2, 4, 8}, RunsOn: []string{"v100"}}}}
	job := wire.JobDetail{ID: "default/el", State: "running", Why: why,
		Job: &wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: "default/el", Workers: 1, Widths: []int{1, 2}, Model: "ResNet-50", Weight: 1},
			JobDecision: wire.JobDecision{Units: two}, JobProgress: wire.JobProgress{Steps: 100}}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) { json.NewEncoder(w).Encode(st) })
	mux.HandleFunc("GET /v1/jobs/default/el", func(w http.ResponseWriter, _ *http.Request) { json.NewEncoder(w).Encode(job) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct {
		args    []string
		want    []string
		notWant []string
	}{
		{[]string{"status", "-addr", srv.URL}, []string{"running, 2 of 1-2 workers", "default/el: 2 of 1-2 workers: " + why, "2,4,8x v100"}, []string{"default/rigid: "}},
		{[]string{"status", "-addr", srv.URL, "default/el"}, []string{"model ResNet-50, 2 of 1-2 workers, weight 1"}, nil},
	} {
		code, out, errs := runHadar(c.args...)
		if code != 0 {
			t.Fatalf("hadar %v: exit %d\n%s%s", c.args, code, out, errs)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("hadar %v does not say %q:\n%s", c.args, w, out)
			}
		}
		for _, w := range c.notWant {
			if strings.Contains(out, w) {
				t.Errorf("hadar %v says %q:\n%s", c.args, w, out)
			}
		}
	}
}
