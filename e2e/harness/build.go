// Package harness starts real Nomad agents for hadar's end-to-end tests:
// it builds the pinned Nomad (e2e/tools/nomad) and hadar's plugins into
// bin/, writes an agent config with free loopback ports, a plugin_dir and
// plugin blocks, starts the agent, waits for it, and on test failure prints
// the agent's log. Tests of other packages (the sidecar's) reuse it.
package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NomadVersion is the Nomad release the tests run against; it must match
// the require line of e2e/tools/nomad/go.mod.
const NomadVersion = "1.11.3"

// RepoRoot finds the repository root (the directory holding the root
// go.mod) from the working directory upwards.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/hadar-sched/hadar\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("repository root not found above the working directory (no go.mod of module github.com/hadar-sched/hadar)")
		}
		dir = parent
	}
}

// lockBin serializes builds into bin/ across test binaries running in
// parallel (go test runs packages concurrently).
func lockBin(t testing.TB, root string) func() {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(root, "bin", ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatal(err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}

func run(ctx context.Context, dir string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s (in %s): %w\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return nil
}

// NomadBinary returns bin/nomad, building it from e2e/tools/nomad when it
// is missing or not NomadVersion (a cold build takes minutes; later calls
// are instant). `make nomad` does the same.
func NomadBinary(t testing.TB) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockBin(t, root)
	defer unlock()
	bin := filepath.Join(root, "bin", "nomad")
	if nomadVersionOK(bin) {
		return bin
	}
	t.Logf("building Nomad %s into %s (minutes on a cold module and build cache)", NomadVersion, bin)
	start := time.Now()
	if err := run(context.Background(), filepath.Join(root, "e2e", "tools", "nomad"), "go", "build", "-o", bin, "github.com/hashicorp/nomad"); err != nil {
		t.Fatalf("build nomad: %v", err)
	}
	if !nomadVersionOK(bin) {
		t.Fatalf("%s built but does not report Nomad v%s; check e2e/tools/nomad/go.mod", bin, NomadVersion)
	}
	t.Logf("built Nomad in %v", time.Since(start).Round(time.Second))
	return bin
}

// ConsulVersion is the Consul agent e2e/tools/consul pins.
const ConsulVersion = "1.22.0"

// ConsulBinary returns bin/consul, building it from e2e/tools/consul when it
// is missing or not ConsulVersion. `make consul` does the same.
func ConsulBinary(t testing.TB) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockBin(t, root)
	defer unlock()
	bin := filepath.Join(root, "bin", "consul")
	ok := func() bool {
		out, err := exec.Command(bin, "version").Output()
		return err == nil && bytes.Contains(out, []byte("Consul v"+ConsulVersion))
	}
	if ok() {
		return bin
	}
	t.Logf("building Consul %s into %s (minutes on a cold module and build cache)", ConsulVersion, bin)
	start := time.Now()
	if err := run(context.Background(), filepath.Join(root, "e2e", "tools", "consul"), "go", "build", "-o", bin, "github.com/hashicorp/consul"); err != nil {
		t.Fatalf("build consul: %v", err)
	}
	if !ok() {
		t.Fatalf("%s built but does not report Consul v%s; check e2e/tools/consul/go.mod", bin, ConsulVersion)
	}
	t.Logf("built Consul in %v", time.Since(start).Round(time.Second))
	return bin
}

func nomadVersionOK(bin string) bool {
	out, err := exec.Command(bin, "version").Output()
	return err == nil && bytes.Contains(out, []byte("Nomad v"+NomadVersion))
}

// GoBinary builds the main package pkg (e.g. "./cmd/hadar-trainer",
// relative to the repository root) into bin/<rel> and returns its path.
// go build's cache makes repeated calls cheap.
func GoBinary(t testing.TB, pkg, rel string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockBin(t, root)
	defer unlock()
	out := filepath.Join(root, "bin", rel)
	if err := run(context.Background(), root, "go", "build", "-o", out, pkg); err != nil {
		t.Fatalf("build %s: %v", pkg, err)
	}
	return out
}

// PluginDir builds hadar's two plugins into bin/plugins (as `make
// plugins` does) and returns that directory.
func PluginDir(t testing.TB) string {
	t.Helper()
	GoBinary(t, "./cmd/hadar-gpu", "plugins/hadar-gpu")
	p := GoBinary(t, "./cmd/hadar-train", "plugins/hadar-train")
	return filepath.Dir(p)
}
