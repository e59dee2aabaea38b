package agent

import (
	"context"
	"testing"
	"time"
)

// TestReadAheadWakeUp: a boundary's signal never blocks, however many
// pass unread, and wakes one wait; a wait ends with its context.
func TestReadAheadWakeUp(t *testing.T) {
	var r readAhead
	r.init(nil, time.Second)
	r.passed()
	r.passed() // a second unread signal is dropped, not blocked on
	if !r.wait(context.Background()) {
		t.Fatal("a wait after a boundary did not wake")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r.wait(ctx) {
		t.Fatal("a wait woke with no boundary pending")
	}
	// The zero value (an agent built without New) never blocks a boundary.
	var z readAhead
	z.passed()
}

// TestReadAheadPeriod: sweeps between boundaries are every, or twice the
// last sweep's duration if longer; running follows on.
func TestReadAheadPeriod(t *testing.T) {
	var r readAhead
	r.init(nil, 5*time.Second)
	if got := r.period(time.Second); got != 5*time.Second {
		t.Fatalf("period after a 1 s sweep = %v, want 5s", got)
	}
	if got := r.period(4 * time.Second); got != 8*time.Second {
		t.Fatalf("period after a 4 s sweep = %v, want 8s", got)
	}
	if r.running() {
		t.Fatal("running before ReadAhead started")
	}
	r.on.Store(true)
	if !r.running() {
		t.Fatal("not running while on")
	}
}
