package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	log "github.com/hashicorp/go-hclog"
	cstructs "github.com/hashicorp/nomad/client/structs"
	"github.com/hashicorp/nomad/plugins/drivers"
)

// TaskState is the driver state Nomad stores with a task and hands back to
// RecoverTask after a client restart.
type TaskState struct {
	TaskConfig   *drivers.TaskConfig
	Pid          int // the supervisor; also the process group ID
	StartTicks   uint64
	StartedAt    time.Time
	ExitFile     string
	ProgressFile string
}

// clockTicks is USER_HZ, the unit of /proc CPU times; 100 on every Linux
// architecture Nomad supports.
const clockTicks = 100

// taskHandle is one training process: its supervisor, its state, the
// progress it reports.
type taskHandle struct {
	logger   log.Logger
	cfg      *drivers.TaskConfig
	state    TaskState
	procRoot string
	// cmd is the supervisor when this driver started it; nil after
	// RecoverTask, when the driver polls /proc instead of waiting.
	cmd        *exec.Cmd
	pollEvery  time.Duration
	eventEvery time.Duration
	emit       func(*drivers.TaskEvent)

	mu          sync.RWMutex
	procState   drivers.TaskState
	completedAt time.Time
	exitResult  *drivers.ExitResult
	progress    *Progress
	doneCh      chan struct{}
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

// run waits for the supervisor to end and records the exit result.
func (h *taskHandle) run(ctx context.Context) {
	var res *drivers.ExitResult
	if h.cmd != nil {
		res = h.waitChild()
	} else {
		res = h.pollRecovered(ctx)
		if res == nil {
			return // driver shutting down; the process keeps running
		}
	}
	h.mu.Lock()
	h.procState = drivers.TaskStateExited
	h.exitResult = res
	h.completedAt = time.Now()
	h.mu.Unlock()
	close(h.doneCh)
}

func (h *taskHandle) waitChild() *drivers.ExitResult {
	err := h.cmd.Wait()
	if st, rerr := readExitStatus(h.state.ExitFile); rerr == nil {
		return st.result()
	}
	// No exit file: the supervisor itself was killed (SIGKILL on the
	// group after the kill timeout) or could not record it.
	res := &drivers.ExitResult{}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Signal = int(ws.Signal())
			res.ExitCode = 128 + res.Signal
		} else {
			res.ExitCode = ee.ExitCode()
		}
	} else if err != nil {
		res.ExitCode, res.Err = -1, fmt.Errorf("waiting for the training process: %w", err)
	}
	return res
}

// pollRecovered watches a supervisor this driver did not start; it
// returns nil when ctx ends first.
func (h *taskHandle) pollRecovered(ctx context.Context) *drivers.ExitResult {
	t := time.NewTicker(h.pollEvery)
	defer t.Stop()
	for alive(h.procRoot, h.state.Pid, h.state.StartTicks) {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
	st, err := readExitStatus(h.state.ExitFile)
	if err != nil {
		return &drivers.ExitResult{ExitCode: -1, Err: fmt.Errorf("training process ended while the driver was away and left no exit status (%v)", err)}
	}
	return st.result()
}

func (st *exitStatus) result() *drivers.ExitResult {
	res := &drivers.ExitResult{ExitCode: st.ExitCode, Signal: st.Signal}
	if st.Err != "" {
		res.Err = errors.New(st.Err)
	}
	return res
}

// signal sends sig to the task's process group, unless it already ended
// (its pid may then belong to someone else).
func (h *taskHandle) signal(sig syscall.Signal) error {
	if !h.running() {
		return nil
	}
	if h.cmd == nil && !alive(h.procRoot, h.state.Pid, h.state.StartTicks) {
		return nil
	}
	if err := syscall.Kill(-h.state.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to process group %d: %w", sig, h.state.Pid, err)
	}
	return nil
}

// shutdown asks the process to checkpoint and exit with sig, waits up to
// timeout, then kills the whole group.
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
	if err := h.signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-h.doneCh:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("process group %d still running 10s after SIGKILL", h.state.Pid)
	}
}

// watchProgress reads the progress file every pollEvery and publishes it
// as task events: at once when a new checkpoint appears, otherwise every
// eventEvery; and once more after the process ends.
func (h *taskHandle) watchProgress(ctx context.Context) {
	t := time.NewTicker(h.pollEvery)
	defer t.Stop()
	var lastEvent time.Time
	var lastCkpt string
	var lastSteps int64 = -1
	check := func(final bool) {
		p, err := ReadProgress(h.state.ProgressFile)
		if err != nil {
			if !os.IsNotExist(err) {
				h.logger.Debug("progress file unreadable", "error", err)
			}
			return
		}
		h.mu.Lock()
		h.progress = p
		h.mu.Unlock()
		switch {
		case p.Checkpoint != "" && p.Checkpoint != lastCkpt:
			h.publish(p.message("checkpoint saved"), p)
			lastCkpt, lastEvent = p.Checkpoint, time.Now()
		case final && p.StepsDone != lastSteps:
			h.publish(p.message("final progress"), p)
		case !final && time.Since(lastEvent) >= h.eventEvery && p.StepsDone != lastSteps:
			h.publish(p.message("progress"), p)
			lastEvent = time.Now()
		default:
			return
		}
		lastSteps = p.StepsDone
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

func (h *taskHandle) publish(msg string, p *Progress) {
	h.emit(&drivers.TaskEvent{
		TaskID:      h.cfg.ID,
		TaskName:    h.cfg.Name,
		AllocID:     h.cfg.AllocID,
		Timestamp:   time.Now(),
		Message:     msg,
		Annotations: p.Annotations(),
	})
}

// stats reports CPU and memory of the task's process group every
// interval.
func (h *taskHandle) stats(ctx context.Context, interval time.Duration, out chan<- *cstructs.TaskResourceUsage) {
	defer close(out)
	pageSize := uint64(os.Getpagesize())
	var lastTicks uint64
	var lastAt time.Time
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ticks, rss, pids, err := groupUsage(h.procRoot, h.state.Pid)
		now := time.Now()
		if err == nil {
			pct := 0.0
			if !lastAt.IsZero() && ticks >= lastTicks {
				pct = 100 * float64(ticks-lastTicks) / clockTicks / now.Sub(lastAt).Seconds()
			}
			lastTicks, lastAt = ticks, now
			usage := &cstructs.TaskResourceUsage{
				ResourceUsage: &cstructs.ResourceUsage{
					MemoryStats: &cstructs.MemoryStats{RSS: uint64(rss) * pageSize, Measured: []string{"RSS"}},
					CpuStats:    &cstructs.CpuStats{Percent: pct, TotalTicks: float64(ticks), Measured: []string{"Percent", "Total Ticks"}},
				},
				Timestamp: now.UnixNano(),
				Pids:      map[string]*cstructs.ResourceUsage{},
			}
			for _, p := range pids {
				usage.Pids[fmt.Sprint(p.pid)] = &cstructs.ResourceUsage{
					MemoryStats: &cstructs.MemoryStats{RSS: uint64(p.rssPages) * pageSize, Measured: []string{"RSS"}},
					CpuStats:    &cstructs.CpuStats{TotalTicks: float64(p.ticks), Measured: []string{"Total Ticks"}},
				}
			}
			select {
			case out <- usage:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
