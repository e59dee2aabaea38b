// Package train is hadar's Nomad task driver ("hadar-train"). It runs a
// training process on the GPUs Nomad reserved, in its own process group,
// under a small supervisor (the same binary) that records the exit status
// so a restarted client can reattach; it reads the process's progress file
// and publishes it as task events; on stop it asks the process to
// checkpoint (SIGTERM) and kills it after the task's kill_timeout. See
// docs/driver.md and docs/training-contract.md.
package train

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul-template/signals"
	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/lib/fifo"
	cstructs "github.com/hashicorp/nomad/client/structs"
	"github.com/hashicorp/nomad/drivers/shared/eventer"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/fsisolation"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"
)

const (
	// PluginName is the driver name jobspecs use and the plugin file name.
	PluginName = "hadar-train"
	// PluginVersion is reported to Nomad and as a node attribute.
	PluginVersion = "v0.1.0"

	fingerprintPeriod = 30 * time.Second
	exitFileName      = ".hadar-train-exit.json"
	taskStateVersion  = 1
)

// The environment of docs/training-contract.md.
const (
	EnvProgressFile  = "HADAR_PROGRESS_FILE"
	EnvCheckpointDir = "HADAR_CHECKPOINT_DIR"
	EnvTotalSteps    = "HADAR_TOTAL_STEPS"
	EnvStepsPerSec   = "HADAR_STEPS_PER_SEC"
	EnvJobID         = "HADAR_JOB_ID"
	EnvCopyIndex     = "HADAR_COPY_INDEX"
	EnvCopies        = "HADAR_COPIES"
	EnvMergeDir      = "HADAR_MERGE_DIR"
	EnvMergeEvery    = "HADAR_MERGE_EVERY"
	EnvGPUModel      = "HADAR_GPU_MODEL"
)

var (
	pluginInfo = &base.PluginInfoResponse{
		Type:              base.PluginTypeDriver,
		PluginApiVersions: []string{drivers.ApiVersion010},
		PluginVersion:     PluginVersion,
		Name:              PluginName,
	}
	capabilities = &drivers.Capabilities{
		SendSignals:       true,
		Exec:              false,
		FSIsolation:       fsisolation.None,
		NetIsolationModes: []drivers.NetIsolationMode{drivers.NetIsolationModeHost},
		MountConfigs:      drivers.MountConfigSupportNone,
	}
)

// Driver is the task driver. Create it with New.
type Driver struct {
	ctx      context.Context
	cancel   context.CancelFunc
	logger   log.Logger
	eventer  *eventer.Eventer
	tasks    *taskStore
	self     string // the hadar-train binary, run as each task's supervisor
	procRoot string

	mu       sync.RWMutex
	settings *settings
}

var _ drivers.DriverPlugin = (*Driver)(nil)

// New returns the driver; its supervisor is the running executable.
func New(logger log.Logger) *Driver {
	self, err := os.Executable()
	if err != nil {
		logger.Error("cannot find own executable; tasks will fail to start", "error", err)
	}
	return NewWithSupervisor(logger, self)
}

// NewWithSupervisor returns the driver using self as the supervisor
// binary (it must call Supervise when its first argument is
// SupervisorArg).
func NewWithSupervisor(logger log.Logger, self string) *Driver {
	ctx, cancel := context.WithCancel(context.Background())
	logger = logger.Named(PluginName)
	return &Driver{
		ctx: ctx, cancel: cancel, logger: logger,
		eventer:  eventer.NewEventer(ctx, logger),
		tasks:    newTaskStore(),
		self:     self,
		procRoot: "/proc",
	}
}

// Shutdown stops the driver's background work; running tasks keep
// running. Nomad kills the plugin process instead; tests call this.
func (d *Driver) Shutdown() { d.cancel() }

// PluginInfo identifies the plugin to Nomad.
func (d *Driver) PluginInfo() (*base.PluginInfoResponse, error) { return pluginInfo, nil }

// ConfigSchema returns the plugin block's schema.
func (d *Driver) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

// SetConfig validates the plugin block.
func (d *Driver) SetConfig(c *base.Config) error {
	cfg := Config{Enabled: true}
	if len(c.PluginConfig) != 0 {
		if err := base.MsgPackDecode(c.PluginConfig, &cfg); err != nil {
			return fmt.Errorf("%s plugin config: %w", PluginName, err)
		}
	}
	s, err := parseConfig(cfg)
	if err != nil {
		return fmt.Errorf("%s plugin config: %w", PluginName, err)
	}
	d.mu.Lock()
	d.settings = s
	d.mu.Unlock()
	return nil
}

func (d *Driver) config() *settings {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.settings == nil {
		s, _ := parseConfig(Config{Enabled: true})
		return s
	}
	return d.settings
}

// TaskConfigSchema returns the schema of a task's config block.
func (d *Driver) TaskConfigSchema() (*hclspec.Spec, error) { return taskConfigSpec, nil }

// Capabilities tells Nomad what the driver supports.
func (d *Driver) Capabilities() (*drivers.Capabilities, error) { return capabilities, nil }

// Fingerprint reports the driver healthy at once and every 30 s.
func (d *Driver) Fingerprint(ctx context.Context) (<-chan *drivers.Fingerprint, error) {
	ch := make(chan *drivers.Fingerprint)
	go func() {
		defer close(ch)
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.ctx.Done():
				return
			case <-t.C:
				t.Reset(fingerprintPeriod)
			}
			fp := &drivers.Fingerprint{Health: drivers.HealthStateUndetected, HealthDescription: "disabled in the plugin block"}
			if d.config().enabled {
				fp = &drivers.Fingerprint{
					Health:            drivers.HealthStateHealthy,
					HealthDescription: drivers.DriverHealthy,
					Attributes: map[string]*pstructs.Attribute{
						"driver." + PluginName:              pstructs.NewBoolAttribute(true),
						"driver." + PluginName + ".version": pstructs.NewStringAttribute(PluginVersion),
					},
				}
			}
			select {
			case ch <- fp:
			case <-ctx.Done():
				return
			case <-d.ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// launch is what StartTask works out before starting anything.
type launch struct {
	command  string
	args     []string
	dir      string
	env      []string
	progress string
	exitFile string
	envMap   map[string]string
}

func (d *Driver) plan(cfg *drivers.TaskConfig, tc *TaskConfig) (*launch, error) {
	s := d.config()
	taskDir := cfg.TaskDir()
	env := map[string]string{}
	for k, v := range cfg.Env {
		env[k] = v
	}
	for k, v := range cfg.DeviceEnv {
		env[k] = v
	}
	if _, ok := env["PATH"]; !ok {
		// Without a PATH the supervisor could not find "python3".
		env["PATH"] = os.Getenv("PATH")
	}

	progress := tc.ProgressFile
	if progress == "" {
		progress = filepath.Join(taskDir.LocalDir, "hadar-progress.json")
	}
	env[EnvProgressFile] = progress
	env[EnvJobID] = cfg.JobID

	copySuffix := ""
	if h := tc.HadarE; h != nil {
		idx := 0
		if h.CopyIndex != nil {
			idx = *h.CopyIndex
		} else if v, ok := env["NOMAD_ALLOC_INDEX"]; ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n >= h.Copies {
				return nil, fmt.Errorf("hadare: NOMAD_ALLOC_INDEX %q is not a copy index in 0..%d; set hadare.copy_index", v, h.Copies-1)
			}
			idx = n
		}
		mergeDir := h.MergeDir
		if mergeDir == "" {
			if s.mergeRoot == "" {
				return nil, fmt.Errorf("hadare: no merge directory; set hadare.merge_dir in the task or merge_root in the %s plugin block (a directory all copies can reach)", PluginName)
			}
			mergeDir = filepath.Join(s.mergeRoot, safe(cfg.Namespace), safe(cfg.JobID))
		}
		if err := os.MkdirAll(mergeDir, 0o755); err != nil {
			return nil, fmt.Errorf("hadare: merge directory: %w", err)
		}
		env[EnvCopyIndex] = strconv.Itoa(idx)
		env[EnvCopies] = strconv.Itoa(h.Copies)
		env[EnvMergeDir] = mergeDir
		if h.MergeEvery > 0 {
			env[EnvMergeEvery] = strconv.Itoa(h.MergeEvery)
		}
		copySuffix = "copy-" + strconv.Itoa(idx)
	}

	ckpt := tc.CheckpointDir
	switch {
	case ckpt != "":
	case s.checkpointRoot != "":
		// Keyed by job, group and task, not allocation, so a job that is
		// stopped and run again (or rescheduled onto a node sharing the
		// root) finds its checkpoints.
		ckpt = filepath.Join(s.checkpointRoot, safe(cfg.Namespace), safe(cfg.JobID), safe(cfg.TaskGroupName), safe(cfg.Name), copySuffix)
	default:
		ckpt = filepath.Join(taskDir.SharedAllocDir, "data", "checkpoints", safe(cfg.Name))
	}
	if err := os.MkdirAll(ckpt, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	env[EnvCheckpointDir] = ckpt
	if tc.TotalSteps > 0 {
		env[EnvTotalSteps] = strconv.FormatInt(tc.TotalSteps, 10)
	}

	models := gpuModels(cfg)
	if len(models) > 0 {
		env[EnvGPUModel] = strings.Join(models, ",")
	}
	if tc.Emulate != nil {
		rate, err := tc.Emulate.stepsPerSec(models)
		if err != nil {
			return nil, err
		}
		env[EnvStepsPerSec] = strconv.FormatFloat(rate, 'g', -1, 64)
	}

	command, err := resolveCommand(tc.Command, taskDir.Dir, env["PATH"])
	if err != nil {
		return nil, err
	}
	dir := tc.WorkDir
	if dir == "" {
		dir = taskDir.Dir
	}
	list := make([]string, 0, len(env))
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	return &launch{command: command, args: tc.Args, dir: dir, env: list, envMap: env, progress: progress, exitFile: filepath.Join(taskDir.Dir, exitFileName)}, nil
}

// gpuModels lists the NVIDIA GPU models Nomad allocated to the task, or
// what the device plugin put in the environment.
func gpuModels(cfg *drivers.TaskConfig) []string {
	seen := map[string]bool{}
	var out []string
	if cfg.Resources != nil && cfg.Resources.NomadResources != nil {
		for _, d := range cfg.Resources.NomadResources.Devices {
			if d.Vendor == "nvidia" && d.Type == "gpu" && !seen[d.Name] {
				seen[d.Name] = true
				out = append(out, d.Name)
			}
		}
	}
	if len(out) == 0 {
		for _, v := range []string{cfg.DeviceEnv["HADAR_GPU_RESERVED_MODEL"], cfg.Env[EnvGPUModel]} {
			for _, m := range strings.Split(v, ",") {
				if m != "" && !seen[m] {
					seen[m] = true
					out = append(out, m)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// resolveCommand finds the program: absolute as is, a relative path
// against the task directory (like raw_exec), a bare name on PATH.
func resolveCommand(command, taskDir, path string) (string, error) {
	switch {
	case filepath.IsAbs(command):
		return command, nil
	case strings.Contains(command, "/"):
		return filepath.Join(taskDir, command), nil
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, command)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q: not found on PATH %q; give an absolute path or a path relative to the task directory", command, path)
}

// safe makes a Nomad name usable as one path element.
func safe(s string) string {
	if s == "" {
		return "_"
	}
	return strings.NewReplacer("/", "_", "..", "_").Replace(s)
}

// StartTask starts the training process under its supervisor.
func (d *Driver) StartTask(cfg *drivers.TaskConfig) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	if _, ok := d.tasks.Get(cfg.ID); ok {
		return nil, nil, fmt.Errorf("task %s already started", cfg.ID)
	}
	if !d.config().enabled {
		return nil, nil, fmt.Errorf("%s is disabled in its plugin block", PluginName)
	}
	var tc TaskConfig
	if err := cfg.DecodeDriverConfig(&tc); err != nil {
		return nil, nil, fmt.Errorf("task %s config: %w", cfg.Name, err)
	}
	if err := tc.validate(); err != nil {
		return nil, nil, fmt.Errorf("task %s config: %w", cfg.Name, err)
	}
	l, err := d.plan(cfg, &tc)
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	// A restarted task reuses its task directory: drop the last run's
	// exit status so it is not mistaken for this run's.
	if err := os.Remove(l.exitFile); err != nil && !os.IsNotExist(err) {
		return nil, nil, fmt.Errorf("task %s: stale exit status: %w", cfg.Name, err)
	}

	stdout, err := fifo.OpenWriter(cfg.StdoutPath)
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: open stdout log %s: %w", cfg.Name, cfg.StdoutPath, err)
	}
	defer stdout.Close()
	stderr, err := fifo.OpenWriter(cfg.StderrPath)
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: open stderr log %s: %w", cfg.Name, cfg.StderrPath, err)
	}
	defer stderr.Close()

	cmd := exec.Command(d.self, append([]string{SupervisorArg, l.exitFile, l.command}, l.args...)...)
	cmd.Dir, cmd.Env = l.dir, l.env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// Own process group: signals reach the training process and its
	// children, and a client or plugin restart does not take it down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: readiness pipe: %w", cfg.Name, err)
	}
	defer readyR.Close()
	cmd.ExtraFiles = []*os.File{readyW}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: start supervisor %s: %w", cfg.Name, d.self, err)
	}
	// Wait until the supervisor guards itself against the group's signals
	// and has started the training process, so an early stop cannot take
	// the supervisor (and the exit status) down.
	_ = readyR.SetReadDeadline(time.Now().Add(30 * time.Second))
	msg, _ := bufio.NewReader(readyR).ReadString('\n')
	if !strings.HasPrefix(msg, "started") {
		h := d.logger.With("task", cfg.Name)
		h.Warn("supervisor did not report the training process started", "report", strings.TrimSpace(msg))
	}
	st, err := readProcStat(d.procRoot, cmd.Process.Pid)
	if err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, nil, fmt.Errorf("task %s: read process start time: %w", cfg.Name, err)
	}
	s := d.config()
	h := &taskHandle{
		logger: d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name),
		cfg:    cfg,
		state: TaskState{
			TaskConfig: cfg, Pid: cmd.Process.Pid, StartTicks: st.startTicks,
			StartedAt: time.Now().Round(time.Millisecond), ExitFile: l.exitFile, ProgressFile: l.progress,
		},
		procRoot: d.procRoot, cmd: cmd,
		pollEvery: s.pollEvery, eventEvery: s.eventEvery,
		emit:      d.emit,
		procState: drivers.TaskStateRunning,
		doneCh:    make(chan struct{}),
	}
	th := drivers.NewTaskHandle(taskStateVersion)
	th.Config, th.State = cfg, drivers.TaskStateRunning
	if err := th.SetDriverState(&h.state); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, nil, fmt.Errorf("task %s: encode driver state: %w", cfg.Name, err)
	}
	d.tasks.Set(cfg.ID, h)
	go h.run(d.ctx)
	go h.watchProgress(d.ctx)
	h.logger.Info("training process started", "pid", cmd.Process.Pid, "command", l.command)
	// Say which GPUs and pace the process got, from the environment it
	// was given, so operators and the sidecar can see it in task events.
	started := map[string]string{
		"hadar.gpus":           l.envMap["NVIDIA_VISIBLE_DEVICES"],
		"hadar.gpu_model":      l.envMap[EnvGPUModel],
		"hadar.steps_per_sec":  l.envMap[EnvStepsPerSec],
		"hadar.checkpoint_dir": l.envMap[EnvCheckpointDir],
		"hadar.progress_file":  l.progress,
	}
	startMsg := "training process started"
	if g := started["hadar.gpus"]; g != "" {
		startMsg += fmt.Sprintf(" on GPUs %s (%s)", g, started["hadar.gpu_model"])
	}
	if r := started["hadar.steps_per_sec"]; r != "" {
		startMsg += ", emulated pace " + r + " steps/s"
	}
	d.emit(&drivers.TaskEvent{TaskID: cfg.ID, TaskName: cfg.Name, AllocID: cfg.AllocID, Timestamp: time.Now(), Message: startMsg, Annotations: started})
	return th, nil, nil
}

func (d *Driver) emit(ev *drivers.TaskEvent) {
	if err := d.eventer.EmitEvent(ev); err != nil {
		d.logger.Debug("task event not delivered", "error", err)
	}
}

// RecoverTask reattaches to a training process after the client (and so
// this plugin) restarted. The process kept running under its supervisor;
// the driver watches it through /proc and reads its exit status file.
func (d *Driver) RecoverTask(handle *drivers.TaskHandle) error {
	if handle == nil {
		return fmt.Errorf("recover: nil task handle")
	}
	if _, ok := d.tasks.Get(handle.Config.ID); ok {
		return nil
	}
	var ts TaskState
	if err := handle.GetDriverState(&ts); err != nil {
		return fmt.Errorf("recover task %s: decode driver state: %w", handle.Config.Name, err)
	}
	if ts.Pid <= 0 || ts.ExitFile == "" {
		return fmt.Errorf("recover task %s: driver state has no process (pid %d)", handle.Config.Name, ts.Pid)
	}
	cfg := handle.Config
	if ts.TaskConfig != nil {
		cfg = ts.TaskConfig
	}
	s := d.config()
	h := &taskHandle{
		logger:    d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name),
		cfg:       cfg,
		state:     ts,
		procRoot:  d.procRoot,
		pollEvery: s.pollEvery, eventEvery: s.eventEvery,
		emit:      d.emit,
		procState: drivers.TaskStateRunning,
		doneCh:    make(chan struct{}),
	}
	d.tasks.Set(cfg.ID, h)
	go h.run(d.ctx)
	go h.watchProgress(d.ctx)
	h.logger.Info("reattached to training process", "pid", ts.Pid, "alive", alive(d.procRoot, ts.Pid, ts.StartTicks))
	return nil
}

// WaitTask returns a channel that gets the task's exit result.
func (d *Driver) WaitTask(ctx context.Context, taskID string) (<-chan *drivers.ExitResult, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ch := make(chan *drivers.ExitResult, 1)
	go func() {
		defer close(ch)
		select {
		case <-h.doneCh:
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		}
		h.mu.RLock()
		res := h.exitResult.Copy()
		h.mu.RUnlock()
		ch <- res
	}()
	return ch, nil
}

// StopTask asks the process to checkpoint and exit (signal, SIGTERM by
// default), waits up to timeout (the task's kill_timeout), then kills the
// process group.
func (d *Driver) StopTask(taskID string, timeout time.Duration, signal string) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	sig := syscall.SIGTERM
	if signal != "" {
		s, err := lookupSignal(signal)
		if err != nil {
			return err
		}
		sig = s
	}
	return h.shutdown(sig, timeout)
}

func lookupSignal(name string) (syscall.Signal, error) {
	s, ok := signals.SignalLookup[strings.ToUpper(name)]
	if !ok {
		return 0, fmt.Errorf("unknown signal %q; use a name such as SIGTERM or SIGINT", name)
	}
	sig, ok := s.(syscall.Signal)
	if !ok {
		return 0, fmt.Errorf("signal %q is not a POSIX signal", name)
	}
	return sig, nil
}

// DestroyTask forgets a task, killing it first when force is set.
func (d *Driver) DestroyTask(taskID string, force bool) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.running() {
		if !force {
			return fmt.Errorf("task %s is still running; stop it first or destroy with force", taskID)
		}
		if err := h.shutdown(syscall.SIGKILL, 5*time.Second); err != nil {
			return err
		}
	}
	d.tasks.Delete(taskID)
	return nil
}

// InspectTask reports the task's state; DriverAttributes carry its last
// progress (hadar.* keys).
func (d *Driver) InspectTask(taskID string) (*drivers.TaskStatus, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	return h.status(), nil
}

// TaskStats reports CPU and memory of the task's process group.
func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *cstructs.TaskResourceUsage, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if interval <= 0 {
		interval = time.Second
	}
	ch := make(chan *cstructs.TaskResourceUsage)
	go h.stats(ctx, interval, ch)
	return ch, nil
}

// TaskEvents streams the progress and checkpoint events.
func (d *Driver) TaskEvents(ctx context.Context) (<-chan *drivers.TaskEvent, error) {
	return d.eventer.TaskEvents(ctx)
}

// SignalTask sends a signal to the task's process group.
func (d *Driver) SignalTask(taskID string, signal string) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	sig, err := lookupSignal(signal)
	if err != nil {
		return err
	}
	return h.signal(sig)
}

// ExecTask is not supported: training processes are not interactive.
func (d *Driver) ExecTask(taskID string, cmd []string, timeout time.Duration) (*drivers.ExecTaskResult, error) {
	return nil, fmt.Errorf("%s does not support exec", PluginName)
}
