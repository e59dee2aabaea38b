package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/demo"
	"github.com/hadar-sched/hadar/internal/hostpath"
)

// demoRun is one hadar-demo process started by a test.
type demoRun struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  string // its -out directory
	done chan struct{}

	mu  sync.Mutex
	log bytes.Buffer
}

// startDemo builds what the demo needs and starts `hadar-demo -workload
// short` on ports reserved for this test, its output captured.
func startDemo(t *testing.T) *demoRun {
	t.Helper()
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	nomad := filepath.Join(root, "bin", "nomad")
	if _, err := os.Stat(nomad); err != nil {
		t.Skipf("%s is missing: `make nomad` builds it (make test does first)", nomad)
	}
	harness.NomadBinary(t) // the version check
	harness.PluginDir(t)
	harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	harness.GoBinary(t, "./cmd/hadar", "hadar")
	bin := harness.GoBinary(t, "./cmd/hadar-demo", "hadar-demo")

	ports, err := harness.FreePorts(3 + 3*len(demo.Cluster) + 1)
	if err != nil {
		t.Fatal(err)
	}
	var nomadPorts []string
	for _, p := range ports[:len(ports)-1] {
		nomadPorts = append(nomadPorts, strconv.Itoa(p))
	}
	d := &demoRun{t: t, out: t.TempDir(), done: make(chan struct{})}
	d.cmd = exec.Command(bin, "-workload", "short", "-out", d.out, "-repo", root,
		"-nomad-ports", strings.Join(nomadPorts, ","), "-http", fmt.Sprintf("127.0.0.1:%d", ports[len(ports)-1]))
	// Its own process group, as on a terminal where Ctrl-C reaches the
	// demo's group and not the agents' (each has a group of its own).
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	d.cmd.Stdout, d.cmd.Stderr = pw, pw
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go d.watch(pr)
	go func() {
		_ = d.cmd.Wait()
		pw.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		// A failed test must not leave the demo running: stop it, then
		// remove what it left (the harness's leak check still fails the
		// run when something was left).
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(2 * time.Minute):
				_ = d.cmd.Process.Kill()
				<-d.done
			}
		}
		if st, err := demo.ReadState(demo.StateFile(d.out)); err == nil {
			demo.Clean(demo.Scope{Run: st.Run, Dirs: []string{st.Dir}, Ports: st.Ports})
		}
		if t.Failed() {
			t.Logf("hadar-demo output:\n%s", d.output())
		}
	})
	return d
}

func (d *demoRun) watch(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		d.mu.Lock()
		d.log.WriteString(sc.Text() + "\n")
		d.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, r)
}

func (d *demoRun) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// state waits for the demo's state file and returns it.
func (d *demoRun) state() demo.State {
	d.t.Helper()
	var st demo.State
	err := harness.Eventually(context.Background(), 60*time.Second, 200*time.Millisecond, func() error {
		var err error
		st, err = demo.ReadState(demo.StateFile(d.out))
		return err
	})
	if err != nil {
		d.t.Fatalf("no state file: %v\n%s", err, d.output())
	}
	return st
}

// waitTrainers waits until the hadar run has training processes running
// (tasks of the demo's Nomad clients, found by their allocation
// directory), so an interruption lands mid-run with everything started.
func (d *demoRun) waitTrainers(st demo.State, n int) {
	d.t.Helper()
	err := harness.Eventually(context.Background(), 120*time.Second, 250*time.Millisecond, func() error {
		select {
		case <-d.done:
			return errors.New("the demo exited")
		default:
		}
		if got := len(demoProcesses(st, "hadar-trainer")); got < n {
			return fmt.Errorf("%d trainers running, want %d", got, n)
		}
		if !strings.Contains(d.output(), "[3/5]") {
			return errors.New("the hadar run has not begun")
		}
		return nil
	})
	if err != nil {
		d.t.Fatalf("%v\n%s", err, d.output())
	}
}

// wait waits for the demo to exit and returns its exit code.
func (d *demoRun) wait(within time.Duration) int {
	d.t.Helper()
	select {
	case <-d.done:
	case <-time.After(within):
		d.t.Fatalf("hadar-demo did not exit within %s\n%s", within, d.output())
	}
	return d.cmd.ProcessState.ExitCode()
}

// demoProcesses lists the live processes of a demo run whose command
// line contains name ("" for all), found independently of the demo's
// own sweep: the run's variable in their environment (the agents,
// plugins, executors, the sidecar) or their working directory or
// allocation directory under the demo's directory (the tasks).
func demoProcesses(st demo.State, name string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		env, _ := os.ReadFile(filepath.Join(dir, "environ"))
		cwd, _ := os.Readlink(filepath.Join(dir, "cwd"))
		ours := bytes.Contains(env, []byte(demo.RunEnv+"="+st.Run+"\x00")) ||
			strings.HasPrefix(cwd, st.Dir+"/") ||
			bytes.Contains(env, []byte("NOMAD_ALLOC_DIR="+st.Dir+"/"))
		cmd := strings.ReplaceAll(string(cmdline), "\x00", " ")
		if ours && strings.Contains(cmd, name) {
			out = append(out, fmt.Sprintf("%d %s", pid, cmd))
		}
	}
	return out
}

// socketsOutside lists the unix sockets that the demo's processes have
// bound outside its directory.
func socketsOutside(st demo.State) []string {
	var pids []int
	for _, p := range demoProcesses(st, "") {
		pid, _, _ := strings.Cut(p, " ")
		if n, err := strconv.Atoi(pid); err == nil {
			pids = append(pids, n)
		}
	}
	return harness.SocketsOutside(st.Dir, pids...)
}

// wantNothingLeft checks, without the demo's own code, that nothing of
// the run is left: no process, no bound port, no mount, no directory.
func wantNothingLeft(t *testing.T, st demo.State) {
	t.Helper()
	var left []string
	err := harness.Eventually(context.Background(), 10*time.Second, 250*time.Millisecond, func() error {
		left = demoProcesses(st, "")
		for name, pid := range st.Procs {
			if syscall.Kill(pid, 0) == nil {
				if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !bytes.Contains(b, []byte(") Z")) {
					left = append(left, fmt.Sprintf("%s (pid %d) alive", name, pid))
				}
			}
		}
		for _, p := range st.Ports {
			if !portFree(p) {
				left = append(left, fmt.Sprintf("port %d bound", p))
			}
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		if bytes.Contains(mounts, []byte(" "+st.Dir+"/")) {
			left = append(left, "mounts under "+st.Dir)
		}
		if _, err := os.Stat(st.Dir); err == nil {
			left = append(left, "directory "+st.Dir)
		}
		if len(left) > 0 {
			return fmt.Errorf("left behind: %v", left)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// TestDemoInterrupted runs the demo with its short workload and stops it
// mid-run as a person would, with Ctrl-C (SIGINT to the demo): it must
// stop in order and leave no process, port, mount or directory behind.
// Then it runs it again, kills it with SIGKILL (no teardown at all) and
// runs `hadar-demo stop`, which `make demo-stop` runs: that must find
// and remove everything the killed demo left.
func TestDemoInterrupted(t *testing.T) {
	skipShort(t)
	t.Run("ctrl-c", func(t *testing.T) {
		d := startDemo(t)
		st := d.state()
		d.waitTrainers(st, 2)
		if out := socketsOutside(st); len(out) > 0 {
			t.Errorf("the demo's processes bound sockets outside its directory, left behind when they are killed: %v", out)
		}
		if len(st.Procs) < 1+len(demo.Cluster)+1 {
			st = d.state() // the sidecar is recorded once it started
		}
		_ = d.cmd.Process.Signal(syscall.SIGINT)
		if code := d.wait(2 * time.Minute); code != 130 {
			t.Errorf("exit code %d after SIGINT, want 130", code)
		}
		out := d.output()
		if !strings.Contains(out, "no process, mount, cgroup or port of the demo left") {
			t.Errorf("the demo did not report a clean stop:\n%s", out)
		}
		if strings.Contains(out, "[5/5]") {
			t.Errorf("the demo reached its summary: the interruption was not mid-run")
		}
		wantNothingLeft(t, st)
		if _, err := os.Stat(demo.StateFile(d.out)); err == nil {
			t.Error("the state file is left after a clean stop")
		}
	})
	t.Run("kill-then-stop", func(t *testing.T) {
		d := startDemo(t)
		st := d.state()
		d.waitTrainers(st, 2)
		st = d.state()
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		d.wait(10 * time.Second)
		if len(demoProcesses(st, "nomad agent")) == 0 {
			t.Fatal("no agent outlived the killed demo: nothing for stop to do, the test proves nothing")
		}
		root, _ := hostpath.RepoRoot()
		stop := exec.Command(filepath.Join(root, "bin", "hadar-demo"), "stop", "-out", d.out)
		out, err := stop.CombinedOutput()
		if err != nil {
			t.Fatalf("hadar-demo stop: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "removing process") {
			t.Errorf("hadar-demo stop removed no process:\n%s", out)
		}
		wantNothingLeft(t, st)
	})
}
