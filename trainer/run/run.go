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

	"github.com/hadar-sched/hadar/contract"
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

	Round      int   // HadarE: the last merged round adopted
	StartRound int   // HadarE: the round the copy started from (adopted, or its checkpoint's)
	StartSteps int64 // the job's steps when training started (resumed or adopted)
	// TrainTime is the time from the first step (the unit gathered) to
	// the end, the span over which its pace is measured.
	TrainTime       time.Duration
	Rank            int     // the worker's rank in its unit
	UnitStepsPerSec float64 // the unit's predicted pace (distributed)
	Nodes           int     // nodes the unit spans (distributed)
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
	init trainer.Params

	jobSteps    int64
	merges      int
	round       int // HadarE: the closed round whose parameters this copy holds
	sinceMerge  int64
	roundTarget int64
	loss        float64

	members    *membership
	latest     *Merged // HadarE: the closed round adopted last
	mergeEvery int     // HadarE: this copy's steps per round
	copies     int     // copies merged in the last round (declared copies before the first)

	group *group          // a unit's rank 0: the other ranks
	ctx   context.Context // the run's; its end is this process's stop signal

	startRound int
	startSteps int64
	startAt    time.Time

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
//
// A rank > 0 of a unit (WORLD_SIZE > 1) trains no model: it follows rank
// 0's steps (dist.go). Rank 0 gathers its unit before the first step and
// ends it when it stops; a unit that loses a worker ends with a
// *UnitBroken error (exit 1) unless this process was asked to stop.
func Run(ctx context.Context, o Options, log *slog.Logger, stdout io.Writer) (Outcome, error) {
	if err := o.Validate(); err != nil {
		return Outcome{}, err
	}
	if o.Distributed() && o.Rank > 0 {
		return follow(ctx, o, log, stdout)
	}
	train, test, err := trainer.Generate(o.Data)
	if err != nil {
		return Outcome{}, err
	}
	shard := train
	if o.Copies > 1 {
		// Declared copies train on disjoint shards; dynamic copies (a
		// number unknown in advance) on all the data, each in its own
		// order (the copy index seeds it).
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
	p := &process{o: o, log: log, sgd: sgd, test: test, init: init, roundTarget: -1, state: contract.StateRunning, copies: o.Copies, ctx: ctx}
	if err := p.resume(); err != nil {
		return Outcome{}, err
	}
	p.progressAt, p.progressSteps = time.Now(), sgd.Steps()
	if o.Distributed() {
		p.state = contract.StateRendezvous
	}
	if err := p.writeProgress(); err != nil {
		return Outcome{}, err
	}
	log.Info("training", "model", o.Train.Model, "steps_done", p.jobSteps, "total_steps", o.Steps,
		"copy", o.CopyIndex, "copies", o.Copies, "train_samples", shard.Len(), "steps_per_sec", o.StepsPerSec,
		"rank", o.Rank, "world_size", o.WorldSize, "unit", o.Unit)

	if o.Distributed() {
		g, err := rendezvous(ctx, o, log, p.tick, p.jobSteps, p.checkpoint)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return p.stop(nil)
			}
			return Outcome{}, err
		}
		p.group = g
		defer g.close()
		p.state = contract.StateRunning
	}
	if o.Merging() {
		p.mergeEvery = p.ownMergeEvery()
		m, latest, err := join(o, log, p.mergeEvery, init)
		if err != nil {
			return p.fail(err)
		}
		p.members = m
		if err := p.adoptStart(latest); err != nil {
			m.hb.stop(MemberLeaving)
			return p.fail(err)
		}
	}

	p.startRound, p.startSteps, p.startAt = p.round, p.jobSteps, time.Now()
	err = p.train(ctx)
	var broken *UnitBroken
	switch {
	case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return p.stop(nil)
	case errors.As(err, &broken):
		return p.stop(broken)
	case err != nil:
		return p.fail(err)
	}

	p.state = contract.StateDone
	if p.members != nil {
		p.members.hb.stop(MemberDone)
	}
	if err := p.saveCheckpoint(); err != nil {
		return p.fail(err)
	}
	if err := p.writeProgress(); err != nil {
		return p.fail(err)
	}
	if p.group != nil {
		p.group.end(stopDone, p.jobSteps, p.checkpoint, "")
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

// stop ends a run that was asked to stop (broken == nil) or whose unit
// lost a worker: a HadarE copy leaves its job's copies with its last
// steps, the checkpoint is written, the unit's other ranks are told, and
// the run returns Stopped (exit 0) if this process was asked to stop —
// at once, or within --stop-grace of its unit breaking — else the
// *UnitBroken error (exit 1).
func (p *process) stop(broken *UnitBroken) (Outcome, error) {
	if p.members != nil {
		p.leave()
	}
	p.state = contract.StateStopped
	if broken != nil {
		p.state = contract.StateFailed
	}
	if err := p.saveCheckpoint(); err != nil {
		return p.fail(fmt.Errorf("stopping: %w", err))
	}
	if err := p.writeProgress(); err != nil {
		return p.fail(fmt.Errorf("stopping: %w", err))
	}
	reason, message := stopSignal, ""
	if broken != nil {
		reason, message = stopPeerLost, broken.Error()
		if broken.Left {
			reason = stopPeerLeft
		}
	}
	if p.group != nil {
		p.group.end(reason, p.jobSteps, p.checkpoint, message)
	}
	p.log.Info("checkpoint written", "checkpoint", p.checkpoint, "steps_done", p.jobSteps, "local_steps", p.sgd.Steps(), "reason", reason)
	if broken == nil {
		return p.outcome(true), nil
	}
	p.log.Warn("the unit broke; waiting for this worker's own stop before failing", "err", broken, "grace", p.o.StopGrace)
	if waitSignal(p.ctx, p.o.StopGrace) {
		p.state = contract.StateStopped
		p.writeProgressLogged()
		return p.outcome(true), nil
	}
	return Outcome{}, fmt.Errorf("rank 0 of unit %d: %w (checkpoint %s at step %d); exiting non-zero so the scheduler re-plans", p.o.Unit, broken, p.checkpoint, p.jobSteps)
}

// fail ends a run on an error: the unit's other ranks are told so they do
// not wait for the peer timeout.
func (p *process) fail(err error) (Outcome, error) {
	if p.members != nil {
		p.members.hb.stop(MemberLeaving)
	}
	if p.group != nil {
		p.group.end(stopError, p.jobSteps, p.checkpoint, err.Error())
	}
	return Outcome{}, err
}

func (p *process) outcome(stopped bool) Outcome {
	out := Outcome{Stopped: stopped, StepsDone: p.jobSteps, LocalSteps: p.sgd.Steps(), Merges: p.merges,
		Resumed: p.resumed, Checkpoint: p.checkpoint, Params: p.sgd.Params(), Round: p.round, Rank: p.o.Rank,
		StartRound: p.startRound, StartSteps: p.startSteps}
	if !p.startAt.IsZero() {
		out.TrainTime = time.Since(p.startAt)
	}
	if p.group != nil {
		out.UnitStepsPerSec, out.Nodes = p.group.pace, p.group.nodes
	}
	return out
}

// train runs steps (and merge rounds) until the job's total is reached or
// ctx is cancelled. Steps run in batches: a unit's barrier after each,
// a HadarE copy's merge after its round's steps.
func (p *process) train(ctx context.Context) error {
	total := int64(p.o.Steps)
	merging := p.members != nil
	rate := p.o.StepsPerSec
	if p.group != nil {
		rate = p.group.ownRate
	}
	pace := &pacer{rate: rate}
	for p.jobSteps < total {
		if merging && p.roundTarget < 0 {
			if err := p.nextRound(ctx); err != nil {
				return err
			}
			pace.reset()
			continue
		}
		n := total - p.jobSteps
		if merging {
			n = p.roundTarget - p.sinceMerge
		}
		if p.group != nil {
			n = min(n, p.group.batch)
			if err := p.group.step(n, p.jobSteps, p.checkpoint); err != nil {
				return err
			}
		}
		for range n {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := pace.wait(ctx, p.tick); err != nil {
				return err
			}
			if err := p.step(merging); err != nil {
				return err
			}
		}
		if p.group != nil {
			// The batch's last step takes its time too: the other ranks
			// spend n/rate on their batch, and so does rank 0.
			if err := pace.finish(ctx, p.tick); err != nil {
				return err
			}
			if err := p.group.barrier(ctx, p.tick); err != nil {
				return err
			}
			// The barrier's wait is not time the pace may catch up on.
			pace.reset()
		}
		if merging && p.sinceMerge >= p.roundTarget {
			if err := p.merge(ctx); err != nil {
				return err
			}
			// Waiting for the others is not time the pace may catch up on.
			pace.reset()
		}
	}
	return nil
}

// step takes one SGD step.
func (p *process) step(merging bool) error {
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
	return nil
}

// ownMergeEvery is this copy's steps per round: its pace (the unit's)
// times --merge-interval when both are known, so that copies on fast and
// slow GPUs reach a round's end together; else --merge-every.
func (p *process) ownMergeEvery() int {
	pace := p.o.StepsPerSec
	if p.group != nil {
		pace = p.group.pace
	}
	if p.o.MergeInterval > 0 && pace > 0 {
		return max(1, int(math.Round(pace*p.o.MergeInterval.Seconds())))
	}
	return p.o.MergeEvery
}

// adoptStart settles where a copy starts: its own checkpoint if that is
// at the newest closed round (it is continuing that round), else the
// newest closed round's parameters and steps (a new copy, or one whose
// checkpoint the others have merged past).
func (p *process) adoptStart(latest *Merged) error {
	switch {
	case p.resumed != "" && p.round == latest.Round:
		p.latest = latest
		p.copies = max(len(latest.Members), p.o.Copies)
		p.log.Info("hadare: continuing the round from the checkpoint", "round", p.round+1, "since_merge", p.sinceMerge)
		return nil
	case p.resumed != "" && p.round > latest.Round:
		return fmt.Errorf("hadare: checkpoint %s is at merge round %d but the merge directory %s has rounds up to %d only: it was replaced; restore it, or remove the checkpoint directory to start from the merge directory",
			p.resumed, p.round, p.o.MergeDir, latest.Round)
	}
	if p.resumed != "" {
		p.log.Info("hadare: the other copies merged past this checkpoint", "checkpoint_round", p.round, "round", latest.Round)
	}
	p.log.Info("hadare: starting from the newest merged round", "round", latest.Round, "steps_done", latest.StepsDone, "members", len(latest.Members))
	return p.adopt(latest, -1)
}

// adopt takes a closed round's parameters and the job's steps. mine is
// the round this copy contributed to (-1: none).
func (p *process) adopt(mg *Merged, mine int) error {
	params, err := ParamsOf(mg.State, p.init)
	if err != nil {
		return fmt.Errorf("hadare: round %d: %w", mg.Round, err)
	}
	if err := p.sgd.SetParams(params); err != nil {
		return fmt.Errorf("hadare: round %d: %w", mg.Round, err)
	}
	if mine >= 0 {
		in := slices.ContainsFunc(mg.Members, func(c Contribution) bool { return c.Copy == p.o.CopyIndex })
		switch {
		case mg.Round == mine && in:
			p.merges++
		case mg.Round == mine:
			p.log.Warn("hadare: the round closed without this copy's steps (it was too late); they are not counted", "round", mine, "steps", p.sinceMerge)
		default:
			p.log.Warn("hadare: the others merged past this copy's round; its steps are not counted", "round", mine, "newest", mg.Round, "steps", p.sinceMerge)
		}
	}
	p.latest = mg
	p.round = mg.Round
	p.jobSteps = mg.StepsDone
	p.sinceMerge = 0
	p.roundTarget = -1
	p.copies = len(mg.Members)
	if mg.Round == 0 {
		p.copies = max(len(mg.Targets), p.o.Copies)
	}
	p.state = contract.StateRunning
	p.log.Debug("hadare: adopted round", "round", mg.Round, "members", mg.Members, "steps_done", mg.StepsDone, "targets", mg.Targets)
	return nil
}

// nextRound makes this copy a member of the next round, waiting for the
// round under way to close if it is not one of its members.
func (p *process) nextRound(ctx context.Context) error {
	if p.latest.Done {
		p.jobSteps = p.latest.StepsDone
		return nil
	}
	t, member := p.latest.Target(p.o.CopyIndex)
	if member {
		if t == 0 || t > int64(p.mergeEvery) {
			t = int64(p.mergeEvery)
		}
		t = min(t, int64(p.o.Steps)-p.jobSteps)
		if t > 0 {
			p.roundTarget = t
			p.members.hb.set(contract.StateRunning, p.round+1)
			return nil
		}
	}
	p.state = contract.StateJoining
	p.writeProgressLogged()
	mg, err := p.members.waitJoin(ctx, p.latest, p.tick, p.checkPeers)
	if err != nil {
		return err
	}
	return p.adopt(mg, -1)
}

// merge ends this copy's round: its file, the wait for the others, and the
// closed round's parameters.
func (p *process) merge(ctx context.Context) error {
	r := p.round + 1
	p.state = contract.StateMerging
	p.writeProgressLogged()
	if err := p.members.contribute(r, p.sinceMerge, p.sgd.Params(), false); err != nil {
		return err
	}
	mg, err := p.members.waitRound(ctx, r, p.latest, p.tick, p.checkPeers)
	if err != nil {
		return err
	}
	if err := p.adopt(mg, r); err != nil {
		return err
	}
	p.log.Debug("merged", "round", mg.Round, "copies_present", len(mg.Members), "steps_done", p.jobSteps)
	p.writeProgressLogged()
	return nil
}

// leave is a stopped copy's goodbye to its job's other copies (merge.go);
// if it closed the round, this copy holds the merged state.
func (p *process) leave() {
	r := p.round + 1
	_, member := p.latest.Target(p.o.CopyIndex)
	member = member && p.state != contract.StateJoining
	mg, err := p.members.leave(r, p.latest, p.sinceMerge, p.sgd.Params(), member)
	if err != nil {
		p.log.Warn("hadare: leaving", "err", err)
		return
	}
	if mg != nil {
		if err := p.adopt(mg, r); err != nil {
			p.log.Warn("hadare: leaving", "err", err)
		}
	}
}

// checkPeers reports a broken unit while a HadarE copy waits.
func (p *process) checkPeers() error {
	if p.group == nil {
		return nil
	}
	return p.group.poll()
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
	pr := contract.Progress{
		StepsDone: p.jobSteps, TotalSteps: int64(p.o.Steps), StepsPerSec: p.rate, Loss: p.loss,
		Checkpoint: p.checkpoint, Updated: time.Now().UTC().Truncate(time.Millisecond),
		State: p.state, CopyIndex: p.o.CopyIndex, Copies: p.copies, LocalSteps: p.sgd.Steps(), Merges: p.merges, Round: p.round,
		Rank: p.o.Rank, WorldSize: p.o.WorldSize, Unit: p.o.Unit,
	}
	if p.group != nil {
		pr.UnitStepsPerSec, pr.Nodes = p.group.pace, p.group.nodes
	}
	return WriteProgress(p.o.ProgressFile, pr)
}

// saveCheckpoint writes ckpt-<local steps>.json atomically and removes all
// but the newest KeepCheckpoints.
func (p *process) saveCheckpoint() error {
	ck := &Checkpoint{
		Version: checkpointVersion, JobID: p.o.JobID, Seed: p.o.Train.Seed, CopyIndex: p.o.CopyIndex, Copies: p.o.Copies,
		TotalSteps: int64(p.o.Steps), StepsDone: p.jobSteps, LocalSteps: p.sgd.Steps(), Merges: p.merges, Round: p.round,
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
		p.jobSteps, p.merges, p.round, p.sinceMerge, p.roundTarget, p.loss = ck.StepsDone, ck.Merges, ck.Round, ck.SinceMerge, ck.RoundTarget, ck.Loss
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
	pc.n++
	return pc.until(ctx, pc.n-1, tick)
}

// finish waits for the end of the window's last step (step n ends at
// n/rate), before a barrier.
func (pc *pacer) finish(ctx context.Context, tick func()) error {
	if pc.rate <= 0 || pc.n == 0 {
		return nil
	}
	return pc.until(ctx, pc.n, tick)
}

// until sleeps until n/rate seconds into the window.
func (pc *pacer) until(ctx context.Context, n int64, tick func()) error {
	due := pc.start.Add(time.Duration(float64(n) / pc.rate * float64(time.Second)))
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
