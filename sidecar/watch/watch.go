// Package watch keeps a consistent in-memory view of a Nomad cluster for
// hadar's sidecar: nodes with their GPU device groups, jobs (with the parsed
// jobspec of managed ones), the allocations and blocked evaluations of
// managed jobs. It lists everything once, then follows Nomad's event stream,
// and re-lists whenever the stream cannot be trusted to be complete: after
// any disconnect, when indexes go backwards, when a subscription may have
// started past a gap, and periodically.
//
// Why re-list so readily: Nomad's event stream starts a subscription at the
// closest event still in its buffer (100 events by default) without saying
// so, and a restarted server has an empty buffer, so a resumed stream can
// silently skip changes. A re-list is the only proof of a complete view.
package watch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
)

// Config tunes a Watcher. Zero fields take the defaults shown.
type Config struct {
	// Namespaces to watch jobs, allocations and evaluations in; ["*"]
	// (the default) means all.
	Namespaces []string
	// RackMetaKey is the node meta key naming the node's rack; "rack".
	RackMetaKey string
	// ResyncInterval is the period of full re-lists (each also reopens the
	// event stream); 5m.
	ResyncInterval time.Duration
	// BackoffMin and BackoffMax bound the wait before reconnecting after
	// an error, doubled per consecutive failure with jitter; 500ms, 30s.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// TaskEvents is how many of each task's last events to keep; 3.
	TaskEvents int
	// ProgressPath is the training progress file's path in the allocation
	// filesystem; "{task}" stands for the task's name. Default
	// "{task}/local/hadar-progress.json", where hadar-train's default
	// progress file ($NOMAD_TASK_DIR/hadar-progress.json) lies.
	ProgressPath string
}

// Defaults of Config.
const (
	DefaultRackMetaKey    = "rack"
	DefaultResyncInterval = 5 * time.Minute
	DefaultBackoffMin     = 500 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
	DefaultTaskEvents     = 3
	DefaultProgressPath   = contract.ProgressAllocPath
)

func (c Config) withDefaults() (Config, error) {
	if len(c.Namespaces) == 0 {
		c.Namespaces = []string{"*"}
	}
	for _, ns := range c.Namespaces {
		if strings.TrimSpace(ns) == "" {
			return c, fmt.Errorf("watch config: namespaces: empty name in %q: want namespace names or \"*\" for all", c.Namespaces)
		}
	}
	if c.RackMetaKey == "" {
		c.RackMetaKey = DefaultRackMetaKey
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = DefaultResyncInterval
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = DefaultBackoffMin
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.TaskEvents == 0 {
		c.TaskEvents = DefaultTaskEvents
	}
	if c.ProgressPath == "" {
		c.ProgressPath = DefaultProgressPath
	}
	switch {
	case c.ResyncInterval < time.Second:
		return c, fmt.Errorf("watch config: resync_interval %v: want at least 1s", c.ResyncInterval)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return c, fmt.Errorf("watch config: backoff %v..%v: want 0 < min <= max", c.BackoffMin, c.BackoffMax)
	case c.TaskEvents < 0:
		return c, fmt.Errorf("watch config: task_events %d: want a positive number", c.TaskEvents)
	case !strings.Contains(c.ProgressPath, "{task}") && !strings.HasPrefix(c.ProgressPath, "alloc/"):
		return c, fmt.Errorf("watch config: progress_path %q: want a path under {task}/ or alloc/, e.g. %q", c.ProgressPath, DefaultProgressPath)
	}
	return c, nil
}

// watches reports whether jobs of namespace ns are in the view.
func (c Config) watches(ns string) bool {
	for _, n := range c.Namespaces {
		if n == "*" || n == ns {
			return true
		}
	}
	return false
}

// listNamespace is the namespace the job and evaluation lists ask for:
// the one watched namespace as is, else all ("*"), filtered by watches.
// Allocations and the event stream always cover every namespace.
func (c Config) listNamespace() string {
	if len(c.Namespaces) == 1 {
		return c.Namespaces[0]
	}
	return "*"
}

// Stats are the watcher's counters, for metrics.
type Stats struct {
	// Relists counts full re-lists applied; GapChecks those made because
	// a new subscription's first event left a possible gap.
	Relists   uint64
	GapChecks uint64
	// Reconnects counts event stream sessions that ended in an error and
	// were retried.
	Reconnects uint64
	// EventsApplied counts events that changed or confirmed the view;
	// EventsSkipped those a re-list had already reflected.
	EventsApplied uint64
	EventsSkipped uint64
	// APIErrors counts failed Nomad API calls (lists, reads, stream opens,
	// stream errors, undecodable events), progress reads excluded.
	APIErrors uint64
	// IndexResets counts re-lists that found Nomad's index lower than the
	// view's: a server that restarted with less state.
	IndexResets uint64
	// ProgressReads and ProgressErrors count Progress calls.
	ProgressReads  uint64
	ProgressErrors uint64
	// Index is the view's Nomad index.
	Index uint64
	// LastRelist and LastEvent are when they happened.
	LastRelist time.Time
	LastEvent  time.Time
}

// Watcher keeps the view. Create it with New, run it with Run, read it with
// Snapshot and Changes.
type Watcher struct {
	client *api.Client
	cfg    Config
	log    hclog.Logger

	running atomic.Bool
	ready   chan struct{} // closed after the first re-list
	changes chan Change   // capacity 1; see notify

	mu    sync.Mutex
	st    *state    // the live view, guarded by mu
	snap  *Snapshot // frozen copy of st, nil when st changed since
	stats Stats
	// resync asks the stream loop for a full re-list (e.g. a job became
	// managed and its earlier allocations are unknown).
	resync bool
}

// New returns a watcher of the cluster client talks to. logger may be nil.
func New(client *api.Client, cfg Config, logger hclog.Logger) (*Watcher, error) {
	if client == nil {
		return nil, errors.New("watch: no Nomad API client")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Watcher{
		client:  client,
		cfg:     cfg,
		log:     logger.Named("watch"),
		ready:   make(chan struct{}),
		changes: make(chan Change, 1),
		st:      newState(),
	}, nil
}

// Ready is closed once the first full re-list is in the snapshot.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Changes delivers what changed since the sidecar last received from it,
// coalesced: a slow reader gets one Change with every kind that happened.
func (w *Watcher) Changes() <-chan Change { return w.changes }

// Snapshot returns the current view. Repeated calls without changes in
// between return the same value.
func (w *Watcher) Snapshot() *Snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.snap == nil {
		w.snap = w.st.freeze()
	}
	return w.snap
}

// Stats returns the counters.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Index = w.st.index
	return s
}

func (w *Watcher) count(f func(*Stats)) {
	w.mu.Lock()
	f(&w.stats)
	w.mu.Unlock()
}

// notify hands c to the reader, merged with any Change still unread. Only
// the Run goroutine sends, so after taking the unread value out the
// channel has room.
func (w *Watcher) notify(c Change) {
	if c.Kinds == 0 {
		return
	}
	select {
	case w.changes <- c:
		return
	default:
	}
	select {
	case old := <-w.changes:
		c = old.merge(c)
	default:
	}
	w.changes <- c
}

// errResyncDue ends a stream session for a periodic or requested re-list.
var errResyncDue = errors.New("re-list due")

// Run watches until ctx ends, then returns nil. It never gives up: API
// errors are logged, counted and retried with backoff.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("watch: Run called twice")
	}
	defer w.running.Store(false)
	failures, reuse := 0, false
	for ctx.Err() == nil {
		healthy, err := w.session(ctx, reuse)
		if ctx.Err() != nil {
			break
		}
		if healthy {
			failures = 0 // start the backoff over
		}
		// A re-list after a clean end may reuse unchanged objects; after
		// an error the server may be another one.
		if reuse = errors.Is(err, errResyncDue); reuse {
			continue
		}
		failures++
		wait := backoff(w.cfg.BackoffMin, w.cfg.BackoffMax, failures)
		w.log.Warn("watch interrupted; re-listing after backoff", "error", err, "backoff", wait, "failures", failures)
		w.count(func(s *Stats) { s.Reconnects++ })
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	return nil
}

// backoff is min*2^(n-1) capped at max, then jittered down by up to half
// so that many sidecars do not reconnect in step.
func backoff(minWait, maxWait time.Duration, n int) time.Duration {
	d := minWait
	for i := 1; i < n && d < maxWait; i++ {
		d *= 2
	}
	d = min(d, maxWait)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// session re-lists, then applies the event stream until it fails, a
// re-list is due, or ctx ends. healthy reports a stream that delivered
// events or stayed open for BackoffMax: one that only opens and drops
// must not reset the backoff.
func (w *Watcher) session(ctx context.Context, reuse bool) (healthy bool, err error) {
	tables, _, err := w.relist(ctx, false, reuse)
	if err != nil {
		return false, err
	}
	start := tables.min() + 1
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := openStream(sctx, w.client, start, "*")
	if err != nil {
		w.count(func(s *Stats) { s.APIErrors++ })
		return false, fmt.Errorf("open event stream at index %d: %w", start, err)
	}
	w.log.Debug("event stream open", "index", start)
	opened := time.Now()
	resync := time.NewTimer(w.cfg.ResyncInterval)
	defer resync.Stop()
	first, last := true, uint64(0)
	// Decides healthy for every return below.
	defer func() { healthy = !first || time.Since(opened) >= w.cfg.BackoffMax }()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-resync.C:
			return false, errResyncDue
		case evs, ok := <-ch:
			if !ok {
				w.count(func(s *Stats) { s.APIErrors++ })
				return false, errors.New("event stream closed")
			}
			if evs.err != nil {
				w.count(func(s *Stats) { s.APIErrors++ })
				return false, fmt.Errorf("event stream: %w", evs.err)
			}
			if first && evs.Index > start {
				// Nomad starts a subscription at the closest buffered
				// event after start without saying whether events in
				// between were dropped. The subscription is live now (it
				// delivered this), so one more re-list closes any gap.
				var reset bool
				if tables, reset, err = w.relist(ctx, true, true); err != nil {
					return false, err
				}
				if reset {
					// The stream belongs to the server's former history.
					return false, errResyncDue
				}
			} else if !first && evs.Index < last {
				return false, fmt.Errorf("event index went back from %d to %d: %w", last, evs.Index, errIndexBack)
			}
			first, last = false, max(last, evs.Index)
			if err := w.apply(ctx, &evs, tables); err != nil {
				return false, err
			}
			if w.takeResync() {
				return false, errResyncDue
			}
		}
	}
}

// errIndexBack marks a stream whose indexes went backwards.
var errIndexBack = errors.New("stream inconsistent")

func (w *Watcher) takeResync() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.resync
	w.resync = false
	return r
}
