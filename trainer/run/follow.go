package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/hadar-sched/hadar/contract"
)

// follower is a rank > 0 of a unit: it trains no model of its own but
// emulates its share of every batch rank 0 announces, at its own GPU's
// pace, and reports done: the barrier that holds the unit to its slowest
// worker (see the protocol in dist.go).
type follower struct {
	o      Options
	log    *slog.Logger
	stdout io.Writer

	link   *link
	events chan peerMsg

	stepsDone  int64 // the job's steps as rank 0 last said
	checkpoint string
	resumed    string
	local      int64 // steps emulated by this worker
	rate       float64
	unitPace   float64
	nodes      int
	state      string
	started    bool // rank 0's start came: the progress file may be written

	progressAt    time.Time
	progressSteps int64
	measured      float64
}

// follow runs a rank > 0 until rank 0 ends the unit. Its exit status
// follows the protocol: 0 when the job is done or this worker was asked
// to stop (after rank 0 checkpointed), an error (exit 1) when the unit
// broke under it.
func follow(ctx context.Context, o Options, log *slog.Logger, stdout io.Writer) (Outcome, error) {
	// No progress file before rank 0's start message: the first one a
	// rank writes names the checkpoint its unit resumed from (rank 0's),
	// which is how the driver reports every rank's resume.
	f := &follower{o: o, log: log, stdout: stdout, state: contract.StateRendezvous, rate: o.StepsPerSec, progressAt: time.Now()}
	addr := net.JoinHostPort(o.MasterAddr, strconv.Itoa(o.MasterPort))
	start, err := f.gather(ctx, addr)
	if err != nil {
		return Outcome{}, err
	}
	if ctx.Err() != nil {
		// Stopped before the unit gathered: nothing to save.
		return f.leave(), nil
	}
	defer f.link.close()
	f.stepsDone, f.checkpoint, f.resumed, f.unitPace, f.nodes = start.StepsDone, start.Checkpoint, start.Checkpoint, start.UnitPace, start.Nodes
	if start.Spread {
		f.rate = o.spreadPace()
	}
	f.state = contract.StateRunning
	f.started = true
	f.writeProgressLogged()
	if start.Checkpoint != "" {
		// Every rank of a unit resumes from rank 0's checkpoint.
		log.Info("resumed", "checkpoint", start.Checkpoint, "steps_done", start.StepsDone, "rank", o.Rank)
	}
	log.Info("training", "rank", o.Rank, "world_size", o.WorldSize, "steps_per_sec", f.rate, "unit_steps_per_sec", f.unitPace, "nodes", f.nodes)

	for {
		m, err := f.next(ctx, contract.StateRunning)
		if err != nil {
			if ctx.Err() != nil {
				return f.leave(), nil
			}
			return f.broken(fmt.Errorf("rank 0 at %s was lost at step %d (%w): the unit cannot go on without it", addr, f.stepsDone, err))
		}
		switch m.Type {
		case msgStep:
			f.stepsDone, f.checkpoint = m.StepsDone, m.Checkpoint
			if end, out, err := f.emulate(ctx, m); end {
				return out, err
			}
		case msgStop:
			return f.end(ctx, m)
		}
	}
}

// gather joins the unit at rank 0's addr and returns rank 0's start
// message, with f.link connected; with ctx done (this worker was asked to
// stop) it returns no error and no start. Until the unit starts, nothing
// that rank 0's side does fails this worker: rank 0 may not listen yet, be
// stopped or restarted by Nomad while the unit gathers (its allocation is
// stopped a moment before this one, or comes back), or the port may still
// be held by another unit that is ending (its rank 0 refuses this worker
// as another unit's). The worker dials again until --rendezvous-timeout;
// only a refusal that cannot change (another protocol, world size or a
// rank given twice) fails it at once.
func (f *follower) gather(ctx context.Context, addr string) (wire, error) {
	o := f.o
	deadline := time.Now().Add(o.RendezvousTimeout)
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if time.Now().After(deadline) {
				return wire{}, fmt.Errorf("rendezvous with rank 0 at %s: the unit did not gather within --rendezvous-timeout %s; last: %w", addr, o.RendezvousTimeout, last)
			}
			f.log.Warn("rendezvous: joining rank 0 again", "addr", addr, "rank", o.Rank, "attempt", attempt+1, "after", last)
			select {
			case <-ctx.Done():
				return wire{}, nil
			case <-time.After(time.Second):
			}
		}
		conn, err := dialRetry(ctx, addr, deadline, f.tick)
		if err != nil {
			if ctx.Err() != nil {
				return wire{}, nil
			}
			if last != nil {
				return wire{}, fmt.Errorf("%w; before that, %v", err, last)
			}
			return wire{}, err
		}
		f.events = make(chan peerMsg, 16)
		f.link = newLink(0, conn, json.NewDecoder(conn), o.PeerTimeout, f.events)
		if err := f.link.send(o.hello()); err != nil {
			f.link.close()
			last = fmt.Errorf("send hello: %w", err)
			continue
		}
		f.log.Info("rendezvous: joined rank 0, waiting for the whole unit", "addr", addr, "rank", o.Rank, "world_size", o.WorldSize)
		start, err := f.next(ctx, contract.StateRendezvous)
		switch {
		case err != nil && ctx.Err() != nil:
			return wire{}, nil
		case err != nil:
			f.link.close()
			last = fmt.Errorf("rank 0 left before the unit started: %w", err)
			continue
		case start.Type == msgError && start.Retry:
			f.link.close()
			last = fmt.Errorf("rank 0 at %s refused this worker: %s", addr, start.Error)
			continue
		case start.Type == msgError:
			f.link.close()
			return wire{}, fmt.Errorf("rendezvous: rank 0 at %s refused this worker: %s", addr, start.Error)
		case start.Type != msgStart:
			f.link.close()
			return wire{}, fmt.Errorf("rendezvous: rank 0 at %s sent %q before start", addr, start.Type)
		}
		return start, nil
	}
}

// dialRetry connects to rank 0, retrying until deadline: rank 0 may not
// listen yet (it starts when Nomad gets to it, and reads its checkpoint
// first).
func dialRetry(ctx context.Context, addr string, deadline time.Time, tick func()) (net.Conn, error) {
	wait := 100 * time.Millisecond
	for {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("rendezvous: rank 0 at %s (MASTER_ADDR:MASTER_PORT) not reachable until the rendezvous timeout: %w", addr, err)
		}
		tick()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// next returns rank 0's next message, keeping the progress file fresh.
func (f *follower) next(ctx context.Context, state string) (wire, error) {
	t := time.NewTicker(f.o.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case ev := <-f.events:
			if ev.err != nil {
				return wire{}, ev.err
			}
			return ev.m, nil
		case <-ctx.Done():
			return wire{}, ctx.Err()
		case <-t.C:
			f.state = state
			f.tick()
		}
	}
}

// emulate runs one batch at this worker's pace and reports it done. end
// is true when the unit ended meanwhile (rank 0's stop, a lost link, or
// this worker's stop signal), with what follow returns.
func (f *follower) emulate(ctx context.Context, m wire) (end bool, out Outcome, err error) {
	due := time.Now()
	if f.rate > 0 {
		due = due.Add(time.Duration(float64(m.Steps) / f.rate * float64(time.Second)))
	}
	for {
		d := time.Until(due)
		if d <= 0 {
			break
		}
		t := time.NewTimer(min(d, f.o.ProgressInterval))
		select {
		case ev := <-f.events:
			t.Stop()
			if ev.err != nil {
				if ctx.Err() != nil {
					return true, f.leave(), nil
				}
				out, err := f.broken(fmt.Errorf("rank 0 was lost at step %d (%w): the unit cannot go on without it", f.stepsDone, ev.err))
				return true, out, err
			}
			if ev.m.Type == msgStop {
				out, err := f.end(ctx, ev.m)
				return true, out, err
			}
		case <-ctx.Done():
			t.Stop()
			return true, f.leave(), nil
		case <-t.C:
		}
		f.tick()
	}
	f.local += m.Steps
	if err := f.link.send(wire{Type: msgDone, Seq: m.Seq, Rank: f.o.Rank}); err != nil {
		if ctx.Err() != nil {
			return true, f.leave(), nil
		}
		out, err := f.broken(fmt.Errorf("rank 0 was lost at step %d (%w): the unit cannot go on without it", f.stepsDone, err))
		return true, out, err
	}
	return false, Outcome{}, nil
}

// end handles rank 0's stop message.
func (f *follower) end(ctx context.Context, m wire) (Outcome, error) {
	f.stepsDone, f.checkpoint = m.StepsDone, m.Checkpoint
	f.link.finish()
	switch m.Reason {
	case stopDone:
		f.state = contract.StateDone
		f.writeProgressLogged()
		f.log.Info("done", "steps_done", f.stepsDone, "rank", f.o.Rank)
		if _, err := fmt.Fprintf(f.stdout, "final steps_done=%d rank=%d world_size=%d\n", f.stepsDone, f.o.Rank, f.o.WorldSize); err != nil {
			return Outcome{}, fmt.Errorf("print final line: %w", err)
		}
		return f.outcome(false), nil
	case stopSignal:
		if ctx.Err() == nil {
			f.log.Info("rank 0 was stopped and checkpointed; waiting for this worker's own stop", "grace", f.o.StopGrace)
		}
	}
	reason := m.Reason
	if m.Error != "" {
		reason += ": " + m.Error
	}
	if waitSignal(ctx, f.o.StopGrace) {
		return f.stopped(), nil
	}
	return f.broken(&UnitBroken{Rank: -1, Reason: reason})
}

// leave tells rank 0 this worker was asked to stop and waits (bounded)
// for rank 0 to checkpoint, so the unit's state is saved before the
// worker is gone.
func (f *follower) leave() Outcome {
	if f.link != nil {
		if err := f.link.send(wire{Type: msgLeaving, Rank: f.o.Rank}); err == nil {
			deadline := time.After(leaveWait)
		wait:
			for {
				select {
				case ev := <-f.events:
					if ev.err != nil {
						break wait
					}
					if ev.m.Type == msgStop {
						f.stepsDone, f.checkpoint = ev.m.StepsDone, ev.m.Checkpoint
						break wait
					}
				case <-deadline:
					f.log.Warn("rank 0 did not confirm its checkpoint in time", "waited", leaveWait)
					break wait
				}
			}
		}
		f.link.close()
	}
	return f.stopped()
}

func (f *follower) stopped() Outcome {
	f.state = contract.StateStopped
	f.writeProgressLogged()
	f.log.Info("stopped", "steps_done", f.stepsDone, "rank", f.o.Rank, "checkpoint", f.checkpoint)
	return f.outcome(true)
}

// broken records a broken unit in the progress file and returns the
// error that makes the process exit 1.
func (f *follower) broken(err error) (Outcome, error) {
	f.state = contract.StateFailed
	f.writeProgressLogged()
	var ub *UnitBroken
	if !errors.As(err, &ub) {
		err = &UnitBroken{Rank: 0, Err: err}
	}
	return Outcome{}, fmt.Errorf("rank %d of unit %d: %w; exiting non-zero so the scheduler re-plans", f.o.Rank, f.o.Unit, err)
}

func (f *follower) outcome(stopped bool) Outcome {
	return Outcome{Stopped: stopped, StepsDone: f.stepsDone, LocalSteps: f.local, Resumed: f.resumed, Checkpoint: f.checkpoint,
		Rank: f.o.Rank, UnitStepsPerSec: f.unitPace, Nodes: f.nodes}
}

func (f *follower) tick() {
	now := time.Now()
	if dt := now.Sub(f.progressAt); dt >= f.o.ProgressInterval {
		f.measured = float64(f.local-f.progressSteps) / dt.Seconds()
		f.progressAt, f.progressSteps = now, f.local
		f.writeProgressLogged()
	}
}

func (f *follower) writeProgressLogged() {
	if !f.started {
		return
	}
	err := WriteProgress(f.o.ProgressFile, contract.Progress{
		StepsDone: f.stepsDone, TotalSteps: int64(f.o.Steps), StepsPerSec: f.measured, Checkpoint: f.checkpoint,
		Updated: time.Now().UTC().Truncate(time.Millisecond), State: f.state, CopyIndex: f.o.CopyIndex, Copies: f.o.Copies,
		LocalSteps: f.local, Rank: f.o.Rank, WorldSize: f.o.WorldSize, Unit: f.o.Unit, UnitStepsPerSec: f.unitPace, Nodes: f.nodes,
	})
	if err != nil {
		f.log.Warn("progress file not written", "err", err)
	}
}
