package agent

import (
	"context"
	"slices"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// ErrorAttribute is the node meta key of the constraint hadar puts first on
// a managed job it refuses: no node has the key, so the constraint only
// carries the error to where the author looks, `nomad job status`:
//
//	Constraint "${meta.hadar.error} = hadar: job "x": meta hadar.steps = "lots": want ...": 4 nodes excluded by filter
const ErrorAttribute = "${meta.hadar.error}"

// maxNote bounds the error text written onto a job.
const maxNote = 300

// noteRefusals writes each refused job's error onto the job, once, when
// the job is held (gated: nothing of it runs, so the write restarts
// nothing). Jobs that are not gated are only reported: they may run, and
// hadar never touches a job it could not validate. A resubmission
// replaces the note with the author's new spec.
func (a *Agent) noteRefusals(ctx context.Context, snap *watch.Snapshot) {
	if a.cfg.DryRun {
		return
	}
	for _, k := range sortedKeys(a.invalid) {
		iv := a.invalid[k]
		j := snap.Jobs[k]
		if j == nil || j.Raw == nil || iv.noted == j.JobModifyIndex || j.Stop || !jobspec.HasGate(j.Raw) {
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
			a.invalid[k] = iv
			continue
		}
		job := *j.Raw
		var cs []*api.Constraint
		for _, c := range job.Constraints {
			if c == nil || c.LTarget != ErrorAttribute {
				cs = append(cs, c)
			}
		}
		job.Constraints = append([]*api.Constraint{api.NewConstraint(ErrorAttribute, "=", msg)}, cs...)
		wo := (&api.WriteOptions{Namespace: k.Namespace}).WithContext(ctx)
		resp, _, err := a.client.Jobs().RegisterOpts(&job, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: j.JobModifyIndex}, wo)
		if err != nil {
			if !strings.Contains(err.Error(), "conflicting job modify index") {
				// Once per version of the job, not every cycle.
				a.log.Warn("could not write the error onto the job", "job", k.String(), "error", err)
				iv.noted = j.JobModifyIndex
				a.invalid[k] = iv
			}
			continue
		}
		iv.noted = resp.JobModifyIndex
		a.invalid[k] = iv
		a.log.Info("wrote the error onto the refused job", "job", k.String())
	}
}
