// Package train is hadar's Nomad task driver ("hadar-train"). It runs a
// training process on the GPUs Nomad reserved through Nomad's own
// executor (drivers/shared/executor, what the exec and raw_exec drivers
// use): as the task's user, in the cgroup Nomad's client made for the
// task with its CPU and memory limits, in its own process group, under an
// executor process that outlives the plugin so a restarted client
// reattaches. It publishes the process's progress, asks it to checkpoint
// (the task's kill_signal) on stop and kills it after kill_timeout. See
// docs/driver.md and docs/training-contract.md.
package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul-template/signals"
	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/lib/numalib"
	cstructs "github.com/hashicorp/nomad/client/structs"
	"github.com/hashicorp/nomad/drivers/shared/eventer"
	"github.com/hashicorp/nomad/drivers/shared/executor"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/fsisolation"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/hadar-sched/hadar/driver/device/nvml"
)

const (
	// PluginName is the driver name jobspecs use and the plugin file name.
	PluginName = "hadar-train"
	// PluginVersion is reported to Nomad and as a node attribute.
	PluginVersion = "v0.2.0"

	fingerprintPeriod = 30 * time.Second
	taskStateVersion  = 2
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
	// EnvSpreadStepsPerSec is the emulated pace of the task's GPU model
	// when its unit spans several nodes (emulate.spread_*).
	EnvSpreadStepsPerSec = "HADAR_SPREAD_STEPS_PER_SEC"
)

// Variables the hadar sidecar puts in the env of the workers it places
// (docs/sidecar.md, "The environment of a worker"); the driver reads them.
const (
	// EnvTemplate names the template group of a generated worker group:
	// checkpoints are keyed by it, since the generated group's name
	// changes with every placement.
	EnvTemplate = "HADAR_TEMPLATE"
	// EnvUnit is the placement unit's number; for a HadarE copy it is the
	// copy's index.
	EnvUnit = "HADAR_UNIT"
	// envForkable is the job meta hadar.forkable as Nomad puts job meta in
	// a task's env: NOMAD_META_ plus the key as written, and upper-cased
	// (Nomad keeps dots in env names).
	envForkable = "NOMAD_META_hadar.forkable"
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
	ctx     context.Context
	cancel  context.CancelFunc
	logger  log.Logger
	eventer *eventer.Eventer
	tasks   *taskStore
	// openNVML opens NVML to name the GPUs of a task whose device plugin
	// gave only their UUIDs (Nomad's nvidia plugin).
	openNVML func() nvml.Library
	// self is the hadar-train binary, run as the shim that switches a
	// task to its user (DropArg).
	self string

	mu          sync.RWMutex
	settings    *settings
	nomadConfig *base.ClientDriverConfig
}

var _ drivers.DriverPlugin = (*Driver)(nil)

// New returns the driver using the system's NVML.
func New(logger log.Logger) *Driver {
	return NewWithNVML(logger, nvml.NewLibrary)
}

// NewWithNVML returns the driver with its NVML supplied by open.
func NewWithNVML(logger log.Logger, open func() nvml.Library) *Driver {
	ctx, cancel := context.WithCancel(context.Background())
	logger = logger.Named(PluginName)
	self, err := os.Executable()
	if err != nil {
		logger.Error("cannot find own executable; tasks that switch users will fail to start", "error", err)
	}
	return &Driver{
		ctx: ctx, cancel: cancel, logger: logger,
		eventer:  eventer.NewEventer(ctx, logger),
		tasks:    newTaskStore(),
		openNVML: open,
		self:     self,
	}
}

// Shutdown stops the driver's background work; running tasks keep
// running under their executors. Nomad kills the plugin process instead;
// tests call this.
func (d *Driver) Shutdown() { d.cancel() }

// PluginInfo identifies the plugin to Nomad.
func (d *Driver) PluginInfo() (*base.PluginInfoResponse, error) { return pluginInfo, nil }

// ConfigSchema returns the plugin block's schema.
func (d *Driver) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

// SetConfig validates the plugin block and keeps the agent's settings
// the executor needs (port range, CPU topology for stats in MHz).
func (d *Driver) SetConfig(c *base.Config) error {
	cfg := defaultConfig()
	if len(c.PluginConfig) != 0 {
		if err := base.MsgPackDecode(c.PluginConfig, &cfg); err != nil {
			return fmt.Errorf("%s plugin config: %w", PluginName, err)
		}
	}
	s, err := parseConfig(cfg)
	if err != nil {
		return fmt.Errorf("%s plugin config: %w", PluginName, err)
	}
	if os.Geteuid() == 0 && s.defaultUser != "" {
		// Refuse a default that could never run a task at load time,
		// rather than at every task start.
		if _, err := resolveUser(s, ""); err != nil {
			return fmt.Errorf("%s plugin config: default_user %q: %w", PluginName, s.defaultUser, err)
		}
	}
	for _, opt := range s.deprecated {
		d.logger.Warn("plugin option ignored: progress is published in the alloc filesystem and as a few task events (docs/driver.md)", "option", opt)
	}
	var nc *base.ClientDriverConfig
	if c.AgentConfig != nil && c.AgentConfig.Driver != nil {
		nc = c.AgentConfig.Driver
	}
	d.mu.Lock()
	d.settings = s
	if nc != nil {
		d.nomadConfig = nc
	}
	d.mu.Unlock()
	return nil
}

func (d *Driver) config() *settings {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.settings == nil {
		s, _ := parseConfig(defaultConfig())
		return s
	}
	return d.settings
}

// agentConfig is what the agent told the plugin about itself; a driver
// run without an agent (an embedder) scans the machine's CPUs itself.
func (d *Driver) agentConfig() *base.ClientDriverConfig {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nomadConfig == nil || d.nomadConfig.Topology == nil {
		d.nomadConfig = &base.ClientDriverConfig{
			ClientMinPort: executor.ExecutorDefaultMinPort,
			ClientMaxPort: executor.ExecutorDefaultMaxPort,
			Topology:      numalib.Scan(numalib.PlatformScanners(false)),
		}
	}
	return d.nomadConfig
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

// StartTask starts the training process under a new executor. It fails,
// and leaves nothing running, when the process cannot be started.
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
	// A restarted task reuses its task directory: the last run's progress
	// must not pass for this run's.
	for _, f := range []string{l.progress, l.mirror} {
		if f == "" {
			continue
		}
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return nil, nil, fmt.Errorf("task %s: stale progress file: %w", cfg.Name, err)
		}
	}

	cmd, args, err := d.execCommand(l)
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	logger := d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name)
	agent := d.agentConfig()
	exec, pluginClient, err := executor.CreateExecutor(logger, agent, &executor.ExecutorConfig{
		LogFile:  filepath.Join(cfg.TaskDir().Dir, "executor.out"),
		LogLevel: "debug",
		Compute:  agent.Topology.Compute(),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: start executor: %w", cfg.Name, err)
	}
	ps, err := exec.Launch(&executor.ExecCommand{
		Cmd:        cmd,
		Args:       args,
		Env:        envList(l.env),
		TaskDir:    cfg.TaskDir().Dir,
		WorkDir:    l.dir,
		StdoutPath: cfg.StdoutPath,
		StderrPath: cfg.StderrPath,
		// The cgroup Nomad's client made for the task, with its cpu and
		// memory limits (cgroups v1 or v2, whichever the client uses).
		Resources:        cfg.Resources.Copy(),
		NetworkIsolation: cfg.NetworkIsolation,
	})
	if err != nil {
		pluginClient.Kill()
		return nil, nil, fmt.Errorf("task %s: start %s: %w", cfg.Name, l.command, err)
	}
	h := &taskHandle{
		logger: logger,
		cfg:    cfg,
		state: TaskState{
			ReattachConfig: pstructs.ReattachConfigFromGoPlugin(pluginClient.ReattachConfig()),
			TaskConfig:     cfg, Pid: ps.Pid, StartedAt: ps.Time.Round(time.Millisecond),
			ProgressFile: l.progress, ProgressMirror: l.mirror,
		},
		exec: exec, pluginClient: pluginClient,
		pollEvery: d.config().pollEvery,
		emit:      d.emit,
		procState: drivers.TaskStateRunning,
		doneCh:    make(chan struct{}),
	}
	th := drivers.NewTaskHandle(taskStateVersion)
	th.Config, th.State = cfg, drivers.TaskStateRunning
	if err := th.SetDriverState(&h.state); err != nil {
		_ = exec.Shutdown("SIGKILL", 0)
		pluginClient.Kill()
		return nil, nil, fmt.Errorf("task %s: encode driver state: %w", cfg.Name, err)
	}
	d.tasks.Set(cfg.ID, h)
	go h.run()
	go h.watchProgress(d.ctx)
	logger.Info("training process started", "pid", ps.Pid, "command", l.command, "uid", l.user.uid)
	// Say which GPUs, model and pace the process got, from the
	// environment it was given, so operators see it in the task events.
	started := map[string]string{
		"hadar.gpus":              l.env["NVIDIA_VISIBLE_DEVICES"],
		"hadar.gpu_model":         l.env[EnvGPUModel],
		"hadar.gpu_model_source":  l.modelSource,
		"hadar.steps_per_sec":     l.env[EnvStepsPerSec],
		"hadar.checkpoint_dir":    l.env[EnvCheckpointDir],
		"hadar.progress_file":     l.progress,
		"hadar.progress_alloc_fs": filepath.Join(cfg.Name, "local", progressFileName),
		"hadar.uid":               fmt.Sprint(l.user.uid),
	}
	msg := "training process started"
	if g := started["hadar.gpus"]; g != "" {
		msg += fmt.Sprintf(" on GPUs %s (%s)", g, started["hadar.gpu_model"])
	}
	if r := started["hadar.steps_per_sec"]; r != "" {
		msg += ", emulated pace " + r + " steps/s"
	}
	d.emit(&drivers.TaskEvent{TaskID: cfg.ID, TaskName: cfg.Name, AllocID: cfg.AllocID, Timestamp: time.Now(), Message: msg, Annotations: started})
	return th, nil, nil
}

func (d *Driver) emit(ev *drivers.TaskEvent) {
	if err := d.eventer.EmitEvent(ev); err != nil {
		d.logger.Debug("task event not delivered", "error", err)
	}
}

// RecoverTask reattaches to a training process after the client (and so
// this plugin) restarted: its executor kept running and still holds the
// process and its exit status.
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
	if ts.ReattachConfig == nil || ts.Pid <= 0 {
		return fmt.Errorf("recover task %s: driver state has no executor (state version %d; tasks started by %s before v0.2.0 cannot be recovered)", handle.Config.Name, handle.Version, PluginName)
	}
	cfg := handle.Config
	if ts.TaskConfig != nil {
		cfg = ts.TaskConfig
	}
	rc, err := pstructs.ReattachConfigToGoPlugin(ts.ReattachConfig)
	if err != nil {
		return fmt.Errorf("recover task %s: reattach config: %w", cfg.Name, err)
	}
	logger := d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name)
	exec, pluginClient, err := executor.ReattachToExecutor(rc, logger, d.agentConfig().Topology.Compute())
	if err != nil {
		return fmt.Errorf("recover task %s: reattach to executor (pid %d): %w", cfg.Name, ts.ReattachConfig.Pid, err)
	}
	h := &taskHandle{
		logger: logger, cfg: cfg, state: ts,
		exec: exec, pluginClient: pluginClient,
		pollEvery: d.config().pollEvery,
		emit:      d.emit,
		recovered: true,
		procState: drivers.TaskStateRunning,
		doneCh:    make(chan struct{}),
	}
	d.tasks.Set(cfg.ID, h)
	go h.run()
	go h.watchProgress(d.ctx)
	logger.Info("reattached to training process", "pid", ts.Pid, "executor_pid", ts.ReattachConfig.Pid)
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
// default; Nomad passes the task's kill_signal), waits up to timeout (the
// task's kill_timeout), then kills the process group.
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

// DestroyTask forgets a task, killing it first when force is set, and
// ends its executor.
func (d *Driver) DestroyTask(taskID string, force bool) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.running() && !force {
		return fmt.Errorf("task %s is still running; stop it first or destroy with force", taskID)
	}
	if !h.pluginClient.Exited() {
		// Also kills what the process left in its group.
		if err := h.exec.Shutdown("SIGKILL", 0); err != nil {
			h.logger.Warn("executor shutdown failed", "error", err)
		}
		h.pluginClient.Kill()
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

// TaskStats reports the task's CPU (MHz and percent, from the agent's CPU
// topology) and memory, as the executor measures them for exec and
// raw_exec tasks.
func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *cstructs.TaskResourceUsage, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ch, err := h.exec.Stats(ctx, interval)
	if err != nil {
		return nil, fmt.Errorf("task %s stats: %w", h.cfg.Name, err)
	}
	return ch, nil
}

// TaskEvents streams the driver's task events.
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
	return nil, errors.New(PluginName + " does not support exec")
}
