package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
)

// TestSidecarLeastPrivilege: on a cluster with ACLs enabled, the sidecar
// runs with a token of docs/acl/hadar-sidecar.nomad.hcl only: it plans and
// places managed jobs in its namespace, keeps its state and lock in Nomad
// Variables, and the token's secret appears in no log, no API answer and
// no error of the run.
func TestSidecarLeastPrivilege(t *testing.T) {
	skipShort(t)
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: "acl-srv", Mode: harness.ModeServer, ACL: true})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	for _, n := range []struct{ name, rack, gpus string }{
		{"acl-v100", "r1", declare("va", "Tesla V100-SXM2-16GB", "16GiB", 2)},
		{"acl-k80", "r2", declare("ka", "Tesla K80", "12GiB", 2)},
	} {
		a := harness.StartAgent(t, harness.Options{Name: n.name, Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr}, ACL: true, Token: c.server.Token,
			Meta: map[string]string{"rack": n.rack}, Plugins: map[string]string{"hadar-gpu": n.gpus, "hadar-train": train}})
		c.nodes[a.NodeID], c.ids[n.name] = n.name, a.NodeID
	}
	if _, err := c.api.Namespaces().Register(&api.Namespace{Name: "training"}, nil); err != nil {
		t.Fatal(err)
	}
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(root, "docs", "acl", "hadar-sidecar.nomad.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.api.ACLPolicies().Upsert(&api.ACLPolicy{Name: "hadar-sidecar", Rules: string(rules)}, nil); err != nil {
		t.Fatalf("the documented policy: %v", err)
	}
	tok, _, err := c.api.ACLTokens().Create(&api.ACLToken{Name: "hadar-sidecar", Type: "client", Policies: []string{"hadar-sidecar"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := tok.SecretID

	// A plain job in the default namespace, outside the sidecar's write
	// permission, holding a K80.
	c.plainGPUJob("human", "acl-k80", "Tesla K80", 1)

	body := `policy = "gavel-maxmin"
placement = "pack"
round = "4s"
min_run_time = "1s"
namespaces = ["*"]
leader {
  enabled   = true
  namespace = "training"
}
state {
  store     = "nomad"
  namespace = "training"
}`
	// The token is in the environment only, as the docs ask.
	t.Setenv("NOMAD_TOKEN", secret)
	r := c.startReplica(t, "acl", body)
	os.Unsetenv("NOMAD_TOKEN")

	job := c.hcl(scJob{id: "trained", steps: 300, gated: true})
	job = strings.Replace(job, "job \"trained\" {", "job \"trained\" {\n  namespace = \"training\"", 1)
	pj, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: job, Canonicalize: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.api.Jobs().Register(pj, nil); err != nil {
		t.Fatal(err)
	}
	q := &api.QueryOptions{Namespace: "training"}
	c.waitFor("the managed job completes under the least-privilege token", 2*time.Minute, func() error {
		j, _, err := c.api.Jobs().Info("trained", q)
		if err != nil {
			return err
		}
		if *j.Status != "dead" {
			return fmt.Errorf("status %s", *j.Status)
		}
		return nil
	})
	h, err := r.health()
	if err != nil || !h.Leader {
		t.Fatalf("health %+v, %v: want the replica leading (the lock under the policy)", h, err)
	}

	// The secret in nothing the sidecar said.
	var answers bytes.Buffer
	for _, p := range []string{"/v1/health", "/v1/plan", "/v1/jobs", "/v1/decisions", "/v1/jobs/training/trained", "/v1/jobs/nope", "/metrics", "/v1/status"} {
		resp, err := http.Get("http://" + r.addr + p)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(&answers, resp.Body)
		resp.Body.Close()
	}
	r.kill(syscall.SIGTERM)
	<-r.done
	logs, _ := os.ReadFile(r.log)
	for name, b := range map[string][]byte{"the sidecar's log": logs, "the status API's answers": answers.Bytes()} {
		if bytes.Contains(b, []byte(secret)) {
			t.Fatalf("the token's secret appears in %s", name)
		}
	}
	if len(logs) == 0 {
		t.Fatal("the sidecar logged nothing: the grep proves nothing")
	}
	// And in no Nomad agent's log either (the sidecar's requests are logged
	// there).
	for _, a := range []*harness.Agent{c.server} {
		b, _ := os.ReadFile(a.LogFile)
		if bytes.Contains(b, []byte(secret)) {
			t.Fatalf("the token's secret appears in agent log %s", a.LogFile)
		}
	}
}
