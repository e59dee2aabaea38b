package agent

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/leader"
)

// errNotLeader fences writes: a replica that does not hold a valid lease
// makes none.
var errNotLeader = errors.New("not the leader (no valid lease): write not made")

// newLock builds the configured leader lock: a Consul session lock when
// CONSUL_HTTP_ADDR is set, else a Nomad Variables lock.
func newLock(cfg config.Config, client *api.Client, id string, a *Agent) (leader.Lock, error) {
	if !cfg.Leader.Enabled {
		return nil, nil
	}
	lc := leader.Config{ID: id, TTL: cfg.Leader.TTL.Duration(), LockDelay: cfg.Leader.LockDelay.Duration(), Logger: a.log.Named("leader")}
	if os.Getenv("CONSUL_HTTP_ADDR") != "" {
		cc, err := consul.NewClient(consul.DefaultConfig())
		if err != nil {
			return nil, err
		}
		return leader.NewConsul(cc, cfg.Leader.Path, lc)
	}
	return leader.NewNomad(client, cfg.Leader.Namespace, cfg.Leader.Path, lc)
}

// lead is a replica's part in the election: the lock (nil without an
// election) and the lease while it holds it, and the checks every write
// passes (the fence).
type lead struct {
	lock  leader.Lock
	lease atomic.Pointer[leader.Lease]
	// gained and lost count the leases taken and lost (Health, metrics).
	gained, lost atomic.Int64
}

// acting reports whether this replica may write to Nomad now: not a dry
// run, and the leader (or no election configured). Called under a.mu.
func (a *Agent) acting() bool {
	return !a.cfg.DryRun && a.leading()
}

// leading reports whether this replica holds the lease (always true
// without an election).
func (l *lead) leading() bool {
	ls := l.lease.Load()
	return l.lock == nil || (ls != nil && ls.Valid())
}

// Leading reports whether this replica leads (always true without an
// election), for status.
func (a *Agent) Leading() bool { return a.leading() }

// generation is the current lease's generation (0 without one).
func (l *lead) generation() uint64 {
	if ls := l.lease.Load(); ls != nil {
		return ls.Generation
	}
	return 0
}

// guard is the fence's check, asked again right before each registration
// (apply.Config.Guard): without an election every write may go; with one,
// only under the lease the write was decided under, while it is valid and
// still this replica's current one.
func (l *lead) guard(ctx context.Context) error {
	if l.lock == nil {
		return nil
	}
	ls := leaseOf(ctx)
	if ls == nil || !ls.Valid() || l.lease.Load() != ls {
		return errNotLeader
	}
	return nil
}

// leaseKey carries, in a write's context, the lease it was decided under.
type leaseKey struct{}

func leaseOf(ctx context.Context) *leader.Lease {
	ls, _ := ctx.Value(leaseKey{}).(*leader.Lease)
	return ls
}

// underLease returns the context a write decided now runs in: with an
// election, one that ends when the current lease is lost or lapses and
// that names that lease (ok false when this replica holds none); without,
// ctx itself.
func (l *lead) underLease(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if l.lock == nil {
		return ctx, func() {}, true
	}
	ls := l.lease.Load()
	if ls == nil {
		return ctx, func() {}, false
	}
	lctx, cancel := ls.Context(ctx)
	return context.WithValue(lctx, leaseKey{}, ls), cancel, true
}

// campaign holds the lock whenever it can: while it does, this replica
// acts; when the lease is lost it stops acting at once, drops its writes
// in flight, and campaigns again.
func (a *Agent) campaign(ctx context.Context) {
	for ctx.Err() == nil {
		l, err := a.lock.Acquire(ctx)
		if err != nil {
			return
		}
		// Writes of an earlier lease still going out (refused by the
		// fence) end before the state is reloaded under them.
		a.out.wait()
		a.mu.Lock()
		// The previous leader's state is the latest (a shared store);
		// restore it before acting on it.
		if err := a.reload(ctx); err != nil {
			a.log.Error("cannot take over: the state is unreadable; giving the lock up", "error", err)
			a.mu.Unlock()
			l.Release(context.Background())
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
			continue
		}
		a.lease.Store(l)
		a.gained.Add(1)
		a.pace.planAt(a.clock()) // plan a round boundary at once
		a.mu.Unlock()
		a.log.Info("leading", "replica", a.id, "generation", l.Generation)
		select {
		case <-ctx.Done():
			// Shutting down: the lease stays held until Run has saved the
			// state under it (resign).
			return
		case <-l.Lost():
		}
		a.mu.Lock()
		a.lease.Store(nil)
		a.lost.Add(1)
		a.applier.CancelAll()
		a.mu.Unlock()
		a.log.Warn("lost the leader lock: following", "replica", a.id, "generation", l.Generation)
	}
}

// resign releases the leader lock this replica holds, if any, so that a
// follower takes over after the lock delay instead of the lease's TTL.
func (a *Agent) resign() {
	l := a.lease.Swap(nil)
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		a.log.Warn("releasing the leader lock failed: a follower takes over when the lease lapses", "error", err)
		return
	}
	a.log.Info("released the leader lock", "replica", a.id, "generation", l.Generation)
}

// reload restores the engine from the store, when it holds a state, in
// place of what this replica built while following. Called under a.mu.
func (a *Agent) reload(ctx context.Context) error {
	if a.ledger.store == nil {
		return nil
	}
	saved, err := a.ledger.store.Load(ctx)
	if err != nil || saved == nil {
		return err
	}
	for mj := range a.roster.all() {
		a.prof.Forget(mj.model)
	}
	a.roster.restore(nil)
	a.cluster.restore(nil, nil)
	return a.openState(ctx, a.ledger.store)
}
