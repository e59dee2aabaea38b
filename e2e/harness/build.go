// Package harness starts real Nomad agents for hadar's end-to-end tests:
// it builds the pinned Nomad (e2e/tools/nomad; the LTS release from
// e2e/tools/nomad-1.10 when a test asks for it) and hadar's plugins into
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

	"github.com/hadar-sched/hadar/internal/hostpath"
)

// NomadVersion is the Nomad release the tests run against by default; it
// must match the require line of e2e/tools/nomad/go.mod.
const NomadVersion = "1.11.3"

// NomadLTSVersion is Nomad's long-term-support release, the second one a
// test can ask for (Options.NomadVersion, NomadBinaryVersion); it must
// match the require line of e2e/tools/nomad-1.10/go.mod.
const NomadLTSVersion = "1.10.5"

// NomadVersions are the Nomad releases the harness can build, the
// default first.
func NomadVersions() []string { return []string{NomadVersion, NomadLTSVersion} }

// nomadTool is where a Nomad release is built from and into, relative to
// the repository root.
type nomadTool struct {
	module string // the wrapper module that pins it
	bin    string
}

func nomadToolFor(version string) (nomadTool, error) {
	switch version {
	case NomadVersion:
		return nomadTool{module: "e2e/tools/nomad", bin: "bin/nomad"}, nil
	case NomadLTSVersion:
		return nomadTool{module: "e2e/tools/nomad-1.10", bin: "bin/nomad-" + NomadLTSVersion}, nil
	}
	return nomadTool{}, fmt.Errorf("harness: no wrapper module pins Nomad %q: use one of %v (add a module under e2e/tools for another)", version, NomadVersions())
}

// lockBin serializes builds into bin/ across test binaries running in
// parallel (go test runs packages concurrently).
func lockBin(t testing.TB, root string) func() {
	t.Helper()
	unlock, err := lockBinDir(root)
	if err != nil {
		t.Fatal(err)
	}
	return unlock
}

func lockBinDir(root string) (func(), error) {
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(root, "bin", ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
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
	return NomadBinaryVersion(t, NomadVersion)
}

// NomadBinaryVersion is NomadBinary for one of NomadVersions: Nomad
// NomadLTSVersion is bin/nomad-<version>, built from e2e/tools/nomad-1.10
// (`make nomad-lts`).
func NomadBinaryVersion(t testing.TB, version string) string {
	t.Helper()
	bin, err := nomadBinary(context.Background(), version, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// nomadBinary is NomadBinaryVersion for callers without a test (a Shared
// agent starts outside any one test).
func nomadBinary(ctx context.Context, version string, logf func(format string, args ...any)) (string, error) {
	tool, err := nomadToolFor(version)
	if err != nil {
		return "", err
	}
	root, err := hostpath.RepoRoot()
	if err != nil {
		return "", err
	}
	unlock, err := lockBinDir(root)
	if err != nil {
		return "", err
	}
	defer unlock()
	bin := filepath.Join(root, tool.bin)
	if nomadVersionOK(bin, version) {
		return bin, nil
	}
	logf("building Nomad %s into %s (minutes on a cold module and build cache)", version, bin)
	start := time.Now()
	if err := run(ctx, filepath.Join(root, tool.module), "go", "build", "-o", bin, "github.com/hashicorp/nomad"); err != nil {
		return "", fmt.Errorf("build nomad %s: %w", version, err)
	}
	if !nomadVersionOK(bin, version) {
		return "", fmt.Errorf("%s built but does not report Nomad v%s; check %s/go.mod", bin, version, tool.module)
	}
	logf("built Nomad %s in %v", version, time.Since(start).Round(time.Second))
	return bin, nil
}

// ConsulVersion is the Consul agent e2e/tools/consul pins.
const ConsulVersion = "1.22.0"

// ConsulBinary returns bin/consul, building it from e2e/tools/consul when it
// is missing or not ConsulVersion. `make consul` does the same.
func ConsulBinary(t testing.TB) string {
	t.Helper()
	root, err := hostpath.RepoRoot()
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

func nomadVersionOK(bin, version string) bool {
	out, err := exec.Command(bin, "version").Output()
	return err == nil && bytes.Contains(out, []byte("Nomad v"+version+"\n"))
}

// GoBinary builds the main package pkg (e.g. "./cmd/hadar-trainer",
// relative to the repository root) into bin/<rel> and returns its path.
// go build's cache makes repeated calls cheap.
func GoBinary(t testing.TB, pkg, rel string) string {
	t.Helper()
	root, err := hostpath.RepoRoot()
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
