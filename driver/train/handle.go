package train

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	log "github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/confine"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/supervise"
)

// maxProgressBytes bounds what the driver reads of a progress file: the
// file is the task's, and the driver must not be made to read gigabytes.
const maxProgressBytes = 1 << 20

// taskHandle is one training process: its supervisor, its state, the
// progress it reports.
type taskHandle struct {
	logger    log.Logger
	id        string
	name      string
	allocID   string
	state     driverState
	sup       *supervise.Handle
	pollEvery time.Duration
	emit      func(*plugin.TaskEvent)
	// recovered: the driver reattached after a restart, so what the
	// progress file says at first was published before.
	recovered bool

	mu          sync.RWMutex
	procState   plugin.TaskState
	completedAt time.Time
	exitResult  *plugin.ExitResult
	progress    *contract.Progress
	// stopAt is when a stop (or any signal) was sent: a checkpoint seen
	// after it is the one the contract asks for.
	stopAt time.Time
	doneCh chan struct{}
}

func (h *taskHandle) status() *plugin.TaskStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	attrs := map[string]string{
		"pid":           strconv.Itoa(h.state.Supervise.Task.PID),
		"supervisor":    strconv.Itoa(h.state.Supervise.Supervisor.PID),
		"progress_file": filepath.Join(h.state.TaskDir, h.state.Progress),
	}
	if h.progress != nil {
		for k, v := range annotations(h.progress) {
			attrs[k] = v
		}
	}
	var res *plugin.ExitResult
	if h.exitResult != nil {
		r := *h.exitResult
		res = &r
	}
	return &plugin.TaskStatus{
		ID:               h.id,
		Name:             h.name,
		State:            h.procState,
		StartedAt:        h.state.StartedAt,
		CompletedAt:      h.completedAt,
		ExitResult:       res,
		DriverAttributes: attrs,
	}
}

func (h *taskHandle) running() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.procState == plugin.TaskStateRunning
}

// run waits for the task to end, through its supervisor, and records
// the exit result; it gives up when ctx (the driver's) ends.
func (h *taskHandle) run(ctx context.Context) {
	r, err := h.sup.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		return
	}
	res := &plugin.ExitResult{}
	state := plugin.TaskStateExited
	completed := time.Now()
	switch {
	case err != nil:
		res.ExitCode, res.Err = -1, fmt.Errorf("supervisor: %w", err)
		state = plugin.TaskStateUnknown
	default:
		res.ExitCode, res.Signal, res.OOMKilled = r.ExitCode, r.Signal, r.OOMKilled
		if !r.ExitedAt.IsZero() {
			completed = r.ExitedAt
		}
		if r.Err != "" {
			res.Err = errors.New(r.Err)
			state = plugin.TaskStateUnknown
		}
	}
	h.mu.Lock()
	h.procState, h.exitResult, h.completedAt = state, res, completed
	h.mu.Unlock()
	close(h.doneCh)
}

// result is the exit result once the task ended.
func (h *taskHandle) result() *plugin.ExitResult {
	h.mu.RLock()
	defer h.mu.RUnlock()
	r := *h.exitResult
	return &r
}

func (h *taskHandle) markStop() {
	h.mu.Lock()
	if h.stopAt.IsZero() {
		h.stopAt = time.Now()
	}
	h.mu.Unlock()
}

// signal sends sig to the task's process group (the contract: helper
// processes get it too) while the process runs.
func (h *taskHandle) signal(sig syscall.Signal) error {
	if !h.running() {
		return nil
	}
	h.markStop()
	if err := h.sup.Signal(sig); err != nil && !errors.Is(err, supervise.ErrExited) {
		return err
	}
	return nil
}

// shutdown asks the process to checkpoint and exit with sig, waits up to
// timeout, then has every process of the task killed, and waits for the
// end to be recorded.
func (h *taskHandle) shutdown(ctx context.Context, sig syscall.Signal, timeout time.Duration) error {
	if h.running() {
		h.markStop()
	}
	if err := h.sup.Stop(ctx, sig, timeout); err != nil {
		return fmt.Errorf("stop task %s: %w", h.name, err)
	}
	select {
	case <-h.doneCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchProgress reads the progress file every pollEvery, keeps the last
// one for InspectTask, copies it to local/hadar-progress.json when the
// process writes it elsewhere, and publishes the few task events of
// progressEvents. It reads once more after the process ends. Every read
// and write is confined to the task directory (see readProgress).
func (h *taskHandle) watchProgress(ctx context.Context) {
	t := time.NewTicker(h.pollEvery)
	defer t.Stop()
	ev := progressEvents{started: h.state.StartedAt, primed: h.recovered, reattached: time.Now(), olderThan: h.checkpointOlderThan}
	check := func(final bool) {
		p, err := h.readProgress()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			h.logger.Debug("progress file unreadable", "error", err)
		}
		if err == nil {
			h.mu.Lock()
			h.progress = p
			h.mu.Unlock()
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
			h.endRun()
			return
		case <-t.C:
			check(false)
		}
	}
}

// readProgress reads the progress file as the driver (root): below the
// task directory, never through a link, a regular file with one link
// (so not a hard link to a file of someone else's), at most
// maxProgressBytes; and mirrors it into the alloc filesystem's path.
func (h *taskHandle) readProgress() (*contract.Progress, error) {
	td, err := openTaskDir(h.state.TaskDir)
	if err != nil {
		return nil, err
	}
	defer td.Close()
	b, err := td.ReadFile("progress_file", h.state.Progress, maxProgressBytes)
	if err != nil {
		return nil, err
	}
	p, err := contract.ParseProgress(b)
	if err != nil {
		return nil, fmt.Errorf("progress file %s: %w", h.state.Progress, err)
	}
	if h.state.Mirror {
		if err := td.WriteFile("progress copy", progressRel, b, 0o644); err != nil {
			h.logger.Debug("progress not copied into the alloc dir", "error", err)
		}
	}
	return p, nil
}

// checkpointOlderThan tells whether the checkpoint a progress file
// names was last written before t (one the process found when it
// started). Only a path in the task's checkpoint directory is looked at,
// and without following a link: the path is the task's to write.
func (h *taskHandle) checkpointOlderThan(path string, t time.Time) bool {
	if h.state.Checkpoint == "" || h.state.CheckpointBase == "" || !filepath.IsAbs(path) {
		return false
	}
	if rel, err := filepath.Rel(h.state.Checkpoint, filepath.Clean(path)); err != nil || rel == ".." || len(rel) > 2 && rel[:3] == "../" {
		return false
	}
	// A handle of an earlier release has the allocation's data directory as
	// its base: every task's, so reached without following a link.
	var base *confine.Dir
	var err error
	if alloc := filepath.Dir(filepath.Clean(h.state.TaskDir)); strings.HasPrefix(h.state.CheckpointBase, alloc+"/") {
		base, err = confine.OpenBelow("checkpoint directory", alloc, h.state.CheckpointBase)
	} else {
		base, err = confine.OpenDir("checkpoint directory", h.state.CheckpointBase)
	}
	if err != nil {
		return false
	}
	defer base.Close()
	st, err := base.Lstat("checkpoint", path)
	if err != nil {
		return false
	}
	return time.Unix(st.Mtim.Unix()).Before(t)
}

func (h *taskHandle) publish(msg string, details map[string]string) {
	h.emit(&plugin.TaskEvent{
		TaskID:      h.id,
		TaskName:    h.name,
		AllocID:     h.allocID,
		Timestamp:   time.Now(),
		Message:     msg,
		Annotations: details,
	})
}

// lookupSignal reads a signal name as Nomad sends it ("SIGTERM").
func lookupSignal(name string) (syscall.Signal, error) {
	s := unix.SignalNum(normalizeSignal(name))
	if s == 0 {
		return 0, fmt.Errorf("unknown signal %q; use a name such as SIGTERM or SIGINT", name)
	}
	return s, nil
}
