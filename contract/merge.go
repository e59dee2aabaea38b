package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// HadarE merging by membership. The copies of a job share one merge
// directory (HADAR_MERGE_DIR):
//
//	members/copy-<i>.json   copy i's heartbeat (Member), rewritten every second
//	round-<r>/copy-<i>.json copy i's state and steps of round r (MergeFile)
//	round-<r>/merged.json   round r closed (Merged): the merged state, the
//	                        job's steps, who took part, and who takes part
//	                        in round r+1 with how many steps
//
// docs/training-contract.md, "HadarE membership and merge", is the
// protocol; every file is JSON, written atomically (temporary file and
// rename), merged.json exclusively (link(2) of a temporary file: the
// first writer wins and every copy adopts the one that is there).

// MergeVersion is the version of the merge directory's files. Version 3:
// the model's state as named tensors (State), so copies of the Go trainer
// and of the Python library merge with each other.
const MergeVersion = 3

// Member states that mean the copy is gone for good; the others are the
// progress file's (joining, running, merging).
const (
	MemberLeaving = "leaving"
	MemberDone    = "done"
)

// MaxMergeFileBytes bounds what a reader takes from a merge file.
const MaxMergeFileBytes = 1 << 31

// MergeFile is what copy i writes to round-<r>/copy-<i>.json: its state
// and the steps it did in round r (the merge weight).
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
	Leaving bool  `json:"leaving,omitempty"`
	State   State `json:"state"`
}

// Validate checks a merge file read from the shared directory.
func (m *MergeFile) Validate() error {
	switch {
	case m.Version != MergeVersion:
		return fmt.Errorf("field \"version\": want %d, got %d; all copies must follow the same contract (hadar-trainer and hadar_train of one release)", MergeVersion, m.Version)
	case m.Round < 1:
		return fmt.Errorf("field \"round\": want >= 1, got %d", m.Round)
	case m.Copies < 1 || m.CopyIndex < 0 || (m.Copies > 1 && m.CopyIndex >= m.Copies):
		return fmt.Errorf("fields \"copy_index\" %d, \"copies\" %d: want copies >= 1, copy_index >= 0, and copy_index < copies when copies > 1", m.CopyIndex, m.Copies)
	case m.Steps < 0:
		return fmt.Errorf("field \"steps\": want >= 0, got %d", m.Steps)
	case m.MergeEvery < 0:
		return fmt.Errorf("field \"merge_every\": want >= 0, got %d", m.MergeEvery)
	}
	if err := m.State.Validate(); err != nil {
		return fmt.Errorf("field \"state\": %w", err)
	}
	return nil
}

// Contribution is one copy's steps in a round.
type Contribution struct {
	Copy    int   `json:"copy"`
	Steps   int64 `json:"steps"`
	Leaving bool  `json:"leaving,omitempty"`
}

// Merged is a closed round, round-<r>/merged.json: the state every copy
// adopts, the job's steps after the round, who took part, and the steps
// each member is to do in the next round. Exactly one is written per
// round. Round 0 is the start: the initial state and no steps.
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
	State    State          `json:"state"`
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
	case m.Version != MergeVersion:
		return fmt.Errorf("field \"version\": want %d, got %d; all copies must follow the same contract (hadar-trainer and hadar_train of one release)", MergeVersion, m.Version)
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
	if err := m.State.Validate(); err != nil {
		return fmt.Errorf("field \"state\": %w", err)
	}
	return nil
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

// Gone tells whether the heartbeat says the copy left or finished.
func (m *Member) Gone() bool { return m.State == MemberLeaving || m.State == MemberDone }

// decodeStrict decodes a merge file: bounded in size, then DecodeStrict.
func decodeStrict(b []byte, v any) error {
	if len(b) > MaxMergeFileBytes {
		return fmt.Errorf("%d bytes, more than the %d a merge file may have", len(b), MaxMergeFileBytes)
	}
	return DecodeStrict(b, v)
}

// DecodeStrict decodes one JSON object with no unknown fields and nothing
// after it: a file of another version or writer is refused, not misread.
// Every file of the training contract is read this way, by the sidecar's
// side and the trainer's alike.
func DecodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode JSON: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("decode JSON: trailing data after the object")
	}
	return nil
}

// ParseMergeFile parses and validates a copy's file of a round.
func ParseMergeFile(b []byte) (*MergeFile, error) {
	var m MergeFile
	if err := decodeStrict(b, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// ParseMerged parses and validates a closed round.
func ParseMerged(b []byte) (*Merged, error) {
	var m Merged
	if err := decodeStrict(b, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// ParseMember parses a heartbeat (unknown fields are ignored: a heartbeat
// only says who is there).
func ParseMember(b []byte) (*Member, error) {
	var m Member
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	return &m, nil
}

// Paths in the merge directory.

// RoundDir is round r's directory.
func RoundDir(dir string, round int) string {
	return filepath.Join(dir, "round-"+strconv.Itoa(round))
}

// CopyPath is where copy i writes its state of round r.
func CopyPath(dir string, round, copyIndex int) string {
	return filepath.Join(RoundDir(dir, round), "copy-"+strconv.Itoa(copyIndex)+".json")
}

// MergedPath is where round r's closed result is.
func MergedPath(dir string, round int) string {
	return filepath.Join(RoundDir(dir, round), "merged.json")
}

// MemberPath is copy i's heartbeat.
func MemberPath(dir string, copyIndex int) string {
	return filepath.Join(dir, "members", "copy-"+strconv.Itoa(copyIndex)+".json")
}

// ParseRoundDir reads a round directory's name ("round-<r>").
func ParseRoundDir(name string) (round int, ok bool) {
	return parseIndexed(name, "round-", "")
}

// ParseCopyName reads a copy file's or heartbeat's name ("copy-<i>.json").
func ParseCopyName(name string) (copyIndex int, ok bool) {
	return parseIndexed(name, "copy-", ".json")
}

func parseIndexed(name, prefix, suffix string) (int, bool) {
	num, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	if num, ok = strings.CutSuffix(num, suffix); !ok || num == "" || strings.TrimLeft(num, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	return n, err == nil
}

// Candidate is a copy that may take part in the next round, with its
// steps per round (0: not known yet).
type Candidate struct {
	Copy       int
	MergeEvery int
}

// NextTargets sizes the next round: every candidate does its merge-every,
// unless that would pass the job's remaining steps; then the remaining
// steps are shared in proportion to the candidates' merge-every (their
// speeds, when merge-every is proportional to the pace) by largest
// remainder (ties to the first), so the steps sum exactly to the
// remaining. A candidate whose merge-every is unknown is sized like
// fallback for the share, and told its own merge-every (0) otherwise.
// Candidates are in copy order.
func NextTargets(remaining int64, cands []Candidate, fallback int) []Contribution {
	out := []Contribution{}
	if remaining <= 0 || len(cands) == 0 {
		return out
	}
	est := make([]float64, len(cands))
	var sum int64
	for i, c := range cands {
		e := c.MergeEvery
		if e <= 0 {
			e = max(fallback, 1)
		}
		est[i] = float64(e)
		sum += int64(e)
	}
	if sum <= remaining {
		for _, c := range cands {
			out = append(out, Contribution{Copy: c.Copy, Steps: int64(c.MergeEvery)})
		}
		return out
	}
	shares := Apportion(remaining, est)
	for i, c := range cands {
		if shares[i] > 0 {
			out = append(out, Contribution{Copy: c.Copy, Steps: shares[i]})
		}
	}
	return out
}

// Apportion splits total in proportion to weights (each > 0) by largest
// remainder, ties to the lower index, so the shares sum exactly to total.
// HadarE's rounds are sized with it here and in the in-process trainer
// (trainer.Allocate), so both split a budget alike.
func Apportion(total int64, weights []float64) []int64 {
	var sum float64
	for _, w := range weights {
		sum += w
	}
	shares := make([]int64, len(weights))
	if len(weights) == 0 || total <= 0 || !(sum > 0) {
		return shares
	}
	rem := make([]float64, len(weights))
	var given int64
	for i, w := range weights {
		exact := float64(total) * w / sum
		shares[i] = int64(math.Floor(exact))
		rem[i] = exact - float64(shares[i])
		given += shares[i]
	}
	for ; given < total; given++ {
		best := 0
		for i := range rem {
			if rem[i] > rem[best] {
				best = i
			}
		}
		shares[best]++
		rem[best] = -1
	}
	return shares
}

// Close closes round base.Round+1 with the copy files present (any order;
// merged in copy order): their states merged by MergeStates weighted by
// their steps (base's state if there are none), the job's steps base's
// plus theirs (at most the total), the members those files, and the next
// round's targets sized by NextTargets for the members that stay and the
// joiners (copies whose fresh heartbeats say they wait to join). fallback
// is the closer's own merge-every.
func Close(base *Merged, files []*MergeFile, joiners []Candidate, closedBy, fallback int, now time.Time) (*Merged, error) {
	r := base.Round + 1
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b *MergeFile) int { return a.CopyIndex - b.CopyIndex })
	states := make([]State, 0, len(files))
	weights := make([]float64, 0, len(files))
	members := []Contribution{}
	var cands []Candidate
	var steps int64
	for _, f := range files {
		if f.Round != r {
			return nil, fmt.Errorf("close round %d: copy %d's file is of round %d", r, f.CopyIndex, f.Round)
		}
		if err := base.State.SameLayout(f.State); err != nil {
			return nil, fmt.Errorf("close round %d: copy %d: %w; all copies must run the same model", r, f.CopyIndex, err)
		}
		states, weights = append(states, f.State), append(weights, float64(f.Steps))
		steps += f.Steps
		members = append(members, Contribution{Copy: f.CopyIndex, Steps: f.Steps, Leaving: f.Leaving})
		if !f.Leaving {
			cands = append(cands, Candidate{Copy: f.CopyIndex, MergeEvery: f.MergeEvery})
		}
	}
	state := base.State
	if len(states) > 0 {
		var err error
		if state, err = MergeStates(states, weights); err != nil {
			return nil, fmt.Errorf("close round %d: %w", r, err)
		}
	}
	done := min(base.StepsDone+steps, base.TotalSteps)
	mg := &Merged{Version: MergeVersion, JobID: base.JobID, Round: r, TotalSteps: base.TotalSteps, StepsDone: done,
		Members: members, Targets: []Contribution{}, Done: done >= base.TotalSteps, ClosedBy: closedBy, Closed: now.UTC(), State: state}
	if !mg.Done {
		for _, j := range joiners {
			if i := slices.IndexFunc(cands, func(c Candidate) bool { return c.Copy == j.Copy }); i >= 0 {
				cands[i].MergeEvery = j.MergeEvery
			} else {
				cands = append(cands, j)
			}
		}
		slices.SortFunc(cands, func(a, b Candidate) int { return a.Copy - b.Copy })
		mg.Targets = NextTargets(base.TotalSteps-done, cands, fallback)
	}
	return mg, nil
}
