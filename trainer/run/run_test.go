package run

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/trainer"

	"github.com/hadar-sched/hadar/contract"
)

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// testOptions parses args with env like the binary does, with paths in dir.
func testOptions(t *testing.T, dir string, e map[string]string, args ...string) Options {
	t.Helper()
	base := []string{"--progress-file", filepath.Join(dir, "progress.json"), "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--progress-interval", "100ms"}
	o, err := ParseTrainArgs(append(base, args...), env(e), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestParseTrainArgsPrecedence(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(Options) bool
		wantErr string
	}{
		{"defaults", nil, nil, func(o Options) bool {
			return o.Steps == 4000 && o.Train.Model == trainer.MLP && o.MergeEvery == 100 && o.Copies == 1 && o.MergeDir == "" && o.StepsPerSec == 0
		}, ""},
		{"env beats default", nil, map[string]string{"HADAR_TOTAL_STEPS": "77", "HADAR_STEPS_PER_SEC": "12.5", "HADAR_COPIES": "3",
			"HADAR_COPY_INDEX": "2", "HADAR_MERGE_DIR": "/m", "HADAR_MERGE_EVERY": "9", "HADAR_JOB_ID": "j1"}, func(o Options) bool {
			return o.Steps == 77 && o.StepsPerSec == 12.5 && o.Copies == 3 && o.CopyIndex == 2 && o.MergeDir == "/m" && o.MergeEvery == 9 && o.JobID == "j1"
		}, ""},
		{"flag beats env", []string{"--steps", "5", "--merge-every", "3"}, map[string]string{"HADAR_TOTAL_STEPS": "77", "HADAR_MERGE_EVERY": "9"},
			func(o Options) bool { return o.Steps == 5 && o.MergeEvery == 3 }, ""},
		{"nomad dirs give the path defaults", nil, map[string]string{"NOMAD_TASK_DIR": "/t", "NOMAD_ALLOC_DIR": "/a"}, func(o Options) bool {
			return o.ProgressFile == "/t/hadar-progress.json" && o.CheckpointDir == "/a/data/checkpoints"
		}, ""},
		{"contract variables beat nomad dirs", nil, map[string]string{"NOMAD_TASK_DIR": "/t", "HADAR_PROGRESS_FILE": "/p.json", "HADAR_CHECKPOINT_DIR": "/c"},
			func(o Options) bool { return o.ProgressFile == "/p.json" && o.CheckpointDir == "/c" }, ""},
		{"model flag", []string{"--model", "softmax", "--seed", "9"}, nil, func(o Options) bool {
			return o.Train.Model == trainer.Softmax && o.Train.Seed == 9 && o.Data.Seed == 9
		}, ""},
		{"bad env value", nil, map[string]string{"HADAR_TOTAL_STEPS": "lots"}, nil, `env HADAR_TOTAL_STEPS="lots": not a valid value for --steps`},
		{"bad model", []string{"--model", "cnn"}, nil, nil, `flag --model: model "cnn"`},
		{"copy index out of range", nil, map[string]string{"HADAR_COPIES": "2", "HADAR_COPY_INDEX": "2", "HADAR_MERGE_DIR": "/m"}, nil, "--copy-index (HADAR_COPY_INDEX): want 0..1"},
		{"copies without merge dir", nil, map[string]string{"HADAR_COPIES": "2"}, nil, "--merge-dir (HADAR_MERGE_DIR) is empty"},
		{"negative pace", []string{"--steps-per-sec", "-1"}, nil, nil, "--steps-per-sec"},
		{"stray argument", []string{"oops"}, nil, nil, `unexpected argument "oops"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseTrainArgs(tt.args, env(tt.env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(o) {
				t.Fatalf("options %+v", o)
			}
		})
	}
}

// runToEnd runs o to completion and returns the outcome and stdout.
func runToEnd(t *testing.T, ctx context.Context, o Options) (Outcome, string) {
	t.Helper()
	var out bytes.Buffer
	res, err := Run(ctx, o, discardLog(), &out)
	if err != nil {
		t.Fatal(err)
	}
	return res, out.String()
}

// TestStopAndResumeMatchesUninterrupted cancels a run (what SIGTERM does in
// the binary), checks the checkpoint and progress file, resumes it and
// expects the very parameters of an uninterrupted run: the data order and
// momentum continue exactly.
func TestStopAndResumeMatchesUninterrupted(t *testing.T) {
	args := []string{"--steps", "1500", "--seed", "2"}
	want, wantLine := runToEnd(t, context.Background(), testOptions(t, t.TempDir(), nil, args...))

	dir := t.TempDir()
	// Paced to 5 s, and stopped once its progress shows a step: a fixed
	// delay stopped it before its first step on a loaded machine.
	paced := testOptions(t, dir, map[string]string{"HADAR_STEPS_PER_SEC": "300"}, append(args, "--progress-interval", "20ms")...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if p, err := ReadProgress(paced.ProgressFile); err == nil && p.StepsDone > 0 {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stopped, line := runToEnd(t, ctx, paced)
	if !stopped.Stopped || line != "" || stopped.StepsDone == 0 || stopped.StepsDone >= 1500 {
		t.Fatalf("stopped run: %+v, stdout %q; want a stop mid-run and no final line", stopped, line)
	}
	ck, err := ReadCheckpoint(stopped.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ReadProgress(paced.ProgressFile)
	if err != nil {
		t.Fatal(err)
	}
	if ck.StepsDone != stopped.StepsDone || prog.StepsDone != ck.StepsDone || prog.State != contract.StateStopped || prog.Checkpoint != stopped.Checkpoint {
		t.Fatalf("checkpoint at %d steps, progress %+v; want both at %d, state stopped, naming the checkpoint", ck.StepsDone, prog, stopped.StepsDone)
	}

	resumed, line := runToEnd(t, context.Background(), testOptions(t, dir, nil, args...))
	if resumed.Resumed != stopped.Checkpoint || resumed.StepsDone != 1500 {
		t.Fatalf("resumed from %q to %d steps; want from %q to 1500", resumed.Resumed, resumed.StepsDone, stopped.Checkpoint)
	}
	if !slices.Equal(resumed.Params.W, want.Params.W) || line != wantLine {
		t.Fatalf("resumed run ended at %q, uninterrupted at %q", line, wantLine)
	}
	// A restart after the end finishes at once with the same result.
	again, line := runToEnd(t, context.Background(), testOptions(t, dir, nil, args...))
	if again.LocalSteps != 1500 || line != wantLine {
		t.Fatalf("restart after the end: %d local steps, %q", again.LocalSteps, line)
	}
}

func TestResumeRejectsOtherConfiguration(t *testing.T) {
	dir := t.TempDir()
	runToEnd(t, context.Background(), testOptions(t, dir, nil, "--steps", "20", "--seed", "1"))
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--seed", "2"}, `field "seed": 1, but --seed is 2`},
		{[]string{"--model", "softmax"}, `field "params": model mlp`},
		{[]string{"--job-id", "other"}, `field "job_id"`},
	}
	for _, tt := range tests {
		_, err := Run(context.Background(), testOptions(t, dir, nil, append([]string{"--steps", "20"}, tt.args...)...), discardLog(), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "ckpt-20.json") {
			t.Errorf("%v: err = %v, want one naming the checkpoint and containing %q", tt.args, err, tt.wantErr)
		}
	}
}

func TestUnreadableNewestCheckpointFallsBack(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir, nil, "--steps", "30")
	runToEnd(t, context.Background(), o)
	if err := os.WriteFile(filepath.Join(o.CheckpointDir, "ckpt-999.json"), []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, _ := runToEnd(t, context.Background(), o)
	if !strings.HasSuffix(res.Resumed, "ckpt-30.json") {
		t.Fatalf("resumed from %q, want ckpt-30.json", res.Resumed)
	}
}

// copyOptions are the options of copy i of k of one job merging in mergeDir.
func copyOptions(t *testing.T, mergeDir string, i, k int, pace, mergeEvery string, extra ...string) Options {
	return testOptions(t, t.TempDir(), map[string]string{
		"HADAR_JOB_ID": "job-1", "HADAR_COPIES": strconv.Itoa(k), "HADAR_COPY_INDEX": strconv.Itoa(i), "HADAR_MERGE_DIR": mergeDir,
		"HADAR_STEPS_PER_SEC": pace, "HADAR_MERGE_EVERY": mergeEvery,
	}, extra...)
}

// TestCopiesMergeThroughDirectory runs three copies at unequal emulated
// speeds merging through a shared directory: they end with identical
// parameters, their steps sum to the job's total, and the accuracy is within
// the HadarE tolerance of a single job of the same steps. With merge-every
// proportional to the pace, rounds take equal time and the copies' steps
// (the merge weights) differ, as HadarE's round boundaries would have it.
func TestCopiesMergeThroughDirectory(t *testing.T) {
	const steps = "1500"
	single, _ := runToEnd(t, context.Background(), testOptions(t, t.TempDir(), nil, "--steps", steps))
	paces := []string{"3000", "2000", "1000"}
	tests := []struct {
		name       string
		mergeEvery []string
		wantLocal  []int64
		wantMerges int
	}{
		{"equal merge-every", []string{"50", "50", "50"}, []int64{500, 500, 500}, 10},
		// Rounds of 150 steps fit the 1500 exactly: every copy does its
		// merge-every in each of the 10 rounds.
		{"merge-every proportional to pace", []string{"75", "50", "25"}, []int64{750, 500, 250}, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mergeDir := t.TempDir()
			outs := make([]Outcome, len(paces))
			var wg sync.WaitGroup
			for i, pace := range paces {
				o := copyOptions(t, mergeDir, i, len(paces), pace, tt.mergeEvery[i], "--steps", steps)
				wg.Go(func() {
					res, err := Run(context.Background(), o, discardLog(), io.Discard)
					if err != nil {
						t.Error(err)
					}
					outs[i] = res
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			for i, o := range outs {
				if o.StepsDone != 1500 || o.LocalSteps != tt.wantLocal[i] || o.Merges != tt.wantMerges {
					t.Errorf("copy %d: %d job steps, %d local steps, %d merges; want 1500, %d, %d",
						i, o.StepsDone, o.LocalSteps, o.Merges, tt.wantLocal[i], tt.wantMerges)
				}
				if !slices.Equal(o.Params.W, outs[0].Params.W) {
					t.Errorf("copy %d ended with other parameters than copy 0", i)
				}
			}
			he := outs[0].Test
			t.Logf("single acc %.2f%% loss %.4f; 3 copies acc %.2f%% loss %.4f", 100*single.Test.Accuracy, single.Test.Loss, 100*he.Accuracy, he.Loss)
			if 100*(single.Test.Accuracy-he.Accuracy) > 1.5 || he.Loss > 1.15*single.Test.Loss {
				t.Errorf("merged copies acc %.4f loss %.4f not within 1.5 pp / 15%% of the single job's %.4f / %.4f",
					he.Accuracy, he.Loss, single.Test.Accuracy, single.Test.Loss)
			}
			if _, err := os.Stat(contract.CopyPath(mergeDir, tt.wantMerges, 2)); err != nil {
				t.Errorf("last round's file of copy 2: %v", err)
			}
		})
	}
}

// TestMissingCopyIsSkipped: copy 2 of 3 never starts; the others wait the
// bounded time each round, merge without it, share its part of the last
// round among themselves and finish exactly the job's steps in three rounds.
func TestMissingCopyIsSkipped(t *testing.T) {
	mergeDir := t.TempDir()
	outs := make([]Outcome, 2)
	var wg sync.WaitGroup
	for i := range outs {
		o := copyOptions(t, mergeDir, i, 3, "", "50", "--steps", "300", "--merge-timeout", "500ms")
		wg.Go(func() {
			res, err := Run(context.Background(), o, discardLog(), io.Discard)
			if err != nil {
				t.Error(err)
			}
			outs[i] = res
		})
	}
	wg.Wait()
	for i, o := range outs {
		if o.StepsDone != 300 || o.Merges != 3 || o.Test.Accuracy < 0.8 {
			t.Errorf("copy %d: %d steps, %d merges, accuracy %.3f; want 300 steps, 3 merges and a trained model", i, o.StepsDone, o.Merges, o.Test.Accuracy)
		}
	}
	if !slices.Equal(outs[0].Params.W, outs[1].Params.W) {
		t.Error("the two present copies ended with different parameters")
	}
}

// TestPaceIsHonoured runs at an emulated 150 steps/s for 2 s: never
// faster. A loaded machine slows any run (87 steps/s at load 20 on 2
// cores), so the bound below is loose: it catches a pause per step added
// to the step's own time instead of pacing to the clock.
func TestPaceIsHonoured(t *testing.T) {
	o := testOptions(t, t.TempDir(), map[string]string{"HADAR_STEPS_PER_SEC": "150"}, "--steps", "300", "--model", "softmax")
	start := time.Now()
	runToEnd(t, context.Background(), o)
	rate := 300 / time.Since(start).Seconds()
	if rate < 150*0.4 || rate > 150*1.1 {
		t.Fatalf("ran at %.1f steps/s, want 150 (-60%%, +10%%)", rate)
	}
	prog, err := ReadProgress(o.ProgressFile)
	if err != nil {
		t.Fatal(err)
	}
	// The reported rate is of the last window, where a pacer that was
	// descheduled catches up (a loaded machine: 237 steps/s seen): the
	// upper bound catches a rate not paced at all (softmax runs thousands
	// of steps/s flat out), the overall rate above the pace itself.
	if prog.StepsPerSec < 150*0.4 || prog.StepsPerSec > 150*3 || prog.State != contract.StateDone {
		t.Fatalf("progress %+v: want about 150 steps/s and state done", prog)
	}
}

func TestMainSubcommands(t *testing.T) {
	tests := []struct {
		args     []string
		wantCode int
		wantOut  string
	}{
		{[]string{"compare", "--models", "softmax", "--copies", "2", "--seeds", "1", "--steps", "200"}, 0, "softmax       2"},
		{[]string{"help"}, 0, "hadar-trainer compare"},
		{[]string{"train", "-h"}, 0, ""},
		{[]string{"bogus"}, 2, ""},
		{[]string{"compare", "--copies", "0"}, 2, ""},
		{[]string{"--steps", "0"}, 2, ""},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), tt.args, env(nil), &out, &errOut)
		if code != tt.wantCode || !strings.Contains(out.String(), tt.wantOut) {
			t.Errorf("Main(%v) = %d, stdout %q; want %d and %q (stderr %q)", tt.args, code, out.String(), tt.wantCode, tt.wantOut, errOut.String())
		}
	}
}

func TestDecodeCheckpointErrors(t *testing.T) {
	valid := func() *Checkpoint {
		p, _ := trainer.InitParams(trainer.Softmax, 2, 0, 2, 1)
		return &Checkpoint{Version: 1, Copies: 1, TotalSteps: 10, StepsDone: 3, LocalSteps: 3, RoundTarget: -1, Params: p, Velocity: make([]float64, len(p.W))}
	}
	tests := []struct {
		name    string
		mutate  func(*Checkpoint)
		wantErr string
	}{
		{"valid", func(*Checkpoint) {}, ""},
		{"version", func(c *Checkpoint) { c.Version = 2 }, `field "version": want 1, got 2`},
		{"velocity length", func(c *Checkpoint) { c.Velocity = c.Velocity[:1] }, `field "velocity": want 6 values, got 1`},
		{"weights length", func(c *Checkpoint) { c.Params.W = c.Params.W[:2] }, `field "params": field "weights": want 6 values, got 2`},
		{"copy index", func(c *Checkpoint) { c.CopyIndex, c.Copies = 2, 2 }, `"copy_index" 2, "copies" 2`},
		{"dynamic copy index", func(c *Checkpoint) { c.CopyIndex = 7 }, ""},
		{"round", func(c *Checkpoint) { c.Round = -1 }, `field "round"`},
		{"since merge", func(c *Checkpoint) { c.SinceMerge = 4 }, `field "since_merge": 4 exceeds "local_steps" 3`},
		{"round target", func(c *Checkpoint) { c.RoundTarget = -2 }, `field "round_target"`},
		{"total steps", func(c *Checkpoint) { c.TotalSteps = 0 }, `field "total_steps"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(c)
			b, err := EncodeCheckpoint(c)
			if err != nil {
				t.Fatal(err)
			}
			_, err = DecodeCheckpoint(b)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// FuzzDecodeCheckpoint: checkpoints are read from disk after a crash or
// from an older version; the decoder must accept only consistent ones and
// never panic. Seeds: testdata/fuzz/FuzzDecodeCheckpoint.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCheckpoint(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		again, err := EncodeCheckpoint(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeCheckpoint(again); err != nil {
			t.Fatalf("re-decoding an accepted checkpoint: %v", err)
		}
	})
}

// FuzzDecodeMergeFile: merge files are written by other processes on a
// shared directory. Seeds: testdata/fuzz/FuzzDecodeMergeFile.
func FuzzDecodeMergeFile(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMergeFile(b)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		if _, err := contract.MergeStates([]contract.State{m.State, m.State}, []float64{float64(m.Steps), 1}); err != nil {
			t.Fatalf("an accepted merge file cannot be merged: %v", err)
		}
	})
}

// FuzzDecodeMerged: closed rounds are written by other copies on a shared
// directory. Seeds: testdata/fuzz/FuzzDecodeMerged.
func FuzzDecodeMerged(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMerged(b)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		if m.StepsDone > m.TotalSteps {
			t.Fatalf("accepted %d steps done of %d", m.StepsDone, m.TotalSteps)
		}
		for _, c := range m.Targets {
			if steps, ok := m.Target(c.Copy); !ok || steps < 0 {
				t.Fatalf("target of copy %d: %d, %v", c.Copy, steps, ok)
			}
		}
	})
}
