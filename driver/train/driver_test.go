package train

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/plugintest"
	"github.com/hadar-sched/hadar/driver/supervise"
	"github.com/hadar-sched/hadar/driver/supervise/cgroup"
)

// TestMain makes the test binary the supervisor, as cmd/hadar-train's
// main does, and fails the package when its tests leave one running.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == supervise.Command {
		os.Exit(supervise.Main(os.Args[2:]))
	}
	if len(os.Args) == 3 && os.Args[1] == "executor" {
		// Stands in for the Nomad executor of a task of v0.2, which
		// waits for ever.
		select {}
	}
	code := m.Run()
	var left []int
	_ = eventually(10*time.Second, func() error {
		if left = supervisorPids(); len(left) > 0 {
			return fmt.Errorf("%d supervisors", len(left))
		}
		return nil
	})
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left supervisors %v running (now killed)\n", left)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		code = 1
	}
	os.Exit(code)
}

// supervisorPids lists the live supervisors this test binary started.
func supervisorPids() []int {
	self, _ := os.Executable()
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && args[0] == self && args[1] == supervise.Command && !zombie(e.Name()) {
			pid, _ := strconv.Atoi(e.Name())
			out = append(out, pid)
		}
	}
	return out
}

func zombie(pid string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return true
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// testIDs is the job id range of the tests: ids no account has.
const (
	testFirstID = 3100000
	testIDCount = 1000
	testIDRange = "3100000-3100999"
)

func inTestRange(id int) bool { return id >= testFirstID && id < testFirstID+testIDCount }

// topology is a node of two 2000 MHz cores, as the agent would send it.
var topology = &plugin.Topology{Cores: []plugin.Core{{BaseMHz: 2000}, {BaseMHz: 2000}}}

type rig struct {
	t testing.TB
	d *Driver
	c *plugintest.Client
	// data is the client's data directory (0711, as the docs ask):
	// allocations go in data/alloc, supervisor state in
	// data/hadar-train.
	data string
	// cgParent is the cgroup the tests' task cgroups are made in, as
	// Nomad's client makes them in "nomad".
	cgParent string
}

var rigSeq atomic.Int64

// newRig serves a driver configured with body (the plugin block's
// config, HCL) over a real go-plugin gRPC connection.
func newRig(t testing.TB, body string) *rig {
	return newRigNVML(t, body, nvml.NewLibraryUnavailable)
}

func newRigNVML(t testing.TB, body string, open func() nvml.Library) *rig {
	t.Helper()
	d := NewWithNVML(log.NewNullLogger(), open)
	t.Cleanup(d.Shutdown)
	c := plugintest.Connect(t, d)
	if !strings.Contains(body, "progress_poll_interval") {
		body += "\nprogress_poll_interval = \"100ms\""
	}
	if !strings.Contains(body, "job_id_range") {
		body += "\njob_id_range = \"" + testIDRange + "\""
	}
	configure(t, c, body)
	data := rootDir(t, 0o711)
	return &rig{t: t, d: d, c: c, data: data, cgParent: fmt.Sprintf("hadar-train-test-%d-%d", os.Getpid(), rigSeq.Add(1))}
}

// configure sends the plugin block body as the agent does.
func configure(t testing.TB, c *plugintest.Client, body string) {
	t.Helper()
	if err := setConfig(c, body); err != nil {
		t.Fatal(err)
	}
}

func setConfig(c *plugintest.Client, body string) error {
	ctx := context.Background()
	spec, err := c.ConfigSchema(ctx)
	if err != nil {
		return err
	}
	b, err := plugintest.PluginConfig(spec, body)
	if err != nil {
		return err
	}
	return c.SetConfig(ctx, b, &plugin.AgentConfig{Topology: topology})
}

// rootDir is a temporary directory of root's with mode perm, removed
// when the test ends (a t.TempDir() is private to root: other users
// cannot reach into it).
func rootDir(t testing.TB, perm os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hadar-train-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	return dir
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	s := hex.EncodeToString(b)
	return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:]
}

// task builds a task running sh -c script, with GPUs of model given (as
// hadar-gpu reserves them), in an allocation directory laid out as
// Nomad's client lays it out, with a cgroup like the one it makes.
func (r *rig) task(script string, model string, mutate func(*TaskConfig)) *plugin.TaskConfig {
	r.t.Helper()
	allocID := randomID()
	cfg := &plugin.TaskConfig{
		AllocID:       allocID,
		JobID:         "train-" + strings.ToLower(r.t.Name()[len(r.t.Name())-4:]),
		TaskGroupName: "g",
		Name:          "trainer",
		Namespace:     "default",
		Env:           map[string]string{},
		DeviceEnv:     map[string]string{},
		AllocDir:      filepath.Join(r.data, "alloc", allocID),
	}
	cfg.ID = allocID + "/" + cfg.Name + "/" + allocID[:8]
	if model != "" {
		// Nomad merges the device plugin's variables into the task's env.
		cfg.DeviceEnv = map[string]string{"NVIDIA_VISIBLE_DEVICES": "g0,g1", "CUDA_VISIBLE_DEVICES": "g0,g1", contract.EnvGPUReservedModel: model}
		for k, v := range cfg.DeviceEnv {
			cfg.Env[k] = v
		}
	}
	tc := &TaskConfig{Command: "/bin/sh", Args: []string{"-c", script}}
	if mutate != nil {
		mutate(tc)
	}
	r.encode(cfg, tc)
	r.allocDir(cfg)
	r.cgroup(cfg, 256)
	return cfg
}

// encode sets cfg's driver config to tc as the client sends it.
func (r *rig) encode(cfg *plugin.TaskConfig, tc *TaskConfig) {
	r.t.Helper()
	b, err := taskConfigSpec.Encode(tc)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg.DriverConfig = b
}

// allocDir makes the allocation and task directories as Nomad's client
// does (allocdir.Build and TaskDir.Build, dropDirPermissions, without the
// tmpfs mounts): the allocation directory root's 0755, and everything in
// it -- alloc/, its logs, data and tmp, the task directory and its
// subdirectories -- mode 0777 owned by nobody, without the sticky bit
// (the task's tmp has it): any task can rename or replace what is in
// them. Stdout and stderr are logmon's FIFOs in alloc/logs.
func (r *rig) allocDir(cfg *plugin.TaskConfig) {
	r.t.Helper()
	td := cfg.TaskDir()
	const nobody = 65534
	for _, d := range []struct {
		path string
		mode os.FileMode
		uid  int
	}{
		{filepath.Dir(cfg.AllocDir), 0o711, 0}, {cfg.AllocDir, 0o755, 0}, {td.SharedAllocDir, 0o777, nobody},
		{td.LogDir, 0o777, nobody}, {filepath.Join(td.SharedAllocDir, "tmp"), 0o777, nobody}, {filepath.Join(td.SharedAllocDir, "data"), 0o777, nobody},
		{td.Dir, 0o777, nobody}, {td.LocalDir, 0o777, nobody}, {td.SecretsDir, 0o777, nobody}, {td.PrivateDir, 0o777, nobody},
		{filepath.Join(td.Dir, "tmp"), 0o777 | os.ModeSticky, nobody},
	} {
		if err := os.MkdirAll(d.path, 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			r.t.Fatal(err)
		}
		if os.Geteuid() == 0 {
			if err := os.Chown(d.path, d.uid, d.uid); err != nil {
				r.t.Fatal(err)
			}
		}
	}
	cfg.StdoutPath = r.logmon(filepath.Join(td.LogDir, "."+cfg.Name+".stdout.fifo"), filepath.Join(td.LogDir, cfg.Name+".stdout.0"))
	cfg.StderrPath = r.logmon(filepath.Join(td.LogDir, "."+cfg.Name+".stderr.fifo"), filepath.Join(td.LogDir, cfg.Name+".stderr.0"))
}

// logmon makes the FIFO as Nomad's logmon does (mkfifo 0600, as root,
// before the task starts) and copies what comes through it into the log
// file, until the test ends. It holds the FIFO open for reading and
// writing: it never sees an end, and a restarted task finds a reader.
func (r *rig) logmon(fifo, log string) string {
	r.t.Helper()
	if err := syscall.Mkfifo(fifo, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
		r.t.Fatal(err)
	}
	in, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	out, err := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(out, in) // ends when the cleanup closes in
	}()
	r.t.Cleanup(func() {
		in.Close()
		<-done
		out.Close()
	})
	return fifo
}

// logFile is the file the rig's logmon copies stream into.
func logFile(cfg *plugin.TaskConfig, stream string) string {
	return filepath.Join(cfg.TaskDir().LogDir, cfg.Name+"."+stream+".0")
}

// cgroup gives the task a cgroup, where Nomad's client would make it,
// and resources with memoryMB as the memory limit; the group goes when
// the test ends. Nothing where there are no cgroups.
func (r *rig) cgroup(cfg *plugin.TaskConfig, memoryMB int64) {
	r.t.Helper()
	cfg.Resources = &plugin.Resources{CPUShares: 100, MemoryMB: memoryMB,
		Linux: &plugin.LinuxResources{CPUShares: 100, MemoryLimitBytes: memoryMB << 20}}
	if os.Geteuid() != 0 {
		return
	}
	h, err := cgroup.Detect()
	if err != nil {
		return
	}
	var rel string
	if h.Version == cgroup.V2 {
		rel = filepath.Join(r.cgParent, cfg.AllocID+"."+cfg.Name+".scope")
		cfg.Resources.Linux.CgroupPath = filepath.Join(h.Root, rel)
	} else {
		rel = filepath.Join(r.cgParent, cfg.AllocID+"."+cfg.Name)
		cfg.Resources.Linux.CgroupPath = filepath.Join(filepath.Dir(h.Mounts["memory"]), "cpuset", r.cgParent, "share")
	}
	g, err := cgroup.Create(h, rel)
	if err != nil {
		r.t.Fatalf("task cgroup: %v", err)
	}
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Kill(ctx)
		if err := g.Remove(ctx); err != nil {
			r.t.Errorf("task cgroup: %v", err)
		}
		dirs := []string{filepath.Join(h.Root, r.cgParent)}
		if h.Version == cgroup.V1 {
			dirs = nil
			for _, m := range h.Mounts {
				dirs = append(dirs, filepath.Join(m, r.cgParent))
			}
		}
		for _, d := range dirs {
			_ = syscall.Rmdir(d) // the last task's cleanup removes it
		}
	})
}

func (r *rig) startErr(cfg *plugin.TaskConfig) (*plugin.TaskHandle, error) {
	h, err := r.c.StartTask(context.Background(), cfg)
	if err == nil {
		r.t.Cleanup(func() { _ = r.d.DestroyTask(context.Background(), cfg.ID, true) })
	}
	return h, err
}

func (r *rig) start(cfg *plugin.TaskConfig) *plugin.TaskHandle {
	r.t.Helper()
	th, err := r.startErr(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return th
}

func (r *rig) wait(id string, within time.Duration) *plugin.ExitResult {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	res := r.c.WaitTask(ctx, id)
	if ctx.Err() != nil {
		r.t.Fatalf("task still running after %v", within)
	}
	return res
}

func (r *rig) inspect(id string) *plugin.TaskStatus {
	r.t.Helper()
	st, err := r.c.InspectTask(context.Background(), id)
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// readLog returns the task's log once it contains all of want (or after
// 5 s).
func readLog(t *testing.T, cfg *plugin.TaskConfig, stream string, want ...string) string {
	t.Helper()
	path := logFile(cfg, stream)
	var s string
	for i := 0; i < 100; i++ {
		b, _ := os.ReadFile(path)
		s = string(b)
		all := len(s) > 0 || len(want) == 0
		for _, w := range want {
			all = all && strings.Contains(s, w)
		}
		if all {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// needRoot skips tests that switch users: only a root client can.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("runs tasks as other users, which needs a root Nomad client; this test runs as uid %d (CI runs as root)", os.Geteuid())
	}
}

func eventually(within time.Duration, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ownerMode is "uid:gid mode" of path, not following a link.
func ownerMode(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d %#o", st.Uid, st.Gid, st.Mode&0o7777)
}

func TestRunExitCodesAndEnv(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name       string
		script     string
		model      string
		mutate     func(*TaskConfig)
		wantCode   int
		wantSignal int
		wantOut    []string
	}{
		{
			name:     "env and exit code",
			script:   `echo "nv=$NVIDIA_VISIBLE_DEVICES cuda=$CUDA_VISIBLE_DEVICES model=$HADAR_GPU_MODEL total=$HADAR_TOTAL_STEPS"; echo "pf=$HADAR_PROGRESS_FILE"; echo "ck=$HADAR_CHECKPOINT_DIR"; echo "pwd=$(pwd)"; echo "ids=$(id -u) $(id -g) $(id -G)"; touch "$HADAR_CHECKPOINT_DIR/w" && echo ck-writable; echo oops >&2; exit 3`,
			model:    "Tesla K80",
			mutate:   func(tc *TaskConfig) { tc.TotalSteps = 500 },
			wantCode: 3,
			wantOut:  []string{"nv=g0,g1 cuda=g0,g1 model=Tesla K80 total=500", "/trainer/local/hadar-progress.json", "/hadar-train/checkpoints/default/train-", "ids=31", "ck-writable"},
		},
		{
			name:   "emulated pace from the GPU model",
			script: `echo "rate=$HADAR_STEPS_PER_SEC"`,
			model:  "Tesla V100-SXM2-16GB",
			mutate: func(tc *TaskConfig) {
				tc.Emulate = &EmulateConfig{StepsPerSec: RateMaps{{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12.5}}}
			},
			wantCode: 0,
			wantOut:  []string{"rate=40"},
		},
		{
			name:       "killed by a signal",
			script:     `kill -USR1 $$`,
			wantCode:   128 + int(syscall.SIGUSR1),
			wantSignal: int(syscall.SIGUSR1),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "")
			cfg := r.task(tc.script, tc.model, tc.mutate)
			r.start(cfg)
			res := r.wait(cfg.ID, 10*time.Second)
			if res.ExitCode != tc.wantCode || res.Signal != tc.wantSignal || res.Err != nil {
				t.Fatalf("exit = %+v, want code %d signal %d", res, tc.wantCode, tc.wantSignal)
			}
			out := readLog(t, cfg, "stdout", tc.wantOut...)
			for _, w := range tc.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout %q lacks %q", out, w)
				}
			}
			if tc.name != "env and exit code" {
				return
			}
			if !strings.Contains(readLog(t, cfg, "stderr", "oops"), "oops") {
				t.Error("stderr not in the task's stderr log")
			}
			if !strings.Contains(out, "pwd="+cfg.TaskDir().Dir+"\n") {
				t.Errorf("working dir is not the task dir %q: %q", cfg.TaskDir().Dir, out)
			}
			// The job's own uid, its gid, and that group only.
			i := strings.Index(out, "ids=")
			f := strings.Fields(strings.SplitN(out[i+4:], "\n", 2)[0])
			uid, _ := strconv.Atoi(f[0])
			if len(f) != 3 || !inTestRange(uid) || f[1] != f[0] || f[2] != f[0] {
				t.Errorf("task ids %q: want the job's uid from %s as uid, gid and its only group", f, testIDRange)
			}
			ck := filepath.Join(r.data, PluginName, checkpointsDir, "default", cfg.JobID, cfg.AllocID, "trainer")
			if got, want := ownerMode(t, ck), fmt.Sprintf("%d:%d 0%o", uid, uid, 0o2770); got != want {
				t.Errorf("checkpoint directory %s: %s, want %s", ck, got, want)
			}
		})
	}
}

// TestStartTaskFailsWhenCommandCannotStart: a program that cannot be
// started is StartTask's error, and no supervisor, cgroup or state is
// left behind.
func TestStartTaskFailsWhenCommandCannotStart(t *testing.T) {
	needRoot(t)
	private := t.TempDir() // 0700 root: the job's uid cannot reach into it
	script := filepath.Join(private, "train.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, command, wantErr string
	}{
		{"missing program", "/nonexistent/train", "/nonexistent/train"},
		{"a directory", "/tmp", "/tmp"},
		{"not reachable by the task's user", script, "permission denied"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "")
			cfg := r.task("", "", func(c *TaskConfig) { c.Command, c.Args = tc.command, nil })
			before := len(supervisorPids())
			_, err := r.startErr(cfg)
			if err == nil {
				t.Fatalf("StartTask succeeded; want an error containing %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q lacks %q", err, tc.wantErr)
			}
			if plugintest.Recoverable(err) {
				t.Errorf("error %q is recoverable: the client would retry a program that cannot start", err)
			}
			if err := eventually(5*time.Second, func() error {
				if after := len(supervisorPids()); after > before {
					return fmt.Errorf("%d supervisors after the failed start, %d before", after, before)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(r.data, PluginName, element(cfg.ID))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state directory left behind: %v", err)
			}
		})
	}
}

func TestStartTaskRejects(t *testing.T) {
	outside, roots := rootDir(t, 0o755), rootDir(t, 0o755)
	ckRoot := `checkpoint_root = "` + filepath.Join(roots, "ck") + `"`
	tests := []struct {
		name    string
		model   string
		plugin  string
		env     map[string]string
		user    string
		mutate  func(*TaskConfig)
		wantErr string
	}{
		{"emulate without entry", "Tesla T4", "", nil, "", func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMaps{{"Tesla K80": 12}}} }, `emulate.steps_per_sec: no entry for GPU model "Tesla T4"`},
		{"emulate without GPU", "", "", nil, "", func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMaps{{"Tesla K80": 12}}} }, `got no GPU`},
		{"emulate bad rate", "Tesla K80", "", nil, "", func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMaps{{"Tesla K80": 0}}} }, `want a positive rate`},
		{"hadare without merge root", "", "", nil, "", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: -1} }, `hadare: no merge directory; set merge_root`},
		{"hadare bad index", "", "", nil, "", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: 2} }, `hadare.copy_index 2`},
		{"hadare declared copies under the sidecar", "", "", map[string]string{"HADAR_UNIT": "5"}, "", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: -1} }, `placed this task as unit 5`},
		{"hadare unit not a number", "", "", map[string]string{"HADAR_UNIT": "u5"}, "", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{CopyIndex: -1} }, `HADAR_UNIT "u5" is not a copy index`},
		{"forkable sidecar job without merge root", "", "", map[string]string{"HADAR_UNIT": "5", "NOMAD_META_HADAR.FORKABLE": "true"}, "", nil, `hadare: no merge directory`},
		{"emulate bad spread factor", "Tesla K80", "", nil, "", func(tc *TaskConfig) {
			tc.Emulate = &EmulateConfig{StepsPerSec: RateMaps{{"Tesla K80": 12}}, SpreadFactor: -1}
		}, `emulate.spread_factor`},
		{"hadare index disagrees with env", "", "", map[string]string{"HADAR_COPY_INDEX": "0"}, "", func(tc *TaskConfig) {
			tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: 1}
		}, `copy_index 1 disagrees with the task env's HADAR_COPY_INDEX=0`},
		{"env overrides a driver variable", "", "", map[string]string{"HADAR_JOB_ID": "other"}, "", nil, `env HADAR_JOB_ID = "other"`},
		{"relative work dir", "", "", nil, "", func(tc *TaskConfig) { tc.WorkDir = "rel" }, `work_dir "rel"`},
		{"fractional total steps", "", "", nil, "", func(tc *TaskConfig) { tc.TotalSteps = 1.5 }, `total_steps 1.5`},
		{"empty command", "", "", nil, "", func(tc *TaskConfig) { tc.Command = " " }, `command: empty`},
		{"command not on PATH", "", "", nil, "", func(tc *TaskConfig) { tc.Command = "no-such-trainer-xyz" }, `command "no-such-trainer-xyz": not found`},
		{"disabled", "", "enabled = false", nil, "", nil, `disabled`},
		{"unknown user", "", "", nil, "no-such-user-xyz", nil, `user "no-such-user-xyz"`},
		{"root without allow_root", "", "", nil, "root", nil, `allow_root = true`},
		// Job paths: under the operator's roots, or refused.
		{"checkpoint_dir without checkpoint_root", "", "", nil, "", func(tc *TaskConfig) { tc.CheckpointDir = "ckpt" }, `sets no checkpoint_root`},
		{"checkpoint_dir outside the root", "", ckRoot, nil, "", func(tc *TaskConfig) { tc.CheckpointDir = outside }, `not under this job's directory`},
		{"checkpoint_dir with ..", "", ckRoot, nil, "", func(tc *TaskConfig) { tc.CheckpointDir = "../other/ckpt" }, `".." is not allowed`},
		{"merge_dir outside the root", "", `merge_root = "` + filepath.Join(roots, "merge") + `"`, nil, "", func(tc *TaskConfig) {
			tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: 0, MergeDir: outside}
		}, `hadare.merge_dir "` + outside + `": not under this job's directory`},
		{"progress_file outside the task dir", "", "", nil, "", func(tc *TaskConfig) { tc.ProgressFile = filepath.Join(outside, "p.json") }, `progress_file "` + filepath.Join(outside, "p.json") + `": not under`},
		{"progress_file with ..", "", "", nil, "", func(tc *TaskConfig) { tc.ProgressFile = "local/../../other/local/hadar-progress.json" }, `".." is not allowed`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.wantErr, "allow_root") || strings.Contains(tc.name, "outside") || strings.Contains(tc.name, "..") {
				needRoot(t)
			}
			r := newRig(t, tc.plugin)
			cfg := r.task("exit 0", tc.model, tc.mutate)
			for k, v := range tc.env {
				cfg.Env[k] = v
			}
			cfg.User = tc.user
			_, err := r.startErr(cfg)
			if err == nil {
				t.Fatalf("started, want error %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q lacks %q", err, tc.wantErr)
			}
		})
	}
	if got := ownerMode(t, outside); got != "0:0 0755" {
		t.Errorf("the directory outside the roots is now %s, want 0:0 0755 (untouched)", got)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("the driver made %v outside the roots", entries)
	}
}

// TestJobPathsConfined: a job names, as checkpoint_dir or merge_dir, a
// root-owned directory outside the operator's roots (the live finding:
// checkpoint_dir = "/etc" gave /etc to nobody), or a path through a link
// its task planted in its own directory: the task does not start, and
// the directory is untouched.
func TestJobPathsConfined(t *testing.T) {
	needRoot(t)
	victim := rootDir(t, 0o755)
	if err := os.WriteFile(filepath.Join(victim, "passwd"), []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ckRoot, mergeRoot := rootDir(t, 0o755), rootDir(t, 0o755)
	r := newRig(t, fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q", ckRoot, mergeRoot))

	// The job's first task plants links in its own directories, which
	// it may write, to the victim.
	plant := r.task(`ln -s "`+victim+`" "$HADAR_CHECKPOINT_DIR/../../escape" && ln -s "`+victim+`" "$HADAR_MERGE_DIR/escape" && echo planted`, "",
		func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 1, CopyIndex: 0} })
	r.start(plant)
	if res := r.wait(plant.ID, 10*time.Second); res.ExitCode != 0 {
		t.Fatalf("planting task exit %+v: %s", res, readLog(t, plant, "stderr"))
	}
	jobCk := filepath.Join(ckRoot, "default", plant.JobID)
	if _, err := os.Readlink(filepath.Join(jobCk, "g", "escape")); err != nil {
		t.Fatalf("the task could not plant its link: %v", err)
	}
	tests := []struct {
		name    string
		mutate  func(*TaskConfig)
		wantErr string
	}{
		{"checkpoint_dir a root-owned directory outside the roots", func(tc *TaskConfig) { tc.CheckpointDir = victim }, `not under this job's directory`},
		{"checkpoint_dir /etc", func(tc *TaskConfig) { tc.CheckpointDir = "/etc" }, `checkpoint_dir "/etc": not under this job's directory`},
		{"checkpoint_dir through a planted link", func(tc *TaskConfig) { tc.CheckpointDir = "g/escape/sub" }, `"escape" is a symbolic link`},
		{"checkpoint_dir absolute through a planted link", func(tc *TaskConfig) { tc.CheckpointDir = filepath.Join(jobCk, "g", "escape") }, `"escape" is a symbolic link`},
		{"merge_dir a root-owned directory outside the roots", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 1, CopyIndex: 0, MergeDir: victim} }, `hadare.merge_dir`},
		{"merge_dir through a planted link", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 1, CopyIndex: 0, MergeDir: "escape/round-1"} }, `"escape" is a symbolic link`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := r.task("exit 0", "", tc.mutate)
			cfg.JobID = plant.JobID
			_, err := r.startErr(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("StartTask error %v, want one containing %q", err, tc.wantErr)
			}
			if plugintest.Recoverable(err) {
				t.Errorf("error %q is recoverable; the client would retry it", err)
			}
		})
	}
	if got := ownerMode(t, victim); got != "0:0 0755" {
		t.Errorf("victim directory %s is now %s, want 0:0 0755", victim, got)
	}
	if entries, _ := os.ReadDir(victim); len(entries) != 1 {
		t.Errorf("victim directory holds %d entries, want only its passwd", len(entries))
	}
	if got := ownerMode(t, filepath.Join(victim, "passwd")); got != "0:0 0644" {
		t.Errorf("victim's passwd is now %s", got)
	}
}

// TestProgressFileConfined: a progress_file outside the task directory
// is refused before anything is touched (the driver used to read it as
// root, copy it into local/ where the alloc filesystem serves it, and,
// at every start, delete it); a progress file the task makes a link to a
// root-only file, or a hard link, is never read.
func TestProgressFileConfined(t *testing.T) {
	needRoot(t)
	secretDir := t.TempDir() // 0700 root
	secret := filepath.Join(secretDir, "secret.json")
	if err := os.WriteFile(secret, []byte(`{"steps_done":4242,"total_steps":4242}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, "")
	cfg := r.task("exit 0", "", func(tc *TaskConfig) { tc.ProgressFile = secret })
	if _, err := r.startErr(cfg); err == nil || !strings.Contains(err.Error(), "not under") {
		t.Fatalf("StartTask with progress_file %s: %v, want a refusal", secret, err)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Fatalf("the root-only file named as progress_file: %v (the driver deleted it)", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.TaskDir().LocalDir, contract.ProgressFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("something was written to local/%s: %v", contract.ProgressFileName, err)
	}

	// A link to it, planted where the driver reads progress.
	for _, tc := range []struct{ name, plant string }{
		{"symbolic link", `ln -s "` + secret + `" "$HADAR_PROGRESS_FILE"`},
		{"symbolic link in the path", `mkdir -p local/p && ln -s "` + secretDir + `" local/p/dir`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := r.task(tc.plant+` && echo planted && sleep 2`, "", func(c *TaskConfig) {
				if strings.Contains(tc.name, "path") {
					c.ProgressFile = "local/p/dir/secret.json"
				}
			})
			r.start(cfg)
			if out := readLog(t, cfg, "stdout", "planted"); !strings.Contains(out, "planted") {
				t.Fatalf("task did not plant its link: %q %q", out, readLog(t, cfg, "stderr"))
			}
			r.wait(cfg.ID, 10*time.Second)
			if st := r.inspect(cfg.ID); st.DriverAttributes["hadar.steps_done"] != "" {
				t.Fatalf("the driver read the root-only file through the task's link: %v", st.DriverAttributes)
			}
			// Read only if the driver wrote a regular file there: the
			// task's link itself points at the secret.
			copied := filepath.Join(cfg.TaskDir().LocalDir, contract.ProgressFileName)
			if fi, err := os.Lstat(copied); err == nil && fi.Mode().IsRegular() {
				if b, err := os.ReadFile(copied); err == nil && strings.Contains(string(b), "4242") {
					t.Fatal("the root-only file was copied into local/")
				}
			}
		})
	}
}

// TestJobsCannotReachEachOther: two jobs sharing checkpoint_root get
// their own uids; one's task can neither list, read nor write the
// other's checkpoints (every task used to run as nobody, owner of every
// checkpoint directory). A job directory owned by someone else (nobody,
// from before per-job ids) is refused with the fix.
func TestJobsCannotReachEachOther(t *testing.T) {
	needRoot(t)
	ckRoot := rootDir(t, 0o755)
	r := newRig(t, fmt.Sprintf("checkpoint_root = %q", ckRoot))
	b := r.task(`echo secret-weights > "$HADAR_CHECKPOINT_DIR/ckpt" && id -u`, "", nil)
	b.JobID = "job-b"
	r.start(b)
	if res := r.wait(b.ID, 10*time.Second); res.ExitCode != 0 {
		t.Fatalf("job B exit %+v: %s", res, readLog(t, b, "stderr"))
	}
	bDir := filepath.Join(ckRoot, "default", "job-b")
	bCkpt := filepath.Join(bDir, "g", "trainer", "ckpt")
	a := r.task(`id -u; ls "`+bDir+`" && echo LISTED; cat "`+bCkpt+`" && echo READ; echo x >> "`+bCkpt+`" && echo WROTE; touch "$HADAR_CHECKPOINT_DIR/mine" && echo OWN-OK`, "", nil)
	a.JobID = "job-a"
	r.start(a)
	r.wait(a.ID, 10*time.Second)
	out := readLog(t, a, "stdout", "OWN-OK")
	for _, bad := range []string{"LISTED", "READ", "WROTE", "secret-weights"} {
		if strings.Contains(out, bad) {
			t.Errorf("job A's task reached job B's checkpoints (%s):\n%s", bad, out)
		}
	}
	if !strings.Contains(out, "OWN-OK") {
		t.Errorf("job A cannot write its own checkpoint directory:\n%s\n%s", out, readLog(t, a, "stderr"))
	}
	uidA := strings.Fields(out)[0]
	uidB := strings.Fields(readLog(t, b, "stdout"))[0]
	if uidA == uidB {
		t.Errorf("jobs A and B both run as uid %s", uidA)
	}
	if b, err := os.ReadFile(bCkpt); err != nil || string(b) != "secret-weights\n" {
		t.Errorf("job B's checkpoint is now %q, %v", b, err)
	}

	// A job directory of before (owned by nobody): refused, with the fix.
	old := filepath.Join(ckRoot, "default", "job-old")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(old, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	c := r.task("exit 0", "", nil)
	c.JobID = "job-old"
	_, err := r.startErr(c)
	if err == nil || !strings.Contains(err.Error(), "predates per-job ownership") || !strings.Contains(err.Error(), "chown -R") {
		t.Fatalf("StartTask on a job directory owned by nobody: %v, want the refusal with the fix", err)
	}
	if got := ownerMode(t, old); got != "65534:65534 0755" {
		t.Errorf("the old job directory is now %s", got)
	}

}

// TestDefaultCheckpointsOfJobs: without checkpoint_root, two jobs' tasks
// on one node, in allocation directories as Nomad makes them (alloc/ and
// alloc/data everyone's, no sticky bit). Job B's task can neither read,
// write, list nor rename away any directory on the way to job A's
// checkpoints, and a link B put at A's alloc/data (before A's restart in
// its allocation) is not followed: nothing is made where it points. A
// task restarted in its allocation finds its checkpoint; once Nomad has
// collected an allocation, its checkpoints go at the job's next start.
func TestDefaultCheckpointsOfJobs(t *testing.T) {
	needRoot(t)
	r := newRig(t, "")
	victim := rootDir(t, 0o755)
	writeA := `echo secret-weights > "$HADAR_CHECKPOINT_DIR/ckpt" && echo "ck=$HADAR_CHECKPOINT_DIR"`
	a := r.task(writeA, "", nil)
	a.JobID = "job-a"
	// What job B's task does to A's allocation before A's task starts
	// again: alloc/ is 0777 without the sticky bit.
	data := filepath.Join(a.TaskDir().SharedAllocDir, "data")
	if err := os.Rename(data, data+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, data); err != nil {
		t.Fatal(err)
	}
	r.start(a)
	if res := r.wait(a.ID, 10*time.Second); res.ExitCode != 0 {
		t.Fatalf("job A exit %+v: %s", res, readLog(t, a, "stderr"))
	}
	out := readLog(t, a, "stdout", "ck=")
	ck := strings.TrimSpace(strings.TrimPrefix(out[strings.Index(out, "ck="):], "ck="))
	if ents, err := os.ReadDir(victim); err != nil || len(ents) > 0 || ownerMode(t, victim) != "0:0 0755" {
		t.Errorf("the directory alloc/data linked to now has %v (%v), %s: the link was followed", ents, err, ownerMode(t, victim))
	}

	// Job B, another uid, tries every directory from A's checkpoint up.
	b := r.task(`id -u; d="`+ck+`"; ls "$d" && echo LISTED; cat "$d/ckpt" && echo READ; echo x >> "$d/ckpt" && echo WROTE
while [ "$d" != / ]; do mv "$d" "$d.x" 2>/dev/null && echo "MOVED $d"; d=$(dirname "$d"); done; echo B-DONE`, "", nil)
	b.JobID = "job-b"
	r.start(b)
	r.wait(b.ID, 10*time.Second)
	outB := readLog(t, b, "stdout", "B-DONE")
	for _, bad := range []string{"LISTED", "READ", "WROTE", "MOVED", "secret-weights"} {
		if strings.Contains(outB, bad) {
			t.Errorf("job B's task reached job A's checkpoints (%s):\n%s", bad, outB)
		}
	}
	if !strings.Contains(outB, "B-DONE") {
		t.Errorf("job B's task did not finish:\n%s\n%s", outB, readLog(t, b, "stderr"))
	}
	if got, err := os.ReadFile(filepath.Join(ck, "ckpt")); err != nil || string(got) != "secret-weights\n" {
		t.Errorf("job A's checkpoint is now %q, %v", got, err)
	}

	// A's task restarted in its allocation finds what it wrote.
	a2 := *a
	a2.ID = a.AllocID + "/" + a.Name + "/restart"
	r.encode(&a2, &TaskConfig{Command: "/bin/sh", Args: []string{"-c", `cat "$HADAR_CHECKPOINT_DIR/ckpt"`}})
	r.start(&a2)
	r.wait(a2.ID, 10*time.Second)
	if out := readLog(t, &a2, "stdout", "secret-weights"); !strings.Contains(out, "secret-weights") {
		t.Errorf("restarted task did not find its checkpoint:\n%s", out)
	}

	// Nomad collected A's allocation: the next start of job A removes
	// its checkpoints.
	if err := os.RemoveAll(a.AllocDir); err != nil {
		t.Fatal(err)
	}
	a3 := r.task("exit 0", "", nil)
	a3.JobID = "job-a"
	r.start(a3)
	r.wait(a3.ID, 10*time.Second)
	if _, err := os.Lstat(filepath.Dir(ck)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("checkpoints of a collected allocation %s: %v, want them gone", filepath.Dir(ck), err)
	}
}

// TestUser: the job's own uid by default, a named user with the job's
// group added, and root only with allow_root.
func TestUser(t *testing.T) {
	needRoot(t)
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skipf("no user nobody on this machine: %v", err)
	}
	tests := []struct {
		name   string
		plugin string
		user   string
		// want is "uid gid groups user", {job} the job's id.
		want string
	}{
		{"the job's own uid", "", "", "{job} {job} {job} user="},
		{"task user", "", "nobody", "65534 65534 65534 {job} user=nobody"},
		{"default_user", `default_user = "nobody"`, "", "65534 65534 65534 {job} user=nobody"},
		{"root allowed", "allow_root = true", "root", "0 0 0 {job} user=root"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.plugin)
			cfg := r.task(`echo "ids=$(id -u) $(id -g) $(id -G) user=$USER"`, "", nil)
			cfg.User = tc.user
			events := driverEvents(t, r)
			r.start(cfg)
			if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 0 {
				t.Fatalf("exit %+v: %s", res, readLog(t, cfg, "stderr"))
			}
			var job string
			if err := eventually(5*time.Second, func() error {
				for _, e := range events(cfg.ID) {
					job = e.Annotations["hadar.job_gid"]
				}
				if job == "" {
					return errors.New("no start event")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			want := "ids=" + strings.ReplaceAll(tc.want, "{job}", job) + "\n"
			if out := readLog(t, cfg, "stdout", want); !strings.Contains(out, want) {
				t.Fatalf("stdout %q, want %q", out, want)
			}
		})
	}
}

// TestTaskEnvPassesThrough: what the hadar sidecar puts in a task's env
// reaches the process unchanged.
func TestTaskEnvPassesThrough(t *testing.T) {
	needRoot(t)
	sidecar := map[string]string{
		"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500",
		"HADAR_GPU_MODEL": "Tesla K80", "HADAR_COPY_INDEX": "1", "HADAR_UNIT": "3", "HADAR_TEMPLATE": "train",
	}
	r := newRig(t, fmt.Sprintf("merge_root = %q", rootDir(t, 0o755)))
	var script strings.Builder
	for k := range sidecar {
		fmt.Fprintf(&script, `echo "%s=$%s"; `, k, k)
	}
	cfg := r.task(script.String(), "Tesla V100-SXM2-16GB", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: -1} })
	cfg.Env["NOMAD_ALLOC_INDEX"] = "0" // the copy index comes from HADAR_COPY_INDEX, not this
	for k, v := range sidecar {
		cfg.Env[k] = v
	}
	r.start(cfg)
	if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 0 {
		t.Fatalf("exit %+v", res)
	}
	var want []string
	for k, v := range sidecar {
		want = append(want, k+"="+v+"\n")
	}
	out := readLog(t, cfg, "stdout", want...)
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("stdout lacks %q:\n%s", w, out)
		}
	}
}

// TestGPUModelPrecedence: the task's HADAR_GPU_MODEL, then hadar-gpu's
// reservation, then an NVML lookup of the UUIDs Nomad's nvidia plugin
// reserved, decide the model (and so the emulated pace).
func TestGPUModelPrecedence(t *testing.T) {
	needRoot(t)
	v100x4, err := nvml.LoadRecording("../device/nvml/testdata/v100x4.json")
	if err != nil {
		t.Fatal(err)
	}
	recorded := func() nvml.Library { return nvml.Recorded{Rec: v100x4} }
	rates := RateMaps{{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12, "Tesla P100-PCIE-16GB": 21}}
	tests := []struct {
		name      string
		env       map[string]string // task env (device env merged in, as Nomad does)
		deviceEnv map[string]string
		nvml      func() nvml.Library
		want      string // "model rate", or "error: <substring>"
	}{
		{"task env wins over the reservation",
			map[string]string{"HADAR_GPU_MODEL": "Tesla K80"},
			map[string]string{"NVIDIA_VISIBLE_DEVICES": "p100-0", contract.EnvGPUReservedModel: "Tesla P100-PCIE-16GB"},
			nvml.NewLibraryUnavailable, "Tesla K80 12"},
		{"hadar-gpu reservation",
			nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "p100-0", contract.EnvGPUReservedModel: "Tesla P100-PCIE-16GB"},
			nvml.NewLibraryUnavailable, "Tesla P100-PCIE-16GB 21"},
		{"nvidia plugin UUIDs through NVML",
			nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-00000001-0000-0000-0000-000000000001,GPU-00000002-0000-0000-0000-000000000002"},
			recorded, "Tesla V100-SXM2-16GB 40"},
		{"nvidia plugin UUIDs without NVML",
			nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-00000001-0000-0000-0000-000000000001"},
			nvml.NewLibraryUnavailable, "error: set HADAR_GPU_MODEL in the task's env"},
		{"UUID NVML does not know",
			nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-ffffffff-0000-0000-0000-000000000000"},
			recorded, `error: no GPU with UUID "GPU-ffffffff-0000-0000-0000-000000000000"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRigNVML(t, "", tc.nvml)
			cfg := r.task(`echo "model=$HADAR_GPU_MODEL rate=$HADAR_STEPS_PER_SEC"`, "", func(c *TaskConfig) {
				c.Emulate = &EmulateConfig{StepsPerSec: rates}
			})
			for k, v := range tc.deviceEnv {
				cfg.DeviceEnv[k], cfg.Env[k] = v, v
			}
			for k, v := range tc.env {
				cfg.Env[k] = v
			}
			if want, ok := strings.CutPrefix(tc.want, "error: "); ok {
				_, err := r.startErr(cfg)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("StartTask error %v, want one containing %q", err, want)
				}
				return
			}
			r.start(cfg)
			if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 0 {
				t.Fatalf("exit %+v", res)
			}
			i := strings.LastIndexByte(tc.want, ' ')
			line := "model=" + tc.want[:i] + " rate=" + tc.want[i+1:] + "\n"
			if out := readLog(t, cfg, "stdout", line); !strings.Contains(out, line) {
				t.Fatalf("stdout %q lacks %q", out, line)
			}
		})
	}
}

func TestPluginConfigErrors(t *testing.T) {
	tests := []struct {
		body    string
		wantErr string
	}{
		{`checkpoint_root = "rel/dir"`, `checkpoint_root "rel/dir": want an absolute path`},
		{`merge_root = "x"`, `merge_root "x"`},
		{`state_dir = "var/lib"`, `state_dir "var/lib"`},
		{`progress_poll_interval = "0s"`, `progress_poll_interval "0s"`},
		{`job_id_range = "300000"`, `job_id_range "300000": want "first-last"`},
		{`job_id_range = "60000-70000"`, `includes 65534 (nobody)`},
		{`job_id_range = "0-100"`, `want 1000 <= first <= last`},
		{`job_id_range = "5000-4000"`, `want 1000 <= first <= last`},
		{`default_user = "no-such-user-xyz"`, `default_user "no-such-user-xyz"`},
		{`default_user = "root"`, `allow_root = true`},
	}
	for _, tc := range tests {
		t.Run(tc.wantErr, func(t *testing.T) {
			if strings.Contains(tc.body, "default_user") {
				needRoot(t) // a client that is not root ignores default_user
			}
			d := NewWithNVML(log.NewNullLogger(), nvml.NewLibraryUnavailable)
			t.Cleanup(d.Shutdown)
			err := setConfig(plugintest.Connect(t, d), tc.body)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestCheckSubordinateIDs(t *testing.T) {
	dir := t.TempDir()
	subuid := filepath.Join(dir, "subuid")
	if err := os.WriteFile(subuid, []byte("alice:100000:65536\nbob:165536:65536\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rng     string
		wantErr string
	}{
		{"200000-265535", `overlaps bob's subordinate ids 165536-231071`},
		{"300000-365535", ""},
		{"231072-240000", ""},
		{"99000-100000", `alice's`},
	} {
		rng, err := parseIDRange(tc.rng)
		if err != nil {
			t.Fatal(err)
		}
		err = checkSubordinateIDs(rng, subuid, filepath.Join(dir, "missing"))
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("range %s: %v, want %q", tc.rng, err, tc.wantErr)
		}
	}
}

// checkpointScript follows the contract: it counts steps into the
// progress file, resumes from the newest checkpoint, and on SIGTERM
// writes a checkpoint and exits 0.
const checkpointScript = `
step=0; ck=""
if [ -f "$HADAR_CHECKPOINT_DIR/ckpt" ]; then step=$(cat "$HADAR_CHECKPOINT_DIR/ckpt"); ck="$HADAR_CHECKPOINT_DIR/ckpt"; echo "resumed at $step"; fi
progress() { printf '{"steps_done":%d,"total_steps":1000,"steps_per_sec":20,"loss":0.5,"checkpoint":"%s","updated":"2026-11-22T00:00:00Z"}' "$step" "$ck" > "$HADAR_PROGRESS_FILE.tmp" && mv "$HADAR_PROGRESS_FILE.tmp" "$HADAR_PROGRESS_FILE"; }
trap 'echo $step > "$HADAR_CHECKPOINT_DIR/ckpt"; ck="$HADAR_CHECKPOINT_DIR/ckpt"; progress; echo "checkpointed at $step"; exit 0' TERM
while true; do step=$((step+1)); progress; sleep 0.05; done
`

// driverEvents collects the driver's task events of one task.
func driverEvents(t *testing.T, r *rig) func(taskID string) []*plugin.TaskEvent {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := r.c.TaskEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var all []*plugin.TaskEvent
	go func() {
		for ev := range ch {
			if ev.Event != nil {
				mu.Lock()
				all = append(all, ev.Event)
				mu.Unlock()
			}
		}
	}()
	return func(taskID string) []*plugin.TaskEvent {
		mu.Lock()
		defer mu.Unlock()
		var out []*plugin.TaskEvent
		for _, ev := range all {
			if ev.TaskID == taskID {
				out = append(out, ev)
			}
		}
		return out
	}
}

func messages(evs []*plugin.TaskEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Message)
	}
	return out
}

// waitSteps waits for the task's progress to pass n steps in InspectTask.
func (r *rig) waitSteps(id string, n int) {
	r.t.Helper()
	err := eventually(10*time.Second, func() error {
		st := r.inspect(id)
		if got, _ := strconv.Atoi(st.DriverAttributes["hadar.steps_done"]); got <= n {
			return fmt.Errorf("steps_done %q", st.DriverAttributes["hadar.steps_done"])
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// TestStopCheckpointsAndResume: a stop makes the process checkpoint and
// exit 0; the driver publishes that checkpoint (and no periodic progress)
// as events; the next run resumes and says so.
func TestStopCheckpointsAndResume(t *testing.T) {
	needRoot(t)
	ckRoot := rootDir(t, 0o755)
	r := newRig(t, fmt.Sprintf("checkpoint_root = %q", ckRoot))
	events := driverEvents(t, r)
	cfg := r.task(checkpointScript, "Tesla K80", nil)
	r.start(cfg)
	r.waitSteps(cfg.ID, 20)
	if err := r.c.StopTask(context.Background(), cfg.ID, 5*time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	res := r.wait(cfg.ID, 5*time.Second)
	if res.ExitCode != 0 || res.Signal != 0 {
		t.Fatalf("stopped task exit %+v, want a clean exit after checkpointing", res)
	}
	ckptFile := filepath.Join(ckRoot, "default", cfg.JobID, "g", "trainer", "ckpt")
	b, err := os.ReadFile(ckptFile)
	if err != nil {
		t.Fatalf("no checkpoint where checkpoint_root puts it: %v", err)
	}
	saved := strings.TrimSpace(string(b))
	var evs []*plugin.TaskEvent
	err = eventually(5*time.Second, func() error {
		evs = events(cfg.ID)
		if len(evs) == 0 || !strings.HasPrefix(evs[len(evs)-1].Message, "final progress") {
			return fmt.Errorf("events %q", messages(evs))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"training process started", "checkpoint saved at step " + saved + ": " + ckptFile, "final progress"}
	if got := messages(evs); len(got) != len(want) {
		t.Fatalf("events %q, want %q (no periodic progress)", got, want)
	}
	for i, w := range want {
		if !strings.HasPrefix(evs[i].Message, w) {
			t.Errorf("event %d %q, want %q", i, evs[i].Message, w)
		}
	}
	if got := evs[1].Annotations["hadar.checkpoint"]; got != ckptFile {
		t.Errorf("checkpoint event details %v", evs[1].Annotations)
	}

	// Run again as a new allocation of the same job: it resumes.
	cfg2 := r.task(checkpointScript, "Tesla K80", nil)
	cfg2.JobID = cfg.JobID
	r.start(cfg2)
	err = eventually(5*time.Second, func() error {
		for _, e := range events(cfg2.ID) {
			if strings.HasPrefix(e.Message, "resumed from checkpoint "+ckptFile+" at step ") {
				return nil
			}
		}
		return fmt.Errorf("no resume event: %q", messages(events(cfg2.ID)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.c.StopTask(context.Background(), cfg2.ID, 5*time.Second, ""); err != nil {
		t.Fatal(err)
	}
	r.wait(cfg2.ID, 5*time.Second)
	if out := readLog(t, cfg2, "stdout", "resumed at "+saved); !strings.Contains(out, "resumed at "+saved) {
		t.Fatalf("second run did not resume from step %s: %q", saved, out)
	}
}

// groupAlive lists the live processes of process group pgid.
func groupAlive(pgid int) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestStopKillsAfterTimeout(t *testing.T) {
	needRoot(t)
	r := newRig(t, "")
	// The child ignores SIGTERM too: the whole group must be killed.
	cfg := r.task(`trap '' TERM; sh -c 'trap "" TERM; sleep 60' & sleep 60`, "", nil)
	r.start(cfg)
	pgid, err := strconv.Atoi(r.inspect(cfg.ID).DriverAttributes["pid"])
	if err != nil {
		t.Fatal(err)
	}
	if err := eventually(5*time.Second, func() error {
		if n := len(groupAlive(pgid)); n < 3 {
			return fmt.Errorf("process group %d has %d processes, want the shell, its child and sleeps", pgid, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := r.c.StopTask(context.Background(), cfg.ID, 500*time.Millisecond, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	res := r.wait(cfg.ID, 5*time.Second)
	if res.Signal != int(syscall.SIGKILL) {
		t.Fatalf("exit %+v, want SIGKILL", res)
	}
	if took := time.Since(begin); took < 500*time.Millisecond || took > 5*time.Second {
		t.Fatalf("stop took %v, want about the 500ms kill timeout", took)
	}
	if err := eventually(2*time.Second, func() error {
		if left := groupAlive(pgid); len(left) > 0 {
			return fmt.Errorf("processes %v of the group survived", left)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRecoverTask: a fresh driver (the plugin after a client restart)
// reattaches to the task's supervisor from the handle Nomad stored, and
// refuses, saying why, a handle of the release that ran Nomad's executor.
func TestRecoverTask(t *testing.T) {
	needRoot(t)
	r := newRig(t, "")
	cfg := r.task(`trap 'echo bye; exit 7' TERM; echo ready; while true; do sleep 0.05; done`, "", nil)
	th := r.start(cfg)
	if out := readLog(t, cfg, "stdout", "ready"); !strings.Contains(out, "ready") {
		t.Fatalf("task not ready: %q", out)
	}
	// The plugin goes away (its supervisors stay).
	r.d.Shutdown()
	r2 := newRig(t, "")
	if err := r2.c.RecoverTask(context.Background(), th); err != nil {
		t.Fatal(err)
	}
	if st := r2.inspect(cfg.ID); st.State != plugin.TaskStateRunning {
		t.Fatalf("recovered task state %v; want running", st.State)
	}
	if err := r2.c.StopTask(context.Background(), cfg.ID, 5*time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if res := r2.wait(cfg.ID, 5*time.Second); res.ExitCode != 7 {
		t.Fatalf("recovered task exit %+v, want code 7", res)
	}
	// A task that ended while the driver was away: its supervisor
	// recorded the exit status.
	r2.d.Shutdown()
	r3 := newRig(t, "")
	if err := r3.c.RecoverTask(context.Background(), th); err != nil {
		t.Fatal(err)
	}
	if res := r3.wait(cfg.ID, 5*time.Second); res.ExitCode != 7 {
		t.Fatalf("late recovery exit %+v, want 7", res)
	}
	if err := r3.c.DestroyTask(context.Background(), cfg.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.data, PluginName, element(cfg.ID))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory after DestroyTask: %v", err)
	}

	// The handle of a task v0.2 started under Nomad's executor
	// (msgpack driver state, version 2), whose program and executor run
	// on: refused, saying why, and they are stopped (the client starts
	// the task again), the program with SIGTERM first.
	legacy := r3.task("", "", nil)
	marker := filepath.Join(legacy.TaskDir().LocalDir, "checkpointed")
	prog := exec.Command("/bin/sh", "-c", `trap 'touch "`+marker+`"; exit 0' TERM; while :; do sleep 0.05; done`)
	prog.Env = []string{"NOMAD_ALLOC_ID=" + legacy.AllocID, "NOMAD_TASK_NAME=" + legacy.Name, "PATH=/usr/bin:/bin"}
	self, _ := os.Executable()
	executor := exec.Command(self, "executor", `{"LogFile":"`+filepath.Join(legacy.TaskDir().Dir, "executor.out")+`","LogLevel":"debug"}`)
	var waits sync.WaitGroup
	for _, c := range []*exec.Cmd{prog, executor} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		waits.Add(1)
		go func() { defer waits.Done(); _ = c.Wait() }()
		t.Cleanup(func() { _ = c.Process.Kill(); waits.Wait() })
	}
	time.Sleep(200 * time.Millisecond) // the shell sets its trap
	old := &plugin.TaskHandle{Version: 2, Config: legacy, State: plugin.TaskStateRunning, DriverState: []byte("\x85\xaeReattachConfig\x80")}
	err := r3.c.RecoverTask(context.Background(), old)
	if err == nil || !strings.Contains(err.Error(), "cannot reattach") || !strings.Contains(err.Error(), "Upgrading") || !strings.Contains(err.Error(), "processes it left") {
		t.Fatalf("RecoverTask of a v0.2 handle: %v, want a refusal saying why, having stopped its processes", err)
	}
	done := make(chan struct{})
	go func() { waits.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the v0.2 task's processes still run")
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the v0.2 task did not get SIGTERM to checkpoint first: %v", err)
	}
}

func TestHadarEEnv(t *testing.T) {
	needRoot(t)
	mergeRoot := rootDir(t, 0o755)
	r := newRig(t, fmt.Sprintf("merge_root = %q", mergeRoot))
	cfg := r.task(`echo "idx=$HADAR_COPY_INDEX n=$HADAR_COPIES dir=$HADAR_MERGE_DIR every=$HADAR_MERGE_EVERY"; mkdir "$HADAR_MERGE_DIR/round-1" && echo merge-writable`, "", func(tc *TaskConfig) {
		tc.HadarE = &HadarEConfig{Copies: 3, CopyIndex: -1, MergeEvery: 50}
	})
	cfg.Env["NOMAD_ALLOC_INDEX"] = "2"
	r.start(cfg)
	if res := r.wait(cfg.ID, 5*time.Second); res.ExitCode != 0 {
		t.Fatalf("exit %+v", res)
	}
	want := "idx=2 n=3 dir=" + filepath.Join(mergeRoot, "default", cfg.JobID) + " every=50\nmerge-writable"
	if out := readLog(t, cfg, "stdout", want); !strings.Contains(out, want) {
		t.Fatalf("stdout %q lacks %q", out, want)
	}
}

// TestSidecarWorkerResumesAcrossUnits: the hadar sidecar moves a job by
// removing its unit's generated groups and adding a new unit, whose
// groups have other names (<template>-hadar-u<unit>-w<rank>). Keyed by
// the template group (HADAR_TEMPLATE), the new unit's workers get the
// checkpoint directory the old unit's rank 0 wrote, and resume from its
// step; every rank of the unit gets the same directory.
func TestSidecarWorkerResumesAcrossUnits(t *testing.T) {
	needRoot(t)
	ckRoot := rootDir(t, 0o755)
	r := newRig(t, fmt.Sprintf("checkpoint_root = %q", ckRoot))
	events := driverEvents(t, r)
	worker := func(unit, rank int, script string) *plugin.TaskConfig {
		cfg := r.task(script, "Tesla K80", nil)
		cfg.JobID = "moved"
		cfg.TaskGroupName = fmt.Sprintf("train-hadar-u%d-w%d", unit, rank)
		for k, v := range map[string]string{"HADAR_TEMPLATE": "train", "HADAR_UNIT": strconv.Itoa(unit), "RANK": strconv.Itoa(rank), "WORLD_SIZE": "2"} {
			cfg.Env[k] = v
		}
		return cfg
	}
	old := worker(1, 0, checkpointScript)
	r.start(old)
	r.waitSteps(old.ID, 20)
	if err := r.c.StopTask(context.Background(), old.ID, 5*time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if res := r.wait(old.ID, 5*time.Second); res.ExitCode != 0 {
		t.Fatalf("old unit's rank 0 exit %+v", res)
	}
	dir := filepath.Join(ckRoot, "default", "moved", "train", "trainer")
	b, err := os.ReadFile(filepath.Join(dir, "ckpt"))
	if err != nil {
		t.Fatalf("the old unit's checkpoint is not under its template group: %v", err)
	}
	saved := strings.TrimSpace(string(b))

	// The new unit (a higher number, as the sidecar writes it): rank 0
	// resumes at the saved step, and rank 1 sees the same directory.
	moved := worker(4, 0, checkpointScript)
	r.start(moved)
	if out := readLog(t, moved, "stdout", "resumed at "+saved); !strings.Contains(out, "resumed at "+saved) {
		t.Fatalf("new unit's rank 0 stdout %q: want it to resume at step %s", out, saved)
	}
	err = eventually(5*time.Second, func() error {
		for _, ev := range events(moved.ID) {
			if strings.HasPrefix(ev.Message, "resumed from checkpoint "+filepath.Join(dir, "ckpt")+" at step ") {
				return nil
			}
		}
		return fmt.Errorf("events %q", messages(events(moved.ID)))
	})
	if err != nil {
		t.Fatal(err)
	}
	peer := worker(4, 1, `echo "ckpt=$HADAR_CHECKPOINT_DIR"`)
	r.start(peer)
	if res := r.wait(peer.ID, 5*time.Second); res.ExitCode != 0 {
		t.Fatalf("rank 1 exit %+v", res)
	}
	if out := readLog(t, peer, "stdout", "ckpt="); !strings.Contains(out, "ckpt="+dir+"\n") {
		t.Fatalf("rank 1 stdout %q: want the unit's checkpoint dir %s", out, dir)
	}
	if err := r.c.StopTask(context.Background(), moved.ID, 5*time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	r.wait(moved.ID, 5*time.Second)
}

// TestSidecarCopyEnv: what the driver derives from the sidecar's worker
// env: the copy index of a HadarE copy is its unit (any number, copies
// dynamic), a forkable job merges without a hadare block, and the spread
// pace comes from the emulate block.
func TestSidecarCopyEnv(t *testing.T) {
	needRoot(t)
	ckRoot, mergeRoot := rootDir(t, 0o755), rootDir(t, 0o755)
	rates := RateMaps{{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 10}}
	sidecar := map[string]string{"HADAR_TEMPLATE": "train", "HADAR_UNIT": "7"}
	forkable := map[string]string{"HADAR_TEMPLATE": "train", "HADAR_UNIT": "7", "NOMAD_META_hadar.forkable": "true", "NOMAD_META_HADAR.FORKABLE": "true"}
	tests := []struct {
		name   string
		env    map[string]string
		mutate func(*TaskConfig)
		want   string // the line the script prints, {ck} and {merge} replaced
	}{
		{"plain job of the sidecar", sidecar, nil,
			"ckpt={ck}/train/trainer idx= copies=unset merge= pace= spread="},
		{"forkable job of the sidecar: a dynamic copy", forkable, nil,
			"ckpt={ck}/train/trainer/copy-7 idx=7 copies=unset merge={merge} pace= spread="},
		{"hadare block without copies: the unit is the copy", sidecar, func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{CopyIndex: -1, MergeEvery: 40} },
			"ckpt={ck}/train/trainer/copy-7 idx=7 copies=unset merge={merge} pace= spread="},
		{"emulated without spread options", nil, func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: rates} },
			"ckpt={ck}/g/trainer idx= copies=unset merge= pace=10 spread="},
		{"spread factor", nil, func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: rates, SpreadFactor: 0.8} },
			"ckpt={ck}/g/trainer idx= copies=unset merge= pace=10 spread=8"},
		{"spread pace of the model wins", nil, func(tc *TaskConfig) {
			tc.Emulate = &EmulateConfig{StepsPerSec: rates, SpreadFactor: 0.8, SpreadStepsPerSec: RateMaps{{"Tesla K80": 6}}}
		}, "ckpt={ck}/g/trainer idx= copies=unset merge= pace=10 spread=6"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q", ckRoot, mergeRoot))
			cfg := r.task(`echo "ckpt=$HADAR_CHECKPOINT_DIR idx=$HADAR_COPY_INDEX copies=${HADAR_COPIES-unset} merge=$HADAR_MERGE_DIR pace=$HADAR_STEPS_PER_SEC spread=$HADAR_SPREAD_STEPS_PER_SEC"`, "Tesla K80", tc.mutate)
			cfg.TaskGroupName = "train-hadar-u7-w0"
			if tc.env == nil {
				cfg.TaskGroupName = "g"
			}
			for k, v := range tc.env {
				cfg.Env[k] = v
			}
			r.start(cfg)
			if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 0 {
				t.Fatalf("exit %+v: %s", res, readLog(t, cfg, "stderr"))
			}
			want := strings.NewReplacer("{ck}", filepath.Join(ckRoot, "default", cfg.JobID), "{merge}", filepath.Join(mergeRoot, "default", cfg.JobID)).Replace(tc.want) + "\n"
			if out := readLog(t, cfg, "stdout", want); !strings.Contains(out, want) {
				t.Fatalf("stdout %q, want %q", out, want)
			}
		})
	}
}

// TestTaskStatsAndSignal: CPU is reported in MHz, consistent with the
// percent and the node's compute; memory from the cgroup; signals reach
// the process group.
func TestTaskStatsAndSignal(t *testing.T) {
	needRoot(t)
	if _, err := cgroup.Detect(); err != nil {
		t.Skipf("no cgroups here: %v", err)
	}
	r := newRig(t, "")
	cfg := r.task(`trap 'echo got-usr1' USR1; echo ready; while :; do :; done`, "", nil)
	r.start(cfg)
	if out := readLog(t, cfg, "stdout", "ready"); !strings.Contains(out, "ready") {
		t.Fatalf("task not ready: %q", out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := r.c.TaskStats(ctx, cfg.ID, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	perCore := float64(topology.TotalCompute()) / float64(len(topology.Cores))
	var samples int
	timeout := time.After(15 * time.Second)
	for samples < 3 {
		select {
		case s := <-ch:
			if s == nil || s.Err != nil {
				t.Fatalf("stats stream ended: %v", s)
			}
			cpu := s.Usage.CPU
			if cpu.Percent < 20 {
				continue // the first sample has no rate yet
			}
			want := cpu.Percent / 100 * perCore
			t.Logf("cpu %.1f%% = %.0f MHz (want %.0f), rss %d", cpu.Percent, cpu.TotalTicks, want, s.Usage.Memory.RSS)
			if cpu.TotalTicks < 0.99*want || cpu.TotalTicks > 1.01*want || cpu.Percent > 220 {
				t.Fatalf("TotalTicks %.0f is not MHz: want %.0f for %.1f%%", cpu.TotalTicks, want, cpu.Percent)
			}
			if s.Usage.Memory.RSS == 0 && s.Usage.Memory.Usage == 0 {
				t.Fatal("no memory figures")
			}
			samples++
		case <-timeout:
			t.Fatalf("%d busy samples within 15s", samples)
		}
	}
	if err := r.c.SignalTask(context.Background(), cfg.ID, "SIGUSR1"); err != nil {
		t.Fatal(err)
	}
	if err := r.c.SignalTask(context.Background(), cfg.ID, "SIGNOPE"); err == nil {
		t.Fatal("unknown signal accepted")
	}
	if out := readLog(t, cfg, "stdout", "got-usr1"); !strings.Contains(out, "got-usr1") {
		t.Fatal("signal did not reach the process")
	}
	if err := r.c.DestroyTask(context.Background(), cfg.ID, false); err == nil {
		t.Fatal("destroyed a running task without force")
	}
	if err := r.c.DestroyTask(context.Background(), cfg.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.InspectTask(context.Background(), cfg.ID); err == nil {
		t.Fatal("a destroyed task is still known")
	}
}

// TestMemoryLimitOOM: a task that outgrows its memory is killed by the
// kernel inside its cgroup and reported OOM-killed.
func TestMemoryLimitOOM(t *testing.T) {
	needRoot(t)
	if _, err := cgroup.Detect(); err != nil {
		t.Skipf("no cgroups here: %v", err)
	}
	r := newRig(t, "")
	cfg := r.task(`head -c 1G /dev/zero | tail > /dev/null`, "", nil)
	cfg.Resources.MemoryMB, cfg.Resources.Linux.MemoryLimitBytes = 32, 32<<20
	r.start(cfg)
	res := r.wait(cfg.ID, 60*time.Second)
	if !res.OOMKilled || res.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("exit %+v, want OOM-killed (exit 137); stderr %q", res, readLog(t, cfg, "stderr"))
	}
}

func TestProgressEvents(t *testing.T) {
	start := time.Now()
	old := "/c/ckpt-100.pt" // written before the run
	olderThan := func(path string, at time.Time) bool { return (path == old || path == "/c/state.pt") && at == start }
	p := func(steps int64, ckpt string, merges int) *contract.Progress {
		return &contract.Progress{StepsDone: steps, TotalSteps: 1000, Checkpoint: ckpt, Merges: merges}
	}
	type step struct {
		p              *contract.Progress
		stopping, done bool
		want           []string // message prefixes
	}
	tests := []struct {
		name   string
		primed bool
		steps  []step
	}{
		{"fresh run stopped", false, []step{
			{p(10, "", 0), false, false, nil},
			{p(500, "", 0), false, false, nil},
			{p(600, "/c/ckpt-600", 0), false, false, nil}, // periodic checkpoint: no event
			{p(700, "/c/ckpt-600", 0), true, false, nil},
			{p(720, "/c/ckpt-720", 0), true, false, []string{"checkpoint saved at step 720: /c/ckpt-720"}},
			{p(720, "/c/ckpt-720", 0), true, true, []string{"final progress: step 720/1000"}},
			{p(720, "/c/ckpt-720", 0), true, true, nil},
		}},
		{"resumed and merged, ran to the end", false, []step{
			{p(100, old, 0), false, false, []string{"resumed from checkpoint " + old + " at step 100"}},
			{p(140, old, 1), false, false, []string{"first merge with the other copies done at step 140"}},
			{p(180, old, 2), false, false, nil},
			{p(1000, "/c/ckpt-1000", 9), false, true, []string{"checkpoint saved at step 1000", "final progress: step 1000/1000"}},
		}},
		// The first read came after the process had gone on from its
		// checkpoint (a loaded node, make test run 32): it resumed at the
		// checkpoint's step, not the step read.
		{"resumed, first read some steps on", false, []step{
			{p(134, old, 0), false, false, []string{"resumed from checkpoint " + old + " at step 100"}},
		}},
		// A name not of the contract's form says no step: the step read.
		{"resumed from a checkpoint of another name", false, []step{
			{p(134, "/c/state.pt", 0), false, false, []string{"resumed from checkpoint /c/state.pt at step 134"}},
		}},
		{"reattached after a client restart", true, []step{
			{p(300, old, 3), false, false, nil},
			{p(320, old, 4), true, false, nil},
			{p(330, "/c/ckpt-330", 4), true, false, []string{"checkpoint saved at step 330"}},
		}},
		// The first read after the reattach came after the stop's
		// checkpoint (a loaded node): it is saved, not where it resumed.
		{"reattached, first read after the stop", true, []step{
			{p(172, "/c/ckpt-172", 0), true, true, []string{"checkpoint saved at step 172", "final progress: step 172/1000"}},
		}},
		{"no progress file", false, []step{
			{nil, false, false, nil},
			{nil, true, true, nil},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := progressEvents{started: start, primed: tc.primed, reattached: start, olderThan: olderThan}
			for i, s := range tc.steps {
				got := e.next(s.p, s.stopping, s.done)
				if len(got) != len(s.want) {
					t.Fatalf("step %d: events %v, want %q", i, got, s.want)
				}
				for j, w := range s.want {
					if !strings.HasPrefix(got[j].message, w) {
						t.Fatalf("step %d: event %q, want %q", i, got[j].message, w)
					}
				}
			}
		})
	}
}

// TestProgressInAllocDir: a progress_file elsewhere in the task directory
// is copied to <task>/local/hadar-progress.json, the path the sidecar
// reads through the alloc filesystem; a stale one from the last run is
// gone before the process starts.
func TestProgressInAllocDir(t *testing.T) {
	needRoot(t)
	r := newRig(t, "")
	cfg := r.task(`mkdir -p "$(dirname "$HADAR_PROGRESS_FILE")"; printf '{"steps_done":7,"total_steps":10}' > "$HADAR_PROGRESS_FILE"; sleep 60`, "", func(tc *TaskConfig) { tc.ProgressFile = "work/progress.json" })
	alloced := filepath.Join(cfg.TaskDir().LocalDir, contract.ProgressFileName)
	if err := os.WriteFile(alloced, []byte(`{"steps_done":999}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r.start(cfg)
	if b, err := os.ReadFile(alloced); err == nil && strings.Contains(string(b), "999") {
		t.Fatal("the last run's progress file survived the start")
	}
	err := eventually(5*time.Second, func() error {
		b, err := os.ReadFile(alloced)
		if err != nil {
			return err
		}
		if string(b) != `{"steps_done":7,"total_steps":10}` {
			return fmt.Errorf("alloc-dir progress %q", b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := r.inspect(cfg.ID); st.DriverAttributes["progress_file"] != filepath.Join(cfg.TaskDir().Dir, "work/progress.json") {
		t.Errorf("progress_file attribute %q", st.DriverAttributes["progress_file"])
	}
}

// A task run as a named user gets only the job's group beside the
// user's own, not the user's supplementary groups (docker, disk, shadow
// would reach the node): issue #30, item 8.
func TestUserKeepsNoSupplementaryGroups(t *testing.T) {
	needRoot(t)
	name, extra := userWithSupplementaryGroup(t)
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, "")
	cfg := r.task(`echo "groups=$(id -G)"`, "", nil)
	cfg.User = name
	events := driverEvents(t, r)
	r.start(cfg)
	if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 0 {
		t.Fatalf("exit %+v: %s", res, readLog(t, cfg, "stderr"))
	}
	var job string
	if err := eventually(5*time.Second, func() error {
		for _, e := range events(cfg.ID) {
			job = e.Annotations["hadar.job_gid"]
		}
		if job == "" {
			return errors.New("no start event")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := "groups=" + u.Gid + " " + job + "\n"
	if out := readLog(t, cfg, "stdout", "groups="); out != want {
		t.Errorf("user %s (also in group %s): stdout %q, want %q: only its own group and the job's", name, extra, out, want)
	}
}

// userWithSupplementaryGroup makes an account of its own that is also a
// member of a group of its own (removed when the test ends): a test that
// looked for such an account among the machine's skipped where none was.
func userWithSupplementaryGroup(t *testing.T) (name, group string) {
	suffix := strconv.Itoa(os.Getpid())
	name, group = "hadart"+suffix, "hadarg"+suffix
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("groupadd", "--system", group)
	t.Cleanup(func() { _ = exec.Command("groupdel", group).Run() })
	run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--groups", group, name)
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	return name, group
}

// A recovered handle whose state_dir is not the one this driver gives
// the task (Nomad's stored state, edited) is refused: DestroyTask would
// remove whatever directory it names (issue #30, item 8).
func TestRecoverForeignStateDir(t *testing.T) {
	needRoot(t)
	r := newRig(t, "")
	cfg := r.task(`exit 3`, "", nil)
	th := r.start(cfg)
	if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 3 {
		t.Fatalf("exit %+v", res)
	}
	r.d.Shutdown()
	st, err := decodeDriverState(th.Version, th.DriverState)
	if err != nil {
		t.Fatal(err)
	}
	victim := t.TempDir()
	res, err := os.ReadFile(filepath.Join(st.Supervise.StateDir, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "result.json"), res, 0o600); err != nil {
		t.Fatal(err)
	}
	st.Supervise.StateDir = victim
	forged := *th
	if forged.DriverState, err = st.encode(); err != nil {
		t.Fatal(err)
	}
	r2 := newRig(t, "")
	err = r2.c.RecoverTask(context.Background(), &forged)
	if err == nil {
		_ = r2.c.DestroyTask(context.Background(), cfg.ID, true)
	}
	if _, serr := os.Stat(victim); serr != nil {
		t.Errorf("the directory a forged handle named: %v", serr)
	}
	if err == nil || !strings.Contains(err.Error(), "state_dir") {
		t.Errorf("RecoverTask of a handle naming %s: %v, want a refusal naming state_dir", victim, err)
	}
}

// TestRerunStartsFreshThroughTheDriver: issue 33 item 7 through
// StartTask. A task that ends done records its run as finished; the
// job's next run (same Nomad job, run again) does not see its
// checkpoints, and one that asks to resume with fewer steps than they
// hold is refused with the reason.
func TestRerunStartsFreshThroughTheDriver(t *testing.T) {
	needRoot(t)
	ckRoot := rootDir(t, 0o755)
	r := newRig(t, fmt.Sprintf("checkpoint_root = %q", ckRoot))
	const done = `ls "$HADAR_CHECKPOINT_DIR" | grep '^ckpt-' | tr '\n' ' '; echo "<- found"
echo x > "$HADAR_CHECKPOINT_DIR/ckpt-4000.json"
printf '{"steps_done":4000,"total_steps":4000,"state":"done","updated":"2026-11-22T00:00:00Z"}' > "$HADAR_PROGRESS_FILE"
sleep 1`
	task := func(steps string, env map[string]string) *plugin.TaskConfig {
		cfg := r.task(done, "Tesla K80", nil)
		cfg.JobID = "again"
		cfg.Env["HADAR_TOTAL_STEPS"] = steps
		cfg.Env["HADAR_JOB_RUN"] = "17"
		maps.Copy(cfg.Env, env)
		return cfg
	}
	first := task("4000", nil)
	r.start(first)
	if res := r.wait(first.ID, 10*time.Second); res.ExitCode != 0 {
		t.Fatalf("first run exit %+v", res)
	}
	dir := filepath.Join(ckRoot, "default", "again", "g", first.Name)
	if err := eventually(5*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(dir, runRecordName))
		if err != nil || !strings.Contains(string(b), `"finished":true`) {
			return fmt.Errorf("run record %q, %v", b, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Run again with fewer steps: fresh, not "done" at once.
	again := task("2000", nil)
	r.start(again)
	if res := r.wait(again.ID, 10*time.Second); res.ExitCode != 0 {
		t.Fatalf("rerun exit %+v", res)
	}
	if out := readLog(t, again, "stdout", "<- found"); !strings.HasPrefix(out, "<- found") {
		t.Fatalf("the rerun found the finished run's checkpoints: %q", out)
	}
	// Asked to resume, with fewer steps than the checkpoint holds.
	_, err := r.startErr(task("2000", map[string]string{"NOMAD_META_hadar.resume": "true"}))
	if err == nil || !strings.Contains(err.Error(), "holds 4000 steps, more than the 2000") {
		t.Fatalf("a resumed rerun asking for fewer steps: err %v", err)
	}
}
