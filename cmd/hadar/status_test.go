package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/sidecar/wire"
)

// statusAPI serves a fixed /v1/status and /v1/jobs/default/a.
func statusAPI(t *testing.T) *httptest.Server {
	now := time.Now()
	eta := now.Add(90 * time.Second)
	reported := now.Add(-3 * time.Second)
	st := wire.Status{Time: now, Sidecar: wire.SidecarStatus{Policy: "hadar", Placement: "delay", Leader: true, Round: 4, NextRound: now.Add(time.Minute), OK: true},
		GPUs: []wire.TypeSummary{{Type: "v100", GPUUse: wire.GPUUse{Total: 4, Allocated: 2, Unmanaged: 1, Idle: 1}}},
		Racks: []wire.Rack{{Rack: "r1", Nodes: []wire.NodeObservation{{ID: "n1", Name: "v100-a", Rack: "r1", Status: "ready", Schedulable: true, Planned: true,
			GPUs: []wire.GPUObservation{{Type: "v100", Total: 4, Healthy: 4, Holders: []wire.Holder{{Job: "default/a", Count: 2, Managed: true}, {Job: "default/plain", Count: 1}}}}}}}},
		Running: []wire.RunningEntry{{ID: "default/a", State: "running", Units: []wire.UnitView{{Slots: []wire.SlotView{{Node: "n1", Rack: "r1", Type: "v100", Count: 2}}}},
			Progress: 0.5, StepsDone: 500, Steps: 1000, Rate: 5.5, ETAS: 90, ETA: &eta, ProgressAt: &reported}},
		Queue:     []wire.QueueEntry{{ID: "default/b", Position: 1, Waits: "no_capacity", Why: "every v100 is taken", Nomad: "train: exhausted", WaitingS: 65, Workers: 4, RunsOn: []string{"v100"}}},
		Decisions: []wire.Event{{Time: now, Job: "default/a", Action: wire.ActionStart, Why: "its turn"}}}
	job := wire.JobDetail{ID: "default/b", State: "waiting", Waits: "no_capacity", QueuePosition: 1, QueueLength: 1, Why: "every v100 is taken",
		Job:        &wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: "default/b", Workers: 4, Model: "ResNet-50", Weight: 1}, JobProgress: wire.JobProgress{Steps: 1000, WaitingS: 65}}, Throughput: map[string]float64{"v100": 30}},
		Placements: []wire.Placement{{Time: now, Action: "stop", Why: "fairness"}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) { json.NewEncoder(w).Encode(st) })
	mux.HandleFunc("GET /v1/jobs/default/b", func(w http.ResponseWriter, _ *http.Request) { json.NewEncoder(w).Encode(job) })
	mux.HandleFunc("GET /v1/jobs/", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error": "no managed job \"zzz\" in the plan or the recent decisions"}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func runHadar(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHadarStatus(t *testing.T) {
	srv := statusAPI(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"status", "-addr", addr}, 0, []string{"healthy; policy hadar, placement delay; leader; round 4, next in", "v100      4      2      1      1",
			"default/a x2, default/plain x1 (not hadar's), 1 idle", "RUNNING (1)", "2xv100@v100-a/r1", " 50% (500/1000) as of 3s ago", "5.5 steps/s", "QUEUE (1)",
			"1  default/b  no capacity  1m5s", "every v100 is taken (Nomad: train: exhausted)", "RECENT DECISIONS", "default/a  start   its turn"}},
		{[]string{"status", "-addr", srv.URL, "default/b"}, 0, []string{"job default/b: waiting", "model ResNet-50, 4 workers", "waits: #1 of 1 in the queue, no capacity, for 1m5s",
			"runs on: v100 30.0 steps/s", "why: every v100 is taken", "PLACEMENTS", "stop"}},
		{[]string{"status", "-addr", srv.URL, "zzz"}, 1, []string{`no managed job "zzz"`}},
		{[]string{"status", "-addr", "ftp://x"}, 1, []string{"want host:port or an http:// or https:// URL"}},
		{[]string{"status", "a", "b"}, 2, []string{"usage: hadar status"}},
	} {
		code, out, errs := runHadar(c.args...)
		if code != c.code {
			t.Errorf("hadar %v: exit %d, want %d\n%s%s", c.args, code, c.code, out, errs)
		}
		for _, w := range c.want {
			if !strings.Contains(out+errs, w) {
				t.Errorf("hadar %v does not say %q:\n%s%s", c.args, w, out, errs)
			}
		}
	}
	// -json: the API's answer, as it is.
	code, out, _ := runHadar("status", "-json", "-addr", addr)
	var st wire.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Queue[0].ID != "default/b" {
		t.Errorf("hadar status -json: %d\n%s", code, out)
	}
	// Nobody listening: say where it looked and what to do.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := ln.Addr().String()
	ln.Close()
	if code, _, errs := runHadar("status", "-addr", free); code != 1 || !strings.Contains(errs, "cannot reach the sidecar at http://"+free) || !strings.Contains(errs, "hadar sidecar") {
		t.Errorf("hadar status against nothing: %d %s", code, errs)
	}
}

// The GPUS column names each node by name where the caller may see
// nodes, else by its whole ID, never by a prefix that could name another
// node; every unit of a HadarE job is listed.
func TestStatusPlacementColumn(t *testing.T) {
	const id1, id2 = "6a72020d-4c1b-11f0-9a1e-0242ac120002", "6a72020d-99ff-11f0-9a1e-0242ac120002"
	us := []wire.UnitView{
		{Slots: []wire.SlotView{{Node: id1, Rack: "r2", Type: "p100", Count: 1}, {Node: id2, Rack: "r2", Type: "v100", Count: 2}}},
		{Slots: []wire.SlotView{{Node: id2, Rack: "r2", Type: "v100", Count: 1}}},
	}
	if got, want := units(us, map[string]string{id1: "mix-a", id2: "mix-b"}), "1xp100@mix-a/r2+2xv100@mix-b/r2 | 1xv100@mix-b/r2"; got != want {
		t.Errorf("with node names: %q, want %q", got, want)
	}
	if got, want := units(us, nil), "1xp100@"+id1+"/r2+2xv100@"+id2+"/r2 | 1xv100@"+id2+"/r2"; got != want {
		t.Errorf("without node names: %q, want %q", got, want)
	}
	if got := units(nil, nil); got != "-" {
		t.Errorf("no units: %q", got)
	}
}
