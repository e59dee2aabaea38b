package agent

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// readAhead is ReadAhead's part of the agent: how a job's progress is
// read, how often ReadAhead reads between round boundaries, whether it
// runs, and the wake-up each boundary sends it. read and every are set
// before the agent runs (tests replace them before starting it) and read
// without a lock; on and the wake-up are safe from any goroutine, so
// neither ReadAhead's waits nor a boundary's signal hold the agent's mu.
type readAhead struct {
	// read reads a job's training progress (the watcher's reader).
	read func(context.Context, *watch.Alloc) (*contract.Progress, error)
	// every is the period between boundary sweeps (tests shorten it).
	every time.Duration
	// on is set while ReadAhead runs: boundaries then use the progress it
	// read instead of reading themselves.
	on atomic.Bool
	// woke holds one pending wake-up: a boundary was planned.
	woke chan struct{}
}

// init sets the reader and period and makes the wake-up.
func (r *readAhead) init(read func(context.Context, *watch.Alloc) (*contract.Progress, error), every time.Duration) {
	r.read, r.every, r.woke = read, every, make(chan struct{}, 1)
}

// running reports whether ReadAhead runs, so a boundary need not read.
func (r *readAhead) running() bool { return r.on.Load() }

// period is how long after the last sweep the next between boundaries
// starts: every, or twice the last sweep's duration if longer, so the
// Nomad server spends at most half its time on the reads.
func (r *readAhead) period(took time.Duration) time.Duration { return max(r.every, 2*took) }

// passed says a boundary was planned; it never blocks (one wake-up is
// kept, as ReadAhead re-reads the next boundary when it wakes).
func (r *readAhead) passed() {
	select {
	case r.woke <- struct{}{}:
	default:
	}
}

// wait waits for a boundary's wake-up; false when ctx ended first.
func (r *readAhead) wait(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-r.woke:
		return true
	}
}
