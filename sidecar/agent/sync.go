package agent

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/sidecar/feasible"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// maxFailures is how often a job's workers may fail before hadar gives up
// on it (it is then left held, with the reason in the status API).
const maxFailures = 3

// sync brings the engine in step with the snapshot: nodes first (jobs on a
// lost node are interrupted), then jobs (arrivals, changes, completions,
// removals), then each job's running placement as Nomad shows it.
func (a *Agent) sync(snap *watch.Snapshot, now float64) error {
	if err := a.syncNodes(snap, now); err != nil {
		return err
	}
	a.syncJobs(snap, now)
	a.reconcile(snap, now)
	a.ports.Reset(a.usedPorts(snap), a.clock())
	if err := a.syncEligibility(snap, now); err != nil {
		return err
	}
	return a.core.eng.SetHeld(a.heldGPUs(snap), now)
}

// syncEligibility tells the engine where each managed job may run by
// Nomad's own placement rules (sidecar/feasible), when that changed. A job
// every node's every type allows is left unrestricted (nil): most jobs,
// and nothing to keep in the engine's snapshot.
func (a *Agent) syncEligibility(snap *watch.Snapshot, now float64) error {
	for _, k := range a.roster.keys() {
		mj := a.roster.job(k)
		j := snap.Jobs[k]
		if j == nil || j.Spec == nil {
			continue
		}
		res := a.feas.Evaluate(j, snap)
		if sameResult(res, mj.feas) {
			continue
		}
		mj.feas = res
		var el round.Eligible
		if !a.allowsAll(res) {
			el = res.Allowed()
		}
		if err := a.core.eng.SetEligible(mj.id, el, res.Why, now); err != nil {
			return fmt.Errorf("job %s: %w", mj.id, err)
		}
	}
	return nil
}

// sameResult reports whether two evaluations are the same one: the
// evaluator hands back its cached result while nothing it depends on
// changed.
func sameResult(a, b feasible.Result) bool {
	return a.Why == b.Why && a.Nodes != nil && b.Nodes != nil && reflect.ValueOf(a.Nodes).UnsafePointer() == reflect.ValueOf(b.Nodes).UnsafePointer()
}

// allowsAll reports whether res lets the job use every GPU type of every
// node the engine plans on.
func (a *Agent) allowsAll(res feasible.Result) bool {
	for id, n := range a.cluster.all() {
		for t, k := range n.GPUs {
			if k > 0 && !res.Allows(id, t) {
				return false
			}
		}
	}
	return true
}

// plannerNode is the engine's view of a Nomad node: its healthy GPUs per
// planner type. ok is false for a node the engine must not plan on (not
// ready, no GPUs).
func (a *Agent) plannerNode(n *watch.Node) (planner.Node, bool) {
	if n.Status != api.NodeStatusReady {
		return planner.Node{}, false
	}
	pn := planner.Node{ID: n.ID, Rack: n.Rack, GPUs: map[planner.GPUType]int{}}
	if pn.Rack == "" {
		pn.Rack = "rack-" + n.ID // no rack meta: a rack of its own
	}
	models := map[planner.GPUType][]string{}
	for _, g := range n.GPUs {
		t := a.types.Type(g.Model)
		if t == "" {
			continue
		}
		if g.Healthy > 0 {
			pn.GPUs[t] += g.Healthy
		}
		models[t] = append(models[t], g.Model)
	}
	a.cluster.describe(n.ID, n.Address, models)
	a.net.SetNode(belief.Node{ID: n.ID, Rack: pn.Rack, GPUs: pn.GPUs, Meta: n.Meta})
	if len(pn.GPUs) == 0 {
		return planner.Node{}, false
	}
	return pn, true
}

func (a *Agent) syncNodes(snap *watch.Snapshot, now float64) error {
	want := map[string]planner.Node{}
	drain := map[string]bool{}
	for id, n := range snap.Nodes {
		for _, g := range n.GPUs {
			if a.types.Type(g.Model) == "" {
				a.warnOnce("model:"+g.Model, "GPU model not recognised: its GPUs are left out of planning", "model", g.Model, "node", n.Name,
					"fix", fmt.Sprintf(`add gpu_types = { %q = "<type>" } to the sidecar config`, g.Model))
			}
		}
		if pn, ok := a.plannerNode(n); ok {
			want[id] = pn
			drain[id] = !n.Schedulable()
		}
	}
	for _, id := range a.cluster.gone(want) {
		hit, err := a.core.eng.RemoveNode(id, now)
		if err != nil {
			return fmt.Errorf("node %s left: %w", id, err)
		}
		a.log.Info("node left the plan", "node", id, "jobs_interrupted", len(hit))
		a.net.RemoveNode(id)
		a.cluster.remove(id)
	}
	var changed []planner.Node
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if a.cluster.changed(want[id]) {
			changed = append(changed, want[id])
		}
	}
	if len(changed) > 0 {
		hit, err := a.core.eng.SetNodes(changed, now)
		if err != nil {
			return fmt.Errorf("nodes: %w", err)
		}
		for _, n := range changed {
			a.cluster.set(n)
		}
		if len(hit) > 0 {
			a.log.Info("GPUs lost under running jobs", "jobs_interrupted", hit)
		}
	}
	for id, d := range drain {
		if a.cluster.draining(id) != d {
			if err := a.core.eng.Drain(id, d, now); err != nil {
				return err
			}
			a.cluster.setDrain(id, d)
		}
	}
	return nil
}

// heldGPUs counts, per node and planner type, the GPUs held by live
// allocations of work the engine does not plan: jobs hadar does not manage,
// and managed jobs it does not plan (a spec it refuses, an admission it
// refused). Never offered to the planner, though still the cluster's
// capacity. Called after syncJobs, so the roster is current.
func (a *Agent) heldGPUs(snap *watch.Snapshot) map[string]map[planner.GPUType]int {
	out := map[string]map[planner.GPUType]int{}
	add := func(node string, gpus map[string]int) {
		for model, n := range gpus {
			t := a.types.Type(model)
			if t == "" {
				continue
			}
			if out[node] == nil {
				out[node] = map[planner.GPUType]int{}
			}
			out[node][t] += n
		}
	}
	for _, h := range snap.Unmanaged {
		add(h.NodeID, h.GPUs)
	}
	for _, al := range snap.Allocs {
		if a.roster.job(al.Job()) == nil && !al.Terminal() {
			add(al.NodeID, al.GPUs)
		}
	}
	return out
}

func (a *Agent) syncJobs(snap *watch.Snapshot, now float64) {
	seen := map[watch.JobKey]bool{}
	for _, j := range snap.ManagedJobs() {
		k := j.Key()
		seen[k] = true
		mj := a.roster.job(k)
		if j.SpecErr != nil {
			if iv, ok := a.roster.refusal(k); !ok || iv.err.Error() != j.SpecErr.Error() {
				a.log.Error("managed job refused: fix its jobspec", "job", k.String(), "error", j.SpecErr.Error())
				a.roster.refuse(k, invalidJob{err: j.SpecErr, index: j.JobModifyIndex})
			}
			if mj != nil {
				a.forget(mj, now)
			}
			continue
		}
		if j.Spec == nil {
			continue
		}
		if iv, ok := a.roster.refusal(k); ok && iv.held {
			if a.stillHeld(iv, j) {
				continue
			}
			a.log.Info("held job changed by its owner: planning it again", "job", k.String())
			a.roster.unrefuse(k)
		}
		if iv, ok := a.roster.refusal(k); ok && !iv.admission {
			a.roster.unrefuse(k) // the spec parses now; an admission refusal stays until admitted
		}
		if mj != nil && j.Version != mj.version && !mj.spec.Same(*j.Spec) {
			a.log.Info("managed job's contract changed: planning it afresh", "job", k.String())
			a.forget(mj, now)
			mj = nil
		}
		if mj != nil {
			mj.version = j.Version
		}
		switch {
		case j.Stop:
			if mj != nil {
				a.log.Info("managed job stopped by its owner", "job", k.String())
				a.forget(mj, now)
			}
		case j.Status == "dead":
			if mj != nil {
				a.finished(snap, j, mj, now)
			}
		case mj == nil:
			a.admit(snap, j, now)
		}
	}
	for _, k := range a.roster.keys() {
		if !seen[k] {
			a.log.Info("managed job is gone", "job", k.String())
			a.forget(a.roster.job(k), now)
		}
	}
	a.roster.keepRefused(seen)
}

// stillHeld says whether a job held for failing on every start stays
// held: until its owner stops it or changes its spec, or registers it
// again (a version of the job that neither the hold saw nor hadar wrote).
func (a *Agent) stillHeld(iv invalidJob, j *watch.Job) bool {
	if j.Stop || !iv.spec.Same(*j.Spec) {
		return false
	}
	switch j.JobModifyIndex {
	case iv.index, iv.noted, a.applier.Own(j.Key()):
		return true
	}
	return false
}

// declare records a job's own figures (hadar.throughput) with the
// profile, and returns the model name it is planned under.
func (a *Agent) declare(s jobspec.Spec) string {
	if d, ok := s.Declared(); ok {
		a.prof.Declare(s.ModelKey(), d)
	}
	return s.ModelKey()
}

// admit hands a valid managed job to the engine.
func (a *Agent) admit(snap *watch.Snapshot, j *watch.Job, now float64) {
	k := j.Key()
	s := *j.Spec
	model := a.declare(s)
	arrival := float64(j.SubmitTime.UnixNano()) / 1e9
	if j.SubmitTime.IsZero() || arrival > now {
		arrival = now
	}
	jb := s.Job(engineID(k), arrival)
	a.placeInQueue(&jb, s, k)
	if err := a.core.eng.Admit(jb, now); err != nil {
		a.prof.Forget(model)
		fe := &jobspec.FieldError{Job: s.JobID, Namespace: s.Namespace, Field: jobspec.KeyModel, Value: s.Model,
			Want: fmt.Sprintf("a job the throughput profile can plan: %v; give hadar.throughput for the GPU types it runs on, or a profiled hadar.workers", err)}
		if iv, ok := a.roster.refusal(k); !ok || iv.err.Error() != fe.Error() {
			a.log.Error("managed job refused", "job", k.String(), "error", fe.Error())
			a.roster.refuse(k, invalidJob{err: fe, index: j.JobModifyIndex, admission: true})
		}
		return
	}
	a.net.SetSensitivity(jb.ID, s.Sensitivity)
	mj := &managed{key: k, id: jb.ID, spec: s, version: j.Version, model: model, arrival: j.SubmitTime}
	mj.units = nextUnit(snap, j)
	a.roster.admitted(mj) // ends its admission refusal
	a.log.Info("managed job admitted", "job", k.String(), "model", s.Model, "workers", s.Workers, "steps", s.Steps)
}

// nextUnit is one past the highest unit number the job's spec or any of
// its allocations used: new units never reuse a group name.
func nextUnit(snap *watch.Snapshot, j *watch.Job) int {
	n := 0
	if j.Raw != nil {
		for _, g := range j.Raw.TaskGroups {
			if w, ok := groupname.Parse(deref(g.Name)); ok {
				n = max(n, w.Unit+1)
			}
		}
	}
	for _, al := range snap.AllocsOf(j.Key()) {
		if al.Worker != nil {
			n = max(n, al.Worker.Unit+1)
		}
	}
	return n
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// finished handles a managed job Nomad reports dead: complete when its
// workers exited 0, else a failure (failedRun).
func (a *Agent) finished(snap *watch.Snapshot, j *watch.Job, mj *managed, now float64) {
	if a.applier.InFlight(watch.JobKey(j.Key())) != nil {
		return // our own write is in flight: Nomad's status is stale
	}
	complete, failed, own := false, "", false
	for _, al := range snap.AllocsOf(j.Key()) {
		own = own || doneOnItsOwn(al, mj)
		if al.Worker == nil || al.JobVersion != j.Version || al.DesiredStatus != api.AllocDesiredStatusRun {
			continue
		}
		switch al.ClientStatus {
		case api.AllocClientStatusComplete:
			complete = true
		case api.AllocClientStatusFailed, api.AllocClientStatusLost:
			failed = fmt.Sprintf("allocation %s %s (%s)", shortID(al.ID), al.ClientStatus, al.ClientDescription)
		}
	}
	if !complete && failed == "" {
		complete = own
	}
	switch {
	case complete && failed == "":
		if err := a.core.eng.Complete(mj.id, now); err == nil {
			a.log.Info("managed job complete", "job", mj.key.String())
			a.note(wire.Event{Time: a.clock(), Job: mj.id, Result: "complete"})
		}
		a.prof.Forget(mj.model)
		a.roster.drop(mj.key)
	case failed != "":
		a.failedRun(snap, mj, j.Version, failed, now)
	}
}

// doneOnItsOwn tells whether al is a rank 0 of the job's current run that
// ended with exit 0 without Nomad stopping it, or with its driver's event
// saying its progress was done: by the training contract, the run is
// done. It catches a job that finished as the sidecar rewrote it
// (a stop decided on progress a few seconds old): its allocations are then
// of an older version, desired "stop", and placing it again would rerun a
// finished run (hadar-train starts a finished run's task fresh). Only
// allocations made since the job's admission count (a finished earlier
// run of the same job is not this one), and only rank 0 (a rank whose
// rank 0 left exits 0 by itself).
func doneOnItsOwn(al *watch.Alloc, mj *managed) bool {
	if al.Worker == nil || al.Worker.Rank != 0 || al.ClientStatus != api.AllocClientStatusComplete || al.CreateTime.Before(mj.arrival) {
		return false
	}
	ts, ok := al.TaskStates[al.Task]
	if !ok || ts.State != "dead" || ts.Failed {
		return false
	}
	stopped := false
	for _, ev := range ts.Events {
		// hadar-train's event at the task's end names its last progress:
		// "done" is the run done even when the stop reached a process
		// already exiting done (make test run 31: done at 160/160 at
		// 06:00:52.319, the stop written 344 ms later, a Killing event).
		if ev.Type == api.TaskDriverMessage && ev.Details[contract.DetailState] == contract.StateDone {
			return true
		}
		stopped = stopped || ev.Type == api.TaskKilling || ev.Type == api.TaskKilled
	}
	return !stopped
}

// Failed runs back off before the next try, doubling from
// failureBackoffBase up to failureBackoffCap: a job that fails at once on
// every start (the driver refuses its configuration) is not placed again
// every round.
const (
	failureBackoffBase = 30 * time.Second
	failureBackoffCap  = 10 * time.Minute
)

// failedRun counts a run of the job (its workers of job version version)
// that failed, once per version: retried from its checkpoint after a
// back-off, held after maxFailures in a row failing for the same reason
// or more than maxFailures in all. A held job leaves the plan and shows
// as refused with the driver's reason until its owner changes it
// (heldJob).
func (a *Agent) failedRun(snap *watch.Snapshot, mj *managed, version uint64, failed string, now float64) {
	if mj.failedVersion == version && mj.failures > 0 {
		return // this run's failure is counted (a rolled-back gang, then Nomad's dead)
	}
	mj.failedVersion = version
	reason := failureReason(snap, mj.key, version)
	if reason == "" {
		reason = failed
	}
	mj.failures++
	if reason == mj.lastFailure {
		mj.sameFailures++
	} else {
		mj.lastFailure, mj.sameFailures = reason, 1
	}
	if mj.sameFailures >= maxFailures || mj.failures > maxFailures {
		msg := fmt.Sprintf("held: its workers failed %d times (%d in a row the same way): %s; fix the cause, then change or stop and run the job again", mj.failures, mj.sameFailures, reason)
		a.log.Error("managed job's workers fail on every start: holding it", "job", mj.key.String(), "failures", mj.failures, "reason", reason)
		a.note(wire.Event{Time: a.clock(), Job: mj.id, Result: "failed for good: " + msg})
		j := snap.Jobs[mj.key]
		a.forget(mj, now)
		if j != nil {
			a.roster.refuse(mj.key, invalidJob{err: errors.New(msg), index: j.JobModifyIndex, held: true, spec: mj.spec})
		}
		return
	}
	wait := min(failureBackoffBase<<(mj.failures-1), failureBackoffCap)
	a.log.Warn("managed job's workers failed: restarting it from its checkpoint after a back-off", "job", mj.key.String(), "failure", mj.failures, "reason", reason, "retry_in", wait)
	if err := a.core.eng.Interrupt(mj.id, now); err != nil {
		a.log.Debug("interrupt", "job", mj.id, "error", err)
	}
	why := fmt.Sprintf("its workers failed (%d of %d tries): %s", mj.failures, maxFailures+1, reason)
	if err := a.core.eng.Defer(mj.id, now+wait.Seconds(), why, now); err != nil {
		a.log.Debug("defer", "job", mj.id, "error", err)
	}
}

// failureReason is why the job's newest failed worker of job version
// version failed, as its task driver or Nomad said it: the task's driver
// failure, else its last event (the exit code), else the allocation's
// description. "" when none of its allocations failed.
func failureReason(snap *watch.Snapshot, k watch.JobKey, version uint64) string {
	var newest *watch.Alloc
	for _, al := range snap.AllocsOf(k) {
		if al.Worker == nil || al.JobVersion != version || !failedAlloc(al) {
			continue
		}
		if newest == nil || al.ModifyTime.After(newest.ModifyTime) {
			newest = al
		}
	}
	if newest == nil {
		return ""
	}
	var last, driver string
	for _, name := range slices.Sorted(maps.Keys(newest.TaskStates)) {
		for _, ev := range newest.TaskStates[name].Events {
			if ev.Message == "" {
				continue
			}
			if ev.Type == api.TaskDriverFailure || ev.Type == api.TaskSetupFailure || ev.Type == api.TaskFailedValidation {
				driver = ev.Message
			}
			last = ev.Type + ": " + ev.Message
		}
	}
	switch {
	case driver != "":
		return driver
	case last != "":
		return last
	}
	return fmt.Sprintf("allocation %s %s (%s)", shortID(newest.ID), newest.ClientStatus, newest.ClientDescription)
}

// newestFailed is the job's worker allocation that failed last, nil when
// none did.
func newestFailed(snap *watch.Snapshot, k watch.JobKey) *watch.Alloc {
	var newest *watch.Alloc
	for _, al := range snap.AllocsOf(k) {
		if al.Worker == nil || !failedAlloc(al) {
			continue
		}
		if newest == nil || al.ModifyTime.After(newest.ModifyTime) {
			newest = al
		}
	}
	return newest
}

func failedAlloc(al *watch.Alloc) bool {
	return al.ClientStatus == api.AllocClientStatusFailed || al.ClientStatus == api.AllocClientStatusLost
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// forget removes a job from the engine.
func (a *Agent) forget(mj *managed, now float64) {
	// Complete and Fail both take the job out; a failure is also logged
	// and noted by the caller.
	if err := a.core.eng.Fail(mj.id, now); err != nil {
		a.log.Debug("forget", "job", mj.id, "error", err)
	}
	a.applier.Cancel(mj.key)
	a.prof.Forget(mj.model)
	a.roster.drop(mj.key)
}

// running returns the units of a job Nomad runs now: written in its spec,
// every worker placed (pending or running) or finished (complete: the
// workers of a unit end a few seconds apart, and a finishing unit is not a
// broken one), none asked to stop.
func running(snap *watch.Snapshot, j *watch.Job) ([]jobform.Unit, error) {
	units, err := j.Units, j.UnitsErr
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, al := range snap.AllocsOf(j.Key()) {
		if al.DesiredStatus != api.AllocDesiredStatusRun {
			continue
		}
		switch al.ClientStatus {
		case api.AllocClientStatusRunning, api.AllocClientStatusPending, api.AllocClientStatusComplete:
			live[al.TaskGroup] = true
		}
	}
	var out []jobform.Unit
	for _, u := range units {
		all := true
		for r := range u.Workers {
			all = all && live[groupname.Format(j.Spec.Group, u.ID, r)]
		}
		if all {
			out = append(out, u)
		}
	}
	return out, nil
}

// reconcile makes the engine's placement of each job without a write in
// flight equal to what Nomad runs: Nomad is the truth (a write refused, a
// gang rolled back, workers that died, a person's edit).
func (a *Agent) reconcile(snap *watch.Snapshot, now float64) {
	for _, k := range a.roster.keys() {
		mj := a.roster.job(k)
		j := snap.Jobs[k]
		if j == nil || j.Spec == nil || a.applier.InFlight(k) != nil {
			continue
		}
		st, ok := a.core.eng.Job(mj.id)
		if !ok {
			continue
		}
		units, err := running(snap, j)
		if err != nil {
			a.warnOnce("units:"+k.String(), "cannot read the placement written in a managed job", "job", k.String(), "error", err)
			continue
		}
		var obs planner.Placement
		for _, u := range units {
			obs.Units = append(obs.Units, u.Planner())
		}
		if samePlacement(st.Placement, obs) {
			continue
		}
		if len(obs.Units) == 0 {
			if st.Running {
				a.log.Info("job no longer runs in Nomad: it waits for a new placement", "job", mj.id)
				if err := a.core.eng.Interrupt(mj.id, now); err != nil {
					a.log.Error("interrupt", "job", mj.id, "error", err)
				}
			}
			continue
		}
		if err := a.core.eng.Adopt(mj.id, obs, now); err != nil {
			a.log.Warn("job runs where the plan cannot hold it: it will be moved", "job", mj.id, "error", err)
			if err := a.core.eng.Interrupt(mj.id, now); err != nil {
				a.log.Error("interrupt", "job", mj.id, "error", err)
			}
			continue
		}
		a.log.Info("adopted the placement Nomad runs", "job", mj.id, "units", len(obs.Units))
	}
}

// samePlacement compares placements unit by unit, in any order.
func samePlacement(a, b planner.Placement) bool {
	if len(a.Units) != len(b.Units) {
		return false
	}
	used := make([]bool, len(b.Units))
	for _, u := range a.Units {
		found := false
		for i, v := range b.Units {
			if !used[i] && u.Equal(v) {
				used[i], found = true, true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// usedPorts are the rendezvous ports written in managed jobs and those
// their live allocations hold, by address.
func (a *Agent) usedPorts(snap *watch.Snapshot) map[string][]int {
	out := map[string][]int{}
	for _, j := range snap.ManagedJobs() {
		if j.Spec == nil || j.Raw == nil {
			continue
		}
		us, err := j.Units, j.UnitsErr
		if err != nil {
			continue
		}
		for _, u := range us {
			out[u.Workers[0].Addr] = append(out[u.Workers[0].Addr], u.Port)
		}
	}
	// A unit's rank 0 holds its port until its allocation is terminal,
	// also after the unit left the job (it checkpoints within its
	// kill_timeout, or still gathers its unit): a port it may listen on is
	// not given to another unit, also by a sidecar that restarted and
	// lost its quarantine of released ports. Otherwise the new unit's
	// workers reach the old rank 0 and its rank 0 finds the port taken.
	for _, al := range snap.Allocs {
		port, ok := al.Ports[jobform.PortLabel]
		if !ok || al.Terminal() {
			continue
		}
		if addr := a.cluster.addr(al.NodeID); addr != "" {
			out[addr] = append(out[addr], port)
		}
	}
	return out
}

// warnOnce logs a warning the first time key is seen, and again once
// warnTTL has passed.
func (a *Agent) warnOnce(key, msg string, args ...any) {
	if a.pace.silenced(key, a.clock()) {
		return
	}
	a.log.Warn(msg, args...)
}
