// Package state keeps what the sidecar must not lose when it restarts:
// the round engine's snapshot (its own versioned format, docs/engine.md),
// the agent's bookkeeping, and a journal of every write made to Nomad with
// the index it was planned on and the leader that made it. Two stores:
// a local bbolt file (the default: fsync'd on every commit), or Nomad
// Variables for a sidecar without a local disk.
//
// On start the sidecar rebuilds from Nomad first (the truth) and from
// this state second (docs/sidecar.md, "State and recovery"). A state it
// cannot read — corrupt, or written by a newer version — stops it with the
// way out in the message; it never plans on half-loaded state.
package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hadar-sched/hadar/planner"
)

// Format and Version identify the state this build writes and reads.
const (
	Format  = "hadar-sidecar-state"
	Version = 1
)

// Saved is the state as of one save.
type Saved struct {
	// Engine is the engine's snapshot (engine.Snapshot).
	Engine []byte `json:"engine"`
	// Agent is the agent's own bookkeeping (its format, versioned with
	// this one).
	Agent json.RawMessage `json:"agent"`
	// At is when it was saved; Index the Nomad index of the view it was
	// planned on; JournalSeq the last journal entry it reflects.
	At         time.Time `json:"at"`
	Index      uint64    `json:"index"`
	JournalSeq uint64    `json:"journal_seq"`
	// Leader and Generation say who saved it (several replicas).
	Leader     string `json:"leader,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
}

// Entry is one write to Nomad, journaled before it is made (Applied
// false) and again once it succeeded (Applied true, JobModifyIndex the
// job's index after it).
type Entry struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Job  string    `json:"job"`
	// Kind is the write: start, stop, rollback, note.
	Kind string `json:"kind"`
	// Units is the placement written (empty: the job held).
	Units []planner.Unit `json:"units,omitempty"`
	// PlannedIndex is the Nomad index of the view the decision was made
	// on; ReadIndex the job's JobModifyIndex the write was made against.
	PlannedIndex   uint64 `json:"planned_index"`
	ReadIndex      uint64 `json:"read_index"`
	Applied        bool   `json:"applied"`
	JobModifyIndex uint64 `json:"job_modify_index,omitempty"`
	Error          string `json:"error,omitempty"`
	// Leader and Generation fence the write: the replica that made it and
	// the lock generation it held.
	Leader     string `json:"leader,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
}

// Store keeps the state. Implementations are safe for concurrent use.
type Store interface {
	// Load returns the last saved state, nil when there is none. A state
	// this build cannot read is an error (ErrUnreadable wrapped).
	Load(ctx context.Context) (*Saved, error)
	// Save replaces the saved state, durably.
	Save(ctx context.Context, s *Saved) error
	// Append adds a journal entry, durably, and returns its sequence
	// number. An entry that lost its races to another replica's appends
	// is not journaled (ErrConflict wrapped) and may be appended again.
	Append(ctx context.Context, e Entry) (uint64, error)
	// Journal returns the entries after seq, oldest first.
	Journal(ctx context.Context, after uint64) ([]Entry, error)
	// Where names the store for messages ("/var/lib/hadar/state.db").
	Where() string
	Close() error
}

// ErrUnreadable marks a state that is corrupt or from another version.
var ErrUnreadable = errors.New("state unreadable")

// ErrFenced marks a Save or Append refused because a newer leader (a
// higher lock generation) already wrote the state or the journal: the
// replica asking is no longer the leader and must not overwrite it.
var ErrFenced = errors.New("state fenced by a newer leader")

// ErrConflict marks a Save that lost a race: another replica switched the
// saved state between this save's read and its write. Nothing of this
// save was kept; the next save starts from the winner's. It also marks an
// Append whose journal write lost too many check-and-set races in a row to
// another replica's appends: the entry was not journaled; the caller may
// append it again.
var ErrConflict = errors.New("another replica saved the state meanwhile")

// MaxJournal is how many journal entries a store keeps (the oldest go).
const MaxJournal = 20000

// unreadable wraps why a state cannot be read, with the way out.
func unreadable(where string, err error) error {
	return fmt.Errorf("%w: %s: %v: move it aside (or delete it) to start afresh: the sidecar then rebuilds from Nomad, which is the truth about what runs; what is lost is what only the state held (learned throughputs, time each job received per GPU type, delay timers, the decision history)", ErrUnreadable, where, err)
}

// fence refuses a write by lock generation gen of what recorded (the
// highest generation that wrote it, by replica by) already holds: writes
// of an older generation are a deposed leader's. Generation 0 (no
// election) is a generation like the others: once an elected leader
// wrote, a replica without an election is refused too.
func fence(where, what string, gen, recorded uint64, by string) error {
	if gen >= recorded {
		return nil
	}
	if gen == 0 {
		return fmt.Errorf("%w: %s: %s without leader election refused: lock generation %d (replica %q) wrote it under an election: turn leader election back on, or move the state aside to start afresh", ErrFenced, where, what, recorded, by)
	}
	return fmt.Errorf("%w: %s: %s by lock generation %d refused: generation %d (replica %q) wrote it since: this replica is no longer the leader (if the lock was reset or moved to another backend, its generations start lower: move the state aside to start afresh)", ErrFenced, where, what, gen, recorded, by)
}

// header is the versioned wrapper every store writes around its payload.
type header struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

func checkHeader(where string, h header) error {
	if h.Format != Format {
		return unreadable(where, fmt.Errorf("format %q, not %q", h.Format, Format))
	}
	if h.Version != Version {
		return unreadable(where, fmt.Errorf("version %d, but this build reads version %d only (written by another hadar release)", h.Version, Version))
	}
	return nil
}
