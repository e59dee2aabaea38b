package plugin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
)

// procDriver is a small but real task driver for the protocol tests: it
// runs a task's command as a child process. It exercises every RPC with
// real behaviour (exit codes, signals, stats read from /proc).
type procDriver struct {
	mu     sync.Mutex
	agent  *plugin.AgentConfig
	conf   procConfig
	tasks  map[string]*procTask
	events []chan *plugin.TaskEvent
	// startErr, when set, fails the next StartTask with it.
	startErr error
}

type procConfig struct {
	Label string `cty:"label"`
}

type procTaskConfig struct {
	Command string   `cty:"command"`
	Args    []string `cty:"args"`
}

type procTask struct {
	cfg     *plugin.TaskConfig
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	// set when done is closed
	result    *plugin.ExitResult
	completed time.Time
}

// procState is the driver state a handle carries.
type procState struct {
	Pid int `json:"pid"`
}

var (
	procConfigSpec = hclspec.Object(map[string]*hclspec.Spec{
		"label": hclspec.Default(hclspec.Attr("label", "string", false), hclspec.Literal(`"proc"`)),
	})
	procTaskSpec = hclspec.Object(map[string]*hclspec.Spec{
		"command": hclspec.Attr("command", "string", true),
		"args":    hclspec.Attr("args", "list(string)", false),
	})
)

func newProcDriver() *procDriver { return &procDriver{tasks: map[string]*procTask{}} }

func (d *procDriver) PluginInfo() plugin.Info {
	return plugin.Info{Type: plugin.TypeDriver, Name: "proc", Version: "v1.2.3"}
}

func (d *procDriver) ConfigSchema() *hclspec.Spec { return procConfigSpec }

func (d *procDriver) SetConfig(_ context.Context, c *plugin.Config) error {
	var conf procConfig
	if err := procConfigSpec.Decode(c.PluginConfig, &conf); err != nil {
		return fmt.Errorf("proc config: %w", err)
	}
	if strings.ContainsAny(conf.Label, " \t") {
		return fmt.Errorf("label %q: no blanks", conf.Label)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conf, d.agent = conf, c.Agent
	return nil
}

func (d *procDriver) TaskConfigSchema() *hclspec.Spec { return procTaskSpec }

func (d *procDriver) Capabilities() plugin.Capabilities {
	return plugin.Capabilities{
		SendSignals:       true,
		FSIsolation:       plugin.FSIsolationNone,
		NetIsolationModes: []plugin.NetIsolationMode{plugin.NetIsolationHost, plugin.NetIsolationNone},
		MountConfigs:      plugin.MountsNone,
	}
}

func (d *procDriver) Fingerprint(ctx context.Context) (<-chan *plugin.DriverFingerprint, error) {
	ch := make(chan *plugin.DriverFingerprint)
	go func() {
		defer close(ch)
		d.mu.Lock()
		label := d.conf.Label
		d.mu.Unlock()
		fps := []*plugin.DriverFingerprint{
			{Health: plugin.HealthHealthy, HealthDescription: plugin.DriverHealthy, Attributes: map[string]plugin.Attribute{
				"driver.proc":       plugin.BoolAttr(true),
				"driver.proc.label": plugin.StringAttr(label),
				"driver.proc.cpus":  plugin.IntAttr(2, ""),
				"driver.proc.speed": plugin.FloatAttr(2.5, "GHz"),
			}},
			{Health: plugin.HealthUnhealthy, HealthDescription: "lost", Err: errors.New("probe failed")},
		}
		for _, fp := range fps {
			select {
			case ch <- fp:
			case <-ctx.Done():
				return
			}
		}
		<-ctx.Done()
	}()
	return ch, nil
}

func (d *procDriver) StartTask(_ context.Context, cfg *plugin.TaskConfig) (*plugin.TaskHandle, error) {
	d.mu.Lock()
	if err := d.startErr; err != nil {
		d.startErr = nil
		d.mu.Unlock()
		return nil, err
	}
	_, dup := d.tasks[cfg.ID]
	d.mu.Unlock()
	if dup {
		return nil, fmt.Errorf("task %s already started", cfg.ID)
	}
	var tc procTaskConfig
	if err := cfg.DecodeDriverConfig(procTaskSpec, &tc); err != nil {
		return nil, fmt.Errorf("task %s config: %w", cfg.Name, err)
	}
	cmd := exec.Command(tc.Command, tc.Args...)
	cmd.Dir = cfg.TaskDir().Dir
	for k, v := range cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range cfg.DeviceEnv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := os.OpenFile(cfg.StdoutPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("task %s stdout: %w", cfg.Name, err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, plugin.Recoverable(fmt.Errorf("task %s: %w", cfg.Name, err))
	}
	t := &procTask{cfg: cfg, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		res := &plugin.ExitResult{}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			res.ExitCode = ws.ExitStatus()
			if ws.Signaled() {
				res.Signal = int(ws.Signal())
			}
		} else if err != nil {
			res.Err = err
		}
		d.mu.Lock()
		t.result, t.completed = res, time.Now()
		d.mu.Unlock()
		close(t.done)
	}()
	state, err := json.Marshal(procState{Pid: cmd.Process.Pid})
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.tasks[cfg.ID] = t
	subs := append([]chan *plugin.TaskEvent(nil), d.events...)
	d.mu.Unlock()
	ev := &plugin.TaskEvent{TaskID: cfg.ID, AllocID: cfg.AllocID, TaskName: cfg.Name, Timestamp: time.Now(), Message: "started", Annotations: map[string]string{"pid": strconv.Itoa(cmd.Process.Pid)}}
	for _, s := range subs {
		select {
		case s <- ev:
		default:
		}
	}
	return &plugin.TaskHandle{Version: 3, Config: cfg, State: plugin.TaskStateRunning, DriverState: state}, nil
}

func (d *procDriver) task(id string) (*procTask, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.tasks[id]
	if !ok {
		return nil, fmt.Errorf("task %q: %w", id, plugin.ErrTaskNotFound)
	}
	return t, nil
}

// RecoverTask checks the handle's state names a live process of ours.
func (d *procDriver) RecoverTask(_ context.Context, h *plugin.TaskHandle) error {
	var st procState
	if err := json.Unmarshal(h.DriverState, &st); err != nil {
		return fmt.Errorf("recover %s: driver state: %w", h.Config.ID, err)
	}
	t, err := d.task(h.Config.ID)
	if err != nil {
		return err
	}
	if t.cmd.Process.Pid != st.Pid {
		return fmt.Errorf("recover %s: pid %d, want %d", h.Config.ID, st.Pid, t.cmd.Process.Pid)
	}
	return nil
}

func (d *procDriver) WaitTask(ctx context.Context, id string) (*plugin.ExitResult, error) {
	t, err := d.task(id)
	if err != nil {
		return nil, err
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := *t.result
	return &r, nil
}

func (d *procDriver) StopTask(ctx context.Context, id string, timeout time.Duration, signal string) error {
	t, err := d.task(id)
	if err != nil {
		return err
	}
	sig := syscall.SIGTERM
	if signal != "" {
		if sig, err = lookupSignal(signal); err != nil {
			return err
		}
	}
	_ = t.cmd.Process.Signal(sig)
	select {
	case <-t.done:
		return nil
	case <-time.After(timeout):
	case <-ctx.Done():
		return ctx.Err()
	}
	_ = t.cmd.Process.Kill()
	<-t.done
	return nil
}

func (d *procDriver) DestroyTask(_ context.Context, id string, force bool) error {
	t, err := d.task(id)
	if err != nil {
		return err
	}
	select {
	case <-t.done:
	default:
		if !force {
			return fmt.Errorf("task %s is running; stop it first", id)
		}
		_ = t.cmd.Process.Kill()
		<-t.done
	}
	d.mu.Lock()
	delete(d.tasks, id)
	d.mu.Unlock()
	return nil
}

func (d *procDriver) InspectTask(_ context.Context, id string) (*plugin.TaskStatus, error) {
	t, err := d.task(id)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &plugin.TaskStatus{ID: id, Name: t.cfg.Name, State: plugin.TaskStateRunning, StartedAt: t.started,
		DriverAttributes: map[string]string{"pid": strconv.Itoa(t.cmd.Process.Pid)}}
	if t.result != nil {
		st.State, st.CompletedAt = plugin.TaskStateExited, t.completed
		r := *t.result
		st.ExitResult = &r
	}
	return st, nil
}

// TaskStats reads the process's resident memory every interval.
func (d *procDriver) TaskStats(ctx context.Context, id string, interval time.Duration) (<-chan *plugin.TaskResourceUsage, error) {
	t, err := d.task(id)
	if err != nil {
		return nil, err
	}
	ch := make(chan *plugin.TaskResourceUsage)
	go func() {
		defer close(ch)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			rss, err := residentBytes(t.cmd.Process.Pid)
			if err != nil {
				return // exited
			}
			u := &plugin.TaskResourceUsage{
				Timestamp: time.Now(),
				CPU:       plugin.CPUUsage{Percent: 1.5, Measured: []plugin.CPUField{plugin.CPUPercent}},
				Memory:    plugin.MemoryUsage{RSS: rss, Measured: []plugin.MemoryField{plugin.MemoryRSS}},
			}
			select {
			case ch <- u:
			case <-ctx.Done():
				return
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			case <-t.done:
				return
			}
		}
	}()
	return ch, nil
}

func residentBytes(pid int) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("pid %d: no VmRSS (exited)", pid)
}

func (d *procDriver) TaskEvents(ctx context.Context) (<-chan *plugin.TaskEvent, error) {
	ch := make(chan *plugin.TaskEvent, 16)
	d.mu.Lock()
	d.events = append(d.events, ch)
	d.mu.Unlock()
	out := make(chan *plugin.TaskEvent)
	go func() {
		defer close(out)
		for {
			select {
			case ev := <-ch:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func (d *procDriver) SignalTask(_ context.Context, id, signal string) error {
	t, err := d.task(id)
	if err != nil {
		return err
	}
	sig, err := lookupSignal(signal)
	if err != nil {
		return err
	}
	return t.cmd.Process.Signal(sig)
}

func lookupSignal(name string) (syscall.Signal, error) {
	switch strings.ToUpper(name) {
	case "SIGTERM":
		return syscall.SIGTERM, nil
	case "SIGINT":
		return syscall.SIGINT, nil
	case "SIGUSR1":
		return syscall.SIGUSR1, nil
	case "SIGKILL":
		return syscall.SIGKILL, nil
	}
	return 0, fmt.Errorf("unknown signal %q; use SIGTERM, SIGINT, SIGUSR1 or SIGKILL", name)
}
