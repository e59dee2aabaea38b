package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/internal/pack"
	"github.com/hadar-sched/hadar/internal/release"
)

// TestPackInstallFromArchive: docs/deploy.md from the release archive
// alone, on an ACL cluster whose HTTP API is not on port 4646 (the
// harness picks free ports): `hadar version` names the release and its
// commit; the sidecar job rendered from the archive's deploy/pack/hadar,
// run with the auth method created from the shipped
// deploy/hadar-auth-method.json (JWKS at 127.0.0.1:4646), cannot log in
// and its log says to run `hadar auth-method -fix`; `hadar auth-method`
// reports it in one line and -fix sets the JWKS URL the pack renders from
// cluster_address; the sidecar then reaches a healthy leader, Nomad's
// checks passing (/v1/health on both replicas, /v1/leader on the leader
// alone). No file is edited by hand.
func TestPackInstallFromArchive(t *testing.T) {
	skipShort(t)
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The release archive, as make dist packs it, of this platform's
	// binaries (make dist's cross builds are not needed here).
	const version = "v0.3.0-e2e"
	commit := strings.TrimSpace(runIn(t, root, "git", "rev-parse", "HEAD"))
	stage := t.TempDir()
	runIn(t, root, "go", "build", "-ldflags", "-X "+release.StampVar+"="+version+" -X "+release.CommitVar+"="+commit, "-o", filepath.Join(stage, "hadar"), "./cmd/hadar")
	for _, b := range []struct{ src, dst string }{
		{harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer"), "hadar-trainer"},
		{filepath.Join(harness.PluginDir(t), "hadar-gpu"), "plugins/hadar-gpu"},
		{filepath.Join(harness.PluginDir(t), "hadar-train"), "plugins/hadar-train"},
	} {
		os.MkdirAll(filepath.Join(stage, filepath.Dir(b.dst)), 0o755)
		runIn(t, root, "cp", b.src, filepath.Join(stage, b.dst))
	}
	p := release.Platform{OS: "linux", Arch: runtime.GOARCH}
	archive := filepath.Join(t.TempDir(), release.ArchiveName(version, p))
	if err := release.Archive(root, stage, version, p, time.Unix(0, 0), archive); err != nil {
		t.Fatal(err)
	}
	// Unpacked where raw_exec's user "nobody" can run it.
	shared := harness.SharedDir(t)
	runIn(t, shared, "tar", "xzf", archive)
	dist := filepath.Join(shared, strings.TrimSuffix(filepath.Base(archive), ".tar.gz"))
	hadar := filepath.Join(dist, "hadar")
	if v := runIn(t, dist, hadar, "version"); !strings.HasPrefix(v, "hadar "+version+" (commit "+commit+")") {
		t.Fatalf("hadar version: %q, want %s and commit %s", v, version, commit)
	}

	srv := harness.StartAgent(t, harness.Options{Name: "pack-srv", Mode: harness.ModeServer, ACL: true})
	u, _ := url.Parse(srv.Addr)
	if u.Port() == "4646" {
		t.Skip("the harness gave the server port 4646: the point is another port")
	}
	var clients []*harness.Agent
	for i := range 2 {
		clients = append(clients, harness.StartAgent(t, harness.Options{Name: fmt.Sprintf("pack-c%d", i), Mode: harness.ModeClient, Servers: []string{srv.RPCAddr}, ACL: true, Token: srv.Token,
			Plugins: map[string]string{"raw_exec": "enabled = true"}}))
	}
	env := []string{"NOMAD_ADDR=" + srv.Addr, "NOMAD_TOKEN=" + srv.Token}
	cli := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dist, append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	nomad := func(args ...string) string {
		t.Helper()
		out, err := cli(harness.NomadBinary(t), args...)
		if err != nil {
			t.Fatalf("nomad %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	// Step 4, as the docs said before the pack: the shipped auth method.
	nomad("namespace", "apply", "training")
	nomad("acl", "policy", "apply", "-namespace", "default", "-job", "hadar-sidecar", "-description", "hadar sidecar", "hadar-sidecar", "docs/acl/hadar-sidecar.nomad.hcl")
	nomad("acl", "auth-method", "create", "-name", "hadar-workload", "-type", "JWT", "-max-token-ttl", "1h", "-token-locality", "local", "-config", "@deploy/hadar-auth-method.json")
	nomad("acl", "binding-rule", "create", "-auth-method", "hadar-workload", "-bind-type", "policy", "-bind-name", "hadar-sidecar",
		"-selector", `value.nomad_namespace == "default" and value.nomad_job_id == "hadar-sidecar"`)
	// Step 5 with the pack from the archive, before the auth method is
	// right: the sidecar cannot log in, and says what to run.
	pk, err := pack.Load(filepath.Join(dist, "deploy", "pack", "hadar"))
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := pk.Render(map[string]any{"cluster_address": srv.Addr, "hadar_binary": hadar, "round": "4s", "lock_ttl": "10s", "lock_delay": "1s"})
	if err != nil {
		t.Fatal(err)
	}
	jobFile := filepath.Join(t.TempDir(), "hadar-sidecar.nomad.hcl")
	if err := os.WriteFile(jobFile, []byte(rendered["hadar-sidecar.nomad"]), 0o644); err != nil {
		t.Fatal(err)
	}
	nomad("job", "run", "-detach", jobFile)
	t.Cleanup(func() {
		if _, _, err := srv.Client.Jobs().Deregister("hadar-sidecar", false, nil); err != nil {
			t.Logf("stopping the sidecar job: %v", err)
			return
		}
		harness.Eventually(context.Background(), time.Minute, 500*time.Millisecond, func() error {
			as, _, err := srv.Client.Jobs().Allocations("hadar-sidecar", true, nil)
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
	logs := func() string {
		var b strings.Builder
		for _, a := range clients {
			files, _ := filepath.Glob(filepath.Join(a.Dir, "data", "alloc", "*", "alloc", "logs", "hadar.std*"))
			for _, f := range files {
				l, _ := os.ReadFile(f)
				b.Write(l)
			}
		}
		return b.String()
	}
	harness.Eventually(context.Background(), 2*time.Minute, time.Second, func() error {
		if !strings.Contains(logs(), "hadar auth-method -fix") {
			return fmt.Errorf("no hint yet")
		}
		return nil
	})
	for _, l := range strings.Split(logs(), "\n") {
		if strings.Contains(l, "hadar auth-method -fix") {
			t.Logf("the sidecar, its auth method's JWKS URL wrong: %s", l)
			break
		}
	}
	if !strings.Contains(logs(), "hadar auth-method -fix") {
		t.Fatalf("the sidecar's log never says to run hadar auth-method:\n%s", tail([]byte(logs()), 4000))
	}
	want := srv.Addr + "/.well-known/jwks.json"
	out, err := cli(hadar, "auth-method")
	t.Logf("hadar auth-method, with the shipped JWKS URL: %s", strings.TrimSpace(out))
	if err == nil || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "is not this cluster's") || !strings.Contains(out, "set it to "+want) {
		t.Fatalf("hadar auth-method on the shipped auth method: %v, %q", err, out)
	}
	if out, err := cli(hadar, "auth-method", "-fix"); err != nil {
		t.Fatalf("hadar auth-method -fix: %v\n%s", err, out)
	}
	if out, err := cli(hadar, "auth-method"); err != nil || !strings.Contains(out, "serves this cluster's keys") {
		t.Fatalf("hadar auth-method after -fix: %v, %q", err, out)
	}

	if m, _, err := srv.Client.ACLAuthMethods().Get("hadar-workload", nil); err != nil || !strings.Contains(rendered["hadar-auth-method.json"], fmt.Sprintf("%q", m.Config.JWKSURL)) || m.Config.JWKSURL != want {
		t.Fatalf("the pack's auth method and the one -fix set differ (%v):\n%s", err, rendered["hadar-auth-method.json"])
	}

	c := &sidecarCluster{t: t, api: srv.Client}
	d := &deployed{c: c, t: t, mgmt: srv.Client}
	start := time.Now()
	c.waitFor("after -fix, two replicas of the pack's job, one leading, Nomad's checks passing (/v1/health on both, /v1/leader on the leader alone)", 3*time.Minute, func() error {
		if _, err := d.leader(); err != nil {
			return err
		}
		return d.checked()
	})
	t.Logf("a healthy leader %v after hadar auth-method -fix, on a server at %s", time.Since(start).Round(time.Second), srv.Addr)
}

// runIn runs a command in dir and returns its output, failing the test on
// an error.
func runIn(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
