package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hadar-sched/hadar/trainer"

	"github.com/hadar-sched/hadar/contract"
)

// HadarE merging by membership (docs/training-contract.md, "HadarE
// membership and merge"; the files are contract/merge.go's). The copies
// of a job share one merge directory:
//
//	members/copy-<i>.json   each copy's heartbeat, rewritten every second
//	round-<r>/copy-<i>.json copy i's model state and steps of round r
//	round-<r>/merged.json   round r closed: the merged state, the job's
//	                        steps, who took part, and who takes part in
//	                        round r+1 with how many steps
//
// Round 0 is the start (the initial parameters, no steps), written by the
// first copy. A copy listed in round r's targets trains its steps of round
// r+1, writes its file and waits, up to --merge-timeout, for the other
// listed copies' files; a listed copy whose heartbeat stopped (older than
// --member-ttl) or says it left is not waited for. The first copy to see
// the round complete (or the wait over) closes it: it averages the files
// weighted by steps, adds the steps to the job's, lists the members of
// the next round (this round's copies that stay, and the copies that
// announced themselves meanwhile) and writes merged.json with link(2), so
// that exactly one result exists; every other copy adopts that one. The
// job's steps are therefore counted once, whoever closes, and all copies
// hold the same parameters after every round.
//
// A copy that starts (a fork, or a unit placed anew) adopts the newest
// closed round: its parameters and the job's steps, not another copy's
// checkpoint and not the initial parameters. If it is not a member of
// the round under way it waits for that round to close (the closer lists
// it for the next). A copy that is stopped writes its steps of the round
// so far (marked leaving) and says so in its heartbeat; the last one
// standing closes the round, so the steps of a job evicted whole are in
// the merged state a later copy resumes from.

// membership is one copy's (a unit's rank 0) view of its job's copies.
type membership struct {
	dir        string
	o          Options
	self       int
	log        *slog.Logger
	hb         *heartbeat
	mergeEvery int            // this copy's steps per round
	init       trainer.Params // round 0's parameters
	initState  contract.State // the same, as the contract's state
}

// heartbeat keeps members/copy-<i>.json fresh while the copy lives.
type heartbeat struct {
	path string
	log  *slog.Logger
	mu   sync.Mutex
	m    Member
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func startHeartbeat(path string, m Member, every time.Duration, log *slog.Logger) (*heartbeat, error) {
	h := &heartbeat{path: path, log: log, m: m, quit: make(chan struct{}), done: make(chan struct{})}
	if err := h.write(); err != nil {
		return nil, err
	}
	go func() {
		defer close(h.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-h.quit:
				return
			case <-t.C:
				if err := h.write(); err != nil {
					h.log.Warn("heartbeat not written", "err", err)
				}
			}
		}
	}()
	return h, nil
}

func (h *heartbeat) write() error {
	h.mu.Lock()
	h.m.Updated = time.Now().UTC()
	b, err := json.Marshal(h.m)
	h.mu.Unlock()
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return writeFileAtomic(h.path, b)
}

// set changes what the heartbeat says and writes it at once.
func (h *heartbeat) set(state string, round int) {
	h.mu.Lock()
	h.m.State, h.m.Round = state, round
	h.mu.Unlock()
	if err := h.write(); err != nil {
		h.log.Warn("heartbeat not written", "err", err)
	}
}

// stop writes the last heartbeat (leaving or done) and ends the loop.
func (h *heartbeat) stop(state string) {
	h.once.Do(func() {
		close(h.quit)
		<-h.done
		h.mu.Lock()
		h.m.State = state
		h.mu.Unlock()
		if err := h.write(); err != nil {
			h.log.Warn("last heartbeat not written", "err", err)
		}
	})
}

// join announces this copy in the merge directory and returns the newest
// closed round (creating round 0 if there is none).
func join(o Options, log *slog.Logger, mergeEvery int, init trainer.Params) (*membership, *Merged, error) {
	initState, err := StateOf(init)
	if err != nil {
		return nil, nil, fmt.Errorf("hadare: %w", err)
	}
	m := &membership{dir: o.MergeDir, o: o, self: o.CopyIndex, log: log, mergeEvery: mergeEvery, init: init, initState: initState}
	host, _ := os.Hostname()
	every := o.heartbeatEvery
	if every <= 0 {
		every = time.Second
	}
	hb, err := startHeartbeat(contract.MemberPath(m.dir, m.self), Member{Version: contract.MergeVersion, JobID: o.JobID, Copy: m.self, State: contract.StateJoining,
		MergeEvery: mergeEvery, Host: host, PID: os.Getpid()}, every, log)
	if err != nil {
		return nil, nil, fmt.Errorf("hadare: announce copy %d in %s: %w", m.self, m.dir, err)
	}
	m.hb = hb
	latest, err := m.latest()
	if err == nil && latest == nil {
		latest, err = m.genesis()
	}
	if err != nil {
		hb.stop(MemberLeaving)
		return nil, nil, err
	}
	return m, latest, nil
}

// latest returns the newest closed round, nil if there is none. A closed
// round of another job or model is an error: the copies would mix runs.
func (m *membership) latest() (*Merged, error) {
	rounds, err := MergedRounds(m.dir)
	if err != nil {
		return nil, err
	}
	for i := len(rounds) - 1; i >= 0; i-- {
		path := MergedPath(m.dir, rounds[i])
		mg, err := ReadMerged(path)
		if err != nil {
			m.log.Warn("hadare: skipping an unreadable closed round", "err", err)
			continue
		}
		if err := m.compatible(mg); err != nil {
			return nil, fmt.Errorf("hadare: %s: %w", path, err)
		}
		return mg, nil
	}
	return nil, nil
}

func (m *membership) compatible(mg *Merged) error {
	switch {
	case mg.JobID != m.o.JobID:
		return fmt.Errorf("field \"job_id\": %q, this copy runs %q; give every job its own merge directory", mg.JobID, m.o.JobID)
	case mg.TotalSteps != int64(m.o.Steps):
		return fmt.Errorf("field \"total_steps\": %d, this copy runs %d steps; all copies must be given the same HADAR_TOTAL_STEPS", mg.TotalSteps, m.o.Steps)
	}
	if err := m.initState.SameLayout(mg.State); err != nil {
		return fmt.Errorf("field \"state\": %w; this copy runs model %s with dim %d hidden %d classes %d, and all copies must run the same model",
			err, m.init.Model, m.init.Dim, m.init.Hidden, m.init.Classes)
	}
	return nil
}

// genesis writes round 0: the initial parameters, and as members of round
// 1 the declared copies (HADAR_COPIES) and those announced so far.
func (m *membership) genesis() (*Merged, error) {
	var cands []contract.Candidate
	if m.o.Copies > 1 {
		for i := range m.o.Copies {
			cands = append(cands, contract.Candidate{Copy: i})
		}
	}
	for _, j := range m.joiners() {
		if i := slices.IndexFunc(cands, func(c contract.Candidate) bool { return c.Copy == j.Copy }); i >= 0 {
			cands[i].MergeEvery = j.MergeEvery
		} else {
			cands = append(cands, j)
		}
	}
	slices.SortFunc(cands, func(a, b contract.Candidate) int { return a.Copy - b.Copy })
	mg := &Merged{Version: contract.MergeVersion, JobID: m.o.JobID, Round: 0, TotalSteps: int64(m.o.Steps), Members: []Contribution{},
		Targets: contract.NextTargets(int64(m.o.Steps), cands, m.mergeEvery), ClosedBy: m.self, Closed: time.Now().UTC(), State: m.initState}
	return m.publish(mg)
}

// joiners are the copies whose fresh heartbeats say they wait to join.
func (m *membership) joiners() []contract.Candidate {
	entries, err := os.ReadDir(filepath.Join(m.dir, "members"))
	if err != nil {
		return nil
	}
	var out []contract.Candidate
	for _, e := range entries {
		c, ok := contract.ParseCopyName(e.Name())
		if !ok {
			continue
		}
		hb, err := readMember(filepath.Join(m.dir, "members", e.Name()))
		if err != nil || hb == nil || hb.JobID != m.o.JobID || hb.State != contract.StateJoining || m.stale(hb) {
			continue
		}
		out = append(out, contract.Candidate{Copy: c, MergeEvery: hb.MergeEvery})
	}
	return out
}

// stale tells whether a heartbeat stopped.
func (m *membership) stale(hb *Member) bool {
	return time.Since(hb.Updated) > m.o.MemberTTL
}

// publish writes a closed round unless one exists, and returns the one
// that is there (this one, or the one another copy wrote first).
func (m *membership) publish(mg *Merged) (*Merged, error) {
	b, err := json.Marshal(mg)
	if err != nil {
		return nil, fmt.Errorf("hadare: encode round %d: %w", mg.Round, err)
	}
	path := MergedPath(m.dir, mg.Round)
	created, err := createExclusive(path, b)
	if err != nil {
		return nil, fmt.Errorf("hadare: close round %d: %w", mg.Round, err)
	}
	if created {
		return mg, nil
	}
	won, err := ReadMerged(path)
	if err != nil {
		return nil, fmt.Errorf("hadare: round %d was closed by another copy: %w", mg.Round, err)
	}
	return won, nil
}

// contribute writes this copy's file of round r.
func (m *membership) contribute(r int, steps int64, params trainer.Params, leaving bool) error {
	copies := max(m.o.Copies, 1)
	state, err := StateOf(params)
	if err != nil {
		return fmt.Errorf("hadare: merge round %d: %w", r, err)
	}
	f := &MergeFile{Version: contract.MergeVersion, JobID: m.o.JobID, Round: r, CopyIndex: m.self, Copies: copies, Steps: steps,
		MergeEvery: m.mergeEvery, Leaving: leaving, State: state}
	b, err := EncodeMergeFile(f)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(contract.CopyPath(m.dir, r, m.self), b); err != nil {
		return fmt.Errorf("hadare: merge round %d: %w", r, err)
	}
	return nil
}

// roundState reads round r's files of the copies base lists as its
// members: files holds those present; waiting lists the members still
// expected (alive, not left, no file yet).
func (m *membership) roundState(r int, base *Merged) (files map[int]*MergeFile, waiting []int) {
	files = map[int]*MergeFile{}
	for _, t := range base.Targets {
		path := contract.CopyPath(m.dir, r, t.Copy)
		raw, err := os.ReadFile(path)
		if err == nil {
			f, err := DecodeMergeFile(raw)
			if err == nil {
				err = m.checkFile(f, r, t.Copy, base)
			}
			if err != nil {
				// Not mergeable: as if the copy had left.
				m.log.Warn("hadare: skipping an invalid copy file", "path", path, "err", err)
				continue
			}
			files[t.Copy] = f
			continue
		}
		if !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("hadare: skipping an unreadable copy file", "path", path, "err", err)
			continue
		}
		hb, err := readMember(contract.MemberPath(m.dir, t.Copy))
		switch {
		case err != nil:
			// Torn heartbeat: look again at the next poll.
			waiting = append(waiting, t.Copy)
		case hb == nil:
			// Declared but not started: waited for, up to the timeout.
			waiting = append(waiting, t.Copy)
		case hb.Gone() || m.stale(hb):
			// Gone without a contribution.
		default:
			waiting = append(waiting, t.Copy)
		}
	}
	return files, waiting
}

// checkFile rejects a file that cannot be merged into round r.
func (m *membership) checkFile(f *MergeFile, r, copyIndex int, base *Merged) error {
	switch {
	case f.JobID != m.o.JobID:
		return fmt.Errorf("field \"job_id\": %q, this copy runs %q; give every job its own merge dir", f.JobID, m.o.JobID)
	case f.Round != r || f.CopyIndex != copyIndex:
		return fmt.Errorf("fields \"round\" %d, \"copy_index\" %d do not match the file's path (round %d, copy %d)", f.Round, f.CopyIndex, r, copyIndex)
	}
	if err := base.State.SameLayout(f.State); err != nil {
		return fmt.Errorf("field \"state\": %w; all copies must run the same model", err)
	}
	return nil
}

// close closes round r (base is round r-1) with the files present, as
// the contract says (contract.Close).
func (m *membership) close(r int, base *Merged, files map[int]*MergeFile) (*Merged, error) {
	list := make([]*MergeFile, 0, len(files))
	var steps int64
	for _, id := range slices.Sorted(maps.Keys(files)) {
		list = append(list, files[id])
		steps += files[id].Steps
	}
	if base.StepsDone+steps > base.TotalSteps {
		// Only copies that disagree about a round's members can get here.
		m.log.Warn("hadare: the round's steps pass the job's total; counting the total", "round", r, "steps", base.StepsDone+steps, "total", base.TotalSteps)
	}
	mg, err := contract.Close(base, list, m.joiners(), m.self, m.mergeEvery, time.Now())
	if err != nil {
		return nil, fmt.Errorf("hadare: %w", err)
	}
	return m.publish(mg)
}

// closedFrom returns the newest closed round if round r (or a later one)
// is closed, else nil.
func (m *membership) closedFrom(r int) (*Merged, error) {
	if _, err := os.Stat(MergedPath(m.dir, r)); err != nil {
		return nil, nil
	}
	return m.latest()
}

// waitRound is a member's wait at the end of round r (base is round r-1):
// for the other members' files, up to --merge-timeout, then it closes the
// round itself unless another copy did. check reports a broken unit.
func (m *membership) waitRound(ctx context.Context, r int, base *Merged, tick func(), check func() error) (*Merged, error) {
	m.hb.set(contract.StateMerging, r)
	deadline := time.Now().Add(m.o.MergeTimeout)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if mg, err := m.closedFrom(r); err != nil || mg != nil {
			return mg, err
		}
		files, waiting := m.roundState(r, base)
		if len(waiting) == 0 {
			return m.close(r, base, files)
		}
		if !time.Now().Before(deadline) {
			m.log.Warn("hadare: copies missing after the wait; merging without them", "round", r, "missing", waiting, "timeout", m.o.MergeTimeout)
			return m.close(r, base, files)
		}
		tick()
		if err := check(); err != nil {
			return nil, err
		}
		timer.Reset(min(pollInterval, time.Until(deadline)))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("merge round %d: %w", r, ctx.Err())
		case <-timer.C:
		}
	}
}

// waitJoin is a copy's wait for the round under way (after base) to close,
// when it is not one of its members. If every member has left without
// closing it, this copy closes it (the job's copies all went and came
// back): nobody else would.
func (m *membership) waitJoin(ctx context.Context, base *Merged, tick func(), check func() error) (*Merged, error) {
	m.hb.set(contract.StateJoining, base.Round+1)
	for {
		mg, err := m.latest()
		if err != nil {
			return nil, err
		}
		if mg != nil && mg.Round > base.Round {
			return mg, nil
		}
		files, waiting := m.roundState(base.Round+1, base)
		if len(waiting) == 0 {
			return m.close(base.Round+1, base, files)
		}
		tick()
		if err := check(); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting to join round %d: %w", base.Round+1, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// leave is a stopped copy's goodbye: if it is a member of the round under
// way, its steps of the round so far, marked leaving (rewritten if it was
// waiting at the merge: the closer must not list it for the next round);
// its heartbeat marked leaving; and, if no other member is still
// expected, the round closed. It returns the round closed, if it closed
// one.
func (m *membership) leave(r int, base *Merged, steps int64, params trainer.Params, member bool) (*Merged, error) {
	if !member {
		m.hb.stop(MemberLeaving)
		return nil, nil
	}
	if mg, err := m.closedFrom(r); err != nil || mg != nil {
		// Closed meanwhile (with or without this copy's file).
		m.hb.stop(MemberLeaving)
		return mg, err
	}
	if err := m.contribute(r, steps, params, true); err != nil {
		m.hb.stop(MemberLeaving)
		return nil, err
	}
	m.hb.stop(MemberLeaving)
	if mg, err := m.closedFrom(r); err != nil || mg != nil {
		return mg, err
	}
	files, waiting := m.roundState(r, base)
	if len(waiting) > 0 {
		m.log.Info("hadare: left; the other copies merge this copy's last steps", "round", r, "steps", steps, "waiting_for", waiting)
		return nil, nil
	}
	return m.close(r, base, files)
}

// pollInterval is how often a waiting copy looks at the merge directory.
const pollInterval = 50 * time.Millisecond
