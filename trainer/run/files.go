package run

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/trainer"
)

// writeFileAtomic writes data to a temporary file in path's directory and
// renames it over path, so readers see the old or the new content, never a
// torn one.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create directory %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Progress is the progress file of the contract. The fields after
// "updated" are hadar-trainer's additions; readers ignore unknown fields.
type Progress struct {
	StepsDone   int64     `json:"steps_done"`
	TotalSteps  int64     `json:"total_steps"`
	StepsPerSec float64   `json:"steps_per_sec"`
	Loss        float64   `json:"loss"`
	Checkpoint  string    `json:"checkpoint,omitempty"`
	Updated     time.Time `json:"updated"`

	State      string `json:"state"`       // running, merging, stopped (checkpointed on a signal) or done
	CopyIndex  int    `json:"copy_index"`  // HadarE copy
	Copies     int    `json:"copies"`      // HadarE copies
	LocalSteps int64  `json:"local_steps"` // steps this copy did, including restored ones
	Merges     int    `json:"merges"`      // merges this copy took part in
}

// Progress states.
const (
	StateRunning = "running"
	StateMerging = "merging"
	StateStopped = "stopped"
	StateDone    = "done"
)

// WriteProgress replaces the progress file atomically.
func WriteProgress(path string, p Progress) error {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("progress %s: %w", path, err)
	}
	return writeFileAtomic(path, append(b, '\n'))
}

// ReadProgress reads a progress file (tests and tools).
func ReadProgress(path string) (Progress, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Progress{}, fmt.Errorf("progress: %w", err)
	}
	var p Progress
	if err := json.Unmarshal(b, &p); err != nil {
		return Progress{}, fmt.Errorf("progress %s: %w", path, err)
	}
	return p, nil
}

// checkpointVersion is bumped when Checkpoint changes incompatibly.
const checkpointVersion = 1

// Checkpoint is everything a process needs to continue where it stopped:
// the parameters, the momentum buffer, the local step count (which fixes the
// data order) and the HadarE round state.
type Checkpoint struct {
	Version    int    `json:"version"`
	JobID      string `json:"job_id"`
	Seed       uint64 `json:"seed"`
	CopyIndex  int    `json:"copy_index"`
	Copies     int    `json:"copies"`
	TotalSteps int64  `json:"total_steps"`
	StepsDone  int64  `json:"steps_done"`  // the job's steps as this process last saw them
	LocalSteps int64  `json:"local_steps"` // this process's SGD steps
	Merges     int    `json:"merges"`      // completed merge rounds
	SinceMerge int64  `json:"since_merge"` // local steps since the last merge
	// RoundTarget is the local steps of the current merge round, -1 before
	// it is decided; kept so that a resumed copy rejoins the same round.
	RoundTarget int64          `json:"round_target"`
	Loss        float64        `json:"loss"`
	Params      trainer.Params `json:"params"`
	Velocity    []float64      `json:"velocity"`
}

// Validate checks a checkpoint read from disk for internal consistency.
func (c *Checkpoint) Validate() error {
	switch {
	case c.Version != checkpointVersion:
		return fmt.Errorf("field \"version\": want %d, got %d; this checkpoint is from another hadar-trainer version, remove it", checkpointVersion, c.Version)
	case c.Copies < 1 || c.CopyIndex < 0 || c.CopyIndex >= c.Copies:
		return fmt.Errorf("fields \"copy_index\" %d, \"copies\" %d: want 0 <= copy_index < copies", c.CopyIndex, c.Copies)
	case c.TotalSteps < 1:
		return fmt.Errorf("field \"total_steps\": want >= 1, got %d", c.TotalSteps)
	case c.StepsDone < 0 || c.LocalSteps < 0 || c.Merges < 0 || c.SinceMerge < 0:
		return fmt.Errorf("fields \"steps_done\", \"local_steps\", \"merges\", \"since_merge\": want >= 0, got %d, %d, %d, %d", c.StepsDone, c.LocalSteps, c.Merges, c.SinceMerge)
	case c.SinceMerge > c.LocalSteps:
		return fmt.Errorf("field \"since_merge\": %d exceeds \"local_steps\" %d", c.SinceMerge, c.LocalSteps)
	case c.RoundTarget < -1 || (c.RoundTarget >= 0 && c.SinceMerge > c.RoundTarget):
		return fmt.Errorf("field \"round_target\": %d; want -1 or >= since_merge %d", c.RoundTarget, c.SinceMerge)
	case math.IsNaN(c.Loss) || math.IsInf(c.Loss, 0):
		return fmt.Errorf("field \"loss\": want a finite value, got %g", c.Loss)
	}
	if err := c.Params.Validate(); err != nil {
		return fmt.Errorf("field \"params\": %w", err)
	}
	if len(c.Velocity) != len(c.Params.W) {
		return fmt.Errorf("field \"velocity\": want %d values, got %d", len(c.Params.W), len(c.Velocity))
	}
	for i, v := range c.Velocity {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("field \"velocity\": value %d is %g; want finite values", i, v)
		}
	}
	return nil
}

// EncodeCheckpoint serializes c as JSON.
func EncodeCheckpoint(c *Checkpoint) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	return b, nil
}

// DecodeCheckpoint parses and validates a checkpoint; its input comes from
// disk and may be anything.
func DecodeCheckpoint(b []byte) (*Checkpoint, error) {
	var c Checkpoint
	if err := trainer.DecodeStrict(b, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// checkpointName is the file name of the checkpoint after local step n.
func checkpointName(n int64) string { return fmt.Sprintf("ckpt-%d.json", n) }

// listCheckpoints returns the checkpoint files in dir, newest (highest
// local step) first. A missing directory has none.
func listCheckpoints(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint dir: %w", err)
	}
	type ck struct {
		n    int64
		path string
	}
	var cks []ck
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "ckpt-")
		if !ok || e.IsDir() {
			continue
		}
		num, ok = strings.CutSuffix(num, ".json")
		n, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || n < 0 {
			continue
		}
		cks = append(cks, ck{n, filepath.Join(dir, e.Name())})
	}
	slices.SortFunc(cks, func(a, b ck) int { return cmp.Compare(b.n, a.n) })
	out := make([]string, len(cks))
	for i, c := range cks {
		out[i] = c.path
	}
	return out, nil
}

// ReadCheckpoint reads and validates one checkpoint file.
func ReadCheckpoint(path string) (*Checkpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	c, err := DecodeCheckpoint(b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return c, nil
}

// mergeFileVersion is bumped when MergeFile changes incompatibly.
const mergeFileVersion = 1

// MergeFile is what a copy writes to round-<r>/copy-<i>.json: its
// parameters and the steps it did since the last merge (the merge weight).
type MergeFile struct {
	Version   int            `json:"version"`
	JobID     string         `json:"job_id"`
	Round     int            `json:"round"`
	CopyIndex int            `json:"copy_index"`
	Copies    int            `json:"copies"`
	Steps     int64          `json:"steps"`
	Params    trainer.Params `json:"params"`
}

// Validate checks a merge file read from the shared directory.
func (m *MergeFile) Validate() error {
	switch {
	case m.Version != mergeFileVersion:
		return fmt.Errorf("field \"version\": want %d, got %d; all copies must run the same hadar-trainer", mergeFileVersion, m.Version)
	case m.Round < 1:
		return fmt.Errorf("field \"round\": want >= 1, got %d", m.Round)
	case m.Copies < 1 || m.CopyIndex < 0 || m.CopyIndex >= m.Copies:
		return fmt.Errorf("fields \"copy_index\" %d, \"copies\" %d: want 0 <= copy_index < copies", m.CopyIndex, m.Copies)
	case m.Steps < 0:
		return fmt.Errorf("field \"steps\": want >= 0, got %d", m.Steps)
	}
	if err := m.Params.Validate(); err != nil {
		return fmt.Errorf("field \"params\": %w", err)
	}
	return nil
}

// EncodeMergeFile serializes m as JSON.
func EncodeMergeFile(m *MergeFile) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode merge file: %w", err)
	}
	return b, nil
}

// DecodeMergeFile parses and validates a merge file written by another
// process.
func DecodeMergeFile(b []byte) (*MergeFile, error) {
	var m MergeFile
	if err := trainer.DecodeStrict(b, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// mergePath is where copy i writes its parameters for round r.
func mergePath(dir string, round, copyIndex int) string {
	return filepath.Join(dir, fmt.Sprintf("round-%d", round), fmt.Sprintf("copy-%d.json", copyIndex))
}
