package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
	if prog.State != run.StateStopped || ck.StepsDone != prog.StepsDone || ck.StepsDone >= 1500 {
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
