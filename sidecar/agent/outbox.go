package agent

import (
	"sync"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

// outbox holds the job writes that go out to Nomad in the background
// (act): it bounds how many run at once, keeps each job's write until the
// agent collects it, and wakes Run when one returns. It owns its lock, so
// a returning write never takes the agent's.
type outbox struct {
	sem  chan struct{} // a slot per write running at once
	woke chan struct{} // one pending wake-up: a write returned
	all  sync.WaitGroup

	mu sync.Mutex
	// writing is each job's write not yet collected, returned those that
	// returned, in the order they did.
	writing  map[watch.JobKey]*pendingWrite
	returned []*pendingWrite
}

// newOutbox returns an outbox that runs at most n writes at once.
func newOutbox(n int) *outbox {
	return &outbox{sem: make(chan struct{}, n), woke: make(chan struct{}, 1), writing: map[watch.JobKey]*pendingWrite{}}
}

// start runs write in the background as w, the write of job k, once a
// slot is free; it replaces any write of k still held. When write returns,
// w.done is closed and the outbox wakes.
func (o *outbox) start(k watch.JobKey, w *pendingWrite, write func()) {
	o.mu.Lock()
	o.writing[k] = w
	o.mu.Unlock()
	o.all.Add(1)
	go func() {
		defer o.all.Done()
		o.sem <- struct{}{}
		write()
		<-o.sem
		o.mu.Lock()
		o.returned = append(o.returned, w)
		o.mu.Unlock()
		close(w.done)
		select {
		case o.woke <- struct{}{}:
		default:
		}
	}()
}

// inFlight returns job k's write not yet collected, nil when none: the
// agent waits on its done before choosing the job's units again.
func (o *outbox) inFlight(k watch.JobKey) *pendingWrite {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.writing[k]
}

// pending is how many jobs have a write not yet collected.
func (o *outbox) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.writing)
}

// collect returns the writes that returned since the last call, each
// once, in the order they returned, and forgets them.
func (o *outbox) collect() []*pendingWrite {
	o.mu.Lock()
	defer o.mu.Unlock()
	ws := o.returned
	o.returned = nil
	for _, w := range ws {
		if o.writing[w.job.Key] == w {
			delete(o.writing, w.job.Key)
		}
	}
	return ws
}

// wait blocks until every write started has returned.
func (o *outbox) wait() { o.all.Wait() }

// wake receives once after one or more writes returned.
func (o *outbox) wake() <-chan struct{} { return o.woke }
