package train

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/helper/uuid"
	"github.com/hashicorp/nomad/nomad/structs"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/testutils"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/zclconf/go-cty/cty/msgpack"
)

// TestMain lets the test binary stand in for hadar-train: the driver runs
// its own executable as the supervisor.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == SupervisorArg {
		os.Exit(Supervise(os.Args[2:]))
	}
	os.Exit(m.Run())
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
	return &base.Config{PluginConfig: b}
}

type rig struct {
	noLogs bool // for tasks that never start: logmon would wait for a writer
	t      *testing.T
	d      *Driver
	h      *testutils.DriverHarness
}

func newRig(t *testing.T, pluginCfg map[string]interface{}) *rig {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := NewWithSupervisor(log.NewNullLogger(), self)
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

// task builds a task running sh -c script, with GPUs of model given.
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
		cfg.Resources = &drivers.Resources{NomadResources: &structs.AllocatedTaskResources{
			Devices: []*structs.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: model, DeviceIDs: []string{"g0", "g1"}}},
		}}
		// As hadar-gpu's Reserve sets it; Nomad does not pass allocated
		// devices to drivers over gRPC.
		cfg.DeviceEnv = map[string]string{"NVIDIA_VISIBLE_DEVICES": "g0,g1", "CUDA_VISIBLE_DEVICES": "g0,g1", "HADAR_GPU_RESERVED_MODEL": model}
	}
	tc := &TaskConfig{Command: "/bin/sh", Args: []string{"-c", script}}
	if mutate != nil {
		mutate(tc)
	}
	if err := cfg.EncodeConcreteDriverConfig(tc); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(r.h.MkAllocDir(cfg, !r.noLogs))
	return cfg
}

func (r *rig) start(cfg *drivers.TaskConfig) *drivers.TaskHandle {
	r.t.Helper()
	th, _, err := r.h.StartTask(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = r.h.DestroyTask(cfg.ID, true) })
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

func TestRunExitCodesAndEnv(t *testing.T) {
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
			script:   `echo "nv=$NVIDIA_VISIBLE_DEVICES cuda=$CUDA_VISIBLE_DEVICES model=$HADAR_GPU_MODEL total=$HADAR_TOTAL_STEPS"; echo "pf=$HADAR_PROGRESS_FILE"; echo "ck=$HADAR_CHECKPOINT_DIR"; echo "pwd=$(pwd)"; echo oops >&2; exit 3`,
			model:    "Tesla K80",
			mutate:   func(tc *TaskConfig) { tc.TotalSteps = 500 },
			wantCode: 3,
			wantOut:  []string{"nv=g0,g1 cuda=g0,g1 model=Tesla K80 total=500", "/local/hadar-progress.json", "/alloc/data/checkpoints/trainer", "pwd=/"},
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
		{
			name:     "missing program",
			script:   "",
			mutate:   func(tc *TaskConfig) { tc.Command = "/nonexistent/train"; tc.Args = nil },
			wantCode: 127,
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

func TestStartTaskRejects(t *testing.T) {
	tests := []struct {
		name    string
		model   string
		plugin  map[string]interface{}
		mutate  func(*TaskConfig)
		wantErr string
	}{
		{"emulate without entry", "Tesla T4", nil, func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla K80": 12}} }, `emulate.steps_per_sec: no entry for GPU model "Tesla T4"`},
		{"emulate without GPU", "", nil, func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla K80": 12}} }, `got no GPU`},
		{"emulate bad rate", "Tesla K80", nil, func(tc *TaskConfig) { tc.Emulate = &EmulateConfig{StepsPerSec: RateMap{"Tesla K80": 0}} }, `want a positive rate`},
		{"hadare without merge dir", "", nil, func(tc *TaskConfig) { tc.HadarE = &HadarEConfig{Copies: 2} }, `hadare: no merge directory`},
		{"hadare bad index", "", nil, func(tc *TaskConfig) { i := 2; tc.HadarE = &HadarEConfig{Copies: 2, CopyIndex: &i, MergeDir: "/tmp/x"} }, `hadare.copy_index 2`},
		{"relative work dir", "", nil, func(tc *TaskConfig) { tc.WorkDir = "rel" }, `work_dir "rel"`},
		{"empty command", "", nil, func(tc *TaskConfig) { tc.Command = " " }, `command: empty`},
		{"command not on PATH", "", nil, func(tc *TaskConfig) { tc.Command = "no-such-trainer-xyz" }, `command "no-such-trainer-xyz": not found`},
		{"disabled", "", map[string]interface{}{"enabled": false}, nil, `disabled`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.plugin)
			r.noLogs = true
			cfg := r.task("exit 0", tc.model, tc.mutate)
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

func TestPluginConfigErrors(t *testing.T) {
	tests := []struct {
		cfg     map[string]interface{}
		wantErr string
	}{
		{map[string]interface{}{"checkpoint_root": "rel/dir"}, `checkpoint_root "rel/dir": want an absolute path`},
		{map[string]interface{}{"merge_root": "x"}, `merge_root "x"`},
		{map[string]interface{}{"progress_poll_interval": "0s"}, `progress_poll_interval "0s"`},
		{map[string]interface{}{"progress_event_interval": "often"}, `progress_event_interval "often"`},
	}
	for _, tc := range tests {
		t.Run(tc.wantErr, func(t *testing.T) {
			d := NewWithSupervisor(log.NewNullLogger(), "/bin/false")
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
step=0
if [ -f "$HADAR_CHECKPOINT_DIR/ckpt" ]; then step=$(cat "$HADAR_CHECKPOINT_DIR/ckpt"); echo "resumed at $step"; fi
progress() { printf '{"steps_done":%d,"total_steps":1000,"steps_per_sec":20,"loss":0.5,"checkpoint":"%s","updated":"2026-11-22T00:00:00Z"}' "$step" "$1" > "$HADAR_PROGRESS_FILE.tmp" && mv "$HADAR_PROGRESS_FILE.tmp" "$HADAR_PROGRESS_FILE"; }
trap 'echo $step > "$HADAR_CHECKPOINT_DIR/ckpt"; progress "$HADAR_CHECKPOINT_DIR/ckpt"; echo "checkpointed at $step"; exit 0' TERM
while true; do step=$((step+1)); progress ""; sleep 0.05; done
`

func TestStopCheckpointsAndResume(t *testing.T) {
	ckRoot := t.TempDir()
	r := newRig(t, map[string]interface{}{"checkpoint_root": ckRoot, "progress_event_interval": "200ms"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := r.h.TaskEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.task(checkpointScript, "Tesla K80", nil)
	r.start(cfg)
	// Progress shows up in InspectTask once the process writes it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := r.h.InspectTask(cfg.ID)
		if err != nil {
			t.Fatal(err)
		}
		if v := st.DriverAttributes["hadar.steps_done"]; v != "" && v != "0" && v != "1" {
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
	// The driver publishes the checkpoint as a task event.
	var sawProgress, sawCkpt bool
	timeout := time.After(5 * time.Second)
	for !sawCkpt {
		select {
		case ev := <-events:
			if ev.TaskID != cfg.ID {
				continue
			}
			if strings.HasPrefix(ev.Message, "progress") {
				sawProgress = true
			}
			if strings.HasPrefix(ev.Message, "checkpoint saved") && ev.Annotations["hadar.steps_done"] == saved {
				sawCkpt = ev.Annotations["hadar.checkpoint"] == ckptFile
			}
		case <-timeout:
			t.Fatalf("no checkpoint event for step %s", saved)
		}
	}
	if !sawProgress {
		t.Error("no periodic progress event before the checkpoint")
	}

	// Run again as a new allocation of the same job: it resumes.
	cfg2 := r.task(checkpointScript, "Tesla K80", nil)
	cfg2.JobID = cfg.JobID
	r.start(cfg2)
	time.Sleep(300 * time.Millisecond)
	if err := r.h.StopTask(cfg2.ID, 5*time.Second, ""); err != nil {
		t.Fatal(err)
	}
	r.wait(cfg2.ID, 5*time.Second)
	if out := readLog(t, cfg2, "stdout", "resumed at "+saved); !strings.Contains(out, "resumed at "+saved) {
		t.Fatalf("second run did not resume from step %s: %q", saved, out)
	}
}

func TestStopKillsAfterTimeout(t *testing.T) {
	r := newRig(t, nil)
	// The child ignores SIGTERM too: the whole group must be killed.
	cfg := r.task(`trap '' TERM; sh -c 'trap "" TERM; sleep 60' & sleep 60`, "", nil)
	r.start(cfg)
	if err := r.h.WaitUntilStarted(cfg.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
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
	st, _ := r.h.InspectTask(cfg.ID)
	pgid, err := strconv.Atoi(st.DriverAttributes["pid"])
	if err != nil {
		t.Fatal(err)
	}
	// Killed processes linger briefly until reaped.
	for i := 0; ; i++ {
		_, _, pids, _ := groupUsage("/proc", pgid)
		if len(pids) == 0 {
			break
		}
		if i == 20 {
			t.Fatalf("processes %v of the group survived", pids)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRecoverTask(t *testing.T) {
	r := newRig(t, nil)
	cfg := r.task(`trap 'echo bye; exit 7' TERM; while true; do sleep 0.05; done`, "", nil)
	th := r.start(cfg)
	if err := r.h.WaitUntilStarted(cfg.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the shell install its trap
	// A second driver stands for the plugin after a client restart: it
	// gets only the handle Nomad stored.
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
	res := r2.wait(cfg.ID, 5*time.Second)
	if res.ExitCode != 7 {
		t.Fatalf("recovered task exit %+v, want code 7 from the exit status file", res)
	}

	// Recovering a task that ended while the driver was away reports its
	// exit status at once.
	r3 := newRig(t, nil)
	if err := r3.h.RecoverTask(th); err != nil {
		t.Fatal(err)
	}
	if res := r3.wait(cfg.ID, 5*time.Second); res.ExitCode != 7 {
		t.Fatalf("late recovery exit %+v, want 7", res)
	}
}

func TestHadarEEnv(t *testing.T) {
	mergeRoot := t.TempDir()
	r := newRig(t, map[string]interface{}{"merge_root": mergeRoot})
	cfg := r.task(`echo "idx=$HADAR_COPY_INDEX n=$HADAR_COPIES dir=$HADAR_MERGE_DIR every=$HADAR_MERGE_EVERY ck=$HADAR_CHECKPOINT_DIR"`, "", func(tc *TaskConfig) {
		tc.HadarE = &HadarEConfig{Copies: 3, MergeEvery: 50}
	})
	cfg.Env["NOMAD_ALLOC_INDEX"] = "2"
	r.start(cfg)
	if res := r.wait(cfg.ID, 5*time.Second); res.ExitCode != 0 {
		t.Fatalf("exit %+v", res)
	}
	want := "idx=2 n=3 dir=" + filepath.Join(mergeRoot, "default", cfg.JobID) + " every=50"
	if out := readLog(t, cfg, "stdout", want); !strings.Contains(out, want) {
		t.Fatalf("stdout %q lacks %q", out, want)
	}
}

func TestTaskStatsAndSignal(t *testing.T) {
	r := newRig(t, nil)
	cfg := r.task(`trap 'echo got-usr1' USR1; while true; do sleep 0.05; done`, "", nil)
	r.start(cfg)
	if err := r.h.WaitUntilStarted(cfg.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the shell install its trap
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := r.h.TaskStats(ctx, cfg.ID, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case u := <-ch:
		if u == nil || u.ResourceUsage.MemoryStats.RSS == 0 || len(u.Pids) < 2 {
			t.Fatalf("stats %+v: want RSS and the supervisor plus the shell", u)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no stats")
	}
	if err := r.h.SignalTask(cfg.ID, "SIGUSR1"); err != nil {
		t.Fatal(err)
	}
	if err := r.h.SignalTask(cfg.ID, "SIGNOPE"); err == nil {
		t.Fatal("unknown signal accepted")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(readLog(t, cfg, "stdout", "got-usr1"), "got-usr1") {
		if time.Now().After(deadline) {
			t.Fatal("signal did not reach the process")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := r.h.DestroyTask(cfg.ID, false); err == nil {
		t.Fatal("destroyed a running task without force")
	}
	if err := r.h.DestroyTask(cfg.ID, true); err != nil {
		t.Fatal(err)
	}
}

func TestParseProcStat(t *testing.T) {
	tests := []struct {
		in      string
		pgid    int
		start   uint64
		state   byte
		wantErr bool
	}{
		{"1234 (sh) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 987654 2600000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0", 1234, 987654, 'S', false},
		{"99 (a) b (c)) Z 1 50 50 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 42 0 0 0", 50, 42, 'Z', false},
		{"garbage", 0, 0, 0, true},
		{"1 (x) S 1 2", 0, 0, 0, true},
	}
	for _, tc := range tests {
		st, err := parseProcStat(tc.in)
		if (err != nil) != tc.wantErr {
			t.Fatalf("%q: err %v", tc.in, err)
		}
		if err == nil && (st.pgid != tc.pgid || st.startTicks != tc.start || st.state != tc.state) {
			t.Fatalf("%q: got %+v", tc.in, st)
		}
	}
}
