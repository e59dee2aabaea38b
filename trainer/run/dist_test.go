package run

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/contract"
)

// freePort returns a loopback port free at the time of the call.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// worker is one rank of a unit in process: its options and, once it ran,
// its outcome.
type worker struct {
	o   Options
	out Outcome
	err error
}

// unitWorkers builds the options of a unit's ranks: the checkpoint
// directory shared (as hadar-train keys it by the template group), a
// progress file each. env[r] adds rank r's variables.
func unitWorkers(t *testing.T, dir string, port, unit int, env []map[string]string, args ...string) []*worker {
	t.Helper()
	var ws []*worker
	for r, e := range env {
		vars := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": strconv.Itoa(len(env)), "MASTER_ADDR": "127.0.0.1",
			"MASTER_PORT": strconv.Itoa(port), "HADAR_UNIT": strconv.Itoa(unit), "HADAR_JOB_ID": "job-u"}
		for k, v := range e {
			vars[k] = v
		}
		base := []string{"--progress-file", filepath.Join(dir, "progress-"+strconv.Itoa(r)+".json"), "--checkpoint-dir", filepath.Join(dir, "ckpt"),
			"--progress-interval", "100ms"}
		o, err := ParseTrainArgs(append(base, args...), env2(vars), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, &worker{o: o})
	}
	return ws
}

func env2(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// whenTraining calls stop once every rank's progress file shows steps
// done, that is once the unit met and trains (or after a minute, so that a
// unit that never meets fails its test instead of hanging it).
func whenTraining(t *testing.T, ws []*worker, stop func()) {
	t.Helper()
	go func() {
		defer stop()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			all := true
			for _, w := range ws {
				p, err := ReadProgress(w.o.ProgressFile)
				if err != nil || p.StepsDone == 0 {
					all = false
					break
				}
			}
			if all {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
}

// runUnit runs the workers concurrently, each with its own context;
// cancel[r], if given, is called with rank r's cancel func once it runs.
func runUnit(ws []*worker, ctxs []context.Context) {
	var wg sync.WaitGroup
	for r, w := range ws {
		ctx := context.Background()
		if ctxs != nil {
			ctx = ctxs[r]
		}
		wg.Go(func() { w.out, w.err = Run(ctx, w.o, discardLog(), io.Discard) })
	}
	wg.Wait()
}

// TestUnitRunsAtItsSlowestWorkersPace: a unit's workers meet at rank 0's
// port and run in lockstep, so the unit runs at the pace of its slowest
// worker (each worker's pace being the job's pace on its GPU model), and
// at the spread paces when it spans nodes: hadar's speed model of a mixed
// unit. Before, each worker ran alone at its own pace.
func TestUnitRunsAtItsSlowestWorkersPace(t *testing.T) {
	const steps = 250
	tests := []struct {
		name   string
		env    []map[string]string
		want   float64 // predicted and measured unit pace
		nodes  int
		spread bool
	}{
		{"V100 and K80 on one node: the K80's pace", []map[string]string{
			{"HADAR_STEPS_PER_SEC": "400", "HADAR_GPU_MODEL": "Tesla V100-SXM2-16GB", "GROUP_RANK": "0"},
			{"HADAR_STEPS_PER_SEC": "100", "HADAR_GPU_MODEL": "Tesla K80", "GROUP_RANK": "0"},
		}, 100, 1, false},
		{"rank 0 is the slowest", []map[string]string{
			{"HADAR_STEPS_PER_SEC": "100", "GROUP_RANK": "0"},
			{"HADAR_STEPS_PER_SEC": "400", "GROUP_RANK": "0"},
			{"HADAR_STEPS_PER_SEC": "400", "GROUP_RANK": "0"},
		}, 100, 1, false},
		{"V100 and K80 on two nodes: the K80's spread pace", []map[string]string{
			{"HADAR_STEPS_PER_SEC": "400", "HADAR_SPREAD_STEPS_PER_SEC": "320", "GROUP_RANK": "0"},
			{"HADAR_STEPS_PER_SEC": "100", "HADAR_SPREAD_STEPS_PER_SEC": "80", "GROUP_RANK": "1"},
		}, 80, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := unitWorkers(t, t.TempDir(), freePort(t), 1, tt.env, "--steps", strconv.Itoa(steps), "--model", "softmax")
			runUnit(ws, nil)
			for r, w := range ws {
				if w.err != nil {
					t.Fatalf("rank %d: %v", r, w.err)
				}
				if w.out.StepsDone != steps || w.out.Stopped || w.out.UnitStepsPerSec != tt.want || w.out.Nodes != tt.nodes {
					t.Fatalf("rank %d: %+v; want %d steps, unit pace %g on %d nodes", r, w.out, steps, tt.want, tt.nodes)
				}
			}
			rate := steps / ws[0].out.TrainTime.Seconds()
			t.Logf("unit of %d: predicted %g steps/s, measured %.1f steps/s (%.0f%%)", len(ws), tt.want, rate, 100*rate/tt.want)
			// The barrier can only slow a unit down, and so can scheduling
			// on a loaded machine (77 % of the pace at load 20 on 2 cores):
			// the bound above is tight, the one below only catches workers
			// that wait for each other's steps in turn.
			if rate > tt.want*1.03 || rate < tt.want*0.5 {
				t.Fatalf("the unit ran at %.1f steps/s; want %g (-50%%, +3%%)", rate, tt.want)
			}
			prog, err := ReadProgress(ws[1].o.ProgressFile)
			if err != nil {
				t.Fatal(err)
			}
			if prog.State != contract.StateDone || prog.StepsDone != steps || prog.Rank != 1 || prog.WorldSize != len(ws) {
				t.Fatalf("rank 1's progress %+v: want done at %d steps", prog, steps)
			}
		})
	}
}

// TestUnitStopAndResume: the workers of a unit are stopped (SIGTERM, at
// slightly different times, as an eviction does): every rank exits 0
// after rank 0 checkpointed. A new unit (another number, as a move gives)
// resumes from that checkpoint, every rank from the same one, and ends
// with exactly the parameters of an uninterrupted run.
func TestUnitStopAndResume(t *testing.T) {
	const steps = 1500
	args := []string{"--steps", strconv.Itoa(steps), "--seed", "4"}
	want, _ := runToEnd(t, context.Background(), testOptions(t, t.TempDir(), nil, args...))

	dir := t.TempDir()
	paced := []map[string]string{{"HADAR_STEPS_PER_SEC": "1500"}, {"HADAR_STEPS_PER_SEC": "1000"}}
	ws := unitWorkers(t, dir, freePort(t), 3, paced, args...)
	ctx0, cancel0 := context.WithCancel(context.Background())
	ctx1, cancel1 := context.WithCancel(context.Background())
	// Stopped once every rank trains: a stop that came before the unit
	// met (a loaded machine's slow start) would test another case.
	whenTraining(t, ws, func() {
		cancel1() // rank 1's stop first,
		time.Sleep(30 * time.Millisecond)
		cancel0() // rank 0's a moment later
	})
	runUnit(ws, []context.Context{ctx0, ctx1})
	for r, w := range ws {
		if w.err != nil || !w.out.Stopped {
			t.Fatalf("rank %d: %+v, %v; want stopped without an error (exit 0)", r, w.out, w.err)
		}
	}
	ck, err := ReadCheckpoint(ws[0].out.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if ck.StepsDone <= 0 || ck.StepsDone >= steps || ws[1].out.Checkpoint != ws[0].out.Checkpoint {
		t.Fatalf("checkpoint at %d steps, rank 1 last saw %q; want one mid-run that rank 1 knows (%q)", ck.StepsDone, ws[1].out.Checkpoint, ws[0].out.Checkpoint)
	}

	moved := unitWorkers(t, dir, freePort(t), 8, paced, args...)
	runUnit(moved, nil)
	for r, w := range moved {
		if w.err != nil {
			t.Fatalf("rank %d of the new unit: %v", r, w.err)
		}
		if w.out.Resumed != ws[0].out.Checkpoint || w.out.StepsDone != steps {
			t.Fatalf("rank %d of the new unit resumed from %q and ended at %d; want from %q (step %d) to %d", r, w.out.Resumed, w.out.StepsDone, ws[0].out.Checkpoint, ck.StepsDone, steps)
		}
	}
	if moved[0].out.StartSteps != ck.StepsDone {
		t.Fatalf("the new unit started at step %d, the checkpoint is at %d", moved[0].out.StartSteps, ck.StepsDone)
	}
	if !slices.Equal(moved[0].out.Params.W, want.Params.W) {
		t.Fatal("the stopped and resumed unit ended with other parameters than an uninterrupted run")
	}
}

// TestUnitWorkerStoppedAlone: one worker is stopped and the others are
// not. The stopped one exits 0 once rank 0 checkpointed; rank 0, not
// stopped itself within --stop-grace, fails (exit 1) so the scheduler
// re-plans, with its checkpoint written.
func TestUnitWorkerStoppedAlone(t *testing.T) {
	ws := unitWorkers(t, t.TempDir(), freePort(t), 1, []map[string]string{{"HADAR_STEPS_PER_SEC": "1000"}, {"HADAR_STEPS_PER_SEC": "1000"}},
		"--steps", "100000", "--stop-grace", "300ms")
	ctx1, cancel1 := context.WithCancel(context.Background())
	whenTraining(t, ws, cancel1)
	runUnit(ws, []context.Context{context.Background(), ctx1})
	if ws[1].err != nil || !ws[1].out.Stopped {
		t.Fatalf("the stopped rank: %+v, %v; want a clean stop", ws[1].out, ws[1].err)
	}
	var broken *UnitBroken
	if !errors.As(ws[0].err, &broken) || broken.Rank != 1 || !broken.Left || !strings.Contains(ws[0].err.Error(), "re-plans") {
		t.Fatalf("rank 0: %v; want the unit broken by rank 1 leaving", ws[0].err)
	}
	prog, err := ReadProgress(ws[0].o.ProgressFile)
	if err != nil {
		t.Fatal(err)
	}
	if prog.State != contract.StateFailed || prog.Checkpoint == "" || prog.StepsDone == 0 {
		t.Fatalf("rank 0's progress %+v: want failed with a checkpoint", prog)
	}
	if _, err := ReadCheckpoint(prog.Checkpoint); err != nil {
		t.Fatal(err)
	}
}

// fakeRank joins (or serves) a unit by hand to break it on purpose.
func dialHello(t *testing.T, port, rank, world, unit int) (net.Conn, *json.Decoder) {
	t.Helper()
	var c net.Conn
	var err error
	for range 100 {
		if c, err = net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewEncoder(c).Encode(wire{Type: msgHello, Version: protocolVersion, JobID: "job-u", Unit: unit, Rank: rank, WorldSize: world, Node: "n"}); err != nil {
		t.Fatal(err)
	}
	return c, json.NewDecoder(c)
}

// TestUnitPeerLost: a worker that vanishes (its connection ends without
// a word) makes the others fail fast, not wait: rank 0 checkpoints and
// exits non-zero; a rank whose rank 0 vanishes exits non-zero.
func TestUnitPeerLost(t *testing.T) {
	t.Run("rank 1 lost", func(t *testing.T) {
		port := freePort(t)
		ws := unitWorkers(t, t.TempDir(), port, 1, []map[string]string{{"HADAR_STEPS_PER_SEC": "500"}, {}}, "--steps", "100000", "--stop-grace", "100ms")
		done := make(chan struct{})
		go func() {
			defer close(done)
			runUnit(ws[:1], nil)
		}()
		c, dec := dialHello(t, port, 1, 2, 1)
		for _, want := range []string{msgStart, msgStep} {
			var m wire
			if err := dec.Decode(&m); err != nil || m.Type != want {
				t.Fatalf("fake rank 1 read %+v, %v; want %s", m, err, want)
			}
		}
		lost := time.Now()
		c.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("rank 0 still runs 10 s after rank 1 vanished")
		}
		var broken *UnitBroken
		if !errors.As(ws[0].err, &broken) || broken.Rank != 1 || broken.Left {
			t.Fatalf("rank 0: %v; want the unit broken by rank 1 lost", ws[0].err)
		}
		t.Logf("rank 0 failed %s after rank 1 vanished: %v", time.Since(lost).Round(time.Millisecond), ws[0].err)
		if prog, err := ReadProgress(ws[0].o.ProgressFile); err != nil || prog.State != contract.StateFailed || prog.Checkpoint == "" {
			t.Fatalf("rank 0's progress %+v, %v: want failed with a checkpoint", prog, err)
		}
	})
	t.Run("rank 0 lost", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		ws := unitWorkers(t, t.TempDir(), port, 1, []map[string]string{{}, {"HADAR_STEPS_PER_SEC": "100"}}, "--steps", "100000", "--stop-grace", "100ms")
		done := make(chan struct{})
		go func() {
			defer close(done)
			var wg sync.WaitGroup
			w := ws[1]
			wg.Go(func() { w.out, w.err = Run(context.Background(), w.o, discardLog(), io.Discard) })
			wg.Wait()
		}()
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		var hello wire
		if err := json.NewDecoder(c).Decode(&hello); err != nil || hello.Rank != 1 {
			t.Fatalf("hello %+v, %v", hello, err)
		}
		enc := json.NewEncoder(c)
		_ = enc.Encode(wire{Type: msgStart, StepsDone: 40})
		_ = enc.Encode(wire{Type: msgStep, Seq: 1, Steps: 100000, StepsDone: 40})
		time.Sleep(200 * time.Millisecond)
		c.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("rank 1 still runs 10 s after rank 0 vanished")
		}
		if ws[1].err == nil || !strings.Contains(ws[1].err.Error(), "rank 0") || !strings.Contains(ws[1].err.Error(), "lost") {
			t.Fatalf("rank 1: %v; want an error saying rank 0 was lost", ws[1].err)
		}
	})
}

// TestRendezvous: no worker trains until the unit is complete; a worker
// of another unit is refused; a unit that does not gather in time fails.
func TestRendezvous(t *testing.T) {
	port := freePort(t)
	dir := t.TempDir()
	// Rank 0 gathers longer than the stranger keeps dialling: a stranger
	// that retries a refusal must see only refusals, not rank 0 giving up
	// (on a loaded machine the two timeouts, when equal, raced).
	ws := unitWorkers(t, dir, port, 1, []map[string]string{{}, {}}, "--steps", "50", "--rendezvous-timeout", "6s")
	stranger := unitWorkers(t, t.TempDir(), port, 2, []map[string]string{{}, {}}, "--steps", "50", "--rendezvous-timeout", "1500ms")[1]
	var wg sync.WaitGroup
	wg.Go(func() { ws[0].out, ws[0].err = Run(context.Background(), ws[0].o, discardLog(), io.Discard) })
	stranger.out, stranger.err = Run(context.Background(), stranger.o, discardLog(), io.Discard)
	if stranger.err == nil || !strings.Contains(stranger.err.Error(), "refused") || !strings.Contains(stranger.err.Error(), "unit 2") {
		t.Fatalf("a worker of unit 2 at unit 1's port: %v; want refused", stranger.err)
	}
	if prog, err := ReadProgress(ws[0].o.ProgressFile); err != nil || prog.State != contract.StateRendezvous || prog.LocalSteps != 0 {
		t.Fatalf("rank 0 while its unit gathers: %+v, %v; want no step, state rendezvous", prog, err)
	}
	wg.Wait()
	if ws[0].err == nil || !strings.Contains(ws[0].err.Error(), "1 of 2 workers joined") {
		t.Fatalf("rank 0 alone: %v; want the rendezvous timeout", ws[0].err)
	}
}

// logLines is a slog handler's output, safe to read while workers log.
type logLines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

func (l *logLines) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// waitLog waits until what was logged says s.
func waitLog(t *testing.T, l *logLines, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !l.has(s) {
		if time.Now().After(deadline) {
			l.mu.Lock()
			t.Fatalf("not logged within 30s: %q; logged:\n%s", s, l.buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRendezvousOutlastsAnotherUnitOnItsPort: a unit whose rendezvous
// port is still held by another unit's rank 0 (a unit that is ending, or
// one a restarted sidecar gave the same port) gathers once that one is
// gone. Before, its rank 1 reached the other rank 0, was refused as
// another unit's worker and exited 1 within a second (make test:
// TestSidecarSurvivesKill9's failed allocations), and its rank 0 gave the
// port up after 30 s.
func TestRendezvousOutlastsAnotherUnitOnItsPort(t *testing.T) {
	port := freePort(t)
	var oldLog logLines
	old := unitWorkers(t, t.TempDir(), port, 1, []map[string]string{{}, {}}, "--steps", "50", "--rendezvous-timeout", "2s")[0]
	var wg sync.WaitGroup
	wg.Go(func() { old.out, old.err = Run(context.Background(), old.o, oldLog.logger(), io.Discard) })
	waitLog(t, &oldLog, "waiting for the unit's workers")
	ws := unitWorkers(t, t.TempDir(), port, 2, []map[string]string{{}, {}}, "--steps", "50", "--rendezvous-timeout", "60s")
	var ranks [2]logLines
	for r, w := range ws {
		wg.Go(func() { w.out, w.err = Run(context.Background(), w.o, ranks[r].logger(), io.Discard) })
	}
	waitLog(t, &oldLog, "a worker of another unit reached this port")
	wg.Wait()
	if old.err == nil || !strings.Contains(old.err.Error(), "1 of 2 workers joined") {
		t.Fatalf("the unit holding the port: %v; want its rendezvous timeout", old.err)
	}
	for r, w := range ws {
		if w.err != nil || w.out.StepsDone != 50 {
			t.Fatalf("rank %d of the unit given the held port: %+v, %v; want all 50 steps", r, w.out, w.err)
		}
	}
	if !ranks[1].has("joining rank 0 again") {
		t.Fatal("rank 1 never met the other unit's rank 0: the test did not test the refusal")
	}
}

// TestRendezvousRankZeroRestartedWhileGathering: rank 0 stopped while its
// unit gathers (Nomad stops a unit's allocations one after the other, or
// restarts a task) does not fail rank 1: rank 1 joins rank 0 when it comes
// back, or exits 0 on its own stop signal. Before, the closed connection
// failed rank 1 at once (exit 1: a failed allocation).
func TestRendezvousRankZeroRestartedWhileGathering(t *testing.T) {
	// Units of three whose rank 2 is not there yet: rank 1 waits in the
	// rendezvous.
	t.Run("rank 0 comes back", func(t *testing.T) {
		port := freePort(t)
		dir := t.TempDir()
		ws := unitWorkers(t, dir, port, 1, []map[string]string{{}, {}, {}}, "--steps", "50", "--rendezvous-timeout", "60s")
		var log0, log1 logLines
		ctx0, stop0 := context.WithCancel(context.Background())
		defer stop0()
		first := make(chan error, 1)
		go func() {
			_, err := Run(ctx0, ws[0].o, log0.logger(), io.Discard)
			first <- err
		}()
		var wg sync.WaitGroup
		wg.Go(func() { ws[1].out, ws[1].err = Run(context.Background(), ws[1].o, log1.logger(), io.Discard) })
		waitLog(t, &log1, "joined rank 0, waiting for the whole unit")
		stop0()
		if err := <-first; err != nil {
			t.Fatalf("rank 0 stopped while gathering: %v; want a clean stop", err)
		}
		waitLog(t, &log1, "joining rank 0 again")
		wg.Go(func() { ws[0].out, ws[0].err = Run(context.Background(), ws[0].o, discardLog(), io.Discard) })
		wg.Go(func() { ws[2].out, ws[2].err = Run(context.Background(), ws[2].o, discardLog(), io.Discard) })
		wg.Wait()
		for r, w := range ws {
			if w.err != nil || w.out.StepsDone != 50 {
				t.Fatalf("rank %d: %+v, %v; want all 50 steps after rank 0 came back", r, w.out, w.err)
			}
		}
	})
	t.Run("the unit is stopped", func(t *testing.T) {
		port := freePort(t)
		ws := unitWorkers(t, t.TempDir(), port, 1, []map[string]string{{}, {}, {}}, "--steps", "50", "--rendezvous-timeout", "60s")[:2]
		var log1 logLines
		ctx0, stop0 := context.WithCancel(context.Background())
		ctx1, stop1 := context.WithCancel(context.Background())
		defer stop1()
		var wg sync.WaitGroup
		wg.Go(func() { ws[0].out, ws[0].err = Run(ctx0, ws[0].o, discardLog(), io.Discard) })
		wg.Go(func() { ws[1].out, ws[1].err = Run(ctx1, ws[1].o, log1.logger(), io.Discard) })
		waitLog(t, &log1, "joined rank 0, waiting for the whole unit")
		stop0()
		waitLog(t, &log1, "joining rank 0 again")
		stop1()
		wg.Wait()
		for r, w := range ws {
			if w.err != nil || !w.out.Stopped || w.out.StepsDone != 0 {
				t.Fatalf("rank %d: %+v, %v; want stopped cleanly with no step", r, w.out, w.err)
			}
		}
	})
}
