// Package train is hadar's Nomad task driver ("hadar-train"). It runs a
// training process on the GPUs Nomad reserved, under a supervisor
// process of its own (driver/supervise): as the task's user (by default
// a uid of its job's own), in the cgroup Nomad's client made for the task
// with its CPU and memory limits, in its own process group; the
// supervisor outlives the plugin, so a restarted client reattaches. Every
// path a job names resolves under the operator's roots (driver/confine).
// It publishes the process's progress, asks it to checkpoint (the task's
// kill_signal) on stop and kills it after kill_timeout. It speaks Nomad's
// plugin protocol through driver/plugin. See docs/driver.md and
// docs/training-contract.md.
package train

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	log "github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
	"github.com/hadar-sched/hadar/driver/supervise"
	"github.com/hadar-sched/hadar/driver/supervise/cgroup"
	"github.com/hadar-sched/hadar/version"
)

const (
	// PluginName is the driver name jobspecs use and the plugin file name.
	PluginName = "hadar-train"

	fingerprintPeriod = 30 * time.Second
)

// envForkable is contract.MetaForkable as Nomad puts job meta in a task's
// env: NOMAD_META_ plus the key as written (Nomad keeps dots in env names).
const envForkable = "NOMAD_META_" + contract.MetaForkable

var capabilities = plugin.Capabilities{
	SendSignals:       true,
	Exec:              false,
	FSIsolation:       plugin.FSIsolationNone,
	NetIsolationModes: []plugin.NetIsolationMode{plugin.NetIsolationHost},
	MountConfigs:      plugin.MountsNone,
}

// Driver is the task driver. Create it with New.
type Driver struct {
	ctx    context.Context
	cancel context.CancelFunc
	logger log.Logger
	events *eventHub
	tasks  *taskStore
	// openNVML opens NVML to name the GPUs of a task whose device plugin
	// gave only their UUIDs (Nomad's nvidia plugin).
	openNVML func() nvml.Library

	mu       sync.RWMutex
	settings *settings
	agent    *plugin.AgentConfig
	// stateRoot is the state directory a task last used (the default
	// one is known only from an allocation), for the ids metric.
	stateRoot string
}

var _ plugin.DriverPlugin = (*Driver)(nil)

// New returns the driver using the system's NVML.
func New(logger log.Logger) *Driver {
	return NewWithNVML(logger, nvml.NewLibrary)
}

// NewWithNVML returns the driver with its NVML supplied by open.
func NewWithNVML(logger log.Logger, open func() nvml.Library) *Driver {
	ctx, cancel := context.WithCancel(context.Background())
	logger = logger.Named(PluginName)
	return &Driver{
		ctx: ctx, cancel: cancel, logger: logger,
		events:   newEventHub(logger),
		tasks:    newTaskStore(),
		openNVML: open,
	}
}

// Shutdown stops the driver's background work and lets go of its tasks;
// they keep running under their supervisors. Nomad kills the plugin
// process instead; tests call this.
func (d *Driver) Shutdown() {
	d.cancel()
	for _, h := range d.tasks.all() {
		h.sup.Close()
	}
}

// PluginInfo identifies the plugin to Nomad.
func (d *Driver) PluginInfo() plugin.Info {
	return plugin.Info{Type: plugin.TypeDriver, Name: PluginName, Version: version.Plugin()}
}

// ConfigSchema returns the plugin block's schema.
func (d *Driver) ConfigSchema() *hclspec.Spec { return configSpec }

// SetConfig validates the plugin block and keeps the agent's CPU
// topology (for CPU statistics in MHz).
func (d *Driver) SetConfig(_ context.Context, c *plugin.Config) error {
	cfg := defaultConfig()
	if len(c.PluginConfig) != 0 {
		if err := configSpec.Decode(c.PluginConfig, &cfg); err != nil {
			return fmt.Errorf("%s plugin config: %w", PluginName, err)
		}
	}
	s, err := parseConfig(cfg)
	if err != nil {
		return fmt.Errorf("%s plugin config: %w", PluginName, err)
	}
	if os.Geteuid() == 0 {
		// Refuse what could never run a task at load time, rather than
		// at every task start.
		if s.defaultUser != "" {
			if _, err := resolveUser(s, "", ids{s.idRange.First, s.idRange.First}); err != nil {
				return fmt.Errorf("%s plugin config: default_user %q: %w", PluginName, s.defaultUser, err)
			}
		}
		if err := checkSubordinateIDs(s.idRange, "/etc/subuid", "/etc/subgid"); err != nil {
			return fmt.Errorf("%s plugin config: %w", PluginName, err)
		}
		if err := checkIDRoot(s); err != nil {
			return fmt.Errorf("%s plugin config: %w", PluginName, err)
		}
	}
	for _, opt := range s.deprecated {
		d.logger.Warn("plugin option ignored: progress is published in the alloc filesystem and as a few task events (docs/driver.md)", "option", opt)
	}
	d.mu.Lock()
	d.settings = s
	if c.Agent != nil {
		d.agent = c.Agent
	}
	d.mu.Unlock()
	return nil
}

// idsInUse is idsInUse for the node's configuration; -1 until the
// records' place is known.
func (d *Driver) idsInUse() (inUse, total int) {
	d.mu.RLock()
	s, stateRoot := d.settings, d.stateRoot
	d.mu.RUnlock()
	if s == nil {
		return -1, 0
	}
	if s.stateDir != "" {
		stateRoot = s.stateDir
	}
	if _, path := idRoot(s, stateRoot); path == "" {
		return -1, 0
	}
	return idsInUse(s, stateRoot)
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

// TaskConfigSchema returns the schema of a task's config block.
func (d *Driver) TaskConfigSchema() *hclspec.Spec { return taskConfigSpec }

// Capabilities tells Nomad what the driver supports.
func (d *Driver) Capabilities() plugin.Capabilities { return capabilities }

// Fingerprint reports the driver healthy at once and every 30 s.
func (d *Driver) Fingerprint(ctx context.Context) (<-chan *plugin.DriverFingerprint, error) {
	ch := make(chan *plugin.DriverFingerprint)
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
			fp := &plugin.DriverFingerprint{Health: plugin.HealthUndetected, HealthDescription: "disabled in the plugin block"}
			if d.config().enabled {
				fp = &plugin.DriverFingerprint{
					Health:            plugin.HealthHealthy,
					HealthDescription: plugin.DriverHealthy,
					Attributes: map[string]plugin.Attribute{
						"driver." + PluginName:              plugin.BoolAttr(true),
						"driver." + PluginName + ".version": plugin.StringAttr(version.Plugin()),
					},
				}
				// How full job_id_range is, where this node records
				// ids (nomad node status -verbose; docs/driver.md).
				if n, total := d.idsInUse(); n >= 0 {
					fp.Attributes["driver."+PluginName+".job_ids_in_use"] = plugin.IntAttr(int64(n), "")
					fp.Attributes["driver."+PluginName+".job_ids_total"] = plugin.IntAttr(int64(total), "")
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

// StartTask starts the training process under a supervisor. It fails,
// and leaves nothing running, when the process cannot be started.
func (d *Driver) StartTask(ctx context.Context, cfg *plugin.TaskConfig) (*plugin.TaskHandle, error) {
	if _, ok := d.tasks.get(cfg.ID); ok {
		return nil, fmt.Errorf("task %s already started", cfg.ID)
	}
	s := d.config()
	if !s.enabled {
		return nil, fmt.Errorf("%s is disabled in its plugin block", PluginName)
	}
	var tc TaskConfig
	if err := cfg.DecodeDriverConfig(taskConfigSpec, &tc); err != nil {
		return nil, fmt.Errorf("task %s config: %w", cfg.Name, err)
	}
	if err := tc.validate(); err != nil {
		return nil, fmt.Errorf("task %s config: %w", cfg.Name, err)
	}
	l, err := d.plan(cfg, &tc)
	if err != nil {
		return nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	// A restarted task reuses its task directory: the last run's progress
	// must not pass for this run's. Removed below the task directory
	// only, never through a link.
	if err := removeStaleProgress(l); err != nil {
		return nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	logger := d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name)
	if err := startRun(l, logger); err != nil {
		return nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	cg, err := taskCgroup(cfg)
	if err != nil {
		return nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	sup, err := supervise.Start(ctx, supervise.Spec{
		Command: l.command,
		Args:    l.args,
		Env:     envList(l.env),
		Dir:     l.dir,
		User:    l.user.spec(s.allowRoot),
		Stdout:  cfg.StdoutPath,
		Stderr:  cfg.StderrPath,
		// Below the allocation directory (root's) everything is the
		// tasks': no link is followed there.
		OutputRoot: cfg.AllocDir,
		Cgroup:     cg,
		StateDir:   l.stateDir,
	})
	if err != nil {
		return nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	st := sup.State()
	h := &taskHandle{
		logger: logger, id: cfg.ID, name: cfg.Name, allocID: cfg.AllocID,
		state: driverState{
			Supervise: st, TaskDir: l.taskDir, Progress: l.progress, Mirror: l.mirror,
			Checkpoint: l.checkpoint, CheckpointBase: l.ckptBase, UID: l.user.uid,
			StartedAt: st.StartedAt, Run: l.env[contract.EnvJobRun],
		},
		sup:       sup,
		pollEvery: s.pollEvery,
		emit:      d.events.emit,
		procState: plugin.TaskStateRunning,
		doneCh:    make(chan struct{}),
	}
	b, err := h.state.encode()
	if err == nil && !d.tasks.add(cfg.ID, h) {
		err = fmt.Errorf("task %s already started", cfg.ID)
	}
	if err != nil {
		if derr := sup.Destroy(context.Background()); derr != nil {
			logger.Error("task not cleaned up after a failed start", "error", derr)
		}
		return nil, fmt.Errorf("task %s: %w", cfg.Name, err)
	}
	go h.run(d.ctx)
	go h.watchProgress(d.ctx)
	logger.Info("training process started", "pid", st.Task.PID, "supervisor_pid", st.Supervisor.PID, "command", l.command, "uid", l.user.uid)
	// Say which GPUs, model, pace and ids the process got, from the
	// environment it was given, so operators see it in the task events.
	started := map[string]string{
		"hadar.gpus":              l.env["NVIDIA_VISIBLE_DEVICES"],
		"hadar.gpu_model":         l.env[contract.EnvGPUModel],
		"hadar.gpu_model_source":  l.modelSource,
		"hadar.steps_per_sec":     l.env[contract.EnvStepsPerSec],
		"hadar.checkpoint_dir":    l.env[contract.EnvCheckpointDir],
		"hadar.progress_file":     l.env[contract.EnvProgressFile],
		"hadar.progress_alloc_fs": filepath.Join(cfg.Name, progressRel),
		"hadar.uid":               fmt.Sprint(l.user.uid),
		"hadar.gid":               fmt.Sprint(l.user.gid),
		"hadar.job_gid":           fmt.Sprint(l.job.gid),
	}
	msg := "training process started"
	if g := started["hadar.gpus"]; g != "" {
		msg += fmt.Sprintf(" on GPUs %s (%s)", g, started["hadar.gpu_model"])
	}
	if r := started["hadar.steps_per_sec"]; r != "" {
		msg += ", emulated pace " + r + " steps/s"
	}
	d.events.emit(&plugin.TaskEvent{TaskID: cfg.ID, TaskName: cfg.Name, AllocID: cfg.AllocID, Timestamp: time.Now(), Message: msg, Annotations: started})
	return &plugin.TaskHandle{Version: taskStateVersion, Config: cfg, State: plugin.TaskStateRunning, DriverState: b}, nil
}

// removeStaleProgress removes the progress file (and its copy) a last
// run left in the task directory.
func removeStaleProgress(l *launch) error {
	td, err := openTaskDir(l.taskDir)
	if err != nil {
		return err
	}
	defer td.Close()
	files := []string{l.progress}
	if l.mirror {
		files = append(files, progressRel)
	}
	for _, f := range files {
		if err := td.Remove("progress_file", f); err != nil {
			return fmt.Errorf("stale progress file: %w", err)
		}
	}
	return nil
}

// taskCgroup is the cgroup Nomad's client made for the task, where the
// supervisor runs it with its limits; none when the client made none
// (not root, cgroups off).
func taskCgroup(cfg *plugin.TaskConfig) (supervise.Cgroup, error) {
	r := cfg.Resources
	if os.Geteuid() != 0 || r == nil || r.Linux == nil || r.Linux.CgroupPath == "" {
		return supervise.Cgroup{}, nil
	}
	h, err := cgroup.Detect()
	if err != nil {
		return supervise.Cgroup{}, err
	}
	c := supervise.Cgroup{Hierarchy: h, Limits: limits(r)}
	if h.Version == cgroup.V2 {
		c.Path = r.Linux.CgroupPath
		return c, nil
	}
	// On v1 Nomad names the cpuset cgroup (<parent>/share, or
	// <parent>/reserve/<alloc>.<task> with reserved cores) and makes
	// <parent>/<alloc>.<task> in the freezer, cpu and memory
	// hierarchies: the task's group.
	// Nomad builds that path as <cgroup root>/cpuset/<parent>/...
	parent := "nomad"
	if m := h.Mounts["memory"]; m != "" {
		cpuset := filepath.Join(filepath.Dir(m), "cpuset")
		if rel, err := filepath.Rel(cpuset, r.Linux.CgroupPath); err == nil && !strings.HasPrefix(rel, "..") {
			if i := strings.Index(rel, "/reserve/"); i > 0 {
				parent = rel[:i]
			} else if strings.HasSuffix(rel, "/share") {
				parent = strings.TrimSuffix(rel, "/share")
			}
		}
	}
	c.Path = filepath.Join(parent, cfg.AllocID+"."+cfg.Name)
	return c, nil
}

// limits are the task's resources as cgroup settings, as Nomad's own
// drivers set them: memory (memory_max when oversubscribed) the hard
// limit, memory the reservation then, cpu the weight.
func limits(r *plugin.Resources) cgroup.Limits {
	var l cgroup.Limits
	lr := r.Linux
	l.CPUShares = lr.CPUShares
	if l.CPUShares == 0 {
		l.CPUShares = r.CPUShares
	}
	l.CPUShares = min(max(l.CPUShares, 0), 262144)
	if lr.CPUQuota > 0 {
		l.CPUQuota = time.Duration(lr.CPUQuota) * time.Microsecond
		l.CPUPeriod = time.Duration(lr.CPUPeriod) * time.Microsecond
		if l.CPUPeriod < time.Millisecond || l.CPUPeriod > time.Second {
			l.CPUPeriod = 0
		}
		l.CPUQuota = max(l.CPUQuota, time.Millisecond)
	}
	switch {
	case r.MemoryMaxMB == -1:
		l.MemoryMax = -1
		l.MemoryLow = r.MemoryMB << 20
	case r.MemoryMaxMB > 0:
		l.MemoryMax = r.MemoryMaxMB << 20
		l.MemoryLow = min(r.MemoryMB<<20, l.MemoryMax)
	case lr.MemoryLimitBytes > 0:
		l.MemoryMax = lr.MemoryLimitBytes
	case r.MemoryMB > 0:
		l.MemoryMax = r.MemoryMB << 20
	}
	return l
}

// RecoverTask reattaches to a training process after the client (and so
// this plugin) restarted: its supervisor kept running and still holds
// the process and records its exit status.
func (d *Driver) RecoverTask(ctx context.Context, handle *plugin.TaskHandle) error {
	if handle == nil || handle.Config == nil {
		return fmt.Errorf("recover: no task handle or task config")
	}
	cfg := handle.Config
	if _, ok := d.tasks.get(cfg.ID); ok {
		return nil
	}
	st, err := decodeDriverState(handle.Version, handle.DriverState)
	if err != nil && handle.Version < taskStateVersion && os.Geteuid() == 0 {
		// Nomad's client starts the task again when RecoverTask fails:
		// the old process must not go on beside it.
		n := stopLegacyTask(ctx, cfg)
		return fmt.Errorf("recover task %s: %w; stopped the %d processes it left (its program got SIGTERM to checkpoint, then SIGKILL after %v, and its Nomad executor); Nomad starts the task again under this release", cfg.Name, err, n, legacyGrace)
	}
	if err != nil {
		return fmt.Errorf("recover task %s: %w", cfg.Name, err)
	}
	if err := d.checkStateDir(cfg, st.Supervise.StateDir); err != nil {
		return fmt.Errorf("recover task %s: %w", cfg.Name, err)
	}
	sup, err := supervise.Attach(ctx, st.Supervise)
	if err != nil {
		return fmt.Errorf("recover task %s: reattach to its supervisor (pid %d): %w", cfg.Name, st.Supervise.Supervisor.PID, err)
	}
	logger := d.logger.With("alloc_id", cfg.AllocID, "task", cfg.Name)
	h := &taskHandle{
		logger: logger, id: cfg.ID, name: cfg.Name, allocID: cfg.AllocID,
		state:     *st,
		sup:       sup,
		pollEvery: d.config().pollEvery,
		emit:      d.events.emit,
		recovered: true,
		procState: plugin.TaskStateRunning,
		doneCh:    make(chan struct{}),
	}
	if !d.tasks.add(cfg.ID, h) {
		sup.Close()
		return nil
	}
	go h.run(d.ctx)
	go h.watchProgress(d.ctx)
	logger.Info("reattached to training process", "pid", st.Supervise.Task.PID, "supervisor_pid", st.Supervise.Supervisor.PID)
	return nil
}

// checkStateDir refuses a handle whose supervisor state directory is not
// the one plan gives the task: DestroyTask removes it, so a handle that
// named another directory would have root remove that.
func (d *Driver) checkStateDir(cfg *plugin.TaskConfig, dir string) error {
	root := d.config().stateDir
	if root == "" {
		root = defaultStateDir(cfg.AllocDir)
	}
	want := filepath.Join(root, element(cfg.ID))
	if filepath.Clean(dir) != want {
		return fmt.Errorf("the handle's supervisor state_dir %q is not %q, where this driver keeps the task's state (the plugin's state_dir %q): not reattached, and nothing there is removed; if state_dir changed in the plugin block while the task ran, set it back until the task ends", dir, want, root)
	}
	return nil
}

// WaitTask blocks until the task ends and returns its exit result.
func (d *Driver) WaitTask(ctx context.Context, taskID string) (*plugin.ExitResult, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, plugin.ErrTaskNotFound
	}
	select {
	case <-h.doneCh:
		return h.result(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-d.ctx.Done():
		return nil, fmt.Errorf("%s is shutting down", PluginName)
	}
}

// StopTask asks the process to checkpoint and exit (signal, SIGTERM by
// default; Nomad passes the task's kill_signal), waits up to timeout (the
// task's kill_timeout), then kills every process of the task.
func (d *Driver) StopTask(ctx context.Context, taskID string, timeout time.Duration, signal string) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return plugin.ErrTaskNotFound
	}
	sig, err := lookupSignal(signal)
	if signal == "" {
		sig, err = lookupSignal("SIGTERM")
	}
	if err != nil {
		return err
	}
	return h.shutdown(ctx, sig, timeout)
}

// DestroyTask forgets a task, killing it first when force is set, and
// removes what its supervisor kept.
func (d *Driver) DestroyTask(ctx context.Context, taskID string, force bool) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return plugin.ErrTaskNotFound
	}
	if h.running() && !force {
		return fmt.Errorf("task %s is still running; stop it first or destroy with force", taskID)
	}
	if err := h.sup.Destroy(ctx); err != nil {
		return fmt.Errorf("destroy task %s: %w", h.name, err)
	}
	d.tasks.remove(taskID)
	return nil
}

// InspectTask reports the task's state; DriverAttributes carry its last
// progress (hadar.* keys).
func (d *Driver) InspectTask(_ context.Context, taskID string) (*plugin.TaskStatus, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, plugin.ErrTaskNotFound
	}
	return h.status(), nil
}

// TaskEvents streams the driver's task events.
func (d *Driver) TaskEvents(ctx context.Context) (<-chan *plugin.TaskEvent, error) {
	return d.events.subscribe(ctx, d.ctx), nil
}

// SignalTask sends a signal to the task's process group.
func (d *Driver) SignalTask(_ context.Context, taskID string, signal string) error {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return plugin.ErrTaskNotFound
	}
	sig, err := lookupSignal(signal)
	if err != nil {
		return err
	}
	return h.signal(sig)
}

// normalizeSignal makes "term" or "sigterm" "SIGTERM".
func normalizeSignal(name string) string {
	n := strings.ToUpper(strings.TrimSpace(name))
	if n != "" && !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	return n
}
