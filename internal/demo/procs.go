package demo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hadar-sched/hadar/internal/hostpath"
)

// RunEnv is set in the environment of every process the demo starts.
// Nomad's plugins and executors inherit it from their agent, so whatever
// a demo leaves (an executor outlives its agent by design) can be found
// by it, even by `hadar-demo stop` from another shell. Tasks do not
// inherit it (Nomad builds their environment); they are found by their
// allocation directory, under the demo's directory.
const RunEnv = "HADAR_DEMO_RUN"

// proc is one process the demo started, in its own process group so that
// a Ctrl-C on the terminal reaches the demo alone, which then stops
// everything in order.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid once done is closed
}

// startProc starts a program with its output appended to logPath.
func startProc(name, logPath string, env []string, prog string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	p := &proc{name: name, cmd: exec.Command(prog, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, prog, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to end with sig and waits up to grace; then it
// kills its whole process group.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) survived SIGKILL for 10 s", p.name, p.cmd.Process.Pid)
	}
	return fmt.Errorf("%s did not stop within %v of %v: killed", p.name, grace, sig)
}

// State is what a running demo records in its state file (the pid file
// `hadar-demo stop` and `make demo-stop` read): enough to stop it, or to
// clean up after it when it was killed.
type State struct {
	PID   int            `json:"pid"`
	Run   string         `json:"run"`
	Dir   string         `json:"dir"`   // its temporary directory
	Ports []int          `json:"ports"` // every port it listens on
	Procs map[string]int `json:"procs"` // name -> pid
}

// StateFile is the state file under the demo's output directory.
func StateFile(out string) string { return filepath.Join(out, "demo.pid.json") }

func writeState(path string, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// ReadState reads a demo's state file.
func ReadState(path string) (State, error) {
	var s State
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Leftover is something a demo left behind.
type Leftover struct {
	Kind string // process, mount, cgroup, directory, port
	What string
	pid  int
	path string
}

func (l Leftover) String() string { return l.Kind + " " + l.What }

// procInfo is what the sweep reads of a live process.
type procInfo struct {
	pid, ppid, pgid int
	state           byte
	cwd, cmdline    string
	env             map[string]string
}

func readProc(pid int) (procInfo, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return procInfo{}, false
	}
	// The command (field 2) may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return procInfo{}, false
	}
	p := procInfo{pid: pid, state: f[0][0], env: map[string]string{}}
	p.ppid, _ = strconv.Atoi(f[1])
	p.pgid, _ = strconv.Atoi(f[2])
	p.cwd, _ = os.Readlink(filepath.Join(dir, "cwd"))
	cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
	p.cmdline = strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
	env, _ := os.ReadFile(filepath.Join(dir, "environ"))
	for _, kv := range bytes.Split(env, []byte{0}) {
		if k, v, ok := bytes.Cut(kv, []byte("=")); ok {
			p.env[string(k)] = string(v)
		}
	}
	return p, true
}

// Scope says what belongs to a demo: processes carrying RunEnv (Run, or
// any value when Run is empty: every demo's), processes whose working or
// allocation directory is under one of Dirs, and mounts, task cgroups and
// directories under Dirs; and the Ports it listened on.
//
// With Orphans, it also holds the processes of any demo whose own
// process is gone (RunEnv's value starts with the demo's pid).
type Scope struct {
	Run     string
	Orphans bool
	Dirs    []string
	Ports   []int
}

func (s Scope) owns(p procInfo) bool {
	if v, ok := p.env[RunEnv]; ok {
		if s.Run != "" && v == s.Run {
			return true
		}
		if s.Orphans {
			pid, err := strconv.Atoi(strings.SplitN(v, "-", 2)[0])
			if err != nil || syscall.Kill(pid, 0) != nil {
				return true
			}
		}
	}
	return hostpath.Under(p.cwd, s.Dirs) || hostpath.Under(p.env["NOMAD_ALLOC_DIR"], s.Dirs)
}

// Find lists what is left of the demo in s.
func Find(s Scope) []Leftover {
	var out []Leftover
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		p, ok := readProc(pid)
		if !ok || p.state == 'Z' || p.state == 'X' || !s.owns(p) {
			continue
		}
		out = append(out, Leftover{Kind: "process", What: fmt.Sprintf("%d (%s)", pid, short(p.cmdline, 120)), pid: pid})
	}
	for _, m := range hostpath.MountsUnder(s.Dirs) {
		out = append(out, Leftover{Kind: "mount", What: m.Point, path: m.Point})
	}
	for _, cg := range allocCgroups(s.Dirs) {
		out = append(out, Leftover{Kind: "cgroup", What: cg, path: cg})
	}
	for _, d := range s.Dirs {
		if _, err := os.Stat(d); err == nil {
			out = append(out, Leftover{Kind: "directory", What: d, path: d})
		}
	}
	for _, port := range s.Ports {
		if !bindable(port) {
			out = append(out, Leftover{Kind: "port", What: fmt.Sprintf("127.0.0.1:%d still bound", port)})
		}
	}
	return out
}

// Clean removes what Find found: processes (SIGKILL), then mounts, task
// cgroups and directories, and returns what is still there after.
func Clean(s Scope) []Leftover {
	for range 3 {
		left := Find(s)
		if len(left) == 0 {
			return nil
		}
		for _, l := range left {
			if l.Kind == "process" {
				_ = syscall.Kill(l.pid, syscall.SIGKILL)
			}
		}
		time.Sleep(300 * time.Millisecond)
		for _, l := range Find(s) {
			switch l.Kind {
			case "mount":
				_ = syscall.Unmount(l.path, syscall.MNT_DETACH)
			case "cgroup":
				removeCgroup(l.path)
			}
		}
		for _, l := range Find(s) {
			if l.Kind == "directory" {
				_ = os.RemoveAll(l.path)
			}
		}
		// A port is free once its process is gone; give the kernel a moment.
		time.Sleep(200 * time.Millisecond)
	}
	return Find(s)
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// allocCgroups lists the task cgroups Nomad made for the allocations
// whose directories are under dirs (cgroups v1:
// <controller>/nomad/[<partition>/]<alloc>.<task>; v2:
// nomad.slice/<partition>/<alloc>.<task>.scope).
func allocCgroups(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		allocDirs, _ := filepath.Glob(filepath.Join(d, "*", "data", "alloc", "*"))
		for _, ad := range allocDirs {
			id := filepath.Base(ad)
			for _, pattern := range []string{
				"/sys/fs/cgroup/*/nomad/" + id + ".*",
				"/sys/fs/cgroup/*/nomad/*/" + id + ".*",
				"/sys/fs/cgroup/nomad.slice/*/" + id + ".*",
			} {
				m, _ := filepath.Glob(pattern)
				out = append(out, m...)
			}
		}
	}
	sort.Strings(out)
	return out
}

// removeCgroup removes a cgroup and its children, deepest first (cgroup
// directories are removed with rmdir, one by one).
func removeCgroup(path string) {
	var dirs []string
	_ = filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(dirs[i])
	}
}

// bindable reports whether 127.0.0.1:port can be listened on.
func bindable(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// portsFree returns an error naming the ports that are taken.
func portsFree(ports []int) error {
	var taken []string
	for _, p := range ports {
		if !bindable(p) {
			taken = append(taken, strconv.Itoa(p))
		}
	}
	if len(taken) > 0 {
		return fmt.Errorf("ports %s on 127.0.0.1 are taken: another demo running? (make demo-stop), or give other ports with -nomad-ports and -http", strings.Join(taken, ", "))
	}
	return nil
}

// errStopped is returned when the demo was interrupted.
var errStopped = errors.New("interrupted")
