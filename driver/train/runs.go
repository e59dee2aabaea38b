package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/confine"
)

// A job's checkpoint directory outlives its runs: it is keyed by job,
// group and task in checkpoint_root, so a job run again after it finished
// (or after `nomad job stop -purge`) would find the old run's checkpoints
// and resume from them, and one that asks for fewer steps than they hold
// would be "done" at once (issue 33). The driver therefore records, in
// the directory, which run wrote it and whether that run finished; a task
// of a new run sets the old run's checkpoints aside unless the job asks to
// resume (contract.MetaResume).

// runRecordName is the driver's record in a checkpoint directory (a dot
// name: no checkpoint, see contract.CheckpointName).
const runRecordName = ".hadar-run"

// setAsidePrefix starts the names checkpoints of an earlier run are
// renamed to: .run-<run>.<gen>-ckpt-<step>.<ext>.
const setAsidePrefix = ".run-"

const maxRunRecord = 4 << 10

// runRecord is what the record holds. The directory is the job's to
// write: a record it forged only changes what happens to its own
// checkpoints.
type runRecord struct {
	// Run is contract.EnvJobRun of the run that last started here.
	Run string `json:"run,omitempty"`
	// Gen counts the runs that started fresh here: the runs of one Nomad
	// job (not purged between) share Run.
	Gen int `json:"gen,omitempty"`
	// Finished: a task of that run ended with its work done.
	Finished bool `json:"finished,omitempty"`
}

// envResume is contract.MetaResume as Nomad puts job meta in a task's env.
const envResume = "NOMAD_META_" + contract.MetaResume

// resumeAsked tells whether the job's meta asks a new run to resume.
func resumeAsked(env map[string]string) bool {
	v, ok := env[envResume]
	if !ok {
		v = env[strings.ToUpper(envResume)]
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	return err == nil && b
}

// openCheckpointDir opens a task's checkpoint directory below its base
// (root's), through no link.
func openCheckpointDir(dir, base string) (*confine.Dir, error) {
	return confine.OpenBelow("checkpoint directory", base, dir)
}

func readRunRecord(ck *confine.Dir) (*runRecord, error) {
	b, err := ck.ReadFile("run record", runRecordName, maxRunRecord)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r runRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("run record %s: %w", runRecordName, err)
	}
	return &r, nil
}

func writeRunRecord(ck *confine.Dir, r runRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return ck.WriteFile("run record", runRecordName, b, 0o644)
}

// beginRun prepares the checkpoint directory for a task of run (""
// when unknown: a task the sidecar did not place) that asks for total
// steps (0: unknown). A directory another run wrote, or one whose run
// finished, is a new run's: its checkpoints are set aside (renamed, kept
// until the run after) unless resume. A directory with no record is
// this run's (its first task, or one written before records were kept).
// It refuses a run whose newest checkpoint holds more steps than it asks
// for: it would end at once, "done" with more steps than it asked for.
// It returns the checkpoints set aside.
func beginRun(ck *confine.Dir, run string, resume bool, total int64) ([]string, error) {
	rec, err := readRunRecord(ck)
	if err != nil {
		return nil, err
	}
	names, err := ck.Names()
	if err != nil {
		return nil, err
	}
	var aside []string
	next := runRecord{Run: run}
	if rec != nil {
		next.Gen = rec.Gen
		if run == "" && !rec.Finished {
			next.Run = rec.Run
		}
	}
	if rec != nil && (rec.Finished || run != "" && rec.Run != "" && rec.Run != run) {
		next.Gen = rec.Gen + 1
	}
	if next.Gen != 0 && (rec == nil || next.Gen != rec.Gen) && !resume {
		old := rec.Run
		if old == "" {
			old = "unknown"
		}
		prefix := fmt.Sprintf("%s%s.%d-", setAsidePrefix, old, rec.Gen)
		// What a run before the old one left is removed; what the old
		// one left is kept until the next new run (another task of this
		// run may be setting it aside right now).
		for _, n := range names {
			if strings.HasPrefix(n, setAsidePrefix) && !strings.HasPrefix(n, prefix) {
				// Best effort: what cannot go (a directory the job
				// made) only takes room.
				_ = ck.Remove("checkpoint", n)
			}
		}
		for _, n := range names {
			if _, _, ok := contract.ParseCheckpointName(n); !ok {
				continue
			}
			if err := ck.Rename(n, prefix+n); err != nil {
				return nil, err
			}
			aside = append(aside, n)
		}
		if names, err = ck.Names(); err != nil {
			return nil, err
		}
	}
	if rec == nil || *rec != next {
		if err := writeRunRecord(ck, next); err != nil {
			return nil, err
		}
	}
	if newest := contract.Checkpoints(names, ""); total > 0 && len(newest) > 0 {
		if step, _, _ := contract.ParseCheckpointName(newest[0]); step > total {
			why := "its checkpoints are this run's"
			if resume {
				why = "the job asks to resume (" + contract.MetaResume + ")"
			}
			return nil, fmt.Errorf("checkpoint %s in %s holds %d steps, more than the %d this run asks for (%s): it would end at once; ask for more steps, or start fresh (without %s, a run after a finished one does)",
				newest[0], ck.Path(), step, total, why, contract.MetaResume)
		}
	}
	return aside, nil
}

// finishRun records that run's work is done, so that the next run starts
// fresh.
func finishRun(ck *confine.Dir, run string) error {
	rec, err := readRunRecord(ck)
	if err != nil {
		return err
	}
	next := runRecord{Run: run, Finished: true}
	if rec != nil {
		next.Gen = rec.Gen
	}
	return writeRunRecord(ck, next)
}

// startRun runs beginRun on a task's checkpoint directory before the task
// starts.
func startRun(l *launch, logger hclog.Logger) error {
	if l.checkpoint == "" || l.ckptBase == "" {
		return nil
	}
	ck, err := openCheckpointDir(l.checkpoint, l.ckptBase)
	if err != nil {
		return err
	}
	defer ck.Close()
	total, _ := strconv.ParseInt(strings.TrimSpace(l.env[contract.EnvTotalSteps]), 10, 64)
	aside, err := beginRun(ck, l.env[contract.EnvJobRun], resumeAsked(l.env), total)
	if err != nil {
		return err
	}
	if len(aside) > 0 {
		logger.Info("a new run of the job starts fresh: the previous run's checkpoints are set aside", "checkpoint_dir", l.checkpoint, "set_aside", strings.Join(aside, ","), "resume_with", contract.MetaResume)
	}
	return nil
}

// endRun records a task that ended with its work done (exit 0, its last
// progress "done") as its run's last.
func (h *taskHandle) endRun() {
	h.mu.RLock()
	p, res := h.progress, h.exitResult
	h.mu.RUnlock()
	if p == nil || res == nil || res.ExitCode != 0 || p.State != contract.StateDone || h.state.Checkpoint == "" || h.state.CheckpointBase == "" {
		return
	}
	if alloc := filepath.Dir(filepath.Clean(h.state.TaskDir)); strings.HasPrefix(h.state.CheckpointBase, alloc+"/") {
		return // an earlier release's checkpoints in the allocation: they go with it
	}
	ck, err := openCheckpointDir(h.state.Checkpoint, h.state.CheckpointBase)
	if err == nil {
		err = finishRun(ck, h.state.Run)
		ck.Close()
	}
	if err != nil {
		h.logger.Warn("the run's end not recorded: a new run of the job may resume from its checkpoints", "error", err)
	}
}
