package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/trainer/run"
)

// buildTrainer builds this command into a temporary directory, so the tests
// exercise the real signal handling and exit status.
func buildTrainer(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not in PATH")
	}
	bin := filepath.Join(t.TempDir(), "hadar-trainer")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// trainerCmd runs bin with the contract's variables pointing into dir.
func trainerCmd(bin, dir string, extraEnv []string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HADAR_PROGRESS_FILE="+filepath.Join(dir, "progress.json"), "HADAR_CHECKPOINT_DIR="+filepath.Join(dir, "ckpt"))
	cmd.Env = append(cmd.Env, extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

func finalLine(t *testing.T, stdout string) string {
	t.Helper()
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, "final ") {
			return l
		}
	}
	t.Fatalf("no final line in stdout %q", stdout)
	return ""
}

// TestSIGTERMCheckpointsAndResumes: SIGTERM mid-run exits 0 after writing a
// checkpoint and the progress file; the restarted process resumes from that
// checkpoint's step and prints the final line of an uninterrupted run.
func TestSIGTERMCheckpointsAndResumes(t *testing.T) {
	bin := buildTrainer(t)
	args := []string{"--steps", "1500", "--seed", "3"}

	whole, stdout, stderr := trainerCmd(bin, t.TempDir(), nil, args...)
	if err := whole.Run(); err != nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, stderr)
	}
	want := finalLine(t, stdout.String())

	dir := t.TempDir()
	cmd, stdout, stderr := trainerCmd(bin, dir, []string{"HADAR_STEPS_PER_SEC=500"}, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	progressFile := filepath.Join(dir, "progress.json")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p, err := run.ReadProgress(progressFile); err == nil && p.StepsDone >= 200 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no progress past 200 steps within 20s\n%s", stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v (want exit 0)\n%s", err, stderr)
	}
	if strings.Contains(stdout.String(), "final ") {
		t.Fatalf("stopped run printed a final line: %q", stdout)
	}
	prog, err := run.ReadProgress(progressFile)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := run.ReadCheckpoint(prog.Checkpoint)
	if err != nil {
		t.Fatalf("progress names checkpoint %q: %v", prog.Checkpoint, err)
	}
	if prog.State != contract.StateStopped || ck.StepsDone != prog.StepsDone || ck.StepsDone >= 1500 {
		t.Fatalf("progress %+v, checkpoint at %d steps; want state stopped and one checkpoint mid-run", prog, ck.StepsDone)
	}

	resumed, stdout, stderr := trainerCmd(bin, dir, nil, args...)
	if err := resumed.Run(); err != nil {
		t.Fatalf("resumed run: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr.String(), "msg=resumed") || !strings.Contains(stderr.String(), "local_steps="+itoa(ck.LocalSteps)) {
		t.Fatalf("resumed run did not log resuming at step %d:\n%s", ck.LocalSteps, stderr)
	}
	if got := finalLine(t, stdout.String()); got != want {
		t.Fatalf("resumed run ended with %q, uninterrupted with %q", got, want)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestTwoProcessesMerge: two copies as separate processes at different
// emulated speeds merge through a shared directory and end identical.
func TestTwoProcessesMerge(t *testing.T) {
	bin := buildTrainer(t)
	mergeDir := t.TempDir()
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	var errs []*bytes.Buffer
	for i, pace := range []string{"2000", "1000"} {
		cmd, stdout, stderr := trainerCmd(bin, t.TempDir(), []string{"HADAR_JOB_ID=j", "HADAR_COPIES=2", "HADAR_COPY_INDEX=" + itoa(int64(i)),
			"HADAR_MERGE_DIR=" + mergeDir, "HADAR_MERGE_EVERY=50", "HADAR_STEPS_PER_SEC=" + pace}, "--steps", "1000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs, errs = append(cmds, cmd), append(outs, stdout), append(errs, stderr)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("copy %d: %v\n%s", i, err, errs[i])
		}
	}
	a, b := finalLine(t, outs[0].String()), finalLine(t, outs[1].String())
	if a != b || !strings.HasPrefix(a, "final steps_done=1000 local_steps=500 merges=10 ") {
		t.Fatalf("copies ended with %q and %q; want the same line with 1000 job steps, 500 local steps, 10 merges", a, b)
	}
}

// unitCmds starts the ranks of a unit of world workers as processes,
// sharing a checkpoint directory, each with its own progress file.
func unitCmds(t *testing.T, bin, dir string, port, unit, world int, paces []string, args ...string) ([]*exec.Cmd, []*bytes.Buffer, []*bytes.Buffer) {
	t.Helper()
	var cmds []*exec.Cmd
	var outs, errs []*bytes.Buffer
	for r := range world {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "HADAR_PROGRESS_FILE="+filepath.Join(dir, "progress-"+itoa(int64(r))+".json"),
			"HADAR_CHECKPOINT_DIR="+filepath.Join(dir, "ckpt"), "HADAR_JOB_ID=j", "HADAR_UNIT="+itoa(int64(unit)),
			"RANK="+itoa(int64(r)), "WORLD_SIZE="+itoa(int64(world)), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+itoa(int64(port)),
			"HADAR_STEPS_PER_SEC="+paces[r])
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		cmds, outs, errs = append(cmds, cmd), append(outs, &stdout), append(errs, &stderr)
	}
	return cmds, outs, errs
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitSteps waits until a progress file shows at least n job steps.
func waitSteps(t *testing.T, path string, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p, err := run.ReadProgress(path); err == nil && p.StepsDone >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no progress past %d steps within 20s", path, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUnitProcessesStopAndFailFast: the ranks of a unit as processes.
// SIGTERM to all (an eviction) exits every rank 0 after rank 0
// checkpointed, and a new unit resumes every rank from that checkpoint;
// a rank killed outright makes rank 0 fail fast (exit 1, saying why)
// with its checkpoint written.
func TestUnitProcessesStopAndFailFast(t *testing.T) {
	bin := buildTrainer(t)
	dir := t.TempDir()
	args := []string{"--steps", "100000", "--stop-grace", "1s"}
	cmds, _, errs := unitCmds(t, bin, dir, freePort(t), 1, 2, []string{"400", "300"}, args...)
	waitSteps(t, filepath.Join(dir, "progress-0.json"), 150)
	for _, c := range cmds {
		if err := c.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for r, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("rank %d after SIGTERM: %v (want exit 0)\n%s", r, err, errs[r])
		}
	}
	p0, err := run.ReadProgress(filepath.Join(dir, "progress-0.json"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := run.ReadCheckpoint(p0.Checkpoint)
	if err != nil || p0.State != contract.StateStopped || ck.StepsDone != p0.StepsDone {
		t.Fatalf("rank 0's progress %+v, checkpoint %v: want stopped at its checkpoint", p0, err)
	}

	// A new unit (a move): both ranks resume from rank 0's checkpoint.
	cmds, _, errs = unitCmds(t, bin, dir, freePort(t), 2, 2, []string{"400", "300"}, args...)
	waitSteps(t, filepath.Join(dir, "progress-0.json"), ck.StepsDone+50)
	for r := range cmds {
		want := "msg=resumed checkpoint=" + p0.Checkpoint
		if !strings.Contains(errs[r].String(), want) || !strings.Contains(errs[r].String(), "steps_done="+itoa(ck.StepsDone)) {
			t.Fatalf("rank %d of the new unit did not log resuming from %s at step %d:\n%s", r, p0.Checkpoint, ck.StepsDone, errs[r])
		}
	}
	// Rank 1 vanishes (SIGKILL: no goodbye).
	killed := time.Now()
	if err := cmds[1].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmds[1].Wait()
	err = cmds[0].Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("rank 0 after rank 1 vanished: %v (want exit 1)\n%s", err, errs[0])
	}
	t.Logf("rank 0 exited 1 %s after rank 1 was killed", time.Since(killed).Round(time.Millisecond))
	if !strings.Contains(errs[0].String(), "rank 1 was lost") || !strings.Contains(errs[0].String(), "re-plans") {
		t.Fatalf("rank 0's log does not say why it failed:\n%s", errs[0])
	}
	p0, err = run.ReadProgress(filepath.Join(dir, "progress-0.json"))
	if err != nil || p0.State != contract.StateFailed || p0.Checkpoint == "" {
		t.Fatalf("rank 0's progress %+v, %v: want failed with a checkpoint", p0, err)
	}
}
