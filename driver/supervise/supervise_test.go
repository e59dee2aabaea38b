package supervise

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/driver/supervise/cgroup"
)

// starterArg makes the test binary a process that starts a task and
// prints its State, for the test that kills the starter.
const starterArg = "test-starter"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case Command:
			// The hook cmd/hadar-train's main has.
			os.Exit(Main(os.Args[2:]))
		case starterArg:
			os.Exit(starterMain(os.Args[2]))
		}
	}
	os.Exit(m.Run())
}

func starterMain(specPath string) int {
	b, err := os.ReadFile(specPath)
	var spec Spec
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	h, err := Start(context.Background(), spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(h.State()); err != nil {
		return 1
	}
	select {} // until the test kills it
}

// The task's user: ids no account has, so nothing else on the machine
// shares them.
const (
	taskUID = 2000100
	taskGID = 2000100
)

var taskGroups = []int{2000101, 2000102}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("runs tasks as uid %d in cgroups, which needs root; this test runs as uid %d (CI runs as root)", taskUID, os.Geteuid())
	}
}

func hierarchy(t *testing.T) *cgroup.Hierarchy {
	t.Helper()
	h, err := cgroup.Detect()
	if err != nil {
		t.Skipf("no usable cgroup hierarchy here: %v", err)
	}
	return h
}

var seq atomic.Int64

// testSpec is a /bin/sh task as taskUID in a cgroup of its own under a
// parent made for the test, with stdout and stderr in files. The parent
// goes when the test ends; the test fails if the task's cgroup is still
// there then.
func testSpec(t *testing.T, script string) Spec {
	t.Helper()
	needRoot(t)
	h := hierarchy(t)
	dir := t.TempDir()
	parent := fmt.Sprintf("hadar-supervise-test-%d-%d", os.Getpid(), seq.Add(1))
	t.Cleanup(func() {
		for _, d := range cgroupDirs(h, parent) {
			if _, err := os.Stat(filepath.Join(d, "task")); err == nil {
				t.Errorf("cgroup %s left behind", filepath.Join(d, "task"))
				_ = syscall.Rmdir(filepath.Join(d, "task"))
			}
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("cgroup parent %s: %v", d, err)
			}
		}
	})
	return Spec{
		Command:  "/bin/sh",
		Args:     []string{"-c", script},
		Env:      []string{"PATH=/usr/bin:/bin"},
		Dir:      "/",
		User:     User{UID: taskUID, GID: taskGID, Groups: taskGroups},
		Stdout:   logmon(t, filepath.Join(dir, "stdout.fifo")),
		Stderr:   logmon(t, filepath.Join(dir, "stderr.fifo")),
		StateDir: filepath.Join(dir, "state"),
		Cgroup:   Cgroup{Parent: parent, Name: "task"},
	}
}

// logmon makes the FIFO path as Nomad's logmon does (mkfifo 0600, as
// root) and copies what comes through it into logOf(path) until the
// test ends. It holds the FIFO open for reading and writing, so it never
// sees an end and tasks after the first find a reader too.
func logmon(t *testing.T, path string) string {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(logOf(path), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(w, r) // ends when the cleanup closes r
	}()
	t.Cleanup(func() {
		r.Close()
		<-done
		w.Close()
	})
	return path
}

// logOf is the file logmon copies the FIFO path into.
func logOf(path string) string { return strings.TrimSuffix(path, ".fifo") }

func cgroupDirs(h *cgroup.Hierarchy, rel string) []string {
	if h.Version == cgroup.V2 {
		return []string{filepath.Join(h.Root, rel)}
	}
	var out []string
	for _, m := range h.Mounts {
		if d := filepath.Join(m, rel); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// startTask starts spec and destroys the task when the test ends, failing
// the test for anything left behind.
func startTask(t *testing.T, spec Spec) *Handle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	st := h.State()
	t.Cleanup(func() { destroy(t, h, st) })
	return h
}

func destroy(t *testing.T, h *Handle, st State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Destroy(ctx); err != nil {
		t.Errorf("Destroy: %v", err)
	}
	for _, p := range []Proc{st.Supervisor, st.Task} {
		if alive(p) {
			t.Errorf("process %d still running after Destroy", p.PID)
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	if st.Cgroup != nil && cgroup.FromState(*st.Cgroup).Exists() {
		for _, d := range st.Cgroup.Created {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("cgroup %s still there after Destroy", d)
			}
		}
	}
	if _, err := os.Stat(st.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir %s still there after Destroy (%v)", st.StateDir, err)
	}
}

// alive tells whether p (pid and start time) still runs; a zombie is
// not running.
func alive(p Proc) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
	if err != nil {
		return false
	}
	t, err := startTicks(p.PID)
	if err != nil || t != p.StartTicks {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && !strings.HasPrefix(string(b[i+1:]), " Z")
}

func wait(t *testing.T, h *Handle) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := h.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return r
}

// waitFor polls file until it has a line matching re; the lines so far
// on timeout.
func waitFor(t *testing.T, file string, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(file)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for _, l := range lines {
			if rx.MatchString(l) {
				return lines
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no line matching %q in 20s; got %q", file, re, lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestExitResults(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		code, signal int
	}{
		{"success", "exit 0", 0, 0},
		{"exit code", "exit 3", 3, 0},
		{"killed by a signal", "kill -KILL $$", 128 + 9, 9},
		{"terminated by a signal", "kill -TERM $$", 128 + 15, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := time.Now()
			h := startTask(t, testSpec(t, tc.script))
			r := wait(t, h)
			if r.ExitCode != tc.code || r.Signal != tc.signal || r.OOMKilled || r.Err != "" {
				t.Errorf("result %+v, want exit code %d signal %d", r, tc.code, tc.signal)
			}
			if r.StartedAt.Before(before.Add(-time.Second)) || r.ExitedAt.Before(r.StartedAt) || time.Since(r.ExitedAt) > time.Minute {
				t.Errorf("times: started %v exited %v (test began %v)", r.StartedAt, r.ExitedAt, before)
			}
			// The supervisor removed the cgroup it made as it exited.
			if st := h.State(); cgroup.FromState(*st.Cgroup).Exists() {
				t.Errorf("cgroup %v still there after the task ended", st.Cgroup.Dirs)
			}
		})
	}
}

// The program runs as exactly the given uid, gid and groups, in its own
// process group, in the task's cgroup, with the spec's environment (and
// the login variables when asked).
func TestTaskProcess(t *testing.T) {
	for _, tc := range []struct {
		name     string
		loginEnv bool
		env      []string
		want     []string
	}{
		{"plain env", false, nil, []string{"USER=", "HOME=", "EXTRA=x"}},
		{"login env", true, nil, []string{"USER=trainer", "HOME=/home/trainer", "EXTRA=x"}},
		{"task env wins", true, []string{"HOME=/data"}, []string{"USER=trainer", "HOME=/data", "EXTRA=x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec(t, `cat /proc/self/status /proc/self/stat; echo; cat /proc/self/cgroup; echo "USER=$USER"; echo "HOME=$HOME"; echo "EXTRA=$EXTRA"`)
			spec.Env = append(spec.Env, append([]string{"EXTRA=x"}, tc.env...)...)
			spec.User.Name, spec.User.Home, spec.User.LoginEnv = "trainer", "/home/trainer", tc.loginEnv
			h := startTask(t, spec)
			if r := wait(t, h); r.ExitCode != 0 {
				t.Fatalf("result %+v; stderr: %s", r, readFile(logOf(spec.Stderr)))
			}
			// The test's logmon copies the FIFO on its own time: wait for
			// the script's last line before reading the rest.
			waitFor(t, logOf(spec.Stdout), `^EXTRA=`)
			out := readFile(logOf(spec.Stdout))
			field := func(name string) string {
				m := regexp.MustCompile(`(?m)^` + name + `:\s*(.*)$`).FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("no %s in /proc/self/status: %s", name, out)
				}
				return strings.Join(strings.Fields(m[1]), " ")
			}
			id := func(n int) string { return strings.TrimSpace(strings.Repeat(strconv.Itoa(n)+" ", 4)) } // real, effective, saved, fs
			if got := field("Uid"); got != id(taskUID) {
				t.Errorf("Uid: %q, want %q", got, id(taskUID))
			}
			if got := field("Gid"); got != id(taskGID) {
				t.Errorf("Gid: %q, want %q", got, id(taskGID))
			}
			if got, want := field("Groups"), "2000101 2000102"; got != want {
				t.Errorf("Groups: %q, want %q (no group 0)", got, want)
			}
			// /proc/self/stat: pid (comm) state ppid pgrp ...
			// cat, the shell's child, is in the process group the shell
			// (the task's program) leads.
			m := regexp.MustCompile(`(?m)^\d+ \(cat\) \S+ \d+ (\d+)`).FindStringSubmatch(out)
			if m == nil || m[1] != strconv.Itoa(h.State().Task.PID) {
				t.Errorf("process group %q, want the task's pid %d", m, h.State().Task.PID)
			}
			cg := "/" + spec.Cgroup.Parent + "/" + spec.Cgroup.Name
			if !regexp.MustCompile(`(?m)^\d+:[^:\n]*memory[^:\n]*:` + regexp.QuoteMeta(cg) + `$|^0::` + regexp.QuoteMeta(cg) + `$`).MatchString(out) {
				t.Errorf("not in the task's memory cgroup %s:\n%s", cg, out)
			}
			for _, w := range tc.want {
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w) + `$`).MatchString(out) {
					t.Errorf("env: no line %q in\n%s", w, out)
				}
			}
		})
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// supervisorsOf lists the processes whose command line names dir: the
// supervisors of a spec written there.
func supervisorsOf(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(b), dir) {
			out = append(out, pid)
		}
	}
	return out
}

// A program that cannot start fails Start with the reason, and leaves no
// supervisor, cgroup or state directory.
func TestCannotStart(t *testing.T) {
	needRoot(t)
	private := t.TempDir() // 0700, root's
	if err := os.WriteFile(filepath.Join(private, "prog"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	open := t.TempDir()
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(open, "rootonly"), []byte("#!/bin/sh\nexit 0\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(open, "data"), []byte("not a program"), 0o644); err != nil {
		t.Fatal(err)
	}
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o777); err != nil { // like a task's private/
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want string
	}{
		{"state dir a task could swap", func(s *Spec) { s.StateDir = filepath.Join(shared, "state") }, "that no one else can write"},
		{"missing program", func(s *Spec) { s.Command = "/nonexistent/train" }, "not found"},
		{"not executable by the user", func(s *Spec) { s.Command = filepath.Join(open, "rootonly") }, "permission denied"},
		{"not a program", func(s *Spec) { s.Command = filepath.Join(open, "data") }, "permission denied"},
		{"directory above unreachable", func(s *Spec) { s.Command = filepath.Join(private, "prog") }, "permission denied"},
		{"working directory unreachable", func(s *Spec) { s.Dir = private }, "permission denied"},
		{"working directory missing", func(s *Spec) { s.Dir = "/nonexistent" }, "working directory /nonexistent"},
		{"root refused", func(s *Spec) { s.User = User{} }, "would run the task as root"},
		{"relative command", func(s *Spec) { s.Command = "sh" }, "want an absolute path"},
		{"cgroup name not one element", func(s *Spec) { s.Cgroup.Name = "." }, "want one path element"},
		{"limits without cgroup", func(s *Spec) { s.Cgroup = Cgroup{Limits: cgroup.Limits{MemoryMax: 1 << 20}} }, "no cgroup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec(t, "exit 0")
			tc.edit(&spec)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h, err := Start(ctx, spec)
			if err == nil {
				destroy(t, h, h.State())
				t.Fatalf("Start succeeded, want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to say %q", err, tc.want)
			}
			if p := supervisorsOf(spec.StateDir); len(p) > 0 {
				t.Errorf("supervisor processes %v left running", p)
			}
			if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state dir left behind: %v", err)
			}
			// testSpec's cleanup fails the test if the cgroup is left.
		})
	}
}

// A supervisor that ends before Start has read its identity (one that
// fails at once, as on a planted output path) is reported as what it
// is, not as a /proc entry gone: Start reads the identity before its
// reaper can remove the entry. The race needs the starting goroutine to
// lose the CPU for the half millisecond true(1) lives, so the test
// tries many times (make test run 41 saw it once, under load).
func TestSupervisorEndsAtOnce(t *testing.T) {
	self, err := exec.LookPath("true")
	if err != nil {
		t.Fatalf("true(1), the supervisor that ends at once: %v", err)
	}
	for i := range 300 {
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		h, err := start(ctx, self, &Spec{StateDir: dir})
		cancel()
		if err == nil {
			h.Close()
			t.Fatalf("try %d: start succeeded with %s as the supervisor", i, self)
		}
		if !strings.Contains(err.Error(), "ended before it reported") {
			t.Fatalf("try %d: error %q, want it to say the supervisor ended before it reported", i, err)
		}
	}
}

func TestCgroupGiven(t *testing.T) {
	spec := testSpec(t, "cat /proc/self/cgroup")
	h := hierarchy(t)
	// As Nomad's client does: the cgroup exists before the task; on v1
	// Nomad makes it in the freezer, cpu and memory hierarchies only.
	rel := filepath.Join(spec.Cgroup.Parent, "given")
	var made []string
	for c, m := range h.Mounts {
		if h.Version == cgroup.V1 && !slices.Contains([]string{"freezer", "cpu", "memory"}, c) {
			continue
		}
		made = append(made, filepath.Join(m, rel))
	}
	if h.Version == cgroup.V2 {
		made = []string{filepath.Join(h.Root, rel)}
	}
	for _, d := range made {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Rmdir(d) })
	}
	spec.Cgroup = Cgroup{Path: rel, Limits: cgroup.Limits{MemoryMax: 64 << 20}}
	hd := startTask(t, spec)
	if r := wait(t, hd); r.ExitCode != 0 {
		t.Fatalf("result %+v: %s", r, readFile(logOf(spec.Stderr)))
	}
	// In the given cgroup: its line reaches the test's logmon in time.
	waitFor(t, logOf(spec.Stdout), regexp.QuoteMeta("/"+rel))
	// The given cgroup is left to whoever made it; what the supervisor
	// added is gone.
	for _, d := range made {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("given cgroup %s removed: %v", d, err)
		}
	}
	for _, d := range hd.State().Cgroup.Created {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s the supervisor made is still there", d)
		}
	}
}

func TestOOMKilled(t *testing.T) {
	spec := testSpec(t, `a=xxxxxxxxxxxxxxxx; while :; do a="$a$a"; done`)
	spec.Cgroup.MemoryMax = 32 << 20
	h := startTask(t, spec)
	r := wait(t, h)
	if !r.OOMKilled || r.Signal != 9 || r.ExitCode != 137 {
		t.Errorf("result %+v, want OOM-killed by signal 9 (exit 137); stderr: %s", r, readFile(logOf(spec.Stderr)))
	}
}

func TestLimitsAndStats(t *testing.T) {
	spec := testSpec(t, `i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; echo busy-done; exec sleep 600`)
	spec.Cgroup.Limits = cgroup.Limits{CPUShares: 512, CPUQuota: 5 * time.Millisecond, CPUPeriod: 50 * time.Millisecond, MemoryMax: 256 << 20, MemoryLow: 64 << 20}
	h := startTask(t, spec)
	waitFor(t, logOf(spec.Stdout), "busy-done")
	st := h.State()
	hier := hierarchy(t)
	read := func(ctl, file string) string {
		d := st.Cgroup.Dirs[ctl]
		if hier.Version == cgroup.V2 {
			d = st.Cgroup.Dirs[""]
		}
		return strings.TrimSpace(readFile(filepath.Join(d, file)))
	}
	want := map[string]string{"cpu.shares": "512", "cpu.cfs_quota_us": "5000", "cpu.cfs_period_us": "50000",
		"memory.limit_in_bytes": strconv.Itoa(256 << 20), "memory.soft_limit_in_bytes": strconv.Itoa(64 << 20)}
	ctl := map[string]string{"cpu.shares": "cpu", "cpu.cfs_quota_us": "cpu", "cpu.cfs_period_us": "cpu", "memory.limit_in_bytes": "memory", "memory.soft_limit_in_bytes": "memory"}
	if hier.Version == cgroup.V2 {
		want = map[string]string{"cpu.weight": strconv.FormatInt(cgroup.Weight(512), 10), "cpu.max": "5000 50000",
			"memory.max": strconv.Itoa(256 << 20), "memory.low": strconv.Itoa(64 << 20)}
		ctl = nil
	}
	for f, v := range want {
		if got := read(ctl[f], f); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
	s, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.CPUTotal <= 0 || s.CPUUser+s.CPUSystem <= 0 || s.MemoryCurrent == 0 || s.MemoryMaxUsage < s.MemoryCurrent && hier.Version == cgroup.V1 {
		t.Errorf("stats %+v: want CPU time and memory use", s)
	}
	if s.CPUPeriods == 0 || s.CPUThrottledPeriods == 0 {
		t.Errorf("stats %+v: a busy loop at a tenth of a CPU must have been throttled", s)
	}
}

// Signal reaches every process of the task's process group.
func TestSignalReachesChildren(t *testing.T) {
	spec := testSpec(t, `
child() { trap 'echo child-term; exit 0' TERM; echo child-ready; while :; do sleep 0.05; done; }
child &
trap 'echo parent-term; wait; exit 5' TERM
echo parent-ready
while :; do sleep 0.05; done`)
	h := startTask(t, spec)
	waitFor(t, logOf(spec.Stdout), "child-ready")
	waitFor(t, logOf(spec.Stdout), "parent-ready")
	if err := h.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := wait(t, h)
	waitFor(t, logOf(spec.Stdout), "child-term")
	waitFor(t, logOf(spec.Stdout), "parent-term")
	out := readFile(logOf(spec.Stdout))
	if r.ExitCode != 5 || !strings.Contains(out, "child-term") || !strings.Contains(out, "parent-term") {
		t.Errorf("result %+v, output %q: want both the shell and its child to get SIGTERM", r, out)
	}
	if err := h.Signal(syscall.SIGTERM); !errors.Is(err, ErrExited) {
		t.Errorf("Signal after the end: %v, want ErrExited", err)
	}
}

// Stop kills, after the timeout, a task that ignores the stop signal,
// and whatever it started.
func TestStopAfterTimeout(t *testing.T) {
	spec := testSpec(t, `trap '' TERM; sleep 600 & echo "bg=$!"; while :; do sleep 0.05; done`)
	h := startTask(t, spec)
	lines := waitFor(t, logOf(spec.Stdout), "^bg=")
	bg, _ := strconv.Atoi(strings.TrimPrefix(lines[0], "bg="))
	bgProc, err := procOf(bg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	if err := h.Stop(ctx, syscall.SIGTERM, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	r := wait(t, h)
	if r.Signal != 9 || took < 500*time.Millisecond {
		t.Errorf("result %+v after %v: want SIGKILL after the 500ms timeout", r, took)
	}
	if alive(bgProc) {
		t.Errorf("background process %d survived Stop", bg)
	}
}

// A task that exits on the stop signal is not killed.
func TestStopGraceful(t *testing.T) {
	spec := testSpec(t, `trap 'echo checkpoint; exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
	h := startTask(t, spec)
	waitFor(t, logOf(spec.Stdout), "ready")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Stop(ctx, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	r := wait(t, h)
	waitFor(t, logOf(spec.Stdout), "checkpoint")
	if r.ExitCode != 0 || r.Signal != 0 {
		t.Errorf("result %+v, output %q: want a clean exit after the checkpoint", r, readFile(logOf(spec.Stdout)))
	}
}

// The supervisor and the task outlive the process that started them;
// Attach from the State it printed gives a working handle.
func TestSurvivesStarter(t *testing.T) {
	spec := testSpec(t, `trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done`)
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(specFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	starter := exec.Command(self, starterArg, specFile)
	starter.Stderr = os.Stderr
	out, err := starter.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := starter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = starter.Process.Kill(); _ = starter.Wait() })
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err != nil {
		t.Fatalf("starter printed no state: %v", err)
	}
	var st State
	if err := json.Unmarshal(line, &st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, logOf(spec.Stdout), "ready")
	if err := starter.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = starter.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := Attach(ctx, st)
	if err != nil {
		t.Fatalf("Attach after the starter died: %v", err)
	}
	t.Cleanup(func() { destroy(t, h, st) })
	if !alive(st.Supervisor) || !alive(st.Task) {
		t.Fatalf("supervisor or task died with the starter")
	}
	if _, err := h.Stats(); err != nil {
		t.Errorf("Stats after Attach: %v", err)
	}
	if err := h.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, h); r.ExitCode != 7 {
		t.Errorf("result %+v, want exit code 7 (the task's answer to SIGTERM)", r)
	}
	// A second Attach after the end reads the recorded result.
	h2, err := Attach(ctx, st)
	if err != nil {
		t.Fatalf("Attach after the end: %v", err)
	}
	if r := wait(t, h2); r.ExitCode != 7 {
		t.Errorf("result after a second Attach: %+v", r)
	}
	h2.Close()
}

// A pid that another process holds now is not taken for the task or its
// supervisor: Attach says they are gone and nothing is signalled.
func TestPidReuseGuard(t *testing.T) {
	spec := testSpec(t, `echo ready; exec sleep 600`)
	h := startTask(t, spec)
	waitFor(t, logOf(spec.Stdout), "ready")
	real := h.State()

	other := exec.Command("/bin/sleep", "600")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	impostor, err := procOf(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// The state names the other process's pid with the start time the
	// task had: the pid was reused.
	stale := impostor
	stale.StartTicks++

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gone := State{StateDir: t.TempDir(), Supervisor: stale, Task: stale}
	if _, err := Attach(ctx, gone); !errors.Is(err, ErrGone) {
		t.Errorf("Attach with reused pids: %v, want ErrGone", err)
	}

	// With the real supervisor but a reused task pid, the handle works
	// but never signals the other process.
	mixed := real
	mixed.Task = stale
	h2, err := Attach(ctx, mixed)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if err := h2.Signal(syscall.SIGKILL); !errors.Is(err, ErrExited) {
		t.Errorf("Signal through a reused pid: %v, want ErrExited", err)
	}
	if !alive(impostor) {
		t.Errorf("the process that reused the pid was killed")
	}
	if !alive(real.Task) {
		t.Errorf("the task was killed")
	}
}

// A Start that gives up (its context ends while the supervisor waits for
// the reader of the stdout FIFO) leaves nothing.
func TestStartCancelled(t *testing.T) {
	spec := testSpec(t, "exit 0")
	fifo := filepath.Join(t.TempDir(), "stdout.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	spec.Stdout = fifo
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	began := time.Now()
	h, err := Start(ctx, spec)
	if err == nil {
		destroy(t, h, h.State())
		t.Fatal("Start succeeded without a reader on the stdout FIFO")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want the context's", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("Start took %v to give up", took)
	}
	if p := supervisorsOf(spec.StateDir); len(p) > 0 {
		t.Errorf("supervisor processes %v left running", p)
	}
}

// With a reader on Nomad's FIFOs, the task's output reaches them.
func TestOutputFIFO(t *testing.T) {
	spec := testSpec(t, "echo to-stdout; echo to-stderr >&2")
	dir := t.TempDir()
	got := map[string]chan string{}
	for _, name := range []string{"stdout", "stderr"} {
		p := filepath.Join(dir, name)
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
		c := make(chan string, 1)
		got[name] = c
		go func() {
			b, _ := os.ReadFile(p) // opens as the reader, reads to EOF
			c <- string(b)
		}()
	}
	spec.Stdout, spec.Stderr = filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr")
	h := startTask(t, spec)
	if r := wait(t, h); r.ExitCode != 0 {
		t.Fatalf("result %+v", r)
	}
	for name, want := range map[string]string{"stdout": "to-stdout\n", "stderr": "to-stderr\n"} {
		select {
		case s := <-got[name]:
			if s != want {
				t.Errorf("%s: %q, want %q", name, s, want)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: no EOF", name)
		}
	}
}

// On a hybrid host the cgroup2 mount (no controllers) runs the v2 code
// path: clone into the cgroup, cgroup.kill, removal.
func TestV2WithoutControllers(t *testing.T) {
	spec := testSpec(t, `trap '' TERM; sleep 600 & echo ready; while :; do sleep 0.05; done`)
	if hierarchy(t).Version == cgroup.V2 {
		t.Skip("cgroup v2 host: the other tests run the v2 path")
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.Lines(string(b)) {
		pre, post, _ := strings.Cut(line, " - ")
		if f := strings.Fields(pre); strings.HasPrefix(post, "cgroup2 ") && len(f) > 4 && f[3] == "/" {
			spec.Cgroup.Hierarchy = &cgroup.Hierarchy{Version: cgroup.V2, Root: f[4]}
		}
	}
	if spec.Cgroup.Hierarchy == nil {
		t.Skip("no cgroup2 mount on this v1 host")
	}
	h := startTask(t, spec)
	waitFor(t, logOf(spec.Stdout), "ready")
	if !strings.Contains(readFile(fmt.Sprintf("/proc/%d/cgroup", h.State().Task.PID)), "0::/"+spec.Cgroup.Parent+"/task\n") {
		t.Fatalf("task not in the v2 cgroup: %s", readFile(fmt.Sprintf("/proc/%d/cgroup", h.State().Task.PID)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Stop(ctx, syscall.SIGTERM, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, h); r.Signal != 9 || r.OOMKilled {
		t.Errorf("result %+v, want killed by SIGKILL", r)
	}
	// testSpec's cleanup fails the test if the cgroup is left.
	d := filepath.Join(spec.Cgroup.Hierarchy.Root, spec.Cgroup.Parent)
	t.Cleanup(func() { _ = syscall.Rmdir(d) })
}

// nomadAllocDir makes an allocation directory as Nomad's client does
// (allocdir.Build): <alloc> root's 0755; alloc/ and alloc/logs mode 0777,
// owned by nobody, no sticky bit, so any task can replace what is in
// them. It returns <alloc> and alloc/logs.
func nomadAllocDir(t *testing.T) (alloc, logs string) {
	t.Helper()
	alloc = t.TempDir()
	if err := os.Chmod(alloc, 0o755); err != nil {
		t.Fatal(err)
	}
	logs = filepath.Join(alloc, "alloc", "logs")
	for _, d := range []string{filepath.Dir(logs), logs} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	return alloc, logs
}

// A task can replace Nomad's stdout FIFO in alloc/logs (everyone's) with
// a link to a root-only file, a hard link to one, or nothing, or replace
// alloc/logs itself with a link, before it is restarted in the same
// allocation: the supervisor, root, must write into none of them, nor
// create anything, and must say why it refused.
func TestOutputNotFollowed(t *testing.T) {
	const victimText = "root-only\n"
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, logs, fifo, victim string)
		want  string
	}{
		{"symlink to a file", func(t *testing.T, logs, fifo, victim string) {
			if err := os.Symlink(victim, fifo); err != nil {
				t.Fatal(err)
			}
		}, "symbolic link"},
		{"hard link to a file", func(t *testing.T, logs, fifo, victim string) {
			if err := os.Link(victim, fifo); err != nil {
				t.Fatal(err)
			}
		}, "regular file"},
		{"nothing", func(t *testing.T, logs, fifo, victim string) {}, "not there"},
		{"logs directory a link to one with a FIFO", func(t *testing.T, logs, fifo, victim string) {
			other := t.TempDir()
			logmon(t, filepath.Join(other, filepath.Base(fifo)))
			if err := os.Remove(logs); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(other, logs); err != nil {
				t.Fatal(err)
			}
		}, "symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec(t, "echo planted-output")
			alloc, logs := nomadAllocDir(t)
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte(victimText), 0o600); err != nil {
				t.Fatal(err)
			}
			fifo := filepath.Join(logs, ".task.stdout.fifo")
			tc.plant(t, logs, fifo, victim)
			spec.Stdout, spec.Stderr, spec.OutputRoot = fifo, "", alloc
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			h, err := Start(ctx, spec)
			if err == nil {
				st := h.State()
				_, _ = h.Wait(ctx)
				destroy(t, h, st)
				t.Errorf("Start succeeded writing stdout into what the task planted")
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want it to say %q", err, tc.want)
			}
			if got := readFile(victim); got != victimText {
				t.Errorf("victim file now %q, want %q", got, victimText)
			}
			if _, err := os.Lstat(fifo); tc.name == "nothing" && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s created (%v)", fifo, err)
			}
			if p := supervisorsOf(spec.StateDir); len(p) > 0 {
				t.Errorf("supervisor processes %v left running", p)
			}
		})
	}
}

// A task that left its process group (into its supervisor's, same
// session) still gets the signal: its pidfd says it lives, so ESRCH on
// the group is not its end (issue #30, item 8).
func TestSignalTaskLeftGroup(t *testing.T) {
	if _, err := exec.LookPath("perl"); err != nil {
		t.Skip("needs perl to call setpgid")
	}
	spec := testSpec(t, `exec perl -e '$|=1; setpgrp(0, getppid()) or die "setpgrp: $!\n"; $SIG{TERM} = sub { print "term\n"; exit 7 }; print "moved\n"; sleep 1 while 1'`)
	h := startTask(t, spec)
	waitFor(t, logOf(spec.Stdout), "moved")
	if err := h.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal to a task out of its group: %v", err)
	}
	if r := wait(t, h); r.ExitCode != 7 {
		t.Errorf("result %+v, want exit 7 from the task's SIGTERM handler; output %q", r, readFile(logOf(spec.Stdout)))
	}
}

// After a reboot a pid with the same start ticks is another process: a
// state from another boot (its boot_id differs) is not attached to a
// live process that matches its pid and start time (issue #30, item 8).
func TestAttachOtherBoot(t *testing.T) {
	needRoot(t)
	self, err := procOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(State{StateDir: t.TempDir(), Supervisor: self, Task: self})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["boot_id"] = "00000000-0000-0000-0000-000000000000"
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := Attach(ctx, st)
	if err == nil {
		h.Close()
		t.Fatal("Attach to a state of another boot took this process for its task")
	}
	if !errors.Is(err, ErrGone) {
		t.Errorf("Attach: %v, want ErrGone", err)
	}
	// This boot's state attaches.
	cur, err := procOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	st = State{StateDir: t.TempDir(), Supervisor: cur, Task: cur, BootID: bootID()}
	if h, err = Attach(ctx, st); err != nil {
		t.Errorf("Attach in this boot: %v", err)
	} else {
		h.Close()
	}
}
