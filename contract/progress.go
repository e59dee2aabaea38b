package contract

import (
	"encoding/json"
	"fmt"
	"time"
)

// MaxProgressBytes bounds a progress file: the contract's is a few hundred
// bytes, and readers must not be exhausted by a runaway one.
const MaxProgressBytes = 1 << 20

// Progress is the progress file: JSON, replaced atomically (a temporary
// file in the same directory, then a rename), at least every 5 s and at
// every checkpoint. Unknown fields are ignored by readers; every field but
// the first six is optional.
type Progress struct {
	// StepsDone counts the job's steps (for a HadarE copy: the job's
	// merged total as this copy last saw it).
	StepsDone   int64   `json:"steps_done"`
	TotalSteps  int64   `json:"total_steps"`
	StepsPerSec float64 `json:"steps_per_sec"`
	Loss        float64 `json:"loss"`
	// Checkpoint names the newest checkpoint.
	Checkpoint string    `json:"checkpoint,omitempty"`
	Updated    time.Time `json:"updated"`

	// Version is the contract's version the writer follows (0: unsaid).
	Version int `json:"version,omitempty"`
	// State is one of the states below.
	State string `json:"state,omitempty"`
	// HadarE: this copy's index, the number of copies (declared, else
	// those merged in the last round), the steps this copy did (restored
	// ones included), the merges it took part in, the last merged round
	// it adopted.
	CopyIndex  int   `json:"copy_index"`
	Copies     int   `json:"copies"`
	LocalSteps int64 `json:"local_steps"`
	Merges     int   `json:"merges"`
	Round      int   `json:"round"`

	// A unit of several workers: this worker's rank and the unit's size,
	// the unit's number (HADAR_UNIT, -1 unset).
	Rank      int `json:"rank"`
	WorldSize int `json:"world_size"`
	Unit      int `json:"unit"`
	// UnitStepsPerSec is the unit's pace as its workers' paces predict it
	// (emulation; 0 otherwise), Nodes the nodes the unit spans.
	UnitStepsPerSec float64 `json:"unit_steps_per_sec,omitempty"`
	Nodes           int     `json:"nodes,omitempty"`
}

// Progress states.
const (
	StateRendezvous = "rendezvous" // waiting for the unit's other workers
	StateJoining    = "joining"    // a HadarE copy waiting for the next round to take part
	StateRunning    = "running"
	StateMerging    = "merging"
	StateStopped    = "stopped" // checkpointed on a stop signal
	StateDone       = "done"
	StateFailed     = "failed" // the unit broke (a peer was lost); the process exits non-zero
)

// Keys of the progress a driver's task events (and its task's inspected
// attributes) carry in their details. The values are the job's own.
const (
	DetailStepsDone  = "hadar.steps_done"
	DetailTotalSteps = "hadar.total_steps"
	// DetailState is the progress state: "done" on the event a task's
	// end publishes tells that its work is done (hadar-train records the
	// run finished on the same rule, with exit 0).
	DetailState = "hadar.state"
)

// ParseProgress reads a progress file's content: at most MaxProgressBytes
// of JSON, with finite, non-negative counts. The file is the job's own:
// readers bound and check what they do with it beyond that.
func ParseProgress(b []byte) (*Progress, error) {
	if len(b) > MaxProgressBytes {
		return nil, fmt.Errorf("progress file: %d bytes, more than the %d a progress file may have", len(b), MaxProgressBytes)
	}
	var p Progress
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("progress file: %w", err)
	}
	if p.StepsDone < 0 || p.TotalSteps < 0 || p.LocalSteps < 0 || p.StepsPerSec < 0 {
		return nil, fmt.Errorf("progress file: negative counts (steps_done %d, total_steps %d, local_steps %d, steps_per_sec %v)", p.StepsDone, p.TotalSteps, p.LocalSteps, p.StepsPerSec)
	}
	return &p, nil
}
