package agent

import (
	"sync"
	"sync/atomic"

	"github.com/hadar-sched/hadar/sidecar/state"
)

// ledger is the agent's hold on its state store: the store, the last
// journal entry the saved state reflects, whether the journal is still to
// be re-checked after a restore, the Nomad index the current plan was made
// on, and the last save's error. Writes in the background journal outside
// the agent's lock, so the journal position has a lock of its own; the
// rest is used under the agent's lock.
type ledger struct {
	store     state.Store // nil: no state is kept
	planIndex atomic.Uint64
	recheck   bool
	saveErr   error

	mu  sync.Mutex
	seq uint64
}

// restored records the journal position of a state just restored: the
// entries after it are re-checked once against Nomad.
func (l *ledger) restored(seq uint64) {
	l.mu.Lock()
	l.seq = seq
	l.mu.Unlock()
	l.recheck = true
}

// journalSeq is the last journal entry the saved state reflects.
func (l *ledger) journalSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// appended records a journal entry written (entries may be recorded out
// of order by writes returning in the background).
func (l *ledger) appended(seq uint64) {
	l.mu.Lock()
	l.seq = max(l.seq, seq)
	l.mu.Unlock()
}

// takeRecheck reports whether the journal is still to be re-checked, and
// from which entry on; it is re-checked once.
func (l *ledger) takeRecheck() (from uint64, ok bool) {
	if !l.recheck || l.store == nil {
		return 0, false
	}
	l.recheck = false
	return l.journalSeq(), true
}

// saved records how a save went, and reports whether it is a failure
// after one that succeeded (worth logging once, not every cycle).
func (l *ledger) saved(err error) (newFailure bool) {
	newFailure = err != nil && l.saveErr == nil
	l.saveErr = err
	return newFailure
}
