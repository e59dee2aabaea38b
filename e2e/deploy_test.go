package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// deployed is the sidecar job of deploy/ on a cluster.
type deployed struct {
	c    *sidecarCluster
	t    *testing.T
	mgmt *api.Client
	env  []string // NOMAD_ADDR and the management token, for the CLI
	// clients are the client agents (their data dirs hold the allocations).
	clients []*harness.Agent
}

// nomadCLI runs bin/nomad as an operator would.
func (d *deployed) nomadCLI(args ...string) string {
	d.t.Helper()
	cmd := exec.Command(harness.NomadBinary(d.t), args...)
	cmd.Env = append(os.Environ(), d.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		d.t.Fatalf("nomad %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// replica is one allocation of the sidecar job with its status API.
type sidecarAlloc struct {
	id, node, addr string
	health         wire.Health
}

// replicas are the sidecar's running allocations, by Nomad's service
// registrations, with their health.
func (d *deployed) replicas() ([]sidecarAlloc, error) {
	regs, _, err := d.mgmt.Services().Get("hadar-sidecar", nil)
	if err != nil {
		return nil, err
	}
	var out []sidecarAlloc
	for _, r := range regs {
		a := sidecarAlloc{id: r.AllocID, node: r.NodeID, addr: fmt.Sprintf("%s:%d", r.Address, r.Port)}
		resp, err := http.Get("http://" + a.addr + "/v1/health")
		if err != nil {
			return nil, err
		}
		err = json.NewDecoder(resp.Body).Decode(&a.health)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

func (d *deployed) leader() (sidecarAlloc, error) {
	rs, err := d.replicas()
	if err != nil {
		return sidecarAlloc{}, err
	}
	var leaders []sidecarAlloc
	for _, r := range rs {
		if r.health.Leader {
			leaders = append(leaders, r)
		}
	}
	if len(rs) != 2 || len(leaders) != 1 {
		return sidecarAlloc{}, fmt.Errorf("%d replicas registered, %d leading", len(rs), len(leaders))
	}
	return leaders[0], nil
}

// checked: Nomad's checks of every replica as the jobspec means them,
// "hadar health" passing on each and "hadar leader" on the leader alone.
func (d *deployed) checked() error {
	rs, err := d.replicas()
	if err != nil {
		return err
	}
	for _, r := range rs {
		checks, err := d.mgmt.Allocations().Checks(r.id, nil)
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, ch := range checks {
			got[ch.Check] = ch.Status + " (" + ch.Output + ")"
		}
		want := map[string]string{"hadar health": "success", "hadar leader": "failure"}
		if r.health.Leader {
			want["hadar leader"] = "success"
		}
		for name, st := range want {
			if !strings.HasPrefix(got[name], st+" ") {
				return fmt.Errorf("allocation %s (leader %v): check %q is %q, want %s", r.id, r.health.Leader, name, got[name], st)
			}
		}
	}
	return nil
}

// submit registers a managed job in the training namespace.
func (d *deployed) submit(id string, steps int) {
	d.t.Helper()
	job := d.c.hcl(scJob{id: id, steps: steps, gated: true})
	job = strings.Replace(job, fmt.Sprintf("job %q {", id), fmt.Sprintf("job %q {\n  namespace = \"training\"", id), 1)
	pj, err := d.mgmt.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: job, Canonicalize: true})
	if err != nil {
		d.t.Fatal(err)
	}
	if _, _, err := d.mgmt.Jobs().Register(pj, nil); err != nil {
		d.t.Fatal(err)
	}
}

func (d *deployed) waitComplete(id string) {
	d.t.Helper()
	d.c.waitFor("job "+id+" completes under the deployed sidecar", 3*time.Minute, func() error {
		j, _, err := d.mgmt.Jobs().Info(id, &api.QueryOptions{Namespace: "training"})
		if err != nil {
			return err
		}
		if *j.Status != "dead" {
			return fmt.Errorf("status %s", *j.Status)
		}
		return nil
	})
}

// identity reads the workload identity token Nomad wrote into an
// allocation's secrets, and its expiry.
func (d *deployed) identity(allocID string) (string, time.Time) {
	d.t.Helper()
	var tok []byte
	for _, a := range d.clients {
		b, err := os.ReadFile(filepath.Join(a.Dir, "data", "alloc", allocID, "hadar", "secrets", "nomad_hadar.jwt"))
		if err == nil {
			tok = b
		}
	}
	parts := strings.Split(strings.TrimSpace(string(tok)), ".")
	if len(parts) != 3 {
		d.t.Fatalf("allocation %s: no workload identity token in its secrets (%q)", allocID, tok)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		d.t.Fatal(err)
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == 0 {
		d.t.Fatalf("identity claims %s: %v", payload, err)
	}
	return string(tok), time.Unix(claims.Exp, 0)
}

// deploySidecar runs the sidecar job of deploy/ on a new cluster with
// ACLs (a server and two clients, a V100 and a K80 node, names prefixed
// by prefix) of Nomad version (harness.NomadVersions; "" the default), as
// docs/deploy.md says, with a lock TTL of ttl.
func deploySidecar(t *testing.T, prefix, version string, ttl time.Duration) *deployed {
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	hadar := harness.GoBinary(t, "./cmd/hadar", "hadar")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: prefix + "-srv", Mode: harness.ModeServer, ACL: true, NomadVersion: version})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	var clients []*harness.Agent
	for _, n := range []struct{ name, rack, gpus string }{
		{prefix + "-v100", "r1", declare("va", "Tesla V100-SXM2-16GB", "16GiB", 2)},
		{prefix + "-k80", "r2", declare("ka", "Tesla K80", "12GiB", 2)},
	} {
		a := harness.StartAgent(t, harness.Options{Name: n.name, Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr}, ACL: true, Token: c.server.Token, NomadVersion: version,
			Meta: map[string]string{"rack": n.rack}, Plugins: map[string]string{"hadar-gpu": n.gpus, "hadar-train": train, "raw_exec": "enabled = true"}})
		c.nodes[a.NodeID], c.ids[n.name] = n.name, a.NodeID
		clients = append(clients, a)
	}
	d := &deployed{c: c, t: t, mgmt: c.api, env: []string{"NOMAD_ADDR=" + c.server.Addr, "NOMAD_TOKEN=" + c.server.Token}, clients: clients}

	// docs/deploy.md, step by step.
	d.nomadCLI("namespace", "apply", "training")
	d.nomadCLI("acl", "policy", "apply", "-namespace", "default", "-job", "hadar-sidecar", "-description", "hadar sidecar",
		"hadar-sidecar", filepath.Join(root, "docs", "acl", "hadar-sidecar.nomad.hcl"))
	// The auth method as shipped, its JWKS at this server's address.
	method, err := os.ReadFile(filepath.Join(root, "deploy", "hadar-auth-method.json"))
	if err != nil {
		t.Fatal(err)
	}
	methodFile := filepath.Join(t.TempDir(), "auth-method.json")
	if err := os.WriteFile(methodFile, bytes.ReplaceAll(method, []byte("http://127.0.0.1:4646"), []byte(c.server.Addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	d.nomadCLI("acl", "auth-method", "create", "-name", "hadar-workload", "-type", "JWT", "-max-token-ttl", "1h", "-token-locality", "local", "-config", "@"+methodFile)
	d.nomadCLI("acl", "binding-rule", "create", "-auth-method", "hadar-workload", "-bind-type", "policy", "-bind-name", "hadar-sidecar",
		"-selector", `value.nomad_namespace == "default" and value.nomad_job_id == "hadar-sidecar"`)
	extra := `placement = "pack"
min_run_time = "1s"
gang_timeout = "40s"
stop_timeout = "30s"
log_level = "debug"`
	d.nomadCLI("job", "run", "-detach",
		"-var", "hadar_binary="+hadar,
		"-var", "policy=gavel-maxmin",
		"-var", "round=4s",
		"-var", "lock_ttl="+ttl.String(),
		"-var", "lock_delay=1s",
		"-var", "identity_ttl=20s",
		"-var", "extra_config="+extra,
		filepath.Join(root, "deploy", "hadar-sidecar.nomad.hcl"))
	// The sidecar's allocations end before the agents' cleanup collects
	// them (their secrets are tmpfs mounts Nomad removes only then).
	t.Cleanup(func() {
		if _, _, err := d.mgmt.Jobs().Deregister("hadar-sidecar", false, nil); err != nil {
			t.Logf("stopping the sidecar job: %v", err)
			return
		}
		harness.Eventually(context.Background(), time.Minute, 500*time.Millisecond, func() error {
			as, _, err := d.mgmt.Jobs().Allocations("hadar-sidecar", true, nil)
			if err != nil {
				return err
			}
			for _, a := range as {
				if a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending {
					return fmt.Errorf("allocation %s %s", a.ID, a.ClientStatus)
				}
			}
			return nil
		})
	})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, a := range clients {
			logs, _ := filepath.Glob(filepath.Join(a.Dir, "data", "alloc", "*", "alloc", "logs", "hadar.std*"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", l, tail(b, 4000))
			}
		}
	})

	return d
}

// TestDeployedSidecar: the sidecar deployed by deploy/hadar-sidecar.nomad.hcl
// on a cluster with ACLs, as docs/deploy.md says: two replicas through
// raw_exec, each authenticated by its workload identity alone (the ACL
// policy of docs/acl bound to the job with `nomad acl policy apply -job`
// and to the JWT auth method of deploy/ by a binding rule; the identity
// read from the task's secrets on every request and exchanged for an ACL
// token), Nomad's checks passing (/v1/health on both, /v1/leader on the
// leader alone). The leader places and completes a job; its identity's
// first token lapses and the sidecar goes on with the renewed ones
// (logging in again with each); its status API answers Nomad ACL tokens
// with the namespaces they may read; stopping the leader's allocation
// hands over to another replica, which places and completes the next job.
func TestDeployedSidecar(t *testing.T) {
	skipShort(t)
	const ttl = 10 * time.Second
	d := deploySidecar(t, "dep", "", ttl)
	c, clients := d.c, d.clients

	var lead sidecarAlloc
	c.waitFor("two replicas registered, one leading, Nomad's checks passing (health on both, leader on the leader)", 3*time.Minute, func() error {
		var err error
		if lead, err = d.leader(); err != nil {
			return err
		}
		return d.checked()
	})
	if c.nodes[lead.node] == "" {
		t.Fatalf("the leader runs on node %s, not one of the cluster's", lead.node)
	}
	firstToken, firstExpiry := d.identity(lead.id)
	t.Logf("leader %s on %s; its first identity token expires at %s", lead.id, c.nodes[lead.node], firstExpiry.Format(time.RFC3339))

	d.submit("first", 300)
	d.waitComplete("first")

	// The status API beyond loopback, Nomad ACL tokens: none is refused, a
	// token of the default namespace alone sees no training job, the
	// management token sees it.
	if _, err := d.mgmt.ACLPolicies().Upsert(&api.ACLPolicy{Name: "default-reader", Rules: `namespace "default" { policy = "read" }`}, nil); err != nil {
		t.Fatal(err)
	}
	reader, _, err := d.mgmt.ACLTokens().Create(&api.ACLToken{Type: "client", Policies: []string{"default-reader"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	statusOf := func(tok string) (int, wire.Status) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+lead.addr+"/v1/status", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st wire.Status
		b, _ := io.ReadAll(resp.Body)
		json.Unmarshal(b, &st)
		return resp.StatusCode, st
	}
	mentions := func(st wire.Status, id string) bool {
		for _, ev := range st.Decisions {
			if ev.Job == id {
				return true
			}
		}
		return false
	}
	if code, _ := statusOf(""); code != http.StatusUnauthorized {
		t.Fatalf("the status API without a token: %d", code)
	}
	if code, st := statusOf(reader.SecretID); code != 200 || mentions(st, "training/first") || len(st.Racks) != 0 {
		t.Fatalf("a default-namespace reader: %d, sees training/first %v, %d racks", code, mentions(st, "training/first"), len(st.Racks))
	}
	if code, st := statusOf(c.server.Token); code != 200 || !mentions(st, "training/first") || len(st.Racks) != 2 {
		t.Fatalf("the management token: %d, sees training/first %v, %d racks", code, mentions(st, "training/first"), len(st.Racks))
	}

	// The identity's first token lapses (Nomad accepts a token up to a
	// minute past its expiry): the sidecar must be on a renewed one.
	if wait := time.Until(firstExpiry.Add(65 * time.Second)); wait > 0 {
		t.Logf("waiting %v for the first identity token to lapse", wait.Round(time.Second))
		time.Sleep(wait)
	}
	if tok, _ := d.identity(lead.id); tok == firstToken {
		t.Fatal("Nomad did not renew the identity token: the renewal is not exercised")
	}
	d.submit("renewed", 200)
	d.waitComplete("renewed")

	// Stop the leader's allocation: another replica takes over (the one
	// that was following, or the replacement Nomad starts at once: they
	// race for the lock).
	stopped := time.Now()
	if _, err := d.mgmt.Allocations().Stop(&api.Allocation{ID: lead.id}, nil); err != nil {
		t.Fatal(err)
	}
	var next sidecarAlloc
	c.waitFor("another replica leads", 2*time.Minute, func() error {
		l, err := d.leader()
		if err != nil {
			return err
		}
		if l.id == lead.id {
			return fmt.Errorf("the stopped allocation %s still leads", l.id)
		}
		next = l
		return nil
	})
	took := time.Since(stopped)
	bound := 2*ttl + time.Second + 2*time.Second + 4*time.Second + 10*time.Second
	t.Logf("replica %s took over %v after the leader's allocation was stopped (bound %v: 2 x TTL + lock delay 1s + acquire retry 2s + a round 4s + 10s for the replacement's start)",
		next.id, took.Round(time.Millisecond), bound)
	if took > bound {
		t.Fatalf("takeover took %v, over %v", took, bound)
	}
	d.submit("after", 200)
	d.waitComplete("after")
	// Every replica logged in with its identity, and again with each
	// renewal: more auth method tokens than replicas ever started.
	toks, _, err := d.mgmt.ACLTokens().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	logins := 0
	for _, tok := range toks {
		if strings.Contains(tok.Name, "hadar-workload") {
			logins++
		}
	}
	t.Logf("%d logins to the auth method by 3 replicas over the run", logins)
	if logins <= 3 {
		t.Fatalf("%d logins: the renewed identities were never used to log in again", logins)
	}
	var logs bytes.Buffer
	for _, a := range clients {
		files, _ := filepath.Glob(filepath.Join(a.Dir, "data", "alloc", "*", "alloc", "logs", "hadar.stderr.*"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			logs.Write(b)
		}
	}
	if bytes.Contains(logs.Bytes(), []byte(firstToken)) {
		t.Fatal("the identity token appears in the sidecar's log")
	}
}
