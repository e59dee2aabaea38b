package train

import (
	"context"
	"sync"
	"time"

	log "github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/driver/plugin"
)

// eventBuffer is how many events a subscriber may fall behind by; and
// eventWait how long emit waits for a full subscriber before it drops
// the event (the client reads the stream all the time: it is not
// expected to happen).
const (
	eventBuffer = 64
	eventWait   = 5 * time.Second
)

// eventHub hands the driver's task events to every TaskEvents stream
// (Nomad's client opens one per plugin instance).
type eventHub struct {
	logger log.Logger
	mu     sync.Mutex
	subs   map[chan *plugin.TaskEvent]struct{}
}

func newEventHub(logger log.Logger) *eventHub {
	return &eventHub{logger: logger, subs: map[chan *plugin.TaskEvent]struct{}{}}
}

// subscribe returns a stream of events that ends (is closed) with ctx or
// stop.
func (e *eventHub) subscribe(ctx, stop context.Context) <-chan *plugin.TaskEvent {
	ch := make(chan *plugin.TaskEvent, eventBuffer)
	e.mu.Lock()
	e.subs[ch] = struct{}{}
	e.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-stop.Done():
		}
		e.mu.Lock()
		delete(e.subs, ch)
		close(ch)
		e.mu.Unlock()
	}()
	return ch
}

// emit sends ev to every stream. It holds the lock while it sends, so a
// stream is never closed under it.
func (e *eventHub) emit(ev *plugin.TaskEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for ch := range e.subs {
		select {
		case ch <- ev:
		case <-time.After(eventWait):
			e.logger.Warn("task event dropped: nobody reads the event stream", "task", ev.TaskName, "message", ev.Message)
		}
	}
}
