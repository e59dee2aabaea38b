package run

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/trainer"
)

// writeFileAtomic writes data to a temporary file in path's directory and
// renames it over path, so readers see the old or the new content, never a
// torn one.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := writeTemp(path, data)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeTemp writes data, synced, to a new temporary file beside path and
// returns its name.
func writeTemp(path string, data []byte) (string, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create directory %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return f.Name(), err
}

// WriteProgress replaces the progress file atomically.
func WriteProgress(path string, p contract.Progress) error {
	p.Version = contract.Version
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("progress %s: %w", path, err)
	}
	return writeFileAtomic(path, append(b, '\n'))
}

// ReadProgress reads a progress file (tests and tools).
func ReadProgress(path string) (contract.Progress, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return contract.Progress{}, fmt.Errorf("progress: %w", err)
	}
	p, err := contract.ParseProgress(b)
	if err != nil {
		return contract.Progress{}, fmt.Errorf("%s: %w", path, err)
	}
	return *p, nil
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
	Merges     int    `json:"merges"`      // merge rounds this process took part in
	// Round is the HadarE round whose merged parameters this process last
	// adopted (its next round is Round+1). Absent in checkpoints of
	// before dynamic copies, where it equals Merges.
	Round      int   `json:"round,omitempty"`
	SinceMerge int64 `json:"since_merge"` // local steps since the last merge
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
	case c.Copies < 1 || c.CopyIndex < 0 || (c.Copies > 1 && c.CopyIndex >= c.Copies):
		return fmt.Errorf("fields \"copy_index\" %d, \"copies\" %d: want copies >= 1, copy_index >= 0, and copy_index < copies when copies > 1", c.CopyIndex, c.Copies)
	case c.Round < 0:
		return fmt.Errorf("field \"round\": want >= 0, got %d", c.Round)
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
	if err := contract.DecodeStrict(b, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Round == 0 {
		c.Round = c.Merges // written before rounds and merges were told apart
	}
	return &c, nil
}

// checkpointExt is the format of the trainer's checkpoints in the
// contract's names (ckpt-<local steps>.json).
const checkpointExt = "json"

// checkpointName is the file name of the checkpoint after local step n.
func checkpointName(n int64) string { return contract.CheckpointName(n, checkpointExt) }

// listCheckpoints returns the trainer's checkpoint files in dir, newest
// (highest local step) first. A missing directory has none.
func listCheckpoints(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint dir: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	out := contract.Checkpoints(names, checkpointExt)
	for i, n := range out {
		out[i] = filepath.Join(dir, n)
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

// The merge directory's files are the contract's (contract/merge.go).
type (
	MergeFile    = contract.MergeFile
	Merged       = contract.Merged
	Member       = contract.Member
	Contribution = contract.Contribution
)

// Heartbeat states of a copy that is gone.
const (
	MemberLeaving = contract.MemberLeaving
	MemberDone    = contract.MemberDone
)

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
func DecodeMergeFile(b []byte) (*MergeFile, error) { return contract.ParseMergeFile(b) }

// DecodeMerged parses and validates a closed round written by another
// process.
func DecodeMerged(b []byte) (*Merged, error) { return contract.ParseMerged(b) }

// ReadMerged reads and validates a closed round.
func ReadMerged(path string) (*Merged, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("merged round: %w", err)
	}
	m, err := contract.ParseMerged(b)
	if err != nil {
		return nil, fmt.Errorf("merged round %s: %w", path, err)
	}
	return m, nil
}

// readMember reads a heartbeat; a missing one is (nil, nil).
func readMember(path string) (*Member, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	m, err := contract.ParseMember(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// MergedPath is where round r's closed result is.
func MergedPath(dir string, round int) string { return contract.MergedPath(dir, round) }

// MergedRounds lists the rounds of dir that have a merged.json, ascending.
func MergedRounds(dir string) ([]int, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("merge dir: %w", err)
	}
	var out []int
	for _, e := range entries {
		r, ok := contract.ParseRoundDir(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if _, err := os.Stat(MergedPath(dir, r)); err == nil {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out, nil
}

// createExclusive writes data to path unless path exists, atomically:
// a temporary file hard-linked into place (link(2) fails on an existing
// name, on local filesystems and NFS alike). created is false when
// another writer was first.
func createExclusive(path string, data []byte) (created bool, err error) {
	tmp, err := writeTemp(path, data)
	if tmp != "" {
		defer os.Remove(tmp)
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, nil
}
