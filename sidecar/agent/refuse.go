package agent

import (
	"context"
	"fmt"
	"slices"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// ErrorAttribute is the node meta key of the constraint hadar puts first on
// a managed job it refuses: no node has the key, so the constraint only
// carries the error to where the author looks, `nomad job status`:
//
//	Constraint "${meta.hadar.error} = hadar: job "x": meta hadar.steps = "lots": want ...": 4 nodes excluded by filter
const ErrorAttribute = jobform.ErrorAttribute

// maxNote bounds the error text written onto a job.
const maxNote = 300

// noteRefusals writes each refused job's error onto the job, once, and
// takes it off a job whose spec is valid again. Either write is made only
// on a job nothing of which runs (gated, no generated group, every
// allocation terminal): the constraint makes Nomad stop what runs, and
// hadar never touches a running job it could not validate. Both go
// through the fence and the journal like every other write. A
// resubmission replaces the note with the author's new spec.
func (a *Agent) noteRefusals(ctx context.Context, snap *watch.Snapshot) {
	if a.cfg.DryRun {
		return
	}
	ctx, cancel, ok := a.underLease(ctx)
	defer cancel()
	if !ok {
		return
	}
	for _, k := range a.roster.refused() {
		iv, _ := a.roster.refusal(k)
		j := snap.Jobs[k]
		if j == nil || j.Raw == nil || iv.noted == j.JobModifyIndex || j.Stop || !idle(snap, j) {
			continue
		}
		if j.Raw.ParentID != nil && *j.Raw.ParentID != "" {
			// A launched job cannot be rewritten (jobspec.Parse, "parent"):
			// its error is in the log and the API only.
			continue
		}
		msg := "hadar: " + iv.err.Error()
		if len(msg) > maxNote {
			msg = msg[:maxNote-3] + "..."
		}
		if slices.ContainsFunc(j.Raw.Constraints, func(c *api.Constraint) bool { return c != nil && c.LTarget == ErrorAttribute && c.RTarget == msg }) {
			iv.noted = j.JobModifyIndex
			a.roster.refuse(k, iv)
			continue
		}
		job := *j.Raw
		job.Constraints = append([]*api.Constraint{api.NewConstraint(ErrorAttribute, "=", msg)}, jobform.WithoutNotes(job.Constraints)...)
		index, err := a.writeNote(ctx, k, &job, j.JobModifyIndex, "note")
		switch {
		case err == nil:
			iv.noted = index
			a.log.Info("wrote the error onto the refused job", "job", k.String())
		case errIsConflict(err), ctx.Err() != nil:
			continue // read again next cycle
		default:
			// Once per version of the job, not every cycle.
			a.log.Warn("could not write the error onto the job", "job", k.String(), "error", err)
			iv.noted = j.JobModifyIndex
		}
		a.roster.refuse(k, iv)
	}
	for _, j := range snap.ManagedJobs() {
		if j.Raw == nil || j.Spec == nil || j.Stop || !hasNote(j.Raw) || !idle(snap, j) {
			continue
		}
		if _, refused := a.roster.refusal(j.Key()); refused {
			continue // held (failed on every start): its note stays
		}
		job := *j.Raw
		job.Constraints = jobform.WithoutNotes(job.Constraints)
		if _, err := a.writeNote(ctx, j.Key(), &job, j.JobModifyIndex, "unnote"); err != nil {
			if !errIsConflict(err) && ctx.Err() == nil {
				a.log.Warn("could not take the old error off the job", "job", j.Key().String(), "error", err)
			}
			continue
		}
		a.log.Info("the job is valid again: took hadar's error off it", "job", j.Key().String())
	}
}

// idle reports that nothing of job j runs or could run: it is gated, has
// no generated worker group, and every allocation of it is terminal.
func idle(snap *watch.Snapshot, j *watch.Job) bool {
	if !jobspec.HasGate(j.Raw) {
		return false
	}
	for _, g := range j.Raw.TaskGroups {
		if g != nil && g.Name != nil {
			if _, gen := groupname.Parse(*g.Name); gen {
				return false
			}
		}
	}
	for _, al := range snap.AllocsOf(j.Key()) {
		if !al.Terminal() {
			return false
		}
	}
	return true
}

func hasNote(job *api.Job) bool {
	return len(jobform.WithoutNotes(job.Constraints)) != len(job.Constraints)
}

// writeNote registers job (a note added or removed) against index, fenced
// and journaled as the applier's writes are, and returns the new index.
func (a *Agent) writeNote(ctx context.Context, k watch.JobKey, job *api.Job, index uint64, kind string) (uint64, error) {
	w := apply.Write{Job: k, Kind: kind, ReadIndex: index}
	if err := a.fence(ctx, w); err != nil {
		return 0, err
	}
	if err := a.guard(ctx); err != nil {
		return 0, err
	}
	wo := (&api.WriteOptions{Namespace: k.Namespace}).WithContext(ctx)
	resp, _, err := a.client.Jobs().RegisterOpts(job, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: index}, wo)
	if err != nil {
		return 0, fmt.Errorf("job %s: the %s write: %w", k, kind, err)
	}
	w.Applied, w.JobModifyIndex = true, resp.JobModifyIndex
	if err := a.fence(ctx, w); err != nil {
		a.log.Warn("write made but not journaled: a restart recognises it from Nomad", "job", k.String(), "error", err)
	}
	return resp.JobModifyIndex, nil
}

func errIsConflict(err error) bool { return apply.IsIndexConflict(err) }
