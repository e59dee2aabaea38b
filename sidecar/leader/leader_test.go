package leader

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testLease is a lease on a fake clock whose renews answer err().
func testLease(ttl time.Duration, err func() error) (*Lease, *fakeClock) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	cfg := Config{TTL: ttl, Margin: ttl / 3, Logger: hclog.NewNullLogger(), Now: c.now}
	return newLease(1, cfg, c.now(), func(context.Context) error { return err() }, func(context.Context) error { return nil }), c
}

// A leader whose renews fail stops acting before its TTL runs out: by then
// Nomad (or Consul) may give the lock to another replica. Driven step by
// step on a fake clock, as the renew loop does every TTL/3.
func TestLeaseStopsActingBeforeTheTTLWhenRenewsFail(t *testing.T) {
	ttl := 15 * time.Second
	l, c := testLease(ttl, func() error { return errors.New("network down") })
	ctx := context.Background()
	if !l.Valid() {
		t.Fatal("a fresh lease is not valid")
	}
	c.add(ttl / 3)
	if !l.renewOnce(ctx) || !l.Valid() {
		t.Fatal("one failed renew (5 s into a 15 s lease) ended it: a transient error must be retried")
	}
	c.add(ttl / 3)
	if l.renewOnce(ctx) || l.Valid() {
		t.Fatal("after 10 s without a renew (TTL 15 s, margin 5 s) the lease is still valid")
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost not closed")
	}
}

// Renewals keep it valid well past its TTL.
func TestLeaseRenewalsKeepItValid(t *testing.T) {
	ttl := 15 * time.Second
	renews := 0
	l, c := testLease(ttl, func() error { renews++; return nil })
	for range 10 {
		c.add(ttl / 3)
		if !l.renewOnce(context.Background()) {
			t.Fatalf("lease lost after %d renews", renews)
		}
	}
	if !l.Valid() || !l.check() {
		t.Fatalf("lease invalid after %d renews over %v", renews, 10*ttl/3)
	}
}

// A renew the lock refuses (held by another) ends the lease at once.
func TestLeaseEndsWhenTheLockIsNotOurs(t *testing.T) {
	l, _ := testLease(15*time.Second, func() error { return errNotHeld })
	if l.renewOnce(context.Background()) || l.Valid() {
		t.Fatal("a refused renew did not end the lease")
	}
}

// The real loop, on the real clock: a lease whose lock refuses the renew
// is lost, and a write's context made from it ends with ErrLeaseLost.
func TestLeaseContextEndsWithTheLease(t *testing.T) {
	cfg := Config{TTL: 10 * time.Second, Margin: 3 * time.Second, Logger: hclog.NewNullLogger(), Now: time.Now}
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	l := newLease(1, cfg, cfg.Now(), func(context.Context) error { return errNotHeld }, func(context.Context) error { return nil })
	ctx, cancel := l.Context(context.Background())
	defer cancel()
	select {
	case <-ctx.Done():
		t.Fatal("the context ended while the lease holds")
	default:
	}
	l.renewOnce(context.Background())
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the write context outlived the lease")
	}
	if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(ctx))
	}
}

// Renew errors are told apart by status code, not by their text: a
// transport error's text names the URL, which contains "lock".
func TestRenewErrorsByStatusCode(t *testing.T) {
	codes := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(<-codes)
		fmt.Fprint(w, "no")
	}))
	defer srv.Close()
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	held := &api.Variable{Path: "hadar/leader", Lock: &api.VariableLock{ID: "x"}}
	for _, tc := range []struct {
		code    int
		notHeld bool
	}{{409, true}, {404, true}, {500, false}, {503, false}, {403, false}} {
		codes <- tc.code
		_, _, err := client.Variables().RenewLock(held, nil)
		got := classifyRenew(err)
		if errors.Is(got, errNotHeld) != tc.notHeld {
			t.Errorf("HTTP %d: %v: not held = %v, want %v", tc.code, got, errors.Is(got, errNotHeld), tc.notHeld)
		}
	}
	// No answer at all: the URL has "lock" in it, the lease must not end.
	dead, err := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = dead.Variables().RenewLock(held, nil)
	if err == nil || !strings.Contains(err.Error(), "lock") {
		t.Fatalf("transport error %v: the test needs its text to contain \"lock\"", err)
	}
	if got := classifyRenew(err); errors.Is(got, errNotHeld) {
		t.Fatalf("a transport error (%v) was taken for a lost lock", got)
	}
}

func TestConfigLimits(t *testing.T) {
	for _, c := range []Config{{TTL: time.Second}, {TTL: 48 * time.Hour}, {TTL: 15 * time.Second, Margin: 20 * time.Second}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// fakeLockServer answers Nomad's lock-acquire with a lock (after answer
// runs: a delay on the fake clock, or a stall) and every other lock call
// with success.
func fakeLockServer(t *testing.T, answer func(r *http.Request)) *api.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.URL.Query()["lock-acquire"]; ok {
			answer(r)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"Namespace":"default","Path":"hadar/leader","Items":{"leader":"r-1"},"Lock":{"ID":"lock-1","TTL":"10s","LockDelay":"15s"},"ModifyIndex":7}`)
	}))
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// The lease is timed from when the acquire was sent: Nomad started the
// TTL when it granted the lock, before its answer travelled back. An
// answer that arrives 12 s after the request, on a 10 s TTL, gives a
// lease already spent, not a fresh one that overlaps the next leader's.
func TestLeaseTimedFromTheAcquireRequest(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	client := fakeLockServer(t, func(*http.Request) { c.add(12 * time.Second) })
	n, err := NewNomad(client, "default", "hadar/leader", Config{ID: "r-1", TTL: 10 * time.Second, Logger: hclog.NewNullLogger(), Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := n.Acquire(ctx)
	if l != nil {
		defer l.Release(context.Background())
	}
	if err == nil && l.Valid() {
		t.Fatal("a lock granted 12 s ago on a 10 s TTL is taken as a valid lease")
	}
}

// An acquire whose answer never comes is given up after TTL - Margin
// (past then the lease it would bring is spent) and tried again, instead
// of blocking the replica for good.
func TestAcquireHasATimeout(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	stop := make(chan struct{})
	client := fakeLockServer(t, func(r *http.Request) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			select { // no answer before the test gives up on it
			case <-r.Context().Done():
			case <-stop:
			case <-time.After(12 * time.Second):
			}
		}
	})
	t.Cleanup(func() { close(stop) }) // before the server's Close, which waits for handlers
	n, err := NewNomad(client, "default", "hadar/leader", Config{ID: "r-1", TTL: 10 * time.Second, Margin: 8 * time.Second, Retry: 10 * time.Millisecond, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	l, err := n.Acquire(ctx)
	if err != nil {
		t.Fatalf("after %v: %v: the stalled acquire was not given up and retried", time.Since(start), err)
	}
	defer l.Release(context.Background())
	if took := time.Since(start); took > 5*time.Second || !l.Valid() {
		t.Fatalf("acquired after %v (valid %v), want a retry after about 2 s", took, l.Valid())
	}
}
