package agent

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/leader"
)

// The fence every write passes: without an election, always; with one,
// only in a context made under the replica's current lease, while it
// holds.
func TestLeadFencesWrites(t *testing.T) {
	var none lead
	if err := none.guard(context.Background()); err != nil {
		t.Fatalf("without an election: %v", err)
	}
	if _, _, ok := none.underLease(context.Background()); !ok || !none.leading() {
		t.Fatal("without an election a replica acts")
	}

	rec := &recordedNomad{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := leader.NewNomad(client, "default", "hadar/test", leader.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l := lead{lock: lock}
	if err := l.guard(context.Background()); !errors.Is(err, errNotLeader) || l.leading() {
		t.Fatalf("following: guard %v, leading %v", err, l.leading())
	}
	if _, _, ok := l.underLease(context.Background()); ok {
		t.Fatal("a follower got a write context")
	}

	first, err := lock.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l.lease.Store(first)
	ctx, cancel, ok := l.underLease(context.Background())
	defer cancel()
	if !ok || l.guard(ctx) != nil || generationOf(ctx) != first.Generation {
		t.Fatalf("leading: ok %v, guard %v, generation %d", ok, l.guard(ctx), generationOf(ctx))
	}
	if err := l.guard(context.Background()); !errors.Is(err, errNotLeader) {
		t.Fatalf("a context not made under the lease passed: %v", err)
	}

	// The lease is lost and another taken: the old write's context ended,
	// and it does not pass under the new lease either.
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a write's context outlived its lease")
	}
	second, err := lock.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(context.Background())
	l.lease.Store(second)
	if err := l.guard(ctx); !errors.Is(err, errNotLeader) {
		t.Fatalf("a write decided under the lost lease passed under the next: %v", err)
	}
}
