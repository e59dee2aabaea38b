package supervise

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hadar-sched/hadar/driver/supervise/cgroup"
)

// ErrExited is returned by Signal once the task's program has ended.
var ErrExited = errors.New("the task has exited")

// ErrGone is returned by Attach when neither the supervisor nor the task
// is running and no result was recorded: there is nothing to attach to.
var ErrGone = errors.New("the task and its supervisor are gone")

// State is what a driver keeps to reattach to a task after a restart.
type State struct {
	StateDir   string        `json:"state_dir"`
	Supervisor Proc          `json:"supervisor"`
	Task       Proc          `json:"task"`
	Cgroup     *cgroup.State `json:"cgroup,omitempty"`
	StartedAt  time.Time     `json:"started_at"`
	// BootID is the kernel's boot id when the task started: start ticks
	// count from boot, so after a reboot a pid with the same ones may be
	// another process. "" in a state from before it was recorded.
	BootID string `json:"boot_id,omitempty"`
}

// Handle is a running (or ended) task under its supervisor. Its methods
// may be called from several goroutines.
type Handle struct {
	state State
	cg    *cgroup.Group

	mu sync.Mutex
	// supFD and taskFD are pidfds on the supervisor and the task's
	// program; -1 once gone or closed.
	supFD, taskFD int
	result        *Result
	// reaped is closed once the supervisor, when this process started it,
	// has been waited for (nil after Attach: it is not our child).
	reaped chan struct{}
}

// State is the handle's serialisable form, for Attach.
func (h *Handle) State() State {
	st := h.state
	if st.Cgroup != nil {
		c := h.cg.State()
		st.Cgroup = &c
	}
	return st
}

// Start writes spec into its state directory and starts a supervisor,
// this binary run as "<binary> supervise <spec-file>" in a session of its
// own, which starts the program. It returns once the program runs, or
// with the reason it could not start (not found, not executable by the
// task's user, a cgroup that cannot be made), and then leaves nothing
// running and no state directory.
func Start(ctx context.Context, spec Spec) (*Handle, error) {
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("supervise: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("supervise: find this binary to run as the supervisor: %w", err)
	}
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("supervise: state_dir: %w", err)
	}
	if err := checkPrivate(spec.StateDir); err != nil {
		os.Remove(spec.StateDir) // only if empty; never through a link
		return nil, fmt.Errorf("supervise: %w", err)
	}
	h, err := start(ctx, self, &spec)
	if err != nil {
		os.RemoveAll(spec.StateDir)
		return nil, err
	}
	return h, nil
}

// checkPrivate makes sure no one but this user can swap the state
// directory, or a file in it, for a link: the supervisor writes there as
// root.
func checkPrivate(dir string) error {
	for _, p := range []string{dir, filepath.Dir(dir)} {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || (p == dir || fi.Mode()&os.ModeSticky == 0) && fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("state_dir %s: %s must be a directory of uid %d that no one else can write (no directory of a task's is: Nomad makes them, private/ included, writable by the task; use one only the driver writes, e.g. under /var/lib/hadar)", dir, p, os.Geteuid())
		}
	}
	return nil
}

func start(ctx context.Context, self string, spec *Spec) (*Handle, error) {
	dir := spec.StateDir
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("supervise: state_dir: %w", err)
	}
	// A restarted task reuses its state directory: the last run's result
	// must not pass for this one's.
	if err := os.Remove(filepath.Join(dir, resultFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("supervise: stale result: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	specPath := filepath.Join(dir, specFile)
	// 0600: the spec holds the task's environment, secrets included.
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		return nil, fmt.Errorf("supervise: write spec: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, logFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("supervise: log: %w", err)
	}
	defer logf.Close()
	reportR, reportW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer reportR.Close()
	defer reportW.Close()
	ackR, ackW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer ackR.Close()
	defer ackW.Close()

	pidfd := -1
	cmd := &exec.Cmd{
		Path: self,
		Args: []string{self, Command, specPath},
		// Nothing of the caller's environment: the task's is in the spec.
		Env:        []string{},
		Dir:        "/",
		Stdout:     logf,
		Stderr:     logf,
		ExtraFiles: []*os.File{reportW, ackR}, // reportFD, ackFD
		// Setsid: neither the plugin's process group nor its session's
		// end reach the supervisor.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("supervise: start the supervisor %s: %w", self, err)
	}
	reportW.Close()
	ackR.Close()
	// Its identity is read before anything reaps it: a supervisor that
	// fails at once (a planted output path) may have exited already, and
	// only until it is reaped does /proc keep its entry, so reaping first
	// would hide its report behind "no such file".
	sup, err := procOf(cmd.Process.Pid)
	h := &Handle{supFD: pidfd, taskFD: -1, reaped: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(h.reaped)
	}()
	if err != nil {
		h.abort(false)
		return nil, fmt.Errorf("supervise: supervisor pid %d: %w", cmd.Process.Pid, err)
	}

	stop := context.AfterFunc(ctx, func() { _ = reportR.SetReadDeadline(time.Now()) })
	b, err = io.ReadAll(reportR)
	stop()
	// The whole report read: the supervisor closed its end and waits
	// for the acknowledgement (or exits, if it reported an error).
	reported := err == nil
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	var r report
	if err == nil {
		if err = json.Unmarshal(b, &r); err != nil {
			err = fmt.Errorf("supervisor (pid %d) ended before it reported: %s", sup.PID, logTail(dir))
		}
	}
	if err == nil && r.Error != "" {
		err = errors.New(r.Error)
	}
	if err == nil {
		_, err = ackW.Write([]byte{ackByte})
	}
	if err != nil {
		// The supervisor, unacknowledged, kills the task if it started
		// and removes its cgroup.
		ackW.Close()
		h.abort(reported)
		return nil, fmt.Errorf("supervise: %w", err)
	}
	ackW.Close()
	h.state = State{StateDir: dir, Supervisor: sup, Task: r.Task, Cgroup: r.Cgroup, StartedAt: r.StartedAt, BootID: bootID()}
	if r.Cgroup != nil {
		h.cg = cgroup.FromState(*r.Cgroup)
	}
	if h.taskFD, err = r.Task.pidfd(); err != nil {
		// A program that ended already: its result will tell.
		h.taskFD = -1
	}
	return h, nil
}

// abort makes a supervisor that Start gives up on clean up and exit: one
// that reported waits for the acknowledgement, whose absence makes it
// kill the task and remove its cgroup; one that did not gets SIGTERM,
// which makes it undo what it did so far. Only if it does not exit in
// killGrace is it killed.
func (h *Handle) abort(reported bool) {
	ctx, cancel := context.WithTimeout(context.Background(), killGrace)
	defer cancel()
	if !reported {
		_ = unix.PidfdSendSignal(h.supFD, unix.SIGTERM, nil, 0)
	}
	if waitExit(ctx, h.supFD) != nil {
		_ = unix.PidfdSendSignal(h.supFD, unix.SIGKILL, nil, 0)
	}
	<-h.reaped
	h.Close()
}

// Attach returns the handle of a task a supervisor runs (or ran), from
// the State of an earlier handle, after the process that held it
// restarted. A pid that now names another process (its start time
// differs) is not taken for the supervisor or the task. It fails with
// ErrGone when neither is running and no result was recorded.
func Attach(ctx context.Context, st State) (*Handle, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if st.StateDir == "" {
		return nil, errors.New("supervise: attach: state has no state_dir")
	}
	h := &Handle{state: st, supFD: -1, taskFD: -1}
	if st.Cgroup != nil {
		h.cg = cgroup.FromState(*st.Cgroup)
	}
	var err error
	// From another boot, both are gone whatever their pids name now.
	if st.BootID == "" || st.BootID == bootID() {
		if h.supFD, err = st.Supervisor.pidfd(); err != nil && !errors.Is(err, errGone) {
			return nil, fmt.Errorf("supervise: attach: supervisor: %w", err)
		}
		if h.taskFD, err = st.Task.pidfd(); err != nil && !errors.Is(err, errGone) {
			h.Close()
			return nil, fmt.Errorf("supervise: attach: task: %w", err)
		}
	}
	if h.supFD < 0 && h.taskFD < 0 {
		if _, err := readResult(st.StateDir); err != nil {
			return nil, fmt.Errorf("supervise: attach: %w: supervisor pid %d and task pid %d are not running (or are other processes now) and %s has no result (%v)", ErrGone, st.Supervisor.PID, st.Task.PID, st.StateDir, err)
		}
	}
	return h, nil
}

// dup returns a copy of *fd for a wait, so that Close can close the
// handle's own while the wait goes on; -1 if none.
func (h *Handle) dup(fd *int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if *fd < 0 {
		return -1
	}
	d, err := unix.FcntlInt(uintptr(*fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return d
}

// Wait blocks until the task has ended and its supervisor recorded how
// and exited, or ctx ends. It works as well on a handle from Attach.
func (h *Handle) Wait(ctx context.Context) (Result, error) {
	h.mu.Lock()
	if h.result != nil {
		defer h.mu.Unlock()
		return *h.result, nil
	}
	h.mu.Unlock()
	if fd := h.dup(&h.supFD); fd >= 0 {
		err := waitExit(ctx, fd)
		unix.Close(fd)
		if err != nil {
			return Result{}, err
		}
	}
	r, err := readResult(h.state.StateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Result{}, fmt.Errorf("supervise: %w", err)
	}
	if err != nil {
		// The supervisor died without a word (killed); the program may
		// run on, and its exit status, reported only to its parent, is
		// lost.
		if fd := h.dup(&h.taskFD); fd >= 0 {
			err := waitExit(ctx, fd)
			unix.Close(fd)
			if err != nil {
				return Result{}, err
			}
		}
		r = Result{
			ExitCode: -1, StartedAt: h.state.StartedAt, ExitedAt: time.Now(),
			Err: fmt.Sprintf("the supervisor (pid %d) ended without recording how the task (pid %d) ended; its exit status is lost (see %s)",
				h.state.Supervisor.PID, h.state.Task.PID, filepath.Join(h.state.StateDir, logFile)),
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.result == nil {
		h.result = &r
	}
	return *h.result, nil
}

// Signal sends sig to the task's process group (the program and what it
// started, unless they left the group). ErrExited once the program ended.
func (h *Handle) Signal(sig syscall.Signal) error {
	fd := h.dup(&h.taskFD)
	if fd < 0 {
		return ErrExited
	}
	defer unix.Close(fd)
	if exited(fd) {
		return ErrExited
	}
	// The program lives (its pidfd says), so its pid is still its own
	// (not reaped) and getpgid tells whether it is still in the group
	// it leads. One that left it (setpgid into another group of its
	// session) gets the signal through its pidfd, and what is left in
	// its old group too: ESRCH on the group is not the task's end.
	pid := h.state.Task.PID
	if pg, err := unix.Getpgid(pid); err == nil && pg == pid {
		if err := unix.Kill(-pid, sig); err == nil {
			return nil
		} else if !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("supervise: signal %v to process group %d: %w", sig, pid, err)
		}
	} else if err := unix.Kill(-pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("supervise: signal %v to process group %d: %w", sig, pid, err)
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return ErrExited
		}
		return fmt.Errorf("supervise: signal %v to the task (pid %d, out of its process group): %w", sig, pid, err)
	}
	return nil
}

// Stop sends sig to the task's process group, waits up to timeout for
// the program to end, then kills every process of the task (its cgroup,
// or its process group without one) and waits for the supervisor to
// record the end.
func (h *Handle) Stop(ctx context.Context, sig syscall.Signal, timeout time.Duration) error {
	if err := h.Signal(sig); err != nil && !errors.Is(err, ErrExited) {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	_, err := h.Wait(wctx)
	cancel()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := h.kill(ctx); err != nil {
		return err
	}
	_, err = h.Wait(ctx)
	return err
}

// kill sends SIGKILL to every process of the task.
func (h *Handle) kill(ctx context.Context) error {
	if h.cg != nil && h.cg.Exists() {
		if err := h.cg.Kill(ctx); err != nil {
			return fmt.Errorf("supervise: %w", err)
		}
		return nil
	}
	if err := h.Signal(unix.SIGKILL); err != nil && !errors.Is(err, ErrExited) {
		return err
	}
	return nil
}

// Stats is the task's resource usage, from its cgroup.
func (h *Handle) Stats() (cgroup.Stats, error) {
	if h.cg == nil {
		return cgroup.Stats{}, errors.New("supervise: the task runs without a cgroup: no statistics")
	}
	return h.cg.Stats()
}

// Destroy kills whatever is left of the task, lets its supervisor record
// the end (or kills it after killGrace), removes the cgroup the supervisor
// made and the state directory, and closes the handle.
func (h *Handle) Destroy(ctx context.Context) error {
	var errs []error
	if err := h.kill(ctx); err != nil {
		errs = append(errs, err)
	}
	if fd := h.dup(&h.supFD); fd >= 0 {
		wctx, cancel := context.WithTimeout(ctx, killGrace)
		if waitExit(wctx, fd) != nil {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			if err := waitExit(ctx, fd); err != nil {
				errs = append(errs, fmt.Errorf("supervise: supervisor pid %d not gone after SIGKILL: %w", h.state.Supervisor.PID, err))
			}
		}
		cancel()
		unix.Close(fd)
	}
	if h.reaped != nil {
		select {
		case <-h.reaped:
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	}
	if h.cg != nil {
		if err := h.cg.Remove(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(h.state.StateDir); err != nil {
		errs = append(errs, fmt.Errorf("supervise: remove state dir: %w", err))
	}
	h.Close()
	return errors.Join(errs...)
}

// Close lets go of the handle's descriptors; the task and its supervisor
// run on (a driver shutting down calls it, and Attach later).
func (h *Handle) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fd := range []*int{&h.supFD, &h.taskFD} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}
