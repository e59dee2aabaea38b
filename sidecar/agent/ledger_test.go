package agent

import (
	"errors"
	"sync"
	"testing"
)

// The journal position only goes forward with appends, a restore sets it
// and asks for one re-check, and a failing save is news only once.
func TestLedger(t *testing.T) {
	var l ledger
	if _, ok := l.takeRecheck(); ok {
		t.Fatal("a re-check without a store")
	}
	l.store = &memStore{}
	l.restored(5)
	if from, ok := l.takeRecheck(); !ok || from != 5 {
		t.Fatalf("re-check from %d (%v), want 5", from, ok)
	}
	if _, ok := l.takeRecheck(); ok {
		t.Fatal("the journal re-checked twice")
	}

	var wg sync.WaitGroup
	for _, seq := range []uint64{9, 7, 12, 6} {
		wg.Go(func() { l.appended(seq) })
	}
	wg.Wait()
	if got := l.journalSeq(); got != 12 {
		t.Fatalf("journal at %d, want 12", got)
	}

	fail := errors.New("disk full")
	if !l.saved(fail) || l.saved(fail) || l.saveErr != fail {
		t.Fatal("a failing save is not news exactly once")
	}
	if l.saved(nil) || l.saveErr != nil || !l.saved(fail) {
		t.Fatal("a success does not clear the failure")
	}
}
