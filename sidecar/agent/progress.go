package agent

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// progressConcurrency bounds the progress files read at once.
const progressConcurrency = 32

// progressRead is one progress file to read: that of the rank 0 worker of
// one of a running job's units.
type progressRead struct {
	id    string
	alloc *watch.Alloc
}

// progressReads lists the progress files of every job the engine runs.
// Called under a.mu.
func (a *Agent) progressReads(snap *watch.Snapshot) []progressRead {
	var reads []progressRead
	for _, k := range a.roster.keys() {
		mj := a.roster.job(k)
		if st, ok := a.core.eng.Job(mj.id); !ok || !st.Running {
			continue
		}
		for _, al := range snap.AllocsOf(k) {
			if al.Worker != nil && al.Worker.Rank == 0 && al.ClientStatus == api.AllocClientStatusRunning {
				reads = append(reads, progressRead{mj.id, al})
			}
		}
	}
	return reads
}

// readProgress reads the files concurrently and returns each job's highest
// steps done (each copy of a HadarE job reports the job's merged steps);
// a job none of whose files could be read is absent. It takes no lock: the
// reads go through the Nomad server, one per running job.
func (a *Agent) readProgress(ctx context.Context, reads []progressRead) map[string]float64 {
	done := make([]float64, len(reads))
	sem := make(chan struct{}, progressConcurrency)
	var wg sync.WaitGroup
	for i, r := range reads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			p, err := a.ahead.read(rctx, r.alloc)
			if err != nil {
				done[i] = -1
				return
			}
			done[i] = float64(p.StepsDone)
		}()
	}
	wg.Wait()
	best := map[string]float64{}
	for i, r := range reads {
		if done[i] >= 0 && done[i] > best[r.id] {
			best[r.id] = done[i]
		}
	}
	return best
}

// applyProgress tells the engine the steps read. A job that left since its
// file was listed is skipped. Called under a.mu.
func (a *Agent) applyProgress(best map[string]float64) {
	now := a.now()
	for _, id := range slices.Sorted(maps.Keys(best)) {
		if st, ok := a.core.eng.Job(id); !ok || !st.Running {
			continue
		}
		if err := a.core.eng.Progress(id, best[id], now); err != nil {
			if errors.Is(err, engine.ErrImplausible) {
				// Once per job: its file keeps saying it every read.
				a.warnOnce("progress:"+id, "a job's progress report was not taken as written (its progress file is the job's own)", "job", id, "error", err)
				continue
			}
			a.log.Debug("progress", "job", id, "error", err)
		}
	}
}

// readSynced reads the progress files of the running jobs of the view
// the engine was last synced with (there the running jobs and their
// allocations agree), as readProgress. It takes a.mu only to list them.
func (a *Agent) readSynced(ctx context.Context) map[string]float64 {
	a.mu.Lock()
	var reads []progressRead
	if seen := a.cluster.view(); seen != nil {
		reads = a.progressReads(seen)
	}
	a.mu.Unlock()
	return a.readProgress(ctx, reads)
}

// progressEvery is how often ReadAhead reads every running job's progress
// between round boundaries, so that views show progress a few seconds old
// rather than as of the last boundary (a round can outlast a job: issue 33
// showed 0% for a job's whole life). Never more often than every other
// sweep's duration: at 500 nodes a sweep is some 550 reads through the
// Nomad server, which must not spend more than half its time on them.
const progressEvery = 5 * time.Second

// ReadAhead reads every running job's progress every progressEvery (or
// twice as long as the last sweep took, if longer), and shortly before
// each round boundary, until ctx ends, so that no boundary waits on one
// read per running job through the Nomad server (at 500 nodes, some 550
// reads: the larger part of a round's time). The boundary's sweep starts
// as far ahead of the boundary as the previous sweep took, and half as
// long again; a sweep not done when the boundary comes is used at the
// next one, and the engine plans on its estimates meanwhile. Run starts
// it; a caller driving Cycle itself may run it beside.
func (a *Agent) ReadAhead(ctx context.Context) {
	a.ahead.on.Store(true)
	defer a.ahead.on.Store(false)
	took := time.Second
	last := a.clock()
	for {
		a.mu.Lock()
		next := a.pace.nextRound()
		a.mu.Unlock()
		lead := min(took*3/2+time.Second, a.cfg.Round.Duration()/2)
		at, between := next.Add(-lead), false
		if every := a.ahead.period(took); last.Add(every).Before(at) {
			at, between = last.Add(every), true
		}
		if wait := at.Sub(a.clock()); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		start := a.clock()
		best := a.readSynced(ctx)
		if ctx.Err() != nil {
			return
		}
		a.mu.Lock()
		a.applyProgress(best)
		swept := a.pace.nextRound()
		a.mu.Unlock()
		last = a.clock()
		took = last.Sub(start)
		if between {
			continue
		}
		// Wait for the boundary this sweep was for (none when it passed
		// during the sweep) before reading for the one after; a signal
		// left from an earlier boundary is not it.
		for swept.Equal(next) {
			if !a.ahead.wait(ctx) {
				return
			}
			a.mu.Lock()
			swept = a.pace.nextRound()
			a.mu.Unlock()
		}
	}
}
