package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/status"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// The explored job's true speeds, only in its emulate block: six times
// faster on the H100, a type no profile names.
const (
	exploreK80Pace  = 10.0
	exploreH100Pace = 60.0
)

// onNode: the job's running groups (c.running) are all on node.
func onNode(running map[string]string, node string) bool {
	for _, n := range running {
		if n != node {
			return false
		}
	}
	return len(running) > 0
}

// getJSON reads one of the status API's answers.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, body)
	}
}

// planned is a job's view in the status API's plan, and the GPU types its
// units hold.
func planned(t *testing.T, base, id string) (wire.JobView, map[string]bool) {
	t.Helper()
	var p wire.PlanView
	getJSON(t, base+"/v1/plan", &p)
	for _, jv := range p.Jobs {
		if jv.Job == id {
			types := map[string]bool{}
			for _, u := range jv.Units {
				for _, s := range u.Slots {
					types[string(s.Type)] = true
				}
			}
			return jv, types
		}
	}
	return wire.JobView{}, nil
}

// learnedOf is the learned figure of explore-llm on one GPU type, once
// applied.
func learnedOf(t *testing.T, base, typ string) (wire.LearnedFigure, bool) {
	t.Helper()
	var l wire.Learned
	getJSON(t, base+"/v1/learned", &l)
	for _, f := range l.Figures {
		if f.Model == "explore-llm" && f.SF == 1 && string(f.Type) == typ && f.Applied {
			return f, true
		}
	}
	return wire.LearnedFigure{}, false
}

// Issue 21 on a real Nomad cluster: a job of a model no profile has, whose
// true speeds are only in its emulate block, starts on the K80 (the H100,
// a type no profile names, is held by a plain Nomad job), is measured
// there, and once the H100 is free the sidecar explores it and the job
// ends on it, its fastest type, within 3 of the sidecar's rounds.
func TestSidecarExploresAnUntriedType(t *testing.T) {
	skipShort(t)
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: "explore-srv", Mode: harness.ModeServer})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	for _, n := range []struct{ name, gpus string }{
		{"k80-a", declare("ka", "Tesla K80", "12GiB", 1)},
		{"h100-a", declare("ha", h100Model, "80GiB", 1)},
	} {
		node := harness.StartAgent(t, harness.Options{Name: n.name, Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr},
			Meta: map[string]string{"rack": "r1"}, Plugins: map[string]string{"hadar-gpu": n.gpus, "hadar-train": train}})
		c.nodes[node.NodeID], c.ids[n.name] = n.name, node.NodeID
	}
	t.Cleanup(c.stopSidecar)
	// The H100 is busy at first: the job can only start on the K80.
	c.plainGPUJob("hold", "h100-a", h100Model, 1)

	// Rounds long enough for a stop and a start on a loaded machine;
	// learning's timing short, so a type is measured within about a round.
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Round: "20s"}, Learning: config.Learning{LearnWarmup: "5s", LearnEvidence: "10s"}})
	srv := httptest.NewServer(status.New(a, status.Options{}).Handler())
	t.Cleanup(srv.Close)
	rounds := func() int {
		var h wire.Health
		getJSON(t, srv.URL+"/v1/health", &h)
		return h.Rounds
	}

	// 9,000 steps: 15 minutes at the K80's pace, enough left after its
	// measurement that a turn on an unknown type is worth a restart.
	c.unprofiledJob("explore", "explore-llm", 9000, map[string]float64{modelK80: exploreK80Pace, h100Model: exploreH100Pace})
	c.waitFor("explore running on the K80", 3*time.Minute, func() error {
		if on := c.running("explore"); len(on) != 1 || !onNode(on, "k80-a") {
			return fmt.Errorf("running on %v", on)
		}
		return nil
	})
	c.waitFor("explore-llm measured on the K80", 3*time.Minute, func() error {
		f, ok := learnedOf(t, srv.URL, "k80")
		if !ok {
			return errNotYet
		}
		if f.Rate < 0.8*exploreK80Pace || f.Rate > 1.2*exploreK80Pace {
			return fmt.Errorf("learned %.1f steps/s on the K80, the truth is %g", f.Rate, exploreK80Pace)
		}
		return nil
	})
	if _, ok := learnedOf(t, srv.URL, "h100"); ok {
		t.Fatal("explore-llm has a figure on the H100 before it ever ran there")
	}

	// The H100 comes free: count rounds from the moment Nomad says so.
	if _, _, err := c.api.Jobs().Deregister("hold", false, nil); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the hold job's allocation ends", time.Minute, func() error {
		for _, al := range c.allocs("hold") {
			if al.ClientStatus == api.AllocClientStatusRunning || al.ClientStatus == api.AllocClientStatusPending {
				return errNotYet
			}
		}
		return nil
	})
	freed := rounds()
	var took int
	c.waitFor("explore running on the H100 within 3 rounds", 5*time.Minute, func() error {
		r := rounds()
		jv, types := planned(t, srv.URL, "explore")
		if on := c.running("explore"); len(on) == 1 && onNode(on, "h100-a") && jv.State == "running" && types["h100"] && !types["k80"] {
			took = r - freed
			return nil
		}
		if r-freed > 3 {
			t.Fatalf("%d rounds after the H100 came free, explore is not running there: plan %+v", r-freed, jv)
		}
		return errNotYet
	})
	t.Logf("explore moved to the H100 %d round(s) after it came free", took)
	// It went there to be measured: the decision says the type was tried.
	var hist []wire.Event
	getJSON(t, srv.URL+"/v1/decisions", &hist)
	tried := false
	for _, ev := range hist {
		if strings.HasSuffix(ev.Job, "explore") && (ev.Action == wire.ActionMove || ev.Action == wire.ActionStart) && strings.Contains(ev.Why, "trying h100") {
			tried = true
		}
	}
	if !tried {
		t.Fatalf("no decision of explore says it tries the H100: %+v", hist)
	}

	// It stays there: measured at its true speed, it completes on the H100.
	c.waitFor("explore-llm measured on the H100", 3*time.Minute, func() error {
		f, ok := learnedOf(t, srv.URL, "h100")
		if !ok {
			return errNotYet
		}
		if f.Rate < 0.8*exploreH100Pace || f.Rate > 1.2*exploreH100Pace {
			return fmt.Errorf("learned %.1f steps/s on the H100, the truth is %g", f.Rate, exploreH100Pace)
		}
		return nil
	})
	c.waitFor("explore completes", 5*time.Minute, func() error {
		if s := c.jobStatus("explore"); s != "dead" {
			return fmt.Errorf("status %s", s)
		}
		return nil
	})
	var last *api.AllocationListStub
	for _, al := range c.allocs("explore") {
		if last == nil || al.CreateIndex > last.CreateIndex {
			last = al
		}
	}
	if last == nil || c.nodes[last.NodeID] != "h100-a" || last.ClientStatus != api.AllocClientStatusComplete {
		t.Fatalf("explore's last allocation: %+v; want it complete on h100-a", last)
	}
}
