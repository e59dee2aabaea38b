package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	log "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/drivers/shared/executor"
	"github.com/hashicorp/nomad/plugins/drivers"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"
)

// TaskState is the driver state Nomad stores with a task and hands back to
// RecoverTask after a client restart: enough to reattach to the task's
// executor, which outlives the plugin.
type TaskState struct {
	ReattachConfig *pstructs.ReattachConfig
	TaskConfig     *drivers.TaskConfig
	// Pid is the training process; it leads its own process group.
	Pid          int
	StartedAt    time.Time
	ProgressFile string
	// ProgressMirror is where the progress is copied inside the alloc
	// dir when ProgressFile lies outside it; "" otherwise.
	ProgressMirror string
}

// taskHandle is one training process: its executor, its state, the
// progress it reports.
type taskHandle struct {
	logger       log.Logger
	cfg          *drivers.TaskConfig
	state        TaskState
	exec         executor.Executor
	pluginClient *plugin.Client
	pollEvery    time.Duration
	emit         func(*drivers.TaskEvent)
	// recovered: the driver reattached after a restart, so what the
	// progress file says at first was published before.
	recovered bool

	mu          sync.RWMutex
	procState   drivers.TaskState
	completedAt time.Time
	exitResult  *drivers.ExitResult
	progress    *Progress
	// stopAt is when a stop (or any signal) was sent: a checkpoint seen
	// after it is the one the contract asks for.
	stopAt time.Time
	doneCh chan struct{}
}

func (h *taskHandle) status() *drivers.TaskStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	attrs := map[string]string{"pid": fmt.Sprint(h.state.Pid), "progress_file": h.state.ProgressFile}
	if h.progress != nil {
		for k, v := range h.progress.Annotations() {
			attrs[k] = v
		}
	}
	return &drivers.TaskStatus{
		ID:               h.cfg.ID,
		Name:             h.cfg.Name,
		State:            h.procState,
		StartedAt:        h.state.StartedAt,
		CompletedAt:      h.completedAt,
		ExitResult:       h.exitResult.Copy(),
		DriverAttributes: attrs,
	}
}

func (h *taskHandle) running() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.procState == drivers.TaskStateRunning
}

// run waits for the process to end, through the executor, and records the
// exit result.
func (h *taskHandle) run() {
	ps, err := h.exec.Wait(context.Background())
	res := &drivers.ExitResult{}
	completed := time.Now()
	state := drivers.TaskStateExited
	if err != nil {
		// The executor is gone (killed, or the machine restarted under a
		// recovered task): the exit status is lost with it.
		res.ExitCode, res.Err = -1, fmt.Errorf("executor: %w", err)
		state = drivers.TaskStateUnknown
	} else {
		res.ExitCode, res.Signal, completed = ps.ExitCode, ps.Signal, ps.Time
		// The executor reports OOM kills only with libcontainer; read the
		// task's cgroup instead.
		res.OOMKilled = ps.OOMKilled || oomKilled(h.cfg)
	}
	h.mu.Lock()
	h.procState, h.exitResult, h.completedAt = state, res, completed
	h.mu.Unlock()
	close(h.doneCh)
}

// signal sends sig to the task's process group (the contract: helper
// processes get it too) while the process runs; afterwards its pid may
// belong to someone else.
func (h *taskHandle) signal(sig syscall.Signal) error {
	if !h.running() {
		return nil
	}
	h.mu.Lock()
	if h.stopAt.IsZero() {
		h.stopAt = time.Now()
	}
	h.mu.Unlock()
	if err := syscall.Kill(-h.state.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to process group %d: %w", sig, h.state.Pid, err)
	}
	return nil
}

// shutdown asks the process to checkpoint and exit with sig, waits up to
// timeout, then has the executor kill the whole group.
func (h *taskHandle) shutdown(sig syscall.Signal, timeout time.Duration) error {
	if err := h.signal(sig); err != nil {
		return err
	}
	select {
	case <-h.doneCh:
		return nil
	case <-time.After(timeout):
	}
	h.logger.Warn("training process did not exit within the kill timeout; killing its process group", "timeout", timeout)
	if err := h.exec.Shutdown("SIGKILL", 0); err != nil && !h.pluginClient.Exited() {
		return fmt.Errorf("executor: kill process group %d: %w", h.state.Pid, err)
	}
	select {
	case <-h.doneCh:
		return nil
	case <-time.After(20 * time.Second):
		return fmt.Errorf("process group %d still running 20s after SIGKILL", h.state.Pid)
	}
}

// watchProgress reads the progress file every pollEvery, keeps the last
// one for InspectTask, copies it into the alloc dir when the process
// writes it elsewhere, and publishes the few task events of
// progressEvents. It reads once more after the process ends.
func (h *taskHandle) watchProgress(ctx context.Context) {
	t := time.NewTicker(h.pollEvery)
	defer t.Stop()
	ev := progressEvents{started: h.state.StartedAt, primed: h.recovered}
	check := func(final bool) {
		p, err := ReadProgress(h.state.ProgressFile)
		if err != nil && !os.IsNotExist(err) {
			h.logger.Debug("progress file unreadable", "error", err)
		}
		if err == nil {
			h.mu.Lock()
			h.progress = p
			h.mu.Unlock()
			if h.state.ProgressMirror != "" {
				if err := writeJSONAtomic(h.state.ProgressMirror, p.raw); err != nil {
					h.logger.Debug("progress not copied into the alloc dir", "error", err)
				}
			}
		}
		h.mu.RLock()
		stopAt := h.stopAt
		h.mu.RUnlock()
		for _, e := range ev.next(p, !stopAt.IsZero(), final) {
			h.publish(e.message, e.details)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.doneCh:
			check(true)
			return
		case <-t.C:
			check(false)
		}
	}
}

func (h *taskHandle) publish(msg string, details map[string]string) {
	h.emit(&drivers.TaskEvent{
		TaskID:      h.cfg.ID,
		TaskName:    h.cfg.Name,
		AllocID:     h.cfg.AllocID,
		Timestamp:   time.Now(),
		Message:     msg,
		Annotations: details,
	})
}

// writeJSONAtomic writes b to path through a temporary file and a rename,
// so a reader (the sidecar, through the alloc filesystem) never sees half
// a file.
func writeJSONAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
