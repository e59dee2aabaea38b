package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/sidecar/config"
)

// The systemd units the release ships (deploy/systemd) pass
// `systemd-analyze verify` with nothing to say: no unknown key, no bad
// value. verify also wants every ExecStart program to exist, so the test
// verifies copies whose /usr/local/bin/ programs are stand-ins in a
// temporary directory; nothing else is changed.
func TestSystemdUnits(t *testing.T) {
	root := repoRoot(t)
	var units []string
	for _, f := range Files() {
		if strings.HasSuffix(f, ".service") {
			units = append(units, f)
		}
	}
	if len(units) != 2 {
		t.Fatalf("the release ships units %v, want the Nomad client's and the sidecar's", units)
	}
	client, err := os.ReadFile(filepath.Join(root, "deploy/systemd/nomad-client.service"))
	if err != nil {
		t.Fatal(err)
	}
	// hadar-train's supervisors must outlive a restart of the client
	// (docs/driver.md, "Install").
	if !regexp.MustCompile(`(?m)^KillMode=process$`).Match(client) {
		t.Error("deploy/systemd/nomad-client.service lacks KillMode=process")
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian's systemd package has it): the units are not verified")
	}
	dir := t.TempDir()
	stubs := filepath.Join(dir, "bin")
	if err := os.Mkdir(stubs, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := regexp.MustCompile(`(?m)^ExecStart=/usr/local/bin/([A-Za-z0-9_.-]+)`)
	var paths []string
	for _, u := range units {
		b, err := os.ReadFile(filepath.Join(root, u))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range exe.FindAllSubmatch(b, -1) {
			if err := os.WriteFile(filepath.Join(stubs, string(m[1])), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		p := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/", stubs+"/")), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, paths...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify %v: %v\n%s", units, err, out)
	}

	// The check catches what it is for: an unknown key.
	bad := filepath.Join(dir, "bad.service")
	if err := os.WriteFile(bad, append(client, []byte("\n[Service]\nKilMode=process\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command(analyze, "verify", bad).CombinedOutput(); !strings.Contains(string(out), "KilMode") {
		t.Errorf("systemd-analyze verify let a misspelt key through: %s", out)
	}
}

// The sidecar's configuration the unit starts it with resolves.
func TestSystemdSidecarConfig(t *testing.T) {
	c, err := config.LoadConfig(filepath.Join(repoRoot(t), "deploy/systemd/sidecar.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.Nomad.TokenFile != "/etc/hadar/nomad-token" || s.State.Path != "/var/lib/hadar/sidecar.db" {
		t.Errorf("token file %q, state %q: not the unit's", s.Nomad.TokenFile, s.State.Path)
	}
}
