package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/internal/hostpath"
)

// RunEnv is set in the environment of every agent this test binary
// starts. Plugins, executors and logmon inherit it, so whatever outlives
// its agent can still be traced back to this run, even once reparented.
const RunEnv = "HADAR_E2E_RUN"

// agentDirEnv is set beside RunEnv to the agent's directory, so a process
// left behind can be traced to the agent (and so the test) it came from.
const agentDirEnv = "HADAR_E2E_AGENT_DIR"

// run records what this test binary's agents created, for Main's check.
var thisRun struct {
	once   sync.Once
	id     string
	mu     sync.Mutex
	dirs   []string
	ports  []int
	allocs map[string]bool
}

func runID() string {
	thisRun.once.Do(func() { thisRun.id = fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()) })
	return thisRun.id
}

func registerDir(dir string) {
	thisRun.mu.Lock()
	defer thisRun.mu.Unlock()
	thisRun.dirs = append(thisRun.dirs, dir)
}

func registerPorts(ports []int) {
	thisRun.mu.Lock()
	defer thisRun.mu.Unlock()
	thisRun.ports = append(thisRun.ports, ports...)
}

func registerAllocs(ids []string) {
	thisRun.mu.Lock()
	defer thisRun.mu.Unlock()
	if thisRun.allocs == nil {
		thisRun.allocs = map[string]bool{}
	}
	for _, id := range ids {
		thisRun.allocs[id] = true
	}
}

func runState() (dirs []string, ports []int, allocs []string) {
	thisRun.mu.Lock()
	defer thisRun.mu.Unlock()
	for id := range thisRun.allocs {
		allocs = append(allocs, id)
	}
	return append([]string(nil), thisRun.dirs...), append([]int(nil), thisRun.ports...), allocs
}

// Main runs an e2e package's tests and then checks that they left nothing
// behind: no process of this run (children of the test binary, and agents,
// plugins, executors, logmon and tasks, found by RunEnv or by a working
// directory or alloc dir under the run's directories), no mount under the
// run's directories, no task cgroup of the run's allocations, no run
// directory, no bound port. Leaks are listed, removed, and fail the run.
// Use it as
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
//
// The Shared agents given are closed after the tests, before the check; a
// failure to stop one fails the run.
func Main(m *testing.M, shared ...*Shared) int {
	runID()
	before := leakSet(findLeaks())
	plugins, agents := countMachine()
	code := m.Run()
	for _, s := range shared {
		if err := s.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e harness: FAIL: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	var leaks []leak
	// Cleanups have stopped every agent; give processes that were told to
	// exit (plugins watching their parent, executors being killed) a moment.
	deadline := time.Now().Add(15 * time.Second)
	for {
		leaks = nil
		for _, l := range findLeaks() {
			if !before[l.key()] {
				leaks = append(leaks, l)
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	plugins2, agents2 := countMachine()
	if testing.Verbose() || len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "e2e harness: machine-wide (all packages) %d plugin and %d nomad processes before the tests, %d and %d after\n", plugins, agents, plugins2, agents2)
	}
	if len(leaks) == 0 {
		return code
	}
	fmt.Fprintf(os.Stderr, "e2e harness: FAIL: the tests left %d things behind (now removed):\n", len(leaks))
	for _, l := range leaks {
		fmt.Fprintf(os.Stderr, "  %s\n", l)
	}
	removeLeaks(leaks)
	if code == 0 {
		code = 1
	}
	return code
}

type leakKind int

const (
	leakProcess leakKind = iota
	leakMount
	leakCgroup
	leakDir
	leakPort
)

type leak struct {
	kind leakKind
	path string // mount point, cgroup or directory
	pid  int
	port int
	desc string
}

func (l leak) key() string { return fmt.Sprintf("%d %s %d %d", l.kind, l.path, l.pid, l.port) }

func (l leak) String() string {
	switch l.kind {
	case leakProcess:
		return fmt.Sprintf("process %d: %s", l.pid, l.desc)
	case leakMount:
		return fmt.Sprintf("mount %s (%s)", l.path, l.desc)
	case leakCgroup:
		return "cgroup " + l.path
	case leakDir:
		return "directory " + l.path
	default:
		return fmt.Sprintf("port 127.0.0.1:%d still bound", l.port)
	}
}

func leakSet(ls []leak) map[string]bool {
	m := map[string]bool{}
	for _, l := range ls {
		m[l.key()] = true
	}
	return m
}

func findLeaks() []leak {
	dirs, ports, allocs := runState()
	var out []leak
	out = append(out, runProcesses(dirs)...)
	for _, mp := range hostpath.MountsUnder(dirs) {
		out = append(out, leak{kind: leakMount, path: mp.Point, desc: mp.FSType})
	}
	for _, cg := range allocCgroups(allocs) {
		out = append(out, leak{kind: leakCgroup, path: cg})
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			out = append(out, leak{kind: leakDir, path: d})
		}
	}
	held := heldElsewhere()
	for _, p := range ports {
		// A port this run released may since be another test process's
		// (its agents bind it): that process answers for it.
		if !held[p] && !bindable(p) {
			out = append(out, leak{kind: leakPort, port: p})
		}
	}
	return out
}

// heldElsewhere returns the ports other live test processes hold in the
// port registry; none when it cannot be read (every port is then this
// run's to answer for).
func heldElsewhere() map[int]bool {
	held := map[int]bool{}
	_ = withPortRegistry(func(entries map[int]int) (map[int]int, error) {
		for port, pid := range entries {
			if pid != os.Getpid() {
				held[port] = true
			}
		}
		return entries, nil
	})
	return held
}

// runProcesses lists the live processes that belong to this run.
func runProcesses(dirs []string) []leak {
	self := os.Getpid()
	marker := RunEnv + "=" + runID()
	return scanProcesses(func(p procInfo) string {
		switch {
		case p.ppid == self:
			return "child of the test binary"
		case p.env[RunEnv] == runID():
			return "started by this run's agents (" + marker + ")"
		case hostpath.Under(p.cwd, dirs):
			return "working directory " + p.cwd
		case hostpath.Under(p.env["NOMAD_ALLOC_DIR"], dirs):
			return "task of this run's agents"
		}
		return ""
	})
}

// procInfo is what scanProcesses knows of a live process.
type procInfo struct {
	pid, ppid, pgid int
	cwd             string
	env             map[string]string
}

// scanProcesses returns a leak for every live process (not this one, not
// a zombie) for which why says why it belongs to the caller.
func scanProcesses(why func(procInfo) string) []leak {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []leak
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' || st.state == 'X' {
			continue // gone, or exited and only waiting to be reaped
		}
		p := procInfo{pid: pid, ppid: st.ppid, pgid: st.pgid, env: map[string]string{}}
		p.cwd, _ = os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		for _, kv := range bytes.Split(raw, []byte{0}) {
			if k, v, ok := bytes.Cut(kv, []byte("=")); ok {
				p.env[string(k)] = string(v)
			}
		}
		reason := why(p)
		if reason == "" {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, leak{kind: leakProcess, pid: pid, desc: fmt.Sprintf("%s (parent %d; %s)", strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")), st.ppid, reason)})
	}
	return out
}

type procStat struct {
	state byte
	ppid  int
	pgid  int
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// The command (field 2) may hold spaces and parentheses: count from
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgid, err2 := strconv.Atoi(f[2])
	if err := errors.Join(err1, err2); err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return procStat{state: f[0][0], ppid: ppid, pgid: pgid}, nil
}

// allocCgroups lists the task cgroups Nomad made for the allocations
// (cgroups v1: <controller>/nomad/[reserve/]<alloc>.<task>; v2:
// nomad.slice/<partition>/<alloc>.<task>.scope).
func allocCgroups(allocs []string) []string {
	var out []string
	for _, id := range allocs {
		for _, pattern := range []string{
			"/sys/fs/cgroup/*/nomad/" + id + ".*",
			"/sys/fs/cgroup/*/nomad/*/" + id + ".*",
			"/sys/fs/cgroup/nomad.slice/*/" + id + ".*",
		} {
			m, _ := filepath.Glob(pattern)
			out = append(out, m...)
		}
	}
	sort.Strings(out)
	return out
}

// countMachine counts every hadar plugin and Nomad agent process on the
// machine, whoever started them (informational: other packages run
// concurrently).
func countMachine() (plugins, agents int) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmd) == 0 {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		switch base := filepath.Base(args[0]); {
		case base == "hadar-gpu" || base == "hadar-train":
			plugins++
		case base == "nomad" && len(args) > 1 && args[1] == "agent":
			agents++
		}
	}
	return plugins, agents
}

func removeLeaks(leaks []leak) {
	for _, l := range leaks {
		if l.kind == leakProcess {
			_ = syscall.Kill(l.pid, syscall.SIGKILL)
		}
	}
	for _, l := range leaks {
		if l.kind == leakMount {
			_ = syscall.Unmount(l.path, syscall.MNT_DETACH)
		}
	}
	for _, l := range leaks {
		switch l.kind {
		case leakCgroup:
			removeCgroup(l.path)
		case leakDir:
			_ = os.RemoveAll(l.path)
		}
	}
}

// removeCgroup removes a cgroup and its children (rmdir, deepest first:
// cgroup directories cannot be removed recursively).
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
