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
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	log "github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hadar-sched/hadar/driver/confine"
	"github.com/hadar-sched/hadar/driver/supervise/cgroup"
)

// Command is the subcommand that makes the driver's binary a supervisor:
// "<binary> supervise <spec-file>". The binary's main calls Main with the
// arguments after it.
const Command = "supervise"

// The descriptors Start gives the supervisor besides stdin/out/err: it
// reports on the first whether the task started, and reads Start's
// acknowledgement on the second.
const (
	reportFD = 3
	ackFD    = 4
	ackByte  = 'k'
)

// report is what the supervisor tells Start once the task started, or
// why it did not.
type report struct {
	Task      Proc          `json:"task"`
	StartedAt time.Time     `json:"started_at"`
	Cgroup    *cgroup.State `json:"cgroup,omitempty"`
	Error     string        `json:"error,omitempty"`
}

// killGrace bounds the supervisor's own cleanup: killing what is left of
// the task and removing its cgroup.
const killGrace = 30 * time.Second

// Main runs a supervisor for the spec file in args[0] and returns its
// exit status. Start runs it in a session of its own, so it and the task
// outlive the process that started them.
func Main(args []string) int {
	logger := log.New(&log.LoggerOptions{Name: "hadar-supervise", Output: os.Stderr, Level: log.Info})
	if len(args) != 1 {
		logger.Error("usage: <binary> " + Command + " <spec-file>")
		return 2
	}
	// The report descriptor must not leak into the task: Start reads it
	// to its end.
	unix.CloseOnExec(reportFD)
	unix.CloseOnExec(ackFD)
	// No terminal is attached; a hangup or a write to a closed pipe must
	// not end the supervisor before it records the task's end.
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	spec, err := readSpec(args[0])
	if err != nil {
		logger.Error("cannot read the spec", "error", err)
		sendReport(report{Error: err.Error()})
		return 1
	}
	s := &supervisor{spec: spec, logger: logger.With("command", spec.Command)}
	s.handleTerm()
	return s.run()
}

func sendReport(r report) bool {
	f := os.NewFile(reportFD, "report")
	defer f.Close()
	return json.NewEncoder(f).Encode(r) == nil
}

// acknowledged waits for Start to take the report: EOF means whoever
// started the supervisor is gone or gave up, and nobody knows the task.
func acknowledged() bool {
	f := os.NewFile(ackFD, "ack")
	defer f.Close()
	b := make([]byte, 1)
	n, _ := io.ReadFull(f, b)
	return n == 1 && b[0] == ackByte
}

type supervisor struct {
	spec   *Spec
	logger log.Logger

	// SIGTERM is Start giving up before the task was acknowledged: while
	// the outputs are being opened (a FIFO waits for its reader) nothing
	// exists yet and the supervisor just exits; later, run checks
	// cancelled between its steps and undoes them. Once the task runs,
	// SIGTERM is ignored: only the task's end ends the supervisor.
	mu        sync.Mutex
	opening   bool
	cancelled bool
}

func (s *supervisor) handleTerm() {
	s.opening = true
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM)
	go func() {
		for range c {
			s.mu.Lock()
			if s.opening {
				os.Exit(1)
			}
			s.cancelled = true
			s.mu.Unlock()
		}
	}()
}

// proceed ends the opening phase and tells whether Start still wants
// the task.
func (s *supervisor) proceed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opening = false
	return !s.cancelled
}

func (s *supervisor) run() int {
	ctx, cancel := context.WithTimeout(context.Background(), killGrace)
	defer cancel()
	if err := s.spec.validate(); err != nil {
		sendReport(report{Error: err.Error()})
		return 1
	}
	// Outputs first: opening Nomad's FIFO waits for its reader, and a
	// supervisor stopped while it waits leaves nothing behind.
	out, err := openOutputs(s.spec)
	if err != nil {
		s.logger.Error("task not started", "error", err)
		sendReport(report{Error: err.Error()})
		return 1
	}
	defer out.close()
	if !s.proceed() {
		return 1
	}
	cg, oomBefore, err := s.cgroup()
	if err != nil {
		s.logger.Error("task not started", "error", err)
		sendReport(report{Error: err.Error()})
		return 1
	}
	cleanup := func() {
		if cg == nil {
			return
		}
		if err := cg.Kill(ctx); err != nil {
			s.logger.Warn("cannot kill what is left in the task's cgroup", "error", err)
		}
		if err := cg.Remove(ctx); err != nil {
			s.logger.Warn("cgroup not removed", "error", err)
		}
	}
	cmd, err := s.start(cg, out)
	out.close()
	if err != nil {
		s.logger.Error("task not started", "error", err)
		cleanup()
		sendReport(report{Error: err.Error()})
		return 1
	}
	started := time.Now()
	pid := cmd.Process.Pid
	task, err := procOf(pid)
	if err != nil {
		// Not reaped yet, so its /proc entry is there.
		s.logger.Warn("task's start time unreadable", "pid", pid, "error", err)
	}
	r := report{Task: task, StartedAt: started}
	if cg != nil {
		st := cg.State()
		r.Cgroup = &st
	}
	if !s.proceed() || !sendReport(r) || !acknowledged() {
		s.logger.Warn("the starter went away before it took the task; killing it", "pid", pid)
		_ = unix.Kill(-pid, unix.SIGKILL)
		_ = cmd.Wait()
		cleanup()
		return 1
	}
	s.logger.Info("task started", "pid", pid)

	_ = cmd.Wait() // an exit status other than 0 is an error here; it is in ProcessState
	res := Result{ExitCode: -1, StartedAt: started, ExitedAt: time.Now()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			res.Signal = int(ws.Signal())
			res.ExitCode = 128 + res.Signal
		default:
			res.ExitCode = ws.ExitStatus()
		}
	}
	// The task is over when its program is: what it left behind goes.
	if cg == nil {
		// The group's id stays in use, so not reused, while a member lives.
		_ = unix.Kill(-pid, unix.SIGKILL)
	} else {
		if err := cg.Kill(ctx); err != nil {
			s.logger.Warn("cannot kill what is left in the task's cgroup", "error", err)
		}
		if n, err := cg.OOMKills(); err == nil {
			res.OOMKilled = n > oomBefore
		} else {
			s.logger.Warn("OOM kills unknown", "error", err)
		}
	}
	if err := writeResult(s.spec.StateDir, res); err != nil {
		s.logger.Error("result not recorded", "error", err)
	}
	s.logger.Info("task ended", "pid", pid, "exit_code", res.ExitCode, "signal", res.Signal, "oom_killed", res.OOMKilled)
	cleanup()
	return 0
}

// cgroup creates or opens the task's cgroup and applies its limits; it
// also returns the OOM kills counted so far, so that an existing cgroup's
// past is not taken for this task's.
func (s *supervisor) cgroup() (*cgroup.Group, uint64, error) {
	c := s.spec.Cgroup
	if c.none() {
		return nil, 0, nil
	}
	h := c.Hierarchy
	if h == nil {
		var err error
		if h, err = cgroup.Detect(); err != nil {
			return nil, 0, err
		}
	}
	var cg *cgroup.Group
	var err error
	if c.Path != "" {
		cg, err = cgroup.Open(h, c.Path)
	} else {
		cg, err = cgroup.Create(h, filepath.Join(c.Parent, c.Name))
	}
	if err != nil {
		return nil, 0, err
	}
	fail := func(err error) (*cgroup.Group, uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = cg.Remove(ctx)
		return nil, 0, err
	}
	if err := cg.Apply(c.Limits); err != nil {
		return fail(err)
	}
	var before uint64
	if h.Version == cgroup.V1 || !c.Limits.Zero() {
		// Without the memory controller (a v2 group with no limits)
		// there is nothing to count.
		if before, err = cg.OOMKills(); err != nil {
			return fail(err)
		}
	}
	return cg, before, nil
}

// start starts the program as the task's user, in its own process group,
// in cg. Go's fork/exec switches groups, gid and uid and enters the
// working directory in the child before exec, and reports a failure of
// any of them here.
func (s *supervisor) start(cg *cgroup.Group, out *outputs) (*exec.Cmd, error) {
	spec := s.spec
	var err error
	cmd := &exec.Cmd{
		Path:        spec.Command,
		Args:        append([]string{spec.Command}, spec.Args...),
		Env:         spec.env(),
		Dir:         spec.Dir,
		Stdin:       out.stdin,
		Stdout:      out.stdout,
		Stderr:      out.stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	u := spec.User
	if os.Geteuid() == 0 {
		groups := make([]uint32, len(u.Groups))
		for i, g := range u.Groups {
			groups[i] = uint32(g)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: groups}
	}
	if cg != nil {
		err = cg.Start(cmd)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return nil, startError(spec, err)
	}
	return cmd, nil
}

// startError says why the program could not start, and what to do.
func startError(spec *Spec, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	who := fmt.Sprintf("uid %d gid %d groups %v", spec.User.UID, spec.User.GID, spec.User.Groups)
	switch {
	case errors.Is(err, unix.ENOENT):
		if _, serr := os.Stat(spec.Dir); serr != nil {
			return fmt.Errorf("cannot start %s: working directory %s: %w", spec.Command, spec.Dir, serr)
		}
		return fmt.Errorf("cannot start %s: not found (or its interpreter is missing): %w; give the path of an existing program", spec.Command, err)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("cannot start %s in %s as %s: %w; the program must be executable by that user, and it and the working directory reachable by it (every directory above them searchable)", spec.Command, spec.Dir, who, err)
	case errors.Is(err, unix.ENOEXEC):
		return fmt.Errorf("cannot start %s: not a program this machine runs (no #! line, or another architecture): %w", spec.Command, err)
	}
	return fmt.Errorf("cannot start %s in %s as %s: %w", spec.Command, spec.Dir, who, err)
}

// outputs are the task's standard descriptors.
type outputs struct{ stdin, stdout, stderr *os.File }

func openOutputs(spec *Spec) (*outputs, error) {
	o := &outputs{}
	var err error
	if o.stdin, err = os.Open(os.DevNull); err != nil {
		return nil, err
	}
	if o.stdout, err = openOutput("stdout", spec.Stdout, spec.OutputRoot); err != nil {
		o.close()
		return nil, err
	}
	if o.stderr, err = openOutput("stderr", spec.Stderr, spec.OutputRoot); err != nil {
		o.close()
		return nil, err
	}
	return o, nil
}

// close closes the supervisor's copies (the task has its own); twice is
// harmless.
func (o *outputs) close() {
	for _, f := range []*os.File{o.stdin, o.stdout, o.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// openOutput opens Nomad's FIFO at path for the task's output (blocks
// until its reader, Nomad's logmon, is there), as root: from root (or
// path's directory) down, no link is followed, nothing is created, and
// only a FIFO is opened. A task can replace anything in alloc/logs
// (mode 0777, no sticky bit); following a link it put there would have
// root append the task's output to any file on the node.
func openOutput(name, path, root string) (*os.File, error) {
	if path == "" {
		return os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	if root == "" {
		root = filepath.Dir(path)
	}
	d, err := confine.OpenDir("output_root", root)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, path, err)
	}
	defer d.Close()
	f, err := d.OpenFIFO(name, path)
	if err != nil {
		return nil, fmt.Errorf("task output: %w", err)
	}
	return f, nil
}

// writeResult records r in dir atomically: a reader sees the whole result
// or none, even across a crash (the file and the directory are synced).
func writeResult(dir string, r Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".result-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, resultFile))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// readResult reads the result a supervisor recorded in dir.
func readResult(dir string) (Result, error) {
	var r Result
	b, err := os.ReadFile(filepath.Join(dir, resultFile))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", filepath.Join(dir, resultFile), err)
	}
	return r, nil
}

// logTail is the end of the supervisor's log, for an error message.
func logTail(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, logFile))
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}
