package train

import (
	"fmt"
	"path/filepath"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hadar-sched/hadar/contract"
)

// annotations renders p as task-event details and InspectTask attributes.
func annotations(p *contract.Progress) map[string]string {
	return map[string]string{
		contract.DetailStepsDone:  strconv.FormatInt(p.StepsDone, 10),
		contract.DetailTotalSteps: strconv.FormatInt(p.TotalSteps, 10),
		contract.DetailState:      bounded(p.State),
		"hadar.steps_per_sec":     strconv.FormatFloat(p.StepsPerSec, 'g', 6, 64),
		"hadar.loss":              strconv.FormatFloat(p.Loss, 'g', 6, 64),
		"hadar.checkpoint":        bounded(p.Checkpoint),
		"hadar.merges":            strconv.Itoa(p.Merges),
		"hadar.updated":           p.Updated.UTC().Format(time.RFC3339),
	}
}

// event is a task event to publish.
type event struct {
	message string
	details map[string]string
}

// progressEvents decides the task events of one run. Progress itself
// lives in the progress file (the alloc filesystem); Nomad keeps only the
// last 10 events of a task and each costs a state write, so an event
// marks a change that matters, each at most once a run:
//
//   - "resumed from checkpoint ... at step N": the first progress names a
//     checkpoint older than the process (it resumed from it);
//   - "first merge ...": a HadarE copy completed its first merge (later
//     merges are periodic, and counted in the progress file);
//   - "checkpoint saved ...": the checkpoint written after the driver
//     signalled the process (the stop), or the run's last one;
//   - "final progress ...": after the process ended.
//
// With "training process started" (StartTask) a run has at most five.
type progressEvents struct {
	started time.Time
	// primed: the driver reattached to a running process (at
	// reattached), so a checkpoint seen first that is older than that was
	// published before the restart. One written since (the stop's, when
	// the first read after a reattach comes late on a loaded node) is new.
	primed     bool
	reattached time.Time
	// olderThan tells whether a checkpoint was written before a time
	// (one the process found when it started); nil: never.
	olderThan func(path string, t time.Time) bool

	seen      bool
	merged    bool
	resumed   string // the checkpoint the run started from
	lastCkpt  string
	ckptSaved bool
	final     bool
}

// next returns the events due now, given the progress read (nil if none),
// whether the process was signalled to stop, and whether it has ended.
func (e *progressEvents) next(p *contract.Progress, stopping, final bool) []event {
	if e.final {
		return nil
	}
	var out []event
	if p != nil {
		if !e.seen {
			e.seen = true
			e.lastCkpt = p.Checkpoint
			e.merged = e.primed && p.Merges > 0
			known := e.olderThan != nil && e.olderThan(p.Checkpoint, e.started)
			if e.primed {
				known = e.olderThan == nil || e.olderThan(p.Checkpoint, e.reattached)
			}
			if p.Checkpoint != "" && known {
				e.resumed = p.Checkpoint
				if !e.primed {
					out = append(out, event{fmt.Sprintf("resumed from checkpoint %s at step %d", bounded(p.Checkpoint), resumedAt(p)), annotations(p)})
				}
			}
		}
		if !e.merged && p.Merges > 0 {
			e.merged = true
			out = append(out, event{fmt.Sprintf("first merge with the other copies done at step %d", p.StepsDone), annotations(p)})
		}
		changed := p.Checkpoint != e.lastCkpt
		e.lastCkpt = p.Checkpoint
		if !e.ckptSaved && p.Checkpoint != "" && p.Checkpoint != e.resumed && ((stopping && changed) || final) {
			e.ckptSaved = true
			out = append(out, event{fmt.Sprintf("checkpoint saved at step %d: %s", p.StepsDone, bounded(p.Checkpoint)), annotations(p)})
		}
	}
	if final {
		e.final = true
		if p != nil {
			out = append(out, event{message(p, "final progress"), annotations(p)})
		}
	}
	return out
}

// resumedAt is the step a process resumed at: its checkpoint's, by the
// contract's name, not the steps done when the driver first read its
// progress (on a loaded node, some steps on).
func resumedAt(p *contract.Progress) int64 {
	if step, _, ok := contract.ParseCheckpointName(filepath.Base(p.Checkpoint)); ok {
		return step
	}
	return p.StepsDone
}

func message(p *contract.Progress, prefix string) string {
	return fmt.Sprintf("%s: step %d/%d, %.3g steps/s, loss %.4g, checkpoint %q", prefix, p.StepsDone, p.TotalSteps, p.StepsPerSec, p.Loss, bounded(p.Checkpoint))
}

// maxEventText bounds the task's own text (the progress file's
// checkpoint, up to 1 MiB) in a task event: events go into Nomad's
// cluster state, a run publishes up to three with it, and a path is far
// shorter (PATH_MAX is 4096).
const maxEventText = 512

// bounded is s cut to maxEventText bytes (at a character boundary), with
// how much was left out.
func bounded(s string) string {
	if len(s) <= maxEventText {
		return s
	}
	cut := maxEventText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes more)", s[:cut], len(s)-cut)
}
