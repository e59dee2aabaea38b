package run

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/trainer"

	"github.com/hadar-sched/hadar/contract"
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
	if err := trainer.DecodeStrict(b, &c); err != nil {
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

// mergeFileVersion is bumped when the merge directory's files change
// incompatibly. Version 2: membership (heartbeats, closed rounds).
const mergeFileVersion = 2

// MergeFile is what a copy writes to round-<r>/copy-<i>.json: its
// parameters and the steps it did since the last merge (the merge weight).
type MergeFile struct {
	Version   int    `json:"version"`
	JobID     string `json:"job_id"`
	Round     int    `json:"round"`
	CopyIndex int    `json:"copy_index"`
	// Copies is the declared number of copies (HADAR_COPIES); 1 when the
	// copies are dynamic.
	Copies int   `json:"copies"`
	Steps  int64 `json:"steps"`
	// MergeEvery is the copy's steps per round, which the round's closer
	// uses to size the next round.
	MergeEvery int `json:"merge_every"`
	// Leaving: the copy was stopped mid-round; these are its last steps.
	Leaving bool           `json:"leaving,omitempty"`
	Params  trainer.Params `json:"params"`
}

// Validate checks a merge file read from the shared directory.
func (m *MergeFile) Validate() error {
	switch {
	case m.Version != mergeFileVersion:
		return fmt.Errorf("field \"version\": want %d, got %d; all copies must run the same hadar-trainer", mergeFileVersion, m.Version)
	case m.Round < 1:
		return fmt.Errorf("field \"round\": want >= 1, got %d", m.Round)
	case m.Copies < 1 || m.CopyIndex < 0 || (m.Copies > 1 && m.CopyIndex >= m.Copies):
		return fmt.Errorf("fields \"copy_index\" %d, \"copies\" %d: want copies >= 1, copy_index >= 0, and copy_index < copies when copies > 1", m.CopyIndex, m.Copies)
	case m.Steps < 0:
		return fmt.Errorf("field \"steps\": want >= 0, got %d", m.Steps)
	case m.MergeEvery < 0:
		return fmt.Errorf("field \"merge_every\": want >= 0, got %d", m.MergeEvery)
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

// Merged is a closed round, round-<r>/merged.json: the parameters every
// copy adopts, the job's steps after the round, who took part, and the
// steps each member is to do in the next round. Exactly one is written per
// round (the first copy to close it wins; the others adopt it), so every
// copy holds the same parameters and the same count of the job's steps.
// Round 0 is the start: the initial parameters and no steps.
type Merged struct {
	Version    int            `json:"version"`
	JobID      string         `json:"job_id"`
	Round      int            `json:"round"`
	TotalSteps int64          `json:"total_steps"`
	StepsDone  int64          `json:"steps_done"` // the job's steps after this round
	Members    []Contribution `json:"members"`    // the copies merged, by copy
	// Targets are the members of the next round and their steps in it;
	// Steps 0 means "your own merge-every" (a declared copy not seen yet).
	Targets  []Contribution `json:"targets"`
	Done     bool           `json:"done"` // the job's total is reached
	ClosedBy int            `json:"closed_by"`
	Closed   time.Time      `json:"closed"`
	Params   trainer.Params `json:"params"`
}

// Contribution is one copy's steps in a round.
type Contribution struct {
	Copy    int   `json:"copy"`
	Steps   int64 `json:"steps"`
	Leaving bool  `json:"leaving,omitempty"`
}

// Target returns copy's steps in the next round; ok is false when it is
// not a member of it.
func (m *Merged) Target(copyIndex int) (steps int64, ok bool) {
	for _, t := range m.Targets {
		if t.Copy == copyIndex {
			return t.Steps, true
		}
	}
	return 0, false
}

// Validate checks a closed round read from the shared directory.
func (m *Merged) Validate() error {
	switch {
	case m.Version != mergeFileVersion:
		return fmt.Errorf("field \"version\": want %d, got %d; all copies must run the same hadar-trainer", mergeFileVersion, m.Version)
	case m.Round < 0:
		return fmt.Errorf("field \"round\": want >= 0, got %d", m.Round)
	case m.TotalSteps < 1 || m.StepsDone < 0 || m.StepsDone > m.TotalSteps:
		return fmt.Errorf("fields \"steps_done\" %d, \"total_steps\" %d: want 0 <= steps_done <= total_steps", m.StepsDone, m.TotalSteps)
	}
	for _, c := range append(slices.Clone(m.Members), m.Targets...) {
		if c.Copy < 0 || c.Steps < 0 {
			return fmt.Errorf("members and targets: copy %d with %d steps; want both >= 0", c.Copy, c.Steps)
		}
	}
	if err := m.Params.Validate(); err != nil {
		return fmt.Errorf("field \"params\": %w", err)
	}
	return nil
}

// DecodeMerged parses and validates a closed round written by another
// process.
func DecodeMerged(b []byte) (*Merged, error) {
	var m Merged
	if err := trainer.DecodeStrict(b, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// ReadMerged reads and validates a closed round.
func ReadMerged(path string) (*Merged, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("merged round: %w", err)
	}
	m, err := DecodeMerged(b)
	if err != nil {
		return nil, fmt.Errorf("merged round %s: %w", path, err)
	}
	return m, nil
}

// Member is a copy's heartbeat, members/copy-<i>.json, rewritten every
// second while the copy lives: how the others know who is there.
type Member struct {
	Version    int       `json:"version"`
	JobID      string    `json:"job_id"`
	Copy       int       `json:"copy"`
	State      string    `json:"state"` // joining, running, merging, leaving, done
	Round      int       `json:"round"` // the round it works on (joining: the one it waits for)
	MergeEvery int       `json:"merge_every"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	Updated    time.Time `json:"updated"`
}

// Member states that mean the copy is gone for good.
const (
	MemberLeaving = "leaving"
	MemberDone    = "done"
)

// readMember reads a heartbeat; a missing one is (nil, nil).
func readMember(path string) (*Member, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	var m Member
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("heartbeat %s: %w", path, err)
	}
	return &m, nil
}

// Paths in the merge directory.
func roundDir(dir string, round int) string {
	return filepath.Join(dir, fmt.Sprintf("round-%d", round))
}

// mergePath is where copy i writes its parameters for round r.
func mergePath(dir string, round, copyIndex int) string {
	return filepath.Join(roundDir(dir, round), fmt.Sprintf("copy-%d.json", copyIndex))
}

// MergedPath is where round r's closed result is.
func MergedPath(dir string, round int) string {
	return filepath.Join(roundDir(dir, round), "merged.json")
}

func memberPath(dir string, copyIndex int) string {
	return filepath.Join(dir, "members", fmt.Sprintf("copy-%d.json", copyIndex))
}

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
		num, ok := strings.CutPrefix(e.Name(), "round-")
		if !ok || !e.IsDir() {
			continue
		}
		r, err := strconv.Atoi(num)
		if err != nil || r < 0 {
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
