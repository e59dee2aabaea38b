package train

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/hashicorp/nomad/client/lib/numalib"
	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/helper/uuid"
	"github.com/hashicorp/nomad/nomad/structs"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/testutils"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/zclconf/go-cty/cty/msgpack"

	"github.com/hadar-sched/hadar/driver/device/nvml"
)

// TestMain fails the package when its tests leave an executor running.
// The test binary serves as each task's executor ("train.test executor
// ..."): Nomad's executor package takes such a process over in its init.
func TestMain(m *testing.M) {
	// The test binary also stands in for hadar-train as the shim that
	// switches a task to its user.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case DropArg:
			os.Exit(DropPrivileges(os.Args[2:]))
		case CheckArg:
			os.Exit(CheckAccess(os.Args[2:]))
		}
	}
	code := m.Run()
	var left []int
	_ = eventually(5*time.Second, func() error {
		if left = executorPids(); len(left) > 0 {
			return fmt.Errorf("%d executors", len(left))
		}
		return nil
	})
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left executors %v running (now killed)\n", left)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		code = 1
	}
	os.Exit(code)
}

// encodePluginConfig turns a plugin block map into what SetConfig gets.
func encodePluginConfig(t *testing.T, spec *hclspec.Spec, m map[string]interface{}) *base.Config {
	t.Helper()
	dec, diags := hclspecutils.Convert(spec)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	val, diags, errs := hclutils.ParseHclInterface(m, dec, nil)
	if len(errs) > 0 || diags.HasErrors() {
		t.Fatalf("plugin config %v: %v %v", m, errs, diags)
	}
	b, err := msgpack.Marshal(val, val.Type())
	if err != nil {
		t.Fatal(err)
	}
	return &base.Config{PluginConfig: b, AgentConfig: &base.AgentConfig{Driver: &base.ClientDriverConfig{Topology: topology()}}}
}

var topology = sync.OnceValue(func() *numalib.Topology { return numalib.Scan(numalib.PlatformScanners(false)) })

type rig struct {
	noLogs bool // for tasks that never start: logmon would wait for a writer
	t      *testing.T
	d      *Driver
	h      *testutils.DriverHarness
}

func newRig(t *testing.T, pluginCfg map[string]interface{}) *rig {
	return newRigNVML(t, pluginCfg, nvml.NewLibraryUnavailable)
}

func newRigNVML(t *testing.T, pluginCfg map[string]interface{}, open func() nvml.Library) *rig {
	t.Helper()
	d := NewWithNVML(log.NewNullLogger(), open)
	t.Cleanup(d.Shutdown)
	h := testutils.NewDriverHarness(t, d)
	if pluginCfg == nil {
		pluginCfg = map[string]interface{}{}
	}
	if _, ok := pluginCfg["progress_poll_interval"]; !ok {
		pluginCfg["progress_poll_interval"] = "100ms"
	}
	if err := h.SetConfig(encodePluginConfig(t, configSpec, pluginCfg)); err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, d: d, h: h}
}

// task builds a task running sh -c script, with GPUs of model given (as
// hadar-gpu reserves them), in a cgroup like the one Nomad's client makes.
func (r *rig) task(script string, model string, mutate func(*TaskConfig)) *drivers.TaskConfig {
	r.t.Helper()
	cfg := &drivers.TaskConfig{
		ID:            uuid.Generate(),
		AllocID:       uuid.Generate(),
		JobID:         "train-" + strings.ToLower(r.t.Name()[len(r.t.Name())-4:]),
		TaskGroupName: "g",
		Name:          "trainer",
		Namespace:     "default",
		Env:           map[string]string{},
		DeviceEnv:     map[string]string{},
	}
	if model != "" {
		// Nomad merges the device plugin's variables into the task's env.
		cfg.DeviceEnv = map[string]string{"NVIDIA_VISIBLE_DEVICES": "g0,g1", "CUDA_VISIBLE_DEVICES": "g0,g1", envReservedModel: model}
		for k, v := range cfg.DeviceEnv {
			cfg.Env[k] = v
		}
	}
	tc := &TaskConfig{Command: "/bin/sh", Args: []string{"-c", script}}
	if mutate != nil {
		mutate(tc)
	}
	if err := cfg.EncodeConcreteDriverConfig(tc); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(r.h.MkAllocDir(cfg, !r.noLogs))
	// The harness's directory is private to root; tasks run as nobody.
	if err := os.Chmod(filepath.Dir(cfg.AllocDir), 0o755); err != nil {
		r.t.Fatal(err)
	}
	r.cgroup(cfg, 256)
	return cfg
}

var initCgroups = sync.OnceValue(func() error {
	return cgroupslib.Init(log.NewNullLogger(), topology().UsableCores().String())
})

// cgroup gives the task a cgroup with memoryMB as its limit, as Nomad's
// client does before it starts a task.
func (r *rig) cgroup(cfg *drivers.TaskConfig, memoryMB int64) {
	r.t.Helper()
	taskCgroup(r.t, cfg, memoryMB)
}

// taskCgroup sets the task's resources and makes its cgroup (nothing where
// cgroups are off); the cgroup is removed when the test ends.
func taskCgroup(tb testing.TB, cfg *drivers.TaskConfig, memoryMB int64) {
	tb.Helper()
	cfg.Resources = &drivers.Resources{
		NomadResources: &structs.AllocatedTaskResources{
			Memory: structs.AllocatedMemoryResources{MemoryMB: memoryMB},
			Cpu:    structs.AllocatedCpuResources{CpuShares: 100},
		},
		LinuxResources: &drivers.LinuxResources{
			MemoryLimitBytes: memoryMB << 20,
			CPUShares:        100,
			CpusetCgroupPath: cgroupslib.LinuxResourcesPath(cfg.AllocID, cfg.Name, false),
		},
	}
	if cgroupslib.GetMode() == cgroupslib.OFF {
		return
	}
	if err := initCgroups(); err != nil {
		tb.Fatalf("cgroups: %v", err)
	}
	cg := cgroupslib.Factory(cfg.AllocID, cfg.Name, false)
	if err := cg.Setup(); err != nil {
		tb.Fatalf("task cgroup: %v", err)
	}
	tb.Cleanup(func() {
		_ = cg.Kill()
		// The kernel needs a moment to empty a cgroup whose processes
		// were just killed.
		for i := 0; i < 50; i++ {
			if cg.Teardown() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		tb.Errorf("task cgroup of %s not removed", cfg.AllocID)
	})
}

func (r *rig) start(cfg *drivers.TaskConfig) *drivers.TaskHandle {
	r.t.Helper()
	th, _, err := r.h.StartTask(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	// Straight to the driver: the harness's gRPC client is closed by the
	// cleanup of the next task's alloc dir.
	r.t.Cleanup(func() { _ = r.d.DestroyTask(cfg.ID, true) })
	return th
}

func (r *rig) wait(id string, within time.Duration) *drivers.ExitResult {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	ch, err := r.h.WaitTask(ctx, id)
	if err != nil {
		r.t.Fatal(err)
	}
	select {
	case res, ok := <-ch:
		if !ok || res == nil {
			r.t.Fatalf("no exit result within %v", within)
		}
		return res
	case <-ctx.Done():
		r.t.Fatalf("task still running after %v", within)
	}
	return nil
}

// readLog returns the task's log once it contains all of want (or after
// 5 s): logmon copies output a moment after the process writes it.
func readLog(t *testing.T, cfg *drivers.TaskConfig, stream string, want ...string) string {
	t.Helper()
	path := filepath.Join(cfg.TaskDir().LogDir, cfg.Name+"."+stream+".0")
	var s string
	for i := 0; i < 100; i++ {
		b, _ := os.ReadFile(path)
		s = string(b)
		all := len(s) > 0
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
		t.Skipf("runs tasks as nobody, which needs a root Nomad client; this test runs as uid %d", os.Geteuid())
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skipf("no user nobody on this machine: %v", err)
	}
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
			script:   `echo "nv=$NVIDIA_VISIBLE_DEVICES cuda=$CUDA_VISIBLE_DEVICES model=$HADAR_GPU_MODEL total=$HADAR_TOTAL_STEPS"; echo "pf=$HADAR_PROGRESS_FILE"; echo "ck=$HADAR_CHECKPOINT_DIR"; echo "pwd=$(pwd)"; echo "uid=$(id -u)"; touch "$HADAR_CHECKPOINT_DIR/w" && echo ck-writable; echo oops >&2; exit 3`,
			model:    "Tesla K80",
			mutate:   func(tc *TaskConfig) { tc.TotalSteps = 500 },
			wantCode: 3,
			wantOut:  []string{"nv=g0,g1 cuda=g0,g1 model=Tesla K80 total=500", "/local/hadar-progress.json", "/alloc/data/checkpoints/trainer", "pwd=/", "uid=65534", "ck-writable"},
		},
		{
			name:   "emulated pace from the GPU model",
			script: `echo "rate=$HADAR_STEPS_PER_SEC"`,
			model:  "Tesla V100-SXM2-16GB",
			mutate: func(tc *TaskConfig) {
				tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12.5}}
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
			r := newRig(t, nil)
			cfg := r.task(tc.script, tc.model, tc.mutate)
			r.start(cfg)
			res := r.wait(cfg.ID, 10*time.Second)
			if res.ExitCode != tc.wantCode || res.Signal != tc.wantSignal {
				t.Fatalf("exit = %+v, want code %d signal %d", res, tc.wantCode, tc.wantSignal)
			}
			out := readLog(t, cfg, "stdout", tc.wantOut...)
			for _, w := range tc.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout %q lacks %q", out, w)
				}
			}
			if tc.name == "env and exit code" {
				if !strings.Contains(readLog(t, cfg, "stderr", "oops"), "oops") {
					t.Error("stderr not in the task's stderr log")
				}
				if !strings.Contains(out, "pwd="+cfg.TaskDir().Dir+"\n") {
					t.Errorf("working dir is not the task dir %q: %q", cfg.TaskDir().Dir, out)
				}
			}
		})
	}
}

// TestStartTaskFailsWhenCommandCannotStart: a program that cannot be
// started is StartTask's error (it used to start a supervisor that
// reported exit 127 later), and no executor is left behind.
func TestStartTaskFailsWhenCommandCannotStart(t *testing.T) {
	needRoot(t)
	private := t.TempDir() // 0700 root: nobody cannot reach into it
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
			r := newRig(t, nil)
			r.noLogs = true
			cfg := r.task("", "", func(c *TaskConfig) { c.Command, c.Args = tc.command, nil })
			before := executors(t)
			_, _, err := r.h.StartTask(cfg)
			if err == nil {
				_ = r.h.DestroyTask(cfg.ID, true)
				t.Fatalf("StartTask succeeded; want an error containing %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q lacks %q", err, tc.wantErr)
			}
			time.Sleep(200 * time.Millisecond)
			if after := executors(t); after > before {
				t.Fatalf("%d executors after the failed start, %d before", after, before)
			}
		})
	}
}

// executors counts the live executor processes this test binary started.
func executors(t *testing.T) int {
	t.Helper()
	return len(executorPids())
}

func executorPids() []int {
	self, _ := os.Executable()
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && args[0] == self && args[1] == "executor" && !zombie(e.Name()) {
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

func TestStartTaskRejects(t *testing.T) {
	tests := []struct {
		name    string
		model   string
		plugin  map[string]interface{}
		env     map[string]string
		user    string
		mutate  func(*TaskConfig)
		wantErr string
	}{
		{"emulate without entry", "Tesla T4", nil, nil, "", func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla K80": 12}} }, `emulate.steps_per_sec: no entry for GPU model "Tesla T4"`},
		{"emulate without GPU", "", nil, nil, "", func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla K80": 12}} }, `got no GPU`},
		{"emulate bad rate", "Tesla K80", nil, nil, "", func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla K80": 0}} }, `want a positive rate`},
		{"hadare without merge dir", "", nil, nil, "", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2} }, `hadare: no merge directory`},
		{"hadare bad index", "", nil, nil, "", func(tc *TaskConfig) { i := 2; tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: &i, MergeDir: "/tmp/x"} }, `hadare.copy_index 2`},
		{"hadare declared copies under the sidecar", "", nil, map[string]string{"HADAR_UNIT": "5"}, "", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2, MergeDir: "/tmp/x"} }, `placed this task as unit 5`},
		{"hadare unit not a number", "", nil, map[string]string{"HADAR_UNIT": "u5"}, "", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{MergeDir: "/tmp/x"} }, `HADAR_UNIT "u5" is not a copy index`},
		{"forkable sidecar job without merge dir", "", nil, map[string]string{"HADAR_UNIT": "5", "NOMAD_META_HADAR.FORKABLE": "true"}, "", nil, `hadare: no merge directory`},
		{"emulate bad spread factor", "Tesla K80", nil, nil, "", func(tc *TaskConfig) {
			tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla K80": 12}, SpreadFactor: -1}
		}, `emulate.spread_factor`},
		{"hadare index disagrees with env", "", nil, map[string]string{"HADAR_COPY_INDEX": "0"}, "", func(tc *TaskConfig) {
			i := 1
			tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: &i, MergeDir: "/tmp/x"}
		}, `copy_index 1 disagrees with the task env's HADAR_COPY_INDEX=0`},
		{"env overrides a driver variable", "", nil, map[string]string{"HADAR_CHECKPOINT_DIR": "/elsewhere"}, "", nil, `env HADAR_CHECKPOINT_DIR = "/elsewhere"`},
		{"relative work dir", "", nil, nil, "", func(tc *TaskConfig) { tc.WorkDir = "rel" }, `work_dir "rel"`},
		{"empty command", "", nil, nil, "", func(tc *TaskConfig) { tc.Command = " " }, `command: empty`},
		{"command not on PATH", "", nil, nil, "", func(tc *TaskConfig) { tc.Command = "no-such-trainer-xyz" }, `command "no-such-trainer-xyz": not found`},
		{"disabled", "", map[string]interface{}{"enabled": false}, nil, "", nil, `disabled`},
		{"unknown user", "", nil, nil, "no-such-user-xyz", nil, `user "no-such-user-xyz"`},
		{"root without allow_root", "", nil, nil, "root", nil, `allow_root = true`},
		{"client's user (root) without allow_root", "", map[string]interface{}{"default_user": ""}, nil, "", nil, `allow_root = true`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.wantErr, "allow_root") {
				needRoot(t)
			}
			r := newRig(t, tc.plugin)
			r.noLogs = true
			cfg := r.task("exit 0", tc.model, tc.mutate)
			for k, v := range tc.env {
				cfg.Env[k] = v
			}
			cfg.User = tc.user
			_, _, err := r.h.StartTask(cfg)
			if err == nil {
				_ = r.h.DestroyTask(cfg.ID, true)
				t.Fatalf("started, want error %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q lacks %q", err, tc.wantErr)
			}
		})
	}
}

// TestUser: the task's user is honoured, nobody is the default, and root
// needs allow_root.
func TestUser(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name    string
		plugin  map[string]interface{}
		user    string
		wantUID string
	}{
		{"default user nobody", nil, "", "65534"},
		{"task user", nil, "nobody", "65534"},
		{"root allowed", map[string]interface{}{"allow_root": true}, "root", "0"},
		{"client's user allowed", map[string]interface{}{"allow_root": true, "default_user": ""}, "", "0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.plugin)
			cfg := r.task(`echo "uid=$(id -u) user=$USER groups=$(id -G)"`, "", nil)
			cfg.User = tc.user
			r.start(cfg)
			if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 0 {
				t.Fatalf("exit %+v", res)
			}
			out := readLog(t, cfg, "stdout", "uid="+tc.wantUID+" ")
			if !strings.Contains(out, "uid="+tc.wantUID+" ") {
				t.Fatalf("stdout %q: want uid %s", out, tc.wantUID)
			}
			// Its own groups only: Nomad's executor, switching users
			// itself, adds the root group (0).
			wantGroups := "user= groups=0\n"
			if tc.wantUID == "65534" {
				wantGroups = "user=nobody groups=65534\n"
			}
			if !strings.Contains(out, wantGroups) {
				t.Errorf("stdout %q: want %q", out, wantGroups)
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
	r := newRig(t, map[string]interface{}{"merge_root": t.TempDir()})
	var script strings.Builder
	for k := range sidecar {
		fmt.Fprintf(&script, `echo "%s=$%s"; `, k, k)
	}
	cfg := r.task(script.String(), "Tesla V100-SXM2-16GB", func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2} })
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
	rates := RateMap{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12, "Tesla P100-PCIE-16GB": 21}
	tests := []struct {
		name      string
		env       map[string]string // task env (device env merged in, as Nomad does)
		deviceEnv map[string]string
		nvml      func() nvml.Library
		want      string // "model rate", or "error: <substring>"
	}{
		{"task env wins over the reservation",
			map[string]string{"HADAR_GPU_MODEL": "Tesla K80"},
			map[string]string{"NVIDIA_VISIBLE_DEVICES": "p100-0", envReservedModel: "Tesla P100-PCIE-16GB"},
			nvml.NewLibraryUnavailable, "Tesla K80 12"},
		{"hadar-gpu reservation",
			nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "p100-0", envReservedModel: "Tesla P100-PCIE-16GB"},
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
			r := newRigNVML(t, nil, tc.nvml)
			r.noLogs = strings.HasPrefix(tc.want, "error: ")
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
				_, _, err := r.h.StartTask(cfg)
				if err == nil {
					_ = r.h.DestroyTask(cfg.ID, true)
					t.Fatalf("started; want an error containing %q", want)
				}
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q lacks %q", err, want)
				}
				return
			}
			r.start(cfg)
			if res := r.wait(cfg.ID, 10*time.Second); res.ExitCode != 0 {
				t.Fatalf("exit %+v", res)
			}
			i := strings.LastIndexByte(tc.want, ' ')
			model, rate := tc.want[:i], tc.want[i+1:]
			line := "model=" + model + " rate=" + rate + "\n"
			if out := readLog(t, cfg, "stdout", line); !strings.Contains(out, line) {
				t.Fatalf("stdout %q lacks %q", out, line)
			}
		})
	}
}

func TestPluginConfigErrors(t *testing.T) {
	tests := []struct {
		cfg     map[string]interface{}
		wantErr string
	}{
		{map[string]interface{}{"checkpoint_root": "rel/dir"}, `checkpoint_root "rel/dir": want an absolute path`},
		{map[string]interface{}{"merge_root": "x"}, `merge_root "x"`},
		{map[string]interface{}{"progress_poll_interval": "0s"}, `progress_poll_interval "0s"`},
		{map[string]interface{}{"default_user": "no-such-user-xyz"}, `default_user "no-such-user-xyz"`},
		{map[string]interface{}{"default_user": "root"}, `allow_root = true`},
	}
	for _, tc := range tests {
		t.Run(tc.wantErr, func(t *testing.T) {
			if _, ok := tc.cfg["default_user"]; ok {
				needRoot(t) // a client that is not root ignores default_user
			}
			d := NewWithNVML(log.NewNullLogger(), nvml.NewLibraryUnavailable)
			defer d.Shutdown()
			err := d.SetConfig(encodePluginConfig(t, configSpec, tc.cfg))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
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
func driverEvents(t *testing.T, r *rig) func(taskID string) []*drivers.TaskEvent {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := r.h.TaskEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var all []*drivers.TaskEvent
	go func() {
		for ev := range ch {
			mu.Lock()
			all = append(all, ev)
			mu.Unlock()
		}
	}()
	return func(taskID string) []*drivers.TaskEvent {
		mu.Lock()
		defer mu.Unlock()
		var out []*drivers.TaskEvent
		for _, ev := range all {
			if ev.TaskID == taskID {
				out = append(out, ev)
			}
		}
		return out
	}
}

func messages(evs []*drivers.TaskEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Message)
	}
	return out
}

// TestStopCheckpointsAndResume: a stop makes the process checkpoint and
// exit 0; the driver publishes that checkpoint (and no periodic progress)
// as events; the next run resumes and says so.
func TestStopCheckpointsAndResume(t *testing.T) {
	needRoot(t)
	ckRoot := t.TempDir()
	if err := os.Chmod(ckRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(ckRoot), 0o755); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, map[string]interface{}{"checkpoint_root": ckRoot})
	events := driverEvents(t, r)
	cfg := r.task(checkpointScript, "Tesla K80", nil)
	r.start(cfg)
	// Progress shows up in InspectTask once the process writes it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := r.h.InspectTask(cfg.ID)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(st.DriverAttributes["hadar.steps_done"]); n > 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress in InspectTask: %v", st.DriverAttributes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := r.h.StopTask(cfg.ID, 5*time.Second, "SIGTERM"); err != nil {
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
	var evs []*drivers.TaskEvent
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
	if err := r.h.StopTask(cfg2.ID, 5*time.Second, ""); err != nil {
		t.Fatal(err)
	}
	r.wait(cfg2.ID, 5*time.Second)
	if out := readLog(t, cfg2, "stdout", "resumed at "+saved); !strings.Contains(out, "resumed at "+saved) {
		t.Fatalf("second run did not resume from step %s: %q", saved, out)
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
	r := newRig(t, nil)
	// The child ignores SIGTERM too: the whole group must be killed.
	cfg := r.task(`trap '' TERM; sh -c 'trap "" TERM; sleep 60' & sleep 60`, "", nil)
	r.start(cfg)
	if err := r.h.WaitUntilStarted(cfg.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	st, _ := r.h.InspectTask(cfg.ID)
	pgid, err := strconv.Atoi(st.DriverAttributes["pid"])
	if err != nil {
		t.Fatal(err)
	}
	if n := len(groupAlive(pgid)); n < 3 {
		t.Fatalf("process group %d has %d processes, want the shell, its child and sleeps", pgid, n)
	}
	begin := time.Now()
	if err := r.h.StopTask(cfg.ID, 500*time.Millisecond, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	res := r.wait(cfg.ID, 5*time.Second)
	if res.Signal != int(syscall.SIGKILL) {
		t.Fatalf("exit %+v, want SIGKILL", res)
	}
	if took := time.Since(begin); took < 500*time.Millisecond || took > 5*time.Second {
		t.Fatalf("stop took %v, want about the 500ms kill timeout", took)
	}
	// Killed processes linger briefly until reaped.
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
// reattaches to the task's executor from the handle Nomad stored.
func TestRecoverTask(t *testing.T) {
	needRoot(t)
	r := newRig(t, nil)
	cfg := r.task(`trap 'echo bye; exit 7' TERM; while true; do sleep 0.05; done`, "", nil)
	th := r.start(cfg)
	if err := r.h.WaitUntilStarted(cfg.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the shell install its trap
	r2 := newRig(t, nil)
	if err := r2.h.RecoverTask(th); err != nil {
		t.Fatal(err)
	}
	st, err := r2.h.InspectTask(cfg.ID)
	if err != nil || st.State != drivers.TaskStateRunning {
		t.Fatalf("recovered task state %v, %v; want running", st, err)
	}
	if err := r2.h.StopTask(cfg.ID, 5*time.Second, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if res := r2.wait(cfg.ID, 5*time.Second); res.ExitCode != 7 {
		t.Fatalf("recovered task exit %+v, want code 7", res)
	}
	// A task that ended while the driver was away: its executor kept the
	// exit status.
	r3 := newRig(t, nil)
	if err := r3.h.RecoverTask(th); err != nil {
		t.Fatal(err)
	}
	if res := r3.wait(cfg.ID, 5*time.Second); res.ExitCode != 7 {
		t.Fatalf("late recovery exit %+v, want 7", res)
	}
	if err := r3.h.DestroyTask(cfg.ID, false); err != nil {
		t.Fatal(err)
	}
}

func TestHadarEEnv(t *testing.T) {
	needRoot(t)
	mergeRoot := t.TempDir()
	if err := os.Chmod(filepath.Dir(mergeRoot), 0o755); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, map[string]interface{}{"merge_root": mergeRoot})
	cfg := r.task(`echo "idx=$HADAR_COPY_INDEX n=$HADAR_COPIES dir=$HADAR_MERGE_DIR every=$HADAR_MERGE_EVERY"; mkdir "$HADAR_MERGE_DIR/round-1" && echo merge-writable`, "", func(tc *TaskConfig) {
		tc.HadarE = &HadarEConfig{Copies: 3, MergeEvery: 50}
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

// sharedRoot is a temporary directory tasks running as nobody can
// reach (t.TempDir's parent is private to root).
func sharedRoot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSidecarWorkerResumesAcrossUnits: the hadar sidecar moves a job by
// removing its unit's generated groups and adding a new unit, whose
// groups have other names (<template>-hadar-u<unit>-w<rank>). Keyed by
// the template group (HADAR_TEMPLATE), the new unit's workers get the
// checkpoint directory the old unit's rank 0 wrote, and resume from its
// step; every rank of the unit gets the same directory.
func TestSidecarWorkerResumesAcrossUnits(t *testing.T) {
	needRoot(t)
	ckRoot := sharedRoot(t)
	r := newRig(t, map[string]interface{}{"checkpoint_root": ckRoot})
	events := driverEvents(t, r)
	worker := func(unit, rank int, script string) *drivers.TaskConfig {
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
	err := eventually(10*time.Second, func() error {
		st, err := r.h.InspectTask(old.ID)
		if err != nil {
			return err
		}
		if n, _ := strconv.Atoi(st.DriverAttributes["hadar.steps_done"]); n <= 20 {
			return fmt.Errorf("steps_done %q", st.DriverAttributes["hadar.steps_done"])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.h.StopTask(old.ID, 5*time.Second, "SIGTERM"); err != nil {
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
	out := readLog(t, moved, "stdout", "resumed at "+saved)
	if !strings.Contains(out, "resumed at "+saved) {
		t.Fatalf("new unit's rank 0 stdout %q: want it to resume at step %s", out, saved)
	}
	err = eventually(5*time.Second, func() error {
		for _, ev := range events(moved.ID) {
			// The script's first progress is one step past the checkpoint.
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
	if err := r.h.StopTask(moved.ID, 5*time.Second, "SIGTERM"); err != nil {
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
	ckRoot, mergeRoot := sharedRoot(t), sharedRoot(t)
	rates := RateMap{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 10}
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
		{"hadare block without copies: the unit is the copy", sidecar, func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{MergeEvery: 40} },
			"ckpt={ck}/train/trainer/copy-7 idx=7 copies=unset merge={merge} pace= spread="},
		{"emulated without spread options", nil, func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: rates} },
			"ckpt={ck}/g/trainer idx= copies=unset merge= pace=10 spread="},
		{"spread factor", nil, func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: rates, SpreadFactor: 0.8} },
			"ckpt={ck}/g/trainer idx= copies=unset merge= pace=10 spread=8"},
		{"spread pace of the model wins", nil, func(tc *TaskConfig) {
			tc.Emulate = &EmulateConfig{StepsPerSec: rates, SpreadFactor: 0.8, SpreadStepsPerSec: RateMap{"Tesla K80": 6}}
		}, "ckpt={ck}/g/trainer idx= copies=unset merge= pace=10 spread=6"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, map[string]interface{}{"checkpoint_root": ckRoot, "merge_root": mergeRoot})
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
				t.Fatalf("exit %+v", res)
			}
			want := strings.NewReplacer("{ck}", filepath.Join(ckRoot, "default", cfg.JobID), "{merge}", filepath.Join(mergeRoot, "default", cfg.JobID)).Replace(tc.want) + "\n"
			if out := readLog(t, cfg, "stdout", want); !strings.Contains(out, want) {
				t.Fatalf("stdout %q, want %q", out, want)
			}
		})
	}
}

// TestTaskStatsAndSignal: CPU is reported in MHz, consistent with the
// percent and the machine's compute (it used to be cumulative jiffies),
// and signals reach the process group.
func TestTaskStatsAndSignal(t *testing.T) {
	needRoot(t)
	if cgroupslib.GetMode() == cgroupslib.OFF {
		t.Skip("cgroups are off here; the executor then measures only the process tree")
	}
	r := newRig(t, nil)
	cfg := r.task(`trap 'echo got-usr1' USR1; while :; do :; done`, "", nil)
	r.start(cfg)
	if err := r.h.WaitUntilStarted(cfg.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := r.h.TaskStats(ctx, cfg.ID, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	compute := topology().Compute()
	perCore := float64(compute.TotalCompute) / float64(compute.NumCores)
	var samples int
	timeout := time.After(15 * time.Second)
	for samples < 3 {
		select {
		case u := <-ch:
			if u == nil || u.ResourceUsage == nil || u.ResourceUsage.CpuStats == nil {
				continue
			}
			cpu := u.ResourceUsage.CpuStats
			if cpu.Percent < 20 {
				continue // the first sample has no rate yet
			}
			want := cpu.Percent / 100 * perCore
			t.Logf("cpu %.1f%% = %.0f MHz (expected %.0f; %d MHz over %d cores), rss %d", cpu.Percent, cpu.TotalTicks, want, compute.TotalCompute, compute.NumCores, u.ResourceUsage.MemoryStats.RSS)
			if cpu.TotalTicks < 0.8*want || cpu.TotalTicks > 1.2*want || cpu.TotalTicks > float64(compute.TotalCompute) {
				t.Fatalf("TotalTicks %.0f is not MHz: want about %.0f for %.1f%%", cpu.TotalTicks, want, cpu.Percent)
			}
			if u.ResourceUsage.MemoryStats.RSS == 0 {
				t.Fatal("no RSS")
			}
			samples++
		case <-timeout:
			t.Fatalf("%d busy samples within 15s", samples)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if err := r.h.SignalTask(cfg.ID, "SIGUSR1"); err != nil {
		t.Fatal(err)
	}
	if err := r.h.SignalTask(cfg.ID, "SIGNOPE"); err == nil {
		t.Fatal("unknown signal accepted")
	}
	if out := readLog(t, cfg, "stdout", "got-usr1"); !strings.Contains(out, "got-usr1") {
		t.Fatal("signal did not reach the process")
	}
	if err := r.h.DestroyTask(cfg.ID, false); err == nil {
		t.Fatal("destroyed a running task without force")
	}
	if err := r.h.DestroyTask(cfg.ID, true); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryLimitOOM: a task that outgrows its memory is killed by the
// kernel inside its cgroup and reported OOM-killed.
func TestMemoryLimitOOM(t *testing.T) {
	needRoot(t)
	if cgroupslib.GetMode() == cgroupslib.OFF {
		t.Skip("cgroups are off here (not root, or no usable cgroup hierarchy): no memory limit to hit")
	}
	r := newRig(t, nil)
	cfg := r.task(`head -c 1G /dev/zero | tail > /dev/null`, "", nil)
	r.cgroup(cfg, 32)
	r.start(cfg)
	res := r.wait(cfg.ID, 60*time.Second)
	if !res.OOMKilled || res.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("exit %+v, want OOM-killed (exit 137); stderr %q", res, readLog(t, cfg, "stderr"))
	}
}

func TestProgressEvents(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "ckpt-100")
	if err := os.WriteFile(old, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(time.Second) // old was written before the run
	p := func(steps int64, ckpt string, merges int) *Progress {
		return &Progress{StepsDone: steps, TotalSteps: 1000, Checkpoint: ckpt, Merges: merges}
	}
	type step struct {
		p              *Progress
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
		{"reattached after a client restart", true, []step{
			{p(300, old, 3), false, false, nil},
			{p(320, old, 4), true, false, nil},
			{p(330, "/c/ckpt-330", 4), true, false, []string{"checkpoint saved at step 330"}},
		}},
		{"no progress file", false, []step{
			{nil, false, false, nil},
			{nil, true, true, nil},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := progressEvents{started: start, primed: tc.primed}
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

func TestOOMKillCount(t *testing.T) {
	for in, want := range map[string]int{
		"oom_kill_disable 0\nunder_oom 0\noom_kill 2\n":                2,
		"low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n": 1,
		"oom_kill_disable 0\nunder_oom 0\n":                            0,
	} {
		if got := oomKillCount([]byte(in)); got != want {
			t.Errorf("oomKillCount(%q) = %d, want %d", in, got, want)
		}
	}
}

// TestProgressInAllocDir: a progress_file outside the task directory is
// copied to <task>/local/hadar-progress.json, the path the sidecar reads
// through the alloc filesystem; a stale one from the last run is gone
// before the process starts.
func TestProgressInAllocDir(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	custom := filepath.Join(dir, "progress.json")
	r := newRig(t, nil)
	cfg := r.task(`printf '{"steps_done":7,"total_steps":10}' > "$HADAR_PROGRESS_FILE"; sleep 60`, "", func(tc *TaskConfig) { tc.ProgressFile = custom })
	alloced := filepath.Join(cfg.TaskDir().LocalDir, progressFileName)
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
}
