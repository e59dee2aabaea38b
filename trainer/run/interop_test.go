package run

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/contract"
)

// debianPython is the interpreter with Debian's python3-torch (make test
// installs it); a python3 earlier on PATH (a pyenv, a venv) may lack it.
const debianPython = "/usr/bin/python3"

// pythonWithTorch returns the interpreter, or skips the test saying how
// to get one.
func pythonWithTorch(t *testing.T) string {
	t.Helper()
	if err := exec.Command(debianPython, "-c", "import torch").Run(); err != nil {
		t.Skipf("%s cannot import torch (%v): apt-get install python3-torch, as make test does", debianPython, err)
	}
	return debianPython
}

// TestMergeWithPythonCopy: a copy of hadar-trainer and a copy of a
// PyTorch script using the Python library (python/tests/interop_copy.py,
// a module of the trainer's mlp shape) run one job through one merge
// directory: they merge with each other round after round, each closes
// rounds the other adopts, the steps add up to the job's, and both end
// at the job's total holding the last merged state.
func TestMergeWithPythonCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Python process with torch; skipped with -short")
	}
	py := pythonWithTorch(t)
	const total, every = 1500, 50
	dir, tmp := t.TempDir(), t.TempDir()
	mergeDir := filepath.Join(dir, "merge")
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The Python copy first: it announces itself before the Go copy
	// starts, so the rounds include it from the start. Both keep a pace,
	// so the job lasts long enough for many rounds together.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join(repo, "python", "tests", "interop_copy.py"), "--dim", "16", "--hidden", "32", "--classes", "4")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repo, "python"), "OMP_NUM_THREADS=1",
		contract.EnvJobID+"=interop", contract.EnvMergeDir+"="+mergeDir, contract.EnvCopyIndex+"=1",
		contract.EnvTotalSteps+"=1500", contract.EnvMergeEvery+"=50", contract.EnvStepsPerSec+"=100",
		contract.EnvCheckpointDir+"="+filepath.Join(tmp, "py-ckpt"), contract.EnvProgressFile+"="+filepath.Join(tmp, "py-progress.json"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pyErr error
	pyDone := make(chan struct{})
	go func() { pyErr = cmd.Wait(); close(pyDone) }()
	t.Cleanup(func() {
		cancel()
		<-pyDone
	})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(contract.MemberPath(mergeDir, 1)); err == nil {
			break
		}
		select {
		case <-pyDone:
			t.Fatalf("the Python copy ended before announcing itself: %v\n%s", pyErr, stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Python copy did not announce itself in %s:\n%s", mergeDir, stderr.String())
		}
	}

	o := testOptions(t, t.TempDir(), nil, "--model", "mlp", "--hidden", "32", "--steps", fmt.Sprint(total), "--job-id", "interop",
		"--merge-dir", mergeDir, "--copy-index", "0", "--merge-every", fmt.Sprint(every), "--steps-per-sec", "100")
	out, err := Run(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	<-pyDone
	if pyErr != nil {
		t.Fatalf("the Python copy: %v\n%s", pyErr, stderr.String())
	}

	rs, err := MergedRounds(mergeDir)
	if err != nil {
		t.Fatal(err)
	}
	var prev int64
	together, closers := 0, map[int]int{}
	var last *Merged
	for _, r := range rs {
		m, err := ReadMerged(MergedPath(mergeDir, r))
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		var who []int
		for _, c := range m.Members {
			sum += c.Steps
			who = append(who, c.Copy)
		}
		if m.StepsDone != prev+sum {
			t.Fatalf("round %d: %d steps after %d with members %+v", r, m.StepsDone, prev, m.Members)
		}
		prev = m.StepsDone
		if slices.Equal(who, []int{0, 1}) {
			together++
			closers[m.ClosedBy]++
		}
		last = m
	}
	t.Logf("%d rounds, %d with both copies; rounds of both closed by copy: %v; Python: %s", len(rs), together, closers, bytes.TrimSpace(stdout.Bytes()))
	if together < 5 || closers[0] == 0 || closers[1] == 0 {
		t.Fatalf("%d rounds with both copies (want >= 5), closed by %v (want both copies closing some)", together, closers)
	}
	if !last.Done || last.StepsDone != total || out.StepsDone != total {
		t.Fatalf("last round %d: %d steps, done %v; the Go copy ended at %d; want done at %d", last.Round, last.StepsDone, last.Done, out.StepsDone, total)
	}
	params, err := ParamsOf(last.State, out.Params)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(params.W, out.Params.W) {
		t.Fatal("the Go copy does not hold the last merged state")
	}
	p, err := ReadProgress(filepath.Join(tmp, "py-progress.json"))
	if err != nil {
		t.Fatal(err)
	}
	if p.State != contract.StateDone || p.StepsDone != total || p.Version != contract.Version {
		t.Fatalf("the Python copy's progress %+v: want done at %d, contract version %d", p, total, contract.Version)
	}
}
