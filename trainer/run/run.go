package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hadar-sched/hadar/trainer"
)

// Outcome is what Run did, for callers that look further than the exit
// status (tests).
type Outcome struct {
	Stopped    bool   // cancelled: a checkpoint was written and training left unfinished
	StepsDone  int64  // the job's steps as this process saw them last
	LocalSteps int64  // steps this process's model took, restored ones included
	Merges     int    // merge rounds completed
	Resumed    string // the checkpoint resumed from, if any
	Checkpoint string // the last checkpoint written
	Params     trainer.Params
	Test       trainer.Eval // held-out loss and accuracy; set when the job finished
}

// lossSmoothing is the EWMA factor of the minibatch loss in the progress file.
const lossSmoothing = 0.05

// process is one training process's state; the fields from jobSteps to loss
// are what a checkpoint carries besides the model.
type process struct {
	o    Options
	log  *slog.Logger
	sgd  *trainer.SGD
	test *trainer.Dataset

	jobSteps    int64
	merges      int
	sinceMerge  int64
	roundTarget int64
	loss        float64

	lastPresent   []int // copy indices merged in the last round, ascending; nil before the first
	state         string
	checkpoint    string
	resumed       string
	progressAt    time.Time
	progressSteps int64
	rate          float64
}

// Run trains as Options say until the job's total steps are reached, then
// writes a final checkpoint and progress file and prints one line to stdout:
//
//	final steps_done=4000 local_steps=4000 merges=0 test_loss=0.187 test_accuracy=0.9390
//
// When ctx is cancelled (the binary cancels it on SIGTERM or SIGINT) it
// writes a checkpoint and the progress file and returns with
// Outcome.Stopped set and a nil error: the contract's exit 0.
func Run(ctx context.Context, o Options, log *slog.Logger, stdout io.Writer) (Outcome, error) {
	if err := o.Validate(); err != nil {
		return Outcome{}, err
	}
	train, test, err := trainer.Generate(o.Data)
	if err != nil {
		return Outcome{}, err
	}
	shard := train
	if o.Copies > 1 {
		if shard, err = train.Shard(o.CopyIndex, o.Copies); err != nil {
			return Outcome{}, err
		}
	}
	init, err := trainer.InitParams(o.Train.Model, o.Data.Dim, o.Train.Hidden, o.Data.Classes, o.Train.Seed)
	if err != nil {
		return Outcome{}, err
	}
	sgd, err := trainer.NewSGD(o.Train, shard, uint64(o.CopyIndex), init)
	if err != nil {
		return Outcome{}, err
	}
	p := &process{o: o, log: log, sgd: sgd, test: test, roundTarget: -1, state: StateRunning}
	if err := p.resume(); err != nil {
		return Outcome{}, err
	}
	p.progressAt, p.progressSteps = time.Now(), sgd.Steps()
	if err := p.writeProgress(); err != nil {
		return Outcome{}, err
	}
	log.Info("training", "model", o.Train.Model, "steps_done", p.jobSteps, "total_steps", o.Steps,
		"copy", o.CopyIndex, "copies", o.Copies, "train_samples", shard.Len(), "steps_per_sec", o.StepsPerSec)

	err = p.train(ctx)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		p.state = StateStopped
		if err := p.saveCheckpoint(); err != nil {
			return Outcome{}, fmt.Errorf("stopping: %w", err)
		}
		if err := p.writeProgress(); err != nil {
			return Outcome{}, fmt.Errorf("stopping: %w", err)
		}
		log.Info("stopped; checkpoint written", "checkpoint", p.checkpoint, "steps_done", p.jobSteps, "local_steps", sgd.Steps())
		return p.outcome(true), nil
	}
	if err != nil {
		return Outcome{}, err
	}

	p.state = StateDone
	if err := p.saveCheckpoint(); err != nil {
		return Outcome{}, err
	}
	if err := p.writeProgress(); err != nil {
		return Outcome{}, err
	}
	out := p.outcome(false)
	if out.Test, err = trainer.Evaluate(out.Params, test); err != nil {
		return Outcome{}, err
	}
	log.Info("done", "steps_done", p.jobSteps, "merges", p.merges, "test_loss", out.Test.Loss, "test_accuracy", out.Test.Accuracy)
	if _, err := fmt.Fprintf(stdout, "final steps_done=%d local_steps=%d merges=%d test_loss=%.6f test_accuracy=%.4f\n",
		p.jobSteps, sgd.Steps(), p.merges, out.Test.Loss, out.Test.Accuracy); err != nil {
		return Outcome{}, fmt.Errorf("print final line: %w", err)
	}
	return out, nil
}

func (p *process) outcome(stopped bool) Outcome {
	return Outcome{Stopped: stopped, StepsDone: p.jobSteps, LocalSteps: p.sgd.Steps(), Merges: p.merges,
		Resumed: p.resumed, Checkpoint: p.checkpoint, Params: p.sgd.Params()}
}

// train runs steps (and merge rounds) until the job's total is reached or
// ctx is cancelled.
func (p *process) train(ctx context.Context) error {
	total := int64(p.o.Steps)
	merging := p.o.MergeDir != ""
	pace := &pacer{rate: p.o.StepsPerSec}
	for p.jobSteps < total {
		if merging && p.roundTarget < 0 {
			p.roundTarget = p.nextRoundTarget()
		}
		for (merging && p.sinceMerge < p.roundTarget) || (!merging && p.jobSteps < total) {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := pace.wait(ctx, p.tick); err != nil {
				return err
			}
			loss := p.sgd.Step()
			if math.IsNaN(loss) || math.IsInf(loss, 0) {
				return fmt.Errorf("training diverged at local step %d (loss %g); lower --lr", p.sgd.Steps(), loss)
			}
			if p.sgd.Steps() == 1 || p.loss == 0 {
				p.loss = loss
			} else {
				p.loss += lossSmoothing * (loss - p.loss)
			}
			if merging {
				p.sinceMerge++
			} else {
				p.jobSteps++
			}
			if p.o.CheckpointEvery > 0 && p.sgd.Steps()%int64(p.o.CheckpointEvery) == 0 {
				if err := p.saveCheckpoint(); err != nil {
					return err
				}
				p.writeProgressLogged() // the contract: progress at every checkpoint
			}
			p.tick()
		}
		if !merging {
			break
		}
		if err := p.merge(ctx); err != nil {
			return err
		}
		// Waiting for the others is not time the pace may catch up on.
		pace.reset()
	}
	return nil
}

// nextRoundTarget is this copy's steps for the next merge round: an equal
// share of the job's remaining steps among the copies present at the last
// merge (all copies before the first), at most MergeEvery, so that the
// copies' steps sum exactly to the total. The copies that saw the same merge
// compute the same shares; a copy that dropped out gets no share of the
// tail, so the others do not wait for it round after round.
func (p *process) nextRoundTarget() int64 {
	remaining := int64(p.o.Steps) - p.jobSteps
	m, rank := int64(p.o.Copies), int64(p.o.CopyIndex)
	if p.lastPresent != nil {
		m, rank = int64(len(p.lastPresent)), int64(slices.Index(p.lastPresent, p.o.CopyIndex))
	}
	share := remaining / m
	if rank < remaining%m {
		share++
	}
	return min(int64(p.o.MergeEvery), share)
}

// merge exchanges parameters with the other copies and replaces this copy's
// with their average weighted by the steps each did in the round.
func (p *process) merge(ctx context.Context) error {
	p.state = StateMerging
	p.writeProgressLogged()
	mine := &MergeFile{Version: mergeFileVersion, JobID: p.o.JobID, Round: p.merges + 1, CopyIndex: p.o.CopyIndex,
		Copies: p.o.Copies, Steps: p.sinceMerge, Params: p.sgd.Params()}
	files, err := exchange(ctx, p.o.MergeDir, mine, p.o.MergeTimeout, p.log, p.tick)
	if err != nil {
		return err
	}
	params := make([]trainer.Params, len(files))
	weights := make([]float64, len(files))
	var steps int64
	for i, f := range files {
		params[i], weights[i] = f.Params, float64(f.Steps)
		steps += f.Steps
	}
	merged, err := trainer.Merge(params, weights)
	if err != nil {
		return fmt.Errorf("merge round %d: %w", mine.Round, err)
	}
	if err := p.sgd.SetParams(merged); err != nil {
		return fmt.Errorf("merge round %d: %w", mine.Round, err)
	}
	p.jobSteps += steps
	p.merges++
	p.sinceMerge = 0
	p.roundTarget = -1
	p.lastPresent = p.lastPresent[:0]
	for _, f := range files {
		p.lastPresent = append(p.lastPresent, f.CopyIndex)
	}
	p.state = StateRunning
	p.log.Debug("merged", "round", mine.Round, "copies_present", len(files), "round_steps", steps, "steps_done", p.jobSteps)
	p.writeProgressLogged()
	return nil
}

// tick rewrites the progress file when it is due.
func (p *process) tick() {
	now := time.Now()
	dt := now.Sub(p.progressAt)
	if dt < p.o.ProgressInterval {
		return
	}
	p.rate = float64(p.sgd.Steps()-p.progressSteps) / dt.Seconds()
	p.progressAt, p.progressSteps = now, p.sgd.Steps()
	p.writeProgressLogged()
}

// writeProgressLogged writes the progress file, logging a failure: a full
// disk for a moment must not end the training.
func (p *process) writeProgressLogged() {
	if err := p.writeProgress(); err != nil {
		p.log.Warn("progress file not written", "err", err)
	}
}

func (p *process) writeProgress() error {
	if p.rate == 0 {
		// Before the first tick, report the rate so far.
		if dt := time.Since(p.progressAt); dt > 100*time.Millisecond {
			p.rate = float64(p.sgd.Steps()-p.progressSteps) / dt.Seconds()
		}
	}
	return WriteProgress(p.o.ProgressFile, Progress{
		StepsDone: p.jobSteps, TotalSteps: int64(p.o.Steps), StepsPerSec: p.rate, Loss: p.loss,
		Checkpoint: p.checkpoint, Updated: time.Now().UTC().Truncate(time.Millisecond),
		State: p.state, CopyIndex: p.o.CopyIndex, Copies: p.o.Copies, LocalSteps: p.sgd.Steps(), Merges: p.merges,
	})
}

// saveCheckpoint writes ckpt-<local steps>.json atomically and removes all
// but the newest KeepCheckpoints.
func (p *process) saveCheckpoint() error {
	ck := &Checkpoint{
		Version: checkpointVersion, JobID: p.o.JobID, Seed: p.o.Train.Seed, CopyIndex: p.o.CopyIndex, Copies: p.o.Copies,
		TotalSteps: int64(p.o.Steps), StepsDone: p.jobSteps, LocalSteps: p.sgd.Steps(), Merges: p.merges,
		SinceMerge: p.sinceMerge, RoundTarget: p.roundTarget, Loss: p.loss, Params: p.sgd.Params(), Velocity: p.sgd.Velocity(),
	}
	b, err := EncodeCheckpoint(ck)
	if err != nil {
		return err
	}
	path := filepath.Join(p.o.CheckpointDir, checkpointName(ck.LocalSteps))
	if err := writeFileAtomic(path, b); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	p.checkpoint = path
	paths, err := listCheckpoints(p.o.CheckpointDir)
	if err != nil {
		return err
	}
	for _, old := range paths[min(p.o.KeepCheckpoints, len(paths)):] {
		if old != path {
			if err := os.Remove(old); err != nil {
				p.log.Warn("old checkpoint not removed", "path", old, "err", err)
			}
		}
	}
	return nil
}

// resume loads the newest readable checkpoint, if any. An unreadable one is
// skipped (logged) in favour of an older one; a readable one that belongs to
// another configuration is an error, since training on would mix two runs.
func (p *process) resume() error {
	paths, err := listCheckpoints(p.o.CheckpointDir)
	if err != nil {
		return err
	}
	for _, path := range paths {
		ck, err := ReadCheckpoint(path)
		if err != nil {
			p.log.Warn("skipping unreadable checkpoint", "err", err)
			continue
		}
		if err := p.compatible(ck); err != nil {
			return fmt.Errorf("checkpoint %s: %w", path, err)
		}
		if err := p.sgd.SetParams(ck.Params); err != nil {
			return fmt.Errorf("checkpoint %s: %w", path, err)
		}
		if err := p.sgd.Restore(ck.LocalSteps, ck.Velocity); err != nil {
			return fmt.Errorf("checkpoint %s: %w", path, err)
		}
		p.jobSteps, p.merges, p.sinceMerge, p.roundTarget, p.loss = ck.StepsDone, ck.Merges, ck.SinceMerge, ck.RoundTarget, ck.Loss
		if p.o.MergeDir == "" && ck.SinceMerge > 0 {
			// Merging was switched off: the unmerged steps count as the job's.
			p.jobSteps += ck.SinceMerge
			p.sinceMerge, p.roundTarget = 0, -1
		}
		p.checkpoint, p.resumed = path, path
		p.log.Info("resumed", "checkpoint", path, "steps_done", p.jobSteps, "local_steps", ck.LocalSteps, "merges", ck.Merges)
		return nil
	}
	return nil
}

const fixCheckpoint = "run with the same flags and environment as before, or remove the checkpoint directory to start over"

// compatible rejects a checkpoint written under another configuration.
func (p *process) compatible(ck *Checkpoint) error {
	o := p.o
	switch {
	case ck.JobID != o.JobID:
		return fmt.Errorf("field \"job_id\": %q, this process runs job %q; %s", ck.JobID, o.JobID, fixCheckpoint)
	case ck.Seed != o.Train.Seed:
		return fmt.Errorf("field \"seed\": %d, but --seed is %d; %s", ck.Seed, o.Train.Seed, fixCheckpoint)
	case ck.CopyIndex != o.CopyIndex || ck.Copies != o.Copies:
		return fmt.Errorf("fields \"copy_index\"/\"copies\": %d/%d, but this process is copy %d of %d; %s", ck.CopyIndex, ck.Copies, o.CopyIndex, o.Copies, fixCheckpoint)
	}
	want := trainer.Params{Model: o.Train.Model, Dim: o.Data.Dim, Classes: o.Data.Classes}
	if o.Train.Model == trainer.MLP {
		want.Hidden = o.Train.Hidden
	}
	got := ck.Params
	if got.Model != want.Model || got.Dim != want.Dim || got.Hidden != want.Hidden || got.Classes != want.Classes {
		return fmt.Errorf("field \"params\": model %s dim %d hidden %d classes %d, but the flags ask for model %s dim %d hidden %d classes %d; %s",
			got.Model, got.Dim, got.Hidden, got.Classes, want.Model, want.Dim, want.Hidden, want.Classes, fixCheckpoint)
	}
	return nil
}

// pacer holds a process to an emulated speed: step n of a pacing window
// starts no earlier than n/rate seconds into it.
type pacer struct {
	rate  float64
	start time.Time
	n     int64
}

// maxPaceSleep bounds one sleep so progress stays fresh at slow paces.
const maxPaceSleep = time.Second

func (pc *pacer) wait(ctx context.Context, tick func()) error {
	if pc.rate <= 0 {
		return nil
	}
	if pc.n == 0 {
		pc.start = time.Now()
	}
	due := pc.start.Add(time.Duration(float64(pc.n) / pc.rate * float64(time.Second)))
	pc.n++
	for {
		d := time.Until(due)
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(min(d, maxPaceSleep))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		tick()
	}
}

// reset starts a new pacing window at the next step.
func (pc *pacer) reset() { pc.n = 0 }
