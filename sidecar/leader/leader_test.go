package leader

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func lease(ttl time.Duration) *Lease {
	cfg := Config{TTL: ttl, Margin: ttl / 3, Logger: hclog.NewNullLogger(), Now: time.Now}
	_, stop := context.WithCancel(context.Background())
	return &Lease{cfg: cfg, renewed: time.Now(), lost: make(chan struct{}), stop: stop, done: make(chan struct{}), release: func(context.Context) error { return nil }}
}

// A leader whose renews fail stops acting before its TTL runs out: by then
// Nomad (or Consul) may give the lock to another replica.
func TestLeaseStopsActingBeforeTheTTLWhenRenewsFail(t *testing.T) {
	ttl := 600 * time.Millisecond
	l := lease(ttl)
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.keep(ctx, func(context.Context) error { return errors.New("network down") })
	if !l.Valid() {
		t.Fatal("a fresh lease is not valid")
	}
	select {
	case <-l.Lost():
	case <-time.After(ttl):
		t.Fatal("the lease was not lost within its TTL")
	}
	if took := time.Since(start); took >= ttl {
		t.Fatalf("stopped acting after %v, not before the TTL %v", took, ttl)
	}
	if l.Valid() {
		t.Fatal("a lost lease is valid")
	}
}

// Renewals keep it valid well past its TTL.
func TestLeaseRenewalsKeepItValid(t *testing.T) {
	ttl := 300 * time.Millisecond
	l := lease(ttl)
	var renews atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	go l.keep(ctx, func(context.Context) error { renews.Add(1); return nil })
	time.Sleep(3 * ttl)
	if !l.Valid() {
		t.Fatalf("lease invalid after %d renews", renews.Load())
	}
	select {
	case <-l.Lost():
		t.Fatal("a renewed lease was lost")
	default:
	}
	cancel()
	<-l.done
}

// A renew the lock refuses (held by another) ends the lease at once.
func TestLeaseEndsWhenTheLockIsNotOurs(t *testing.T) {
	ttl := 3 * time.Second
	l := lease(ttl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.keep(ctx, func(context.Context) error { return errNotHeld })
	select {
	case <-l.Lost():
	case <-time.After(ttl / 2):
		t.Fatal("a refused renew did not end the lease")
	}
}

func TestConfigLimits(t *testing.T) {
	for _, c := range []Config{{TTL: time.Second}, {TTL: 48 * time.Hour}, {TTL: 15 * time.Second, Margin: 20 * time.Second}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
