package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// SupervisorArg is the first argument that makes the hadar-train binary
// act as a task's supervisor instead of serving the plugin.
const SupervisorArg = "supervise"

// exitStatus is what the supervisor leaves behind when the training
// process ends, so a driver that restarted meanwhile (and so is no longer
// the supervisor's parent) still learns the exit code.
type exitStatus struct {
	ExitCode   int       `json:"exit_code"`
	Signal     int       `json:"signal"`
	FinishedAt time.Time `json:"finished_at"`
	Err        string    `json:"error,omitempty"`
}

// Supervise runs argv[1:] and records how it ended in argv[0]; it returns
// the exit code to end with. It shares the training process's process
// group, so a signal to the group reaches the training process; the
// supervisor itself catches and ignores those signals (a caught handler,
// unlike an ignored one, is reset in the child by exec) and ends only when
// the training process does, or when SIGKILL hits the group.
func Supervise(argv []string) int {
	if len(argv) < 2 {
		fmt.Fprintln(os.Stderr, "hadar-train supervise: want <exit-file> <command> [args...]")
		return 2
	}
	exitFile, command, args := argv[0], argv[1], argv[2:]
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for range sigs {
		}
	}()
	// fd 3 is the driver's readiness pipe: once written, the driver knows
	// signals aimed at the group will not kill the supervisor.
	syscall.CloseOnExec(3) // keep the pipe out of the training process
	ready := os.NewFile(3, "ready")
	cmd := exec.Command(command, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	st := exitStatus{}
	err := cmd.Start()
	if ready != nil {
		if err != nil {
			fmt.Fprintf(ready, "start failed: %v\n", err)
		} else {
			fmt.Fprintln(ready, "started")
		}
		ready.Close()
	}
	if err == nil {
		err = cmd.Wait()
	}
	st.FinishedAt = time.Now().UTC()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		ws, _ := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			st.Signal = int(ws.Signal())
			st.ExitCode = 128 + st.Signal
		} else {
			st.ExitCode = ws.ExitStatus()
		}
	default:
		// The program could not be started: say so in the task's stderr
		// (Nomad's log) and in the exit status.
		fmt.Fprintf(os.Stderr, "hadar-train: cannot start %q: %v\n", command, err)
		st.ExitCode, st.Err = 127, err.Error()
	}
	if werr := writeJSONAtomic(exitFile, st); werr != nil {
		fmt.Fprintf(os.Stderr, "hadar-train: cannot record exit status: %v\n", werr)
	}
	return st.ExitCode
}

func writeJSONAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
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
	return os.Rename(tmp.Name(), path)
}

func readExitStatus(path string) (*exitStatus, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var st exitStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("exit status %s: %w", path, err)
	}
	return &st, nil
}
