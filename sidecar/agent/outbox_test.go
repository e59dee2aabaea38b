package agent

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

func outboxWrite(id string) (watch.JobKey, *pendingWrite) {
	k := watch.JobKey{Namespace: "default", ID: id}
	return k, &pendingWrite{job: &apply.Job{Key: k}, done: make(chan struct{})}
}

// The outbox runs at most its bound of writes at once, and holds each
// job's write as in flight until it is collected, once.
func TestOutbox(t *testing.T) {
	const bound, n = 3, 10
	o := newOutbox(bound)
	var running, most, entries atomic.Int32
	release := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(bound)
	ws := map[watch.JobKey]*pendingWrite{}
	for i := range n {
		k, w := outboxWrite(string(rune('a' + i)))
		ws[k] = w
		o.start(k, w, func() {
			r := running.Add(1)
			for {
				m := most.Load()
				if r <= m || most.CompareAndSwap(m, r) {
					break
				}
			}
			if entries.Add(1) <= bound {
				entered.Done()
			}
			<-release
			running.Add(-1)
		})
	}
	entered.Wait() // bound writes hold their slots
	time.Sleep(20 * time.Millisecond)
	if got := running.Load(); got != bound {
		t.Fatalf("%d writes running at once, want %d", got, bound)
	}
	if o.pending() != n {
		t.Fatalf("%d pending, want %d", o.pending(), n)
	}
	for k, w := range ws {
		if o.inFlight(k) != w {
			t.Fatalf("job %v: not in flight", k)
		}
	}
	if got := o.collect(); len(got) != 0 {
		t.Fatalf("collected %d before any returned", len(got))
	}
	select {
	case <-o.wake():
		t.Fatal("woken before a write returned")
	default:
	}

	close(release)
	o.wait()
	if m := most.Load(); m > bound {
		t.Fatalf("%d writes ran at once, bound %d", m, bound)
	}
	select {
	case <-o.wake():
	default:
		t.Fatal("not woken after writes returned")
	}
	for _, w := range ws {
		select {
		case <-w.done:
		default:
			t.Fatalf("job %v: done not closed", w.job.Key)
		}
	}
	got := o.collect()
	if len(got) != n {
		t.Fatalf("collected %d, want %d", len(got), n)
	}
	seen := map[*pendingWrite]bool{}
	for _, w := range got {
		if seen[w] || ws[w.job.Key] != w {
			t.Fatalf("job %v collected twice or not started", w.job.Key)
		}
		seen[w] = true
	}
	if len(o.collect()) != 0 || o.pending() != 0 {
		t.Fatal("writes collected again, or still pending")
	}
	for k := range ws {
		if o.inFlight(k) != nil {
			t.Fatalf("job %v in flight after collect", k)
		}
	}
}

// A job's newer write stays in flight when its older one is collected.
func TestOutboxNewerWriteStays(t *testing.T) {
	o := newOutbox(2)
	k, old := outboxWrite("j")
	o.start(k, old, func() {})
	<-old.done
	_, newer := outboxWrite("j")
	block := make(chan struct{})
	o.start(k, newer, func() { <-block })
	if got := o.collect(); len(got) != 1 || got[0] != old {
		t.Fatalf("collected %v, want the older write", got)
	}
	if o.inFlight(k) != newer {
		t.Fatal("the newer write is not in flight")
	}
	close(block)
	o.wait()
	if got := o.collect(); len(got) != 1 || got[0] != newer || o.inFlight(k) != nil {
		t.Fatalf("collected %v, in flight %v", got, o.inFlight(k))
	}
}
