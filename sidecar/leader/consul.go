package leader

import (
	"context"
	"fmt"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// Consul is a Consul session lock on one KV key: a session with the TTL
// and lock delay, the key acquired with it, the session renewed by the
// lease's own loop (so a leader that cannot renew stops acting before the
// TTL runs out, as with the Nomad lock).
type Consul struct {
	client *consul.Client
	key    string
	cfg    Config
}

// NewConsul returns a lock on key of the Consul agent the client talks to
// (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ... as consul/api reads them).
func NewConsul(client *consul.Client, key string, cfg Config) (*Consul, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Consul{client: client, key: key, cfg: cfg}, nil
}

// Where implements Lock.
func (c *Consul) Where() string { return "Consul key " + c.key }

// Holder implements Lock.
func (c *Consul) Holder(ctx context.Context) (string, error) {
	kv, _, err := c.client.KV().Get(c.key, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil || kv == nil || kv.Session == "" {
		return "", err
	}
	return string(kv.Value), nil
}

// Acquire implements Lock.
func (c *Consul) Acquire(ctx context.Context) (*Lease, error) {
	for {
		l, err := c.try(ctx)
		if l != nil || ctx.Err() != nil {
			return l, ctx.Err()
		}
		if err != nil {
			c.cfg.Logger.Warn("leader lock: acquire failed; retrying", "lock", c.Where(), "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(c.cfg.Retry):
		}
	}
}

// try makes one attempt: a fresh session, then the key acquired with it.
func (c *Consul) try(ctx context.Context) (*Lease, error) {
	sent := c.cfg.Now() // the session's TTL runs from no later than this
	ctx, cancel := context.WithTimeout(ctx, c.cfg.acquireTimeout())
	defer cancel()
	wo := (&consul.WriteOptions{}).WithContext(ctx)
	sid, _, err := c.client.Session().Create(&consul.SessionEntry{
		Name: "hadar-sidecar " + c.cfg.ID, TTL: c.cfg.TTL.String(), LockDelay: c.cfg.LockDelay,
		Behavior: consul.SessionBehaviorRelease,
	}, wo)
	if err != nil {
		return nil, fmt.Errorf("create session: %w", err)
	}
	ok, _, err := c.client.KV().Acquire(&consul.KVPair{Key: c.key, Value: []byte(c.cfg.ID), Session: sid}, wo)
	if err != nil || !ok {
		c.client.Session().Destroy(sid, nil)
		if err != nil {
			return nil, fmt.Errorf("acquire %s: %w", c.key, err)
		}
		return nil, nil // held by another replica
	}
	kv, _, err := c.client.KV().Get(c.key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil || kv == nil || kv.Session != sid {
		c.client.Session().Destroy(sid, nil)
		return nil, fmt.Errorf("read back %s after acquiring it: %v", c.key, err)
	}
	l := newLease(kv.ModifyIndex, c.cfg, sent, func(ctx context.Context) error {
		entry, _, err := c.client.Session().Renew(sid, (&consul.WriteOptions{}).WithContext(ctx))
		if err != nil {
			return err
		}
		if entry == nil {
			return fmt.Errorf("%w: session %s is gone", errNotHeld, sid)
		}
		return nil
	}, func(ctx context.Context) error {
		w := (&consul.WriteOptions{}).WithContext(ctx)
		_, _, err := c.client.KV().Release(&consul.KVPair{Key: c.key, Session: sid}, w)
		if _, derr := c.client.Session().Destroy(sid, w); err == nil {
			err = derr
		}
		return err
	})
	l.start()
	c.cfg.Logger.Info("leader lock acquired", "lock", c.Where(), "generation", l.Generation, "ttl", c.cfg.TTL)
	return l, nil
}
