// Package leader elects one acting sidecar among several replicas, through
// a Nomad Variables lock (or, with CONSUL_HTTP_ADDR set, a Consul session
// lock). The others watch and serve read-only status.
//
// The loop is written on the lock primitives (acquire, renew, release),
// not on the Nomad api package's LockLeaser: that one does not cancel the
// protected function when a renew fails, so a leader would keep acting
// after it lost the lock. Here a lease is valid only while its last
// successful renew is younger than TTL - Margin: a leader that cannot renew
// stops acting before its TTL can run out and another replica acquire the
// lock (which Nomad allows only after the TTL and the lock delay). Every
// write the leader makes checks Lease.Valid first and carries the lease's
// generation into the journal: the fence.
package leader

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/nomadclient"
)

// Config of an election.
type Config struct {
	// ID names this replica (hostname-pid by default).
	ID string
	// TTL of the lock (10 s to 24 h; default 15 s) and LockDelay, the
	// grace period after a lost lock before another may take it (default
	// 15 s).
	TTL       time.Duration
	LockDelay time.Duration
	// Margin is how long before the TTL would run out a leader that could
	// not renew stops acting (default TTL/3).
	Margin time.Duration
	// Retry is the wait between acquire attempts (default 2 s).
	Retry  time.Duration
	Logger hclog.Logger
	// Now is the clock (tests).
	Now func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.TTL == 0 {
		c.TTL = 15 * time.Second
	}
	if c.LockDelay == 0 {
		c.LockDelay = 15 * time.Second
	}
	if c.TTL < 10*time.Second || c.TTL > 24*time.Hour {
		return c, fmt.Errorf("leader: ttl %v: want 10s to 24h (Nomad's limits)", c.TTL)
	}
	if c.Margin == 0 {
		c.Margin = c.TTL / 3
	}
	if c.Margin <= 0 || c.Margin >= c.TTL {
		return c, fmt.Errorf("leader: margin %v: want between 0 and the ttl %v", c.Margin, c.TTL)
	}
	if c.Retry == 0 {
		c.Retry = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// Lock is a leader lock.
type Lock interface {
	// Acquire blocks until this replica holds the lock (or ctx ends) and
	// returns its lease; the lease renews itself until Release or loss.
	Acquire(ctx context.Context) (*Lease, error)
	// Holder reports who holds the lock now ("" if no one), for status.
	Holder(ctx context.Context) (string, error)
	// Where names the lock for messages.
	Where() string
}

// Lease is one holding of the lock.
type Lease struct {
	// Generation increases with every acquisition of the lock, by any
	// replica: writes carry it so a log proves who acted when.
	Generation uint64
	cfg        Config
	mu         sync.Mutex
	renewed    time.Time
	lost       chan struct{}
	lostOnce   sync.Once
	release    func(context.Context) error
	renew      func(context.Context) error
	stop       context.CancelFunc
	done       chan struct{}
}

// newLease returns a lease acquired by a request sent at sent, that renew
// keeps and release gives up; start runs its renew loop. The lease is
// timed from the request, not the answer: the lock's TTL started when
// it was granted, somewhere between the two, and an answer delayed past
// the TTL must not give a lease that overlaps the next leader's.
func newLease(gen uint64, cfg Config, sent time.Time, renew, release func(context.Context) error) *Lease {
	return &Lease{Generation: gen, cfg: cfg, renewed: sent, lost: make(chan struct{}), done: make(chan struct{}), renew: renew, release: release}
}

// acquireTimeout bounds one acquire request: an answer later than TTL -
// Margin would bring a lease already spent.
func (c Config) acquireTimeout() time.Duration { return c.TTL - c.Margin }

// start runs the renew loop in the background.
func (l *Lease) start() {
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	go l.keep(ctx)
}

// Valid reports whether the leader may act now: the lease was renewed
// within TTL - Margin and was not released or lost.
func (l *Lease) Valid() bool {
	select {
	case <-l.lost:
		return false
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cfg.Now().Sub(l.renewed) < l.cfg.TTL-l.cfg.Margin
}

// Lost is closed when the lease is lost (a renew failed past the margin,
// or the lock is held by another) or released.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Context returns a context derived from parent that ends when the lease
// is lost or lapses (within Margin/4 of TTL - Margin, before another
// replica can hold the lock): what a write made under the lease runs in.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		select {
		case <-l.lost:
			cancel(ErrLeaseLost)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// ErrLeaseLost is the cause of a lease context's end.
var ErrLeaseLost = errors.New("leader lease lost")

// Release gives the lock up.
func (l *Lease) Release(ctx context.Context) error {
	if l.stop != nil {
		l.stop()
		<-l.done
	}
	l.markLost()
	return l.release(ctx)
}

func (l *Lease) markLost() { l.lostOnce.Do(func() { close(l.lost) }) }

// keep renews the lease every TTL/3 until ctx ends; a lease that could not
// be renewed within TTL - Margin is lost.
func (l *Lease) keep(ctx context.Context) {
	defer close(l.done)
	tick := time.NewTicker(l.cfg.TTL / 3)
	defer tick.Stop()
	check := time.NewTicker(l.cfg.Margin / 4)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			if !l.check() {
				return
			}
		case <-tick.C:
			if !l.renewOnce(ctx) {
				return
			}
		}
	}
}

// check marks the lease lost once it lapsed; false when it is lost.
func (l *Lease) check() bool {
	if l.Valid() {
		return true
	}
	l.cfg.Logger.Warn("leader lease lapsed: stopped acting", "generation", l.Generation)
	l.markLost()
	return false
}

// renewOnce renews the lease once: a renew the lock refuses (not ours any
// more) loses it at once; any other failure is retried at the next tick,
// and the lease lapses if none succeeds in time. False when it is lost.
func (l *Lease) renewOnce(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.Margin/2)
	sent := l.cfg.Now() // the renewed TTL runs from no later than this
	err := l.renew(rctx)
	cancel()
	switch {
	case err == nil:
		l.mu.Lock()
		l.renewed = sent
		l.mu.Unlock()
	case errors.Is(err, errNotHeld):
		l.cfg.Logger.Warn("leader lock no longer ours: stopped acting", "generation", l.Generation, "error", err)
		l.markLost()
		return false
	default:
		l.cfg.Logger.Warn("leader lease renew failed; retrying", "generation", l.Generation, "error", err)
	}
	return l.check()
}

// errNotHeld is a renew refused because the lock is not ours any more.
var errNotHeld = errors.New("lock not held")

// Nomad is a Nomad Variables lock on one variable path.
type Nomad struct {
	vars *api.Variables
	ns   string
	path string
	cfg  Config
}

// NewNomad returns a lock on the variable at path in namespace ns.
func NewNomad(client *api.Client, ns, path string, cfg Config) (*Nomad, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if ns == "" {
		ns = api.DefaultNamespace
	}
	return &Nomad{vars: client.Variables(), ns: ns, path: path, cfg: cfg}, nil
}

// Where implements Lock.
func (n *Nomad) Where() string { return fmt.Sprintf("Nomad variable %s (namespace %s)", n.path, n.ns) }

// Holder implements Lock.
func (n *Nomad) Holder(ctx context.Context) (string, error) {
	v, _, err := n.vars.Peek(n.path, (&api.QueryOptions{Namespace: n.ns}).WithContext(ctx))
	if err != nil || v == nil || v.Lock == nil {
		return "", err
	}
	return v.Items["leader"], nil
}

// Acquire implements Lock.
func (n *Nomad) Acquire(ctx context.Context) (*Lease, error) {
	wo := func(ctx context.Context) *api.WriteOptions {
		return (&api.WriteOptions{Namespace: n.ns}).WithContext(ctx)
	}
	for {
		v := &api.Variable{Namespace: n.ns, Path: n.path, Items: api.VariableItems{"leader": n.cfg.ID},
			Lock: &api.VariableLock{TTL: n.cfg.TTL.String(), LockDelay: n.cfg.LockDelay.String()}}
		sent := n.cfg.Now()
		actx, cancel := context.WithTimeout(ctx, n.cfg.acquireTimeout())
		got, _, err := n.vars.AcquireLock(v, wo(actx))
		cancel()
		if err == nil && got != nil && got.Lock != nil {
			held := got.Copy()
			l := newLease(got.ModifyIndex, n.cfg, sent, func(ctx context.Context) error {
				_, _, err := n.vars.RenewLock(held, wo(ctx))
				return classifyRenew(err)
			}, func(ctx context.Context) error {
				// Nomad refuses a release that carries items ("lock release
				// operation doesn't take variable items"): the lock's ID
				// and the path say which lock.
				rel := &api.Variable{Namespace: held.Namespace, Path: held.Path, Lock: &api.VariableLock{ID: held.Lock.ID}}
				_, _, err := n.vars.ReleaseLock(rel, wo(ctx))
				return err
			})
			l.start()
			n.cfg.Logger.Info("leader lock acquired", "lock", n.Where(), "generation", l.Generation, "ttl", n.cfg.TTL)
			return l, nil
		}
		if err != nil && !isConflict(err) {
			n.cfg.Logger.Warn("leader lock: acquire failed; retrying", "lock", n.Where(), "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(n.cfg.Retry):
		}
	}
}

// statusCode is the HTTP status of a Nomad API error (0 when the request
// got no answer: a transport error, a timeout).
func statusCode(err error) int { return nomadclient.StatusCode(err) }

// classifyRenew tells a renew Nomad refused because the lock is not ours
// (409: another holds it or it expired; 404: the variable is gone) from
// one that may succeed when tried again (no answer, 5xx, a timeout): by
// status code, never by the text (every renew URL contains "lock").
func classifyRenew(err error) error {
	if err == nil {
		return nil
	}
	switch statusCode(err) {
	case http.StatusConflict, http.StatusNotFound:
		return fmt.Errorf("%w: %v", errNotHeld, err)
	}
	return err
}

// isConflict: the lock is held by another replica (Nomad answers 409).
func isConflict(err error) bool { return statusCode(err) == http.StatusConflict }
