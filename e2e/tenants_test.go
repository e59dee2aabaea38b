package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/agent"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/status"
)

// TestTwoTeamsOneFleet is issue 31's live scenario: two teams (namespaces
// cv and nlp) share one fleet on an ACL cluster, with a third namespace
// named like cv's queue. Nothing one team's jobs declare changes how the
// other's are planned, a namespace named like a queue gets no guarantee,
// and a token of one namespace learns nothing of another's jobs through
// the status API.
func TestTwoTeamsOneFleet(t *testing.T) {
	skipShort(t)
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: "teams-srv", Mode: harness.ModeServer, ACL: true})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	gpus := declare("tv", "Tesla V100-SXM2-16GB", "16GiB", 2) + strings.TrimPrefix(declare("tk", "Tesla K80", "12GiB", 2), "fingerprint_period = \"1s\"\n")
	n := harness.StartAgent(t, harness.Options{Name: "teams-fleet", Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr}, ACL: true, Token: c.server.Token,
		Meta: map[string]string{"rack": "r1"}, Plugins: map[string]string{"hadar-gpu": gpus, "hadar-train": train}})
	c.nodes[n.NodeID], c.ids["teams-fleet"] = "teams-fleet", n.NodeID
	for _, ns := range []string{"cv", "nlp", "vision"} {
		if _, err := c.api.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.stopSidecar)

	// The sidecar runs with the management token; its queues give cv's
	// queue, named "vision", two V100s.
	a := c.startSidecar(config.Config{
		Cluster:    config.Cluster{Nomad: &config.NomadConfig{Token: c.server.Token}, Namespaces: []string{"*"}},
		Scheduling: config.Scheduling{Policy: "gavel-maxmin", Round: "4s"},
		TeamQueues: config.TeamQueues{Queues: []queue.Block{
			{Name: "vision", Namespaces: []string{"cv"}, Guarantee: map[string]int{"v100": 2}},
			{Name: "research", Namespaces: []string{"nlp"}},
		}},
	})
	base := startTeamStatus(t, a, status.NewNomadTokens(c.api))

	submit := func(ns string, m scJob, edit func(string) string) {
		t.Helper()
		hcl := strings.Replace(c.hcl(m), fmt.Sprintf("job %q {", m.id), fmt.Sprintf("job %q {\n  namespace = %q", m.id, ns), 1)
		if edit != nil {
			hcl = edit(hcl)
		}
		j, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: hcl, Canonicalize: true})
		if err != nil {
			t.Fatalf("parse %s/%s: %v\n%s", ns, m.id, err, hcl)
		}
		if _, _, err := c.api.Jobs().Register(j, nil); err != nil {
			t.Fatalf("register %s/%s: %v", ns, m.id, err)
		}
	}
	throughputOf := func(id string) (map[string]float64, bool) {
		for _, j := range a.Observe().Jobs {
			if j.ID == id {
				return j.Throughput, true
			}
		}
		return nil, false
	}

	// nlp's job of model shared-net declares its own figures (40 and 10
	// steps/s, its true paces); a job in the namespace named like cv's
	// queue declares the same model at 0.001 steps/s and comes after it.
	const model = `    "hadar.model" = "shared-net"`
	submit("nlp", scJob{id: "honest-7f", steps: 10_000_000, gated: true, extra: model}, nil)
	c.waitFor("nlp's job is planned", 2*time.Minute, func() error {
		if tp, ok := throughputOf("nlp/honest-7f"); !ok || tp["v100"] != 40 {
			return fmt.Errorf("nlp/honest-7f: planned %v, throughput %v", ok, tp)
		}
		return nil
	})
	submit("vision", scJob{id: "liar-7f", steps: 10_000_000, gated: true, extra: model}, func(h string) string {
		return strings.Replace(h, `"hadar.throughput" = "k80=10,p100=20,v100=40"`, `"hadar.throughput" = "k80=0.001,v100=0.001"`, 1)
	})
	submit("cv", scJob{id: "cvjob-7f", steps: 10_000_000, gated: true}, nil)
	c.waitFor("every job is in the plan", 2*time.Minute, func() error {
		for _, id := range []string{"vision/liar-7f", "cv/cvjob-7f"} {
			if _, ok := throughputOf(id); !ok {
				return fmt.Errorf("%s not planned yet", id)
			}
		}
		return nil
	})
	c.waitCycles(a, 3)
	if tp, _ := throughputOf("vision/liar-7f"); tp["v100"] != 0.001 {
		t.Errorf("vision/liar-7f is planned at %v: its own declaration should plan it", tp)
	}
	if tp, _ := throughputOf("nlp/honest-7f"); tp["v100"] != 40 || tp["k80"] != 10 {
		t.Errorf("nlp/honest-7f is planned at %v after another namespace's job declared its model at 0.001 steps/s: want its own 40 and 10", tp)
	}

	// A namespace named like a queue is a queue of its own, with no
	// guarantee; cv's job is in the queue its operator named.
	if q := c.planOf(a, "liar-7f").TeamQueue; q != queue.NamespaceQueuePrefix+"vision" {
		t.Errorf("vision/liar-7f is in queue %q: want %q, not cv's queue named vision", q, queue.NamespaceQueuePrefix+"vision")
	}
	if q := c.planOf(a, "cvjob-7f").TeamQueue; q != "vision" {
		t.Errorf("cv/cvjob-7f is in queue %q: want vision", q)
	}

	// The liar leaves: nlp's job keeps its figures.
	if _, _, err := c.api.Jobs().Deregister("liar-7f", true, &api.WriteOptions{Namespace: "vision"}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("vision's job leaves the plan", 2*time.Minute, func() error {
		if _, ok := throughputOf("vision/liar-7f"); ok {
			return errNotYet
		}
		return nil
	})
	c.waitCycles(a, 2)
	if tp, ok := throughputOf("nlp/honest-7f"); !ok || tp["v100"] != 40 || tp["k80"] != 10 {
		t.Errorf("nlp/honest-7f after another namespace's job of its model left: planned %v at %v, want its own 40 and 10", ok, tp)
	}

	// A token that reads nlp alone sees nlp's job and nothing of cv's or
	// vision's, on every endpoint; the management token sees them all.
	if _, err := c.api.ACLPolicies().Upsert(&api.ACLPolicy{Name: "nlp-reader", Rules: `namespace "nlp" { policy = "read" }`}, nil); err != nil {
		t.Fatal(err)
	}
	nlp, _, err := c.api.ACLTokens().Create(&api.ACLToken{Type: "client", Policies: []string{"nlp-reader"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	read := func(tok string) string {
		var all strings.Builder
		for _, p := range []string{"/v1/status", "/v1/plan", "/v1/jobs", "/v1/decisions", "/v1/queues", "/v1/jobs/nlp/honest-7f"} {
			req, _ := http.NewRequest(http.MethodGet, base+p, nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("GET %s: %v", p, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d %s", p, resp.StatusCode, b)
			}
			fmt.Fprintf(&all, "%s\n%s\n", p, b)
		}
		return all.String()
	}
	mine, everyone := read(nlp.SecretID), read(c.server.Token)
	if !strings.Contains(mine, "honest-7f") {
		t.Fatalf("the nlp token does not see nlp's own job:\n%s", mine)
	}
	for _, other := range []string{"cvjob-7f", "liar-7f"} {
		if !strings.Contains(everyone, other) {
			t.Errorf("the management token does not see %s: the check below proves nothing", other)
		}
		if strings.Contains(mine, other) {
			t.Errorf("the nlp token learns of another namespace's job %s:\n%s", other, mine)
		}
	}
}

// startTeamStatus serves a's status API on loopback, authenticating
// Nomad ACL tokens, and returns its base URL.
func startTeamStatus(t *testing.T, a *agent.Agent, tokens *status.NomadTokens) string {
	t.Helper()
	srv := status.New(a, status.Options{Auth: status.Auth{Nomad: tokens},
		Logger: hclog.New(&hclog.LoggerOptions{Name: "status", Output: testWriter{t}})})
	ctx, cancel := context.WithCancel(context.Background())
	return serveStatus(t, ctx, srv, cancel)
}
