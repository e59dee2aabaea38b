package run

import (
	"context"
	"io"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/trainer"
)

// dynamicCopy is the options of a HadarE copy the sidecar placed as unit
// unit: no HADAR_COPIES, no HADAR_COPY_INDEX, a checkpoint directory of
// its own (hadar-train keys it by the unit).
func dynamicCopy(t *testing.T, mergeDir string, unit int, pace, mergeEvery string, extra ...string) Options {
	t.Helper()
	return testOptions(t, t.TempDir(), map[string]string{"HADAR_JOB_ID": "job-d", "HADAR_UNIT": strconv.Itoa(unit), "HADAR_MERGE_DIR": mergeDir,
		"HADAR_STEPS_PER_SEC": pace, "HADAR_MERGE_EVERY": mergeEvery}, extra...)
}

// closedRounds reads every closed round of dir, in order.
func closedRounds(t *testing.T, dir string) []*Merged {
	t.Helper()
	rs, err := MergedRounds(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []*Merged
	for _, r := range rs {
		m, err := ReadMerged(MergedPath(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// checkAccounting: the rounds are 0, 1, 2, ... with no gap; each adds
// exactly its members' steps to the job's (nothing counted twice or
// lost); the last one is done at the job's total.
func checkAccounting(t *testing.T, rounds []*Merged, total int64) {
	t.Helper()
	for i, m := range rounds {
		if m.Round != i {
			t.Fatalf("closed rounds %d..: round %d missing", i, i)
		}
		prev := int64(0)
		if i > 0 {
			prev = rounds[i-1].StepsDone
		}
		var sum int64
		for _, c := range m.Members {
			sum += c.Steps
		}
		if m.StepsDone != prev+sum {
			t.Fatalf("round %d: steps_done %d, want %d + %d of members %+v", i, m.StepsDone, prev, sum, m.Members)
		}
	}
	last := rounds[len(rounds)-1]
	if !last.Done || last.StepsDone != total {
		t.Fatalf("last round %d: done %v at %d steps; want done at %d", last.Round, last.Done, last.StepsDone, total)
	}
}

// waitRound polls until a closed round satisfies ok.
func waitRound(t *testing.T, dir string, within time.Duration, ok func(*Merged) bool) *Merged {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		rs, _ := MergedRounds(dir)
		for _, r := range slices.Backward(rs) {
			if m, err := ReadMerged(MergedPath(dir, r)); err == nil && ok(m) {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no closed round as wanted within %s", within)
	return nil
}

func hasMember(m *Merged, copyIndex int) bool {
	return slices.ContainsFunc(m.Members, func(c Contribution) bool { return c.Copy == copyIndex })
}

// TestCopiesComeAndGo: copies of a HadarE job numbered by their units (3
// and 7, not 0..k-1) come and go while the job runs, without restarting
// the copy that stays. A copy forked in starts from the newest merged
// parameters and the job's steps; copies merge by membership; a copy
// stopped mid-round contributes its last steps and leaves; the job's
// steps are counted once and sum exactly to its total.
func TestCopiesComeAndGo(t *testing.T) {
	const total = 3000
	mergeDir := t.TempDir()
	a := dynamicCopy(t, mergeDir, 3, "2000", "50", "--steps", strconv.Itoa(total))
	b := dynamicCopy(t, mergeDir, 7, "1000", "50", "--steps", strconv.Itoa(total))
	var outA, outB Outcome
	var errA, errB error
	var wg sync.WaitGroup
	wg.Go(func() { outA, errA = Run(context.Background(), a, discardLog(), io.Discard) })
	waitRound(t, mergeDir, 20*time.Second, func(m *Merged) bool { return m.Round >= 4 })
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	wg.Go(func() { outB, errB = Run(ctxB, b, discardLog(), io.Discard) })
	both := waitRound(t, mergeDir, 20*time.Second, func(m *Merged) bool { return hasMember(m, 3) && hasMember(m, 7) })
	waitRound(t, mergeDir, 20*time.Second, func(m *Merged) bool { return m.Round >= both.Round+2 })
	cancelB() // the unfork: the sidecar removes copy 7's unit
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("copy 3: %v; copy 7: %v", errA, errB)
	}
	if outA.Stopped || outA.StepsDone != total || !outB.Stopped {
		t.Fatalf("copy 3 %+v, copy 7 %+v; want copy 3 done at %d and copy 7 stopped", outA.StepsDone, outB.StepsDone, total)
	}
	rounds := closedRounds(t, mergeDir)
	checkAccounting(t, rounds, total)
	if outB.StartRound < 4 || outB.StartSteps != rounds[outB.StartRound].StepsDone || outB.StartSteps == 0 {
		t.Fatalf("copy 7 started from round %d at %d steps; want the newest merged round then (>= 4, with its %d steps)",
			outB.StartRound, outB.StartSteps, rounds[min(outB.StartRound, len(rounds)-1)].StepsDone)
	}
	var together, left int
	var local3, local7 int64
	for _, m := range rounds {
		if hasMember(m, 3) && hasMember(m, 7) {
			together++
		}
		for _, c := range m.Members {
			if c.Copy == 7 && c.Leaving {
				left++
			}
			if c.Copy == 3 {
				local3 += c.Steps
			} else {
				local7 += c.Steps
			}
		}
	}
	t.Logf("%d rounds, %d with both copies; copy 3 did %d steps, copy 7 %d; copy 7 joined at round %d (%d steps) and left with its last steps: %d",
		len(rounds), together, local3, local7, outB.StartRound, outB.StartSteps, left)
	// Every step either copy took is in a merged round, copy 7's last
	// ones too (marked leaving when it was stopped mid-round, unmarked
	// when it was stopped waiting at a merge).
	if together < 3 || left > 1 || local3 != outA.LocalSteps || local7 != outB.LocalSteps || local3+local7 != total {
		t.Fatalf("rounds with both copies %d (want >= 3), copy 7 leaving %d times (want at most 1), merged steps of copy 3 %d of %d local, of copy 7 %d of %d; sum %d (want %d)",
			together, left, local3, outA.LocalSteps, local7, outB.LocalSteps, local3+local7, total)
	}
	last := rounds[len(rounds)-1]
	lastParams, err := ParamsOf(last.State, outA.Params)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(outA.Params.W, lastParams.W) {
		t.Fatal("copy 3 ended with other parameters than the last merged round")
	}
	single, _ := runToEnd(t, context.Background(), testOptions(t, t.TempDir(), nil, "--steps", strconv.Itoa(total)))
	t.Logf("single job acc %.2f%% loss %.4f; copies acc %.2f%% loss %.4f", 100*single.Test.Accuracy, single.Test.Loss, 100*outA.Test.Accuracy, outA.Test.Loss)
	if !withinHadarETolerance(outA.Test, single.Test) {
		t.Fatalf("merged copies acc %.4f loss %.4f not within 1.5 pp / 15%% of the single job's %.4f / %.4f",
			outA.Test.Accuracy, outA.Test.Loss, single.Test.Accuracy, single.Test.Loss)
	}
}

// withinHadarETolerance is docs/trainer.md's bound: accuracy at most 1.5
// points below the single job's, loss at most 15 % above.
func withinHadarETolerance(got, single trainer.Eval) bool {
	return 100*(single.Accuracy-got.Accuracy) <= 1.5 && got.Loss <= 1.15*single.Loss
}

// TestEvictedJobResumesFromItsMerges: the only copy of a HadarE job is
// stopped mid-round (the job evicted whole): it merges its last steps
// itself, so the merge directory holds the job's exact state. A copy of
// a later unit (another number, an empty checkpoint directory) starts
// there, not from scratch, and the job ends at exactly its total.
func TestEvictedJobResumesFromItsMerges(t *testing.T) {
	const total = 1200
	mergeDir := t.TempDir()
	first := dynamicCopy(t, mergeDir, 1, "1000", "100", "--steps", strconv.Itoa(total))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stopped Outcome
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		stopped, err = Run(ctx, first, discardLog(), io.Discard)
	}()
	// Half a round (50 steps at 1000/s) after round 3 closed.
	waitRound(t, mergeDir, 20*time.Second, func(m *Merged) bool { return m.Round >= 3 })
	time.Sleep(50 * time.Millisecond)
	cancel()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if !stopped.Stopped || stopped.StepsDone == 0 || stopped.StepsDone >= total || stopped.StepsDone%100 == 0 {
		t.Fatalf("stopped at %d steps: want mid-round, after some rounds", stopped.StepsDone)
	}
	rounds := closedRounds(t, mergeDir)
	last := rounds[len(rounds)-1]
	if last.StepsDone != stopped.StepsDone || len(last.Members) != 1 || !last.Members[0].Leaving || len(last.Targets) != 0 {
		t.Fatalf("last closed round %+v: want the stopped copy's last steps merged, up to its %d steps, and no member left", last.Members, stopped.StepsDone)
	}
	ck, err := ReadCheckpoint(stopped.Checkpoint)
	if err != nil || ck.StepsDone != stopped.StepsDone || ck.Round != last.Round {
		t.Fatalf("checkpoint %+v, %v: want it at the merged round %d", ck, err, last.Round)
	}

	later := dynamicCopy(t, mergeDir, 5, "", "100", "--steps", strconv.Itoa(total))
	res, _ := runToEnd(t, context.Background(), later)
	if res.StartSteps != stopped.StepsDone || res.StepsDone != total || res.Resumed != "" {
		t.Fatalf("the later copy started at %d steps (resumed %q) and ended at %d; want from the merged %d to %d", res.StartSteps, res.Resumed, res.StepsDone, stopped.StepsDone, total)
	}
	checkAccounting(t, closedRounds(t, mergeDir), total)
}

// TestMultiWorkerCopyMerges: a copy that is a unit of two workers (rank 0
// merges, rank 1 follows) and a single-GPU copy merge as equals.
func TestMultiWorkerCopyMerges(t *testing.T) {
	const total = 1200
	mergeDir := t.TempDir()
	ws := unitWorkers(t, t.TempDir(), freePort(t), 4, []map[string]string{
		{"HADAR_STEPS_PER_SEC": "1000", "HADAR_MERGE_DIR": mergeDir, "HADAR_MERGE_EVERY": "60", "HADAR_JOB_ID": "job-d"},
		{"HADAR_STEPS_PER_SEC": "1000", "HADAR_MERGE_DIR": mergeDir, "HADAR_MERGE_EVERY": "60", "HADAR_JOB_ID": "job-d"},
	}, "--steps", strconv.Itoa(total))
	single := &worker{o: dynamicCopy(t, mergeDir, 9, "1000", "40", "--steps", strconv.Itoa(total))}
	runUnit(append(ws, single), nil)
	for i, w := range append(ws, single) {
		if w.err != nil || w.out.StepsDone != total {
			t.Fatalf("worker %d: %+v, %v", i, w.out.StepsDone, w.err)
		}
	}
	rounds := closedRounds(t, mergeDir)
	checkAccounting(t, rounds, total)
	together := 0
	for _, m := range rounds {
		if hasMember(m, 4) && hasMember(m, 9) {
			together++
		}
	}
	if together < 5 || !slices.Equal(ws[0].out.Params.W, single.out.Params.W) {
		t.Fatalf("%d rounds with both copies; want >= 5 and both copies ending with the same parameters", together)
	}
}
