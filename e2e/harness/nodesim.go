package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// NodesimSpec is the cluster spec bin/nodesim reads (the JSON of package
// nodesim's Spec in the test-tool module e2e/tools/nomad, which the main
// module never imports: it speaks Nomad's client RPCs with Nomad's own
// packages).
type NodesimSpec struct {
	Datacenter string        `json:"datacenter,omitempty"`
	Nodes      []NodesimNode `json:"nodes"`
}

// NodesimNode is one simulated client node: a unique name and IPv4
// address (nothing listens there), a rack in its node meta, GPU groups.
type NodesimNode struct {
	Name    string       `json:"name"`
	Rack    string       `json:"rack"`
	Address string       `json:"address"`
	GPUs    []NodesimGPU `json:"gpus"`
}

// NodesimGPU is a group of identical GPUs (a device group named Model).
type NodesimGPU struct {
	Model     string `json:"model"`
	Count     int    `json:"count"`
	MemoryMiB int64  `json:"memory_mib"`
}

// NodesimBinary returns bin/nodesim, which `make nodesim` builds from the
// wrapper module e2e/tools/nomad; like NomadBinary it builds it when it
// is missing, and also when a source of that module is newer than it (a
// binary left by an earlier build would simulate with old code).
func NodesimBinary(t testing.TB) string {
	t.Helper()
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockBin(t, root)
	defer unlock()
	out := filepath.Join(root, "bin", "nodesim")
	mod := filepath.Join(root, "e2e", "tools", "nomad")
	why, err := staleBinary(out, mod)
	if err != nil {
		t.Fatal(err)
	}
	if why == "" {
		return out
	}
	t.Logf("building %s (%s), as make nodesim does", out, why)
	if err := run(context.Background(), mod, "go", "build", "-o", out, "./nodesim/cmd/nodesim"); err != nil {
		t.Fatalf("build nodesim: %v", err)
	}
	return out
}

// staleBinary says why the binary at bin needs building from the module
// at mod ("" when it is up to date).
func staleBinary(bin, mod string) (string, error) {
	st, err := os.Stat(bin)
	if os.IsNotExist(err) {
		return "missing", nil
	}
	if err != nil {
		return "", fmt.Errorf("binary %s: %w", bin, err)
	}
	newer := ""
	err = filepath.WalkDir(mod, func(path string, d os.DirEntry, err error) error {
		if err != nil || newer != "" {
			return err
		}
		name := d.Name()
		if d.IsDir() || !(strings.HasSuffix(name, ".go") || name == "go.mod" || name == "go.sum") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.ModTime().After(st.ModTime()) {
			newer = path
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("sources in %s: %w", mod, err)
	}
	if newer != "" {
		return newer + " is newer", nil
	}
	return "", nil
}

// NodesimServerConfig goes into the ExtraConfig of a server that
// StartNodesim runs against: every simulated node holds its own RPC
// connection from 127.0.0.1, and Nomad allows 100 per client address by
// default (it closes the rest at once).
const NodesimServerConfig = `
limits {
  rpc_max_conns_per_client  = 0
  http_max_conns_per_client = 0
}
`

// Nodesim is a running node simulator.
type Nodesim struct {
	cmd    *exec.Cmd
	done   chan struct{}
	err    error // valid once done is closed
	stdout bytes.Buffer
	// Log is its stderr (hclog), kept in a directory removed with the test.
	Log string
}

// StartNodesim runs bin/nodesim with spec against a server's RPCAddr (a
// server with NodesimServerConfig when the spec has more than about 90
// nodes), extra flags appended (e.g. "-compress", "60"), and waits until
// every node is ready (up to 3 minutes). It is stopped when the test
// ends.
func StartNodesim(t testing.TB, server *Agent, spec NodesimSpec, extra ...string) *Nodesim {
	t.Helper()
	bin := NodesimBinary(t)
	dir, err := os.MkdirTemp("", "hadar-nodesim-")
	if err != nil {
		t.Fatal(err)
	}
	registerDir(dir)
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specPath, ready := filepath.Join(dir, "cluster.json"), filepath.Join(dir, "ready")
	if err := os.WriteFile(specPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := &Nodesim{done: make(chan struct{}), Log: filepath.Join(dir, "nodesim.log")}
	logf, err := os.Create(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-spec", specPath, "-server", server.RPCAddr, "-ready", ready, "-log-level", "warn"}, extra...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, logf
	p.cmd.Env = append(os.Environ(), RunEnv+"="+runID())
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start nodesim: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	// Cleanups run last registered first: stop, then show the log, then
	// remove the directory.
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("harness: remove nodesim directory: %v", err)
		}
	})
	t.Cleanup(func() {
		p.Stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(p.Log)
			t.Logf("nodesim log (last 4 KiB):\n%s", tail(b, 4<<10))
		}
	})
	err = Eventually(context.Background(), 3*time.Minute, 250*time.Millisecond, func() error {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.Log)
			return fmt.Errorf("nodesim exited: %v\n%s", p.err, tail(b, 4<<10))
		default:
		}
		if _, err := os.Stat(ready); err != nil {
			return errors.New("nodes not ready yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Stop ends the simulator (SIGTERM; SIGKILL to its process group after
// 20 s) and returns its counters (the JSON it prints when it stops).
func (p *Nodesim) Stop(t testing.TB) string {
	select {
	case <-p.done:
		return p.stdout.String()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("harness: nodesim did not stop within 20 s of SIGTERM: killed")
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return p.stdout.String()
}
