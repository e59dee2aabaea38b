package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// Snapshot format identifiers (docs/engine.md, "Snapshots").
//
// Version rules: a change to what a snapshot holds bumps SnapshotVersion;
// Restore reads every version from 1 to SnapshotVersion (converting an
// older one: a sidecar upgraded in place restores what its predecessor
// saved) and writes only the current one; a build refuses a version newer
// than its own. Each version keeps a fixture in testdata
// (snapshot-v<N>.json) that TestSnapshotFixturesRestore restores.
//
//   - 1: the first format.
//   - 2: learning ledgers hold the exposure (steps at a consolidated 1
//     steps/s) instead of the steps the profile predicted, so that keys
//     without a profile figure are learned; the keys being explored.
const (
	SnapshotFormat  = "hadar-engine-snapshot"
	SnapshotVersion = 2
)

// envelope wraps a versioned state with a checksum, so a truncated or
// edited file is refused rather than half-loaded.
type envelope struct {
	Format  string          `json:"format"`
	Version int             `json:"version"`
	SHA256  string          `json:"sha256"`
	State   json.RawMessage `json:"state"`
}

// Seal wraps state (any JSON value) in a checksummed envelope of the given
// format and version.
func Seal(format string, version int, state any) ([]byte, error) {
	b, err := json.Marshal(state)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", format, err)
	}
	sum := sha256.Sum256(b)
	return json.Marshal(envelope{Format: format, Version: version, SHA256: hex.EncodeToString(sum[:]), State: b})
}

// Open checks an envelope written by Seal and returns its state bytes:
// the format must match, the version must be one this build reads (1 to
// version), and the checksum must hold.
func Open(data []byte, format string, version int) ([]byte, error) {
	b, _, err := OpenVersion(data, format, version)
	return b, err
}

// OpenVersion is Open that also returns the version the state was
// written in, for a reader that converts older versions.
func OpenVersion(data []byte, format string, version int) ([]byte, int, error) {
	var env envelope
	if err := round.StrictUnmarshal(data, &env); err != nil {
		return nil, 0, fmt.Errorf("%s: not a snapshot (%v): the file is corrupt or not a snapshot", format, err)
	}
	if env.Format != format {
		return nil, 0, fmt.Errorf("%s: the file is a %q, not a %q", format, env.Format, format)
	}
	if env.Version < 1 || env.Version > version {
		return nil, 0, fmt.Errorf("%s: version %d, but this build reads versions 1 to %d: restore it with the hadar release that wrote it, or start afresh", format, env.Version, version)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, env.State); err != nil {
		return nil, 0, fmt.Errorf("%s: state: %w", format, err)
	}
	sum := sha256.Sum256(compact.Bytes())
	if hex.EncodeToString(sum[:]) != env.SHA256 {
		return nil, 0, fmt.Errorf("%s: checksum mismatch: the snapshot is corrupt (truncated or edited)", format)
	}
	return compact.Bytes(), env.Version, nil
}

type stateV1 struct {
	Round     float64                            `json:"round_s"`
	NoFills   bool                               `json:"no_fills"`
	Overrun   float64                            `json:"overrun"`
	Now       float64                            `json:"now"`
	Dirty     bool                               `json:"dirty"`
	Epoch     uint64                             `json:"epoch"`
	Nodes     []planner.Node                     `json:"nodes"`
	Drained   []string                           `json:"drained"`
	Held      map[string]map[planner.GPUType]int `json:"held,omitempty"`
	Types     []planner.GPUType                  `json:"types"`
	Jobs      []jobV1                            `json:"jobs"`
	Estimates *estimatesV1                       `json:"estimates,omitempty"`
	Scheduler schedulerV1                        `json:"scheduler"`
}

type jobV1 struct {
	Job         planner.Job       `json:"job"`
	Remaining   float64           `json:"remaining"`
	Done        float64           `json:"done"`
	Running     bool              `json:"running"`
	Placement   planner.Placement `json:"placement"`
	Received    []float64         `json:"received"`
	PlacedAt    float64           `json:"placed_at"`
	LastAt      float64           `json:"last_at"`
	ReportedAt  float64           `json:"reported_at,omitempty"`
	TrustedDone float64           `json:"trusted_done,omitempty"`
	TrustedAt   float64           `json:"trusted_at,omitempty"`
	LastDone    float64           `json:"last_done"`
	// ProgressAt is when the job last made a step: a stall survives a
	// restart of the sidecar.
	ProgressAt float64 `json:"progress_at,omitempty"`
	// TrainedAt is when it made its first step on its placement: its
	// minimum run time counts from there (engine.ran).
	TrainedAt    float64      `json:"trained_at,omitempty"`
	Reason       round.Reason `json:"reason"`
	WaitingSince float64      `json:"waiting_since"`
	DeferUntil   float64      `json:"defer_until,omitempty"`
	DeferWhy     string       `json:"defer_why,omitempty"`
	// Eligible is SetEligible's restriction (absent: none); Ineligible its
	// reason when nothing is allowed.
	Eligible   round.Eligible `json:"eligible,omitempty"`
	Ineligible string         `json:"ineligible,omitempty"`
	// StalledOn holds the GPU types the job's own stall keeps it off and
	// when each was seen (absent in older snapshots: none).
	StalledOn map[planner.GPUType]float64 `json:"stalled_on,omitempty"`
	// Setup: the placement's new workers did not all run yet (absent in
	// older snapshots: they did).
	Setup bool `json:"setup,omitempty"`
}

// estimatesV1 is the estimates of versions 1 and 2 (the fields of 2
// only are empty in 1).
type estimatesV1 struct {
	Learn    LearnConfig    `json:"learn"`
	Gen      uint64         `json:"generation"`
	LearnGen uint64         `json:"learn_generation,omitempty"`
	Corr     []correctionV1 `json:"corrections"`
	Explore  []exploreV2    `json:"explore,omitempty"`
}

type correctionV1 struct {
	Model string          `json:"model"`
	SF    int             `json:"sf"`
	Type  planner.GPUType `json:"type"`
	// Job is the job whose ledger this is ("" for ledgers folded
	// together, and in snapshots written before ledgers were per job).
	Job string `json:"job,omitempty"`
	Seq uint64 `json:"seq,omitempty"`
	// Last is the engine time of the ledger's last observation (absent
	// in older snapshots: the time of the snapshot).
	Last     *float64 `json:"last_seen_s,omitempty"`
	Observed float64  `json:"observed_steps"`
	// Predicted (version 1) is the steps the profile predicted; Exposure
	// (version 2) the steps a consolidated 1 steps/s would have made.
	Predicted *float64 `json:"predicted_steps,omitempty"`
	Exposure  *float64 `json:"exposure_steps,omitempty"`
	Seconds   float64  `json:"seconds"`
}

type exploreV2 struct {
	Model string          `json:"model"`
	SF    int             `json:"sf"`
	Type  planner.GPUType `json:"type"`
	Value float64         `json:"value"`
}

type schedulerV1 struct {
	Name  string          `json:"name"`
	State json.RawMessage `json:"state,omitempty"`
}

// Snapshot serialises the engine and its scheduler's state (and, when it
// learns, its estimates) to the versioned format of docs/engine.md.
func (e *Engine) Snapshot() ([]byte, error) {
	st := stateV1{Round: e.cfg.Round, NoFills: e.cfg.NoFills, Overrun: e.cfg.Overrun, Now: e.now, Dirty: e.dirty, Epoch: e.epoch,
		Nodes: e.nodes, Drained: []string{}, Held: e.held, Types: e.types, Scheduler: schedulerV1{Name: e.sched.Name()}}
	for _, n := range e.nodes {
		if e.drained[n.ID] {
			st.Drained = append(st.Drained, n.ID)
		}
	}
	for _, j := range e.jobs {
		st.Jobs = append(st.Jobs, jobV1{Job: j.view.Job, Remaining: j.rem, Done: j.done, Running: j.view.Running, Placement: j.view.Placement,
			Received: j.view.Received, PlacedAt: j.placedAt, LastAt: j.lastAt, ReportedAt: j.reportedAt, TrustedDone: j.trustedDone, TrustedAt: j.trustedAt, LastDone: j.lastDone, ProgressAt: j.progressAt, TrainedAt: j.trainedAt, Reason: j.reason, WaitingSince: j.waitingSince,
			DeferUntil: j.deferUntil, DeferWhy: j.deferWhy, Eligible: j.eligible, Ineligible: j.ineligible, StalledOn: j.stalledOn, Setup: j.setup})
	}
	if e.est != nil {
		es := &estimatesV1{Learn: e.est.learn, Gen: e.est.gen, LearnGen: e.est.learnGen}
		for _, k := range sortedKeys(e.est.corr) {
			ls := e.est.corr[k]
			for _, job := range slices.Sorted(maps.Keys(ls)) {
				c := ls[job]
				x, last := c.Exposure, c.Last
				es.Corr = append(es.Corr, correctionV1{Model: k.Model, SF: k.SF, Type: k.Type, Job: job, Seq: c.Seq, Last: &last,
					Observed: c.Observed, Exposure: &x, Seconds: c.Seconds})
			}
		}
		for _, k := range sortedKeys(e.est.explore) {
			es.Explore = append(es.Explore, exploreV2{Model: k.Model, SF: k.SF, Type: k.Type, Value: e.est.explore[k]})
		}
		st.Estimates = es
	}
	if s, ok := e.sched.(round.Stateful); ok {
		b, err := s.SaveState()
		if err != nil {
			return nil, fmt.Errorf("engine snapshot: scheduler %s: %w", e.sched.Name(), err)
		}
		st.Scheduler.State = b
	}
	return Seal(SnapshotFormat, SnapshotVersion, st)
}

// Restore builds an engine from a snapshot, with cfg and a freshly built
// scheduler of the same name as the ones that took it (same speed model,
// same placement policy). It is all or nothing: on any error no engine is
// returned and sched's and the estimates' state are unchanged.
func Restore(data []byte, cfg Config, sched round.Scheduler) (*Engine, error) {
	raw, version, err := OpenVersion(data, SnapshotFormat, SnapshotVersion)
	if err != nil {
		return nil, err
	}
	var st stateV1
	if err := round.StrictUnmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("engine snapshot: %w", err)
	}
	e, err := New(cfg, sched)
	if err != nil {
		return nil, err
	}
	if st.Round != e.cfg.Round || st.NoFills != e.cfg.NoFills || st.Overrun != e.cfg.Overrun {
		return nil, fmt.Errorf("engine snapshot: taken with round %v s, fills off %v, overrun %v; this engine has %v s, %v, %v: restore with the configuration that took it",
			st.Round, st.NoFills, st.Overrun, e.cfg.Round, e.cfg.NoFills, e.cfg.Overrun)
	}
	if st.Scheduler.Name != sched.Name() {
		return nil, fmt.Errorf("engine snapshot: taken with scheduler %q, restoring into %q", st.Scheduler.Name, sched.Name())
	}
	if err := finite("now", st.Now); err != nil {
		return nil, err
	}
	e.now, e.dirty, e.epoch = st.Now, st.Dirty, st.Epoch
	seen := map[string]bool{}
	for _, n := range st.Nodes {
		if n.ID == "" || seen[n.ID] {
			return nil, fmt.Errorf("engine snapshot: node %q empty or given twice", n.ID)
		}
		seen[n.ID] = true
		for t, k := range n.GPUs {
			if k < 0 || t == "" {
				return nil, fmt.Errorf("engine snapshot: node %s: %d GPUs of type %q", n.ID, k, t)
			}
		}
		e.nodes = append(e.nodes, cloneNode(n))
	}
	for _, id := range st.Drained {
		if !seen[id] {
			return nil, fmt.Errorf("engine snapshot: drained node %q is not a node", id)
		}
		e.drained[id] = true
	}
	for n, m := range st.Held {
		if !seen[n] {
			return nil, fmt.Errorf("engine snapshot: held GPUs on %q, which is not a node", n)
		}
		for t, k := range m {
			if k < 0 {
				return nil, fmt.Errorf("engine snapshot: %d held GPUs of type %s on node %s", k, t, n)
			}
		}
	}
	e.held = st.Held
	e.refresh()
	if !slices.Equal(e.types, st.Types) {
		return nil, fmt.Errorf("engine snapshot: its nodes give GPU types %v but it records %v", e.types, st.Types)
	}
	for _, js := range st.Jobs {
		if err := js.Job.Validate(); err != nil {
			return nil, fmt.Errorf("engine snapshot: %w", err)
		}
		if e.byID[js.Job.ID] != nil {
			return nil, fmt.Errorf("engine snapshot: job %s given twice", js.Job.ID)
		}
		if len(js.Received) != len(e.types) {
			return nil, fmt.Errorf("engine snapshot: job %s: %d received times for %d GPU types", js.Job.ID, len(js.Received), len(e.types))
		}
		for _, x := range append(slices.Clone(js.Received), js.Remaining, js.Done, js.PlacedAt, js.LastAt, js.ReportedAt, js.TrustedDone, js.TrustedAt, js.LastDone, js.ProgressAt, js.TrainedAt, js.WaitingSince, js.DeferUntil) {
			if err := finite("job "+js.Job.ID, x); err != nil {
				return nil, err
			}
		}
		for _, u := range js.Placement.Units {
			for _, sl := range u.Slots {
				if !seen[sl.Node] || sl.Count <= 0 {
					return nil, fmt.Errorf("engine snapshot: job %s placed on %v: no such node", js.Job.ID, sl)
				}
			}
		}
		if js.Running != (len(js.Placement.Units) > 0) {
			return nil, fmt.Errorf("engine snapshot: job %s: running=%v with %d units", js.Job.ID, js.Running, len(js.Placement.Units))
		}
		var el round.Eligible
		if js.Eligible != nil {
			el = cloneEligible(js.Eligible)
		}
		var stalledOn map[planner.GPUType]float64
		for t, at := range js.StalledOn {
			if err := finite("job "+js.Job.ID+" stalled on "+string(t), at); err != nil {
				return nil, err
			}
			if stalledOn == nil {
				stalledOn = map[planner.GPUType]float64{}
			}
			stalledOn[t] = at
		}
		js.Job.MinRunTime = e.capMinRunTime(js.Job.MinRunTime) // a cap set since the snapshot holds too
		j := &job{view: round.JobView{Job: js.Job, Remaining: js.Remaining, Received: slices.Clone(js.Received), Placement: clonePlacement(js.Placement), Running: js.Running, Eligible: el},
			eligible: el, ineligible: js.Ineligible, stalledOn: stalledOn,
			rem: js.Remaining, done: js.Done, placedAt: js.PlacedAt, lastAt: js.LastAt, reportedAt: js.ReportedAt, trustedDone: js.TrustedDone, trustedAt: js.TrustedAt, lastDone: js.LastDone, progressAt: js.ProgressAt, trainedAt: js.TrainedAt, reason: js.Reason, waitingSince: js.WaitingSince,
			deferUntil: js.DeferUntil, deferWhy: js.DeferWhy, setup: js.Setup && js.Running && e.cfg.StartsReported}
		e.jobs = append(e.jobs, j)
		e.byID[js.Job.ID] = j
	}
	var corr map[estKey]map[string]*correction
	var explore map[estKey]float64
	switch {
	case st.Estimates != nil && e.est == nil:
		return nil, fmt.Errorf("engine snapshot: it carries learned estimates, but the speed model's profile is not an *engine.Estimates")
	case st.Estimates != nil:
		if st.Estimates.Learn.withDefaults() != e.est.learn {
			return nil, fmt.Errorf("engine snapshot: learning %+v, the estimates here %+v", st.Estimates.Learn.withDefaults(), e.est.learn)
		}
		if corr, explore, err = e.est.restoreLedgers(st.Estimates, version, st.Now); err != nil {
			return nil, err
		}
	}
	stateful, isStateful := sched.(round.Stateful)
	switch {
	case st.Scheduler.State != nil && !isStateful:
		return nil, fmt.Errorf("engine snapshot: scheduler %s keeps no state but the snapshot has some", sched.Name())
	case st.Scheduler.State == nil && isStateful:
		return nil, fmt.Errorf("engine snapshot: the state of scheduler %s is missing", sched.Name())
	case isStateful:
		// Everything else is checked: the scheduler loads last, all or
		// nothing, and the estimates after it cannot fail.
		if err := stateful.LoadState(st.Scheduler.State); err != nil {
			return nil, fmt.Errorf("engine snapshot: %w", err)
		}
	}
	if corr != nil {
		e.est.corr, e.est.factor, e.est.rate, e.est.explore = corr, map[estKey]float64{}, map[estKey]float64{}, explore
		e.est.seenBase = e.est.baseGen()
		e.est.live = nil
		e.est.setLive(e.liveByModel())
		for _, k := range sortedKeys(corr) {
			e.est.refactor(k)
		}
		e.est.gen, e.est.learnGen, e.est.tab = st.Estimates.Gen, st.Estimates.LearnGen, nil
	}
	// Throughputs are a pure function of the cluster and the estimates:
	// recompute them.
	e.tputEpoch, e.tputGen = math.MaxUint64, math.MaxUint64
	if err := e.refreshThroughputs(); err != nil {
		return nil, err
	}
	return e, nil
}

func finite(what string, x float64) error {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Errorf("engine snapshot: %s: %v is not a finite number", what, x)
	}
	return nil
}

// restoreLedgers checks and converts the estimates of a snapshot of the
// given version. A version 1 ledger's predicted steps become its exposure
// through the declared profile's consolidated figure (exact: the factor
// was observed/predicted, and is observed/(exposure x figure) now); a
// ledger whose key the profile no longer has a figure for is dropped.
func (e *Estimates) restoreLedgers(es *estimatesV1, version int, now float64) (map[estKey]map[string]*correction, map[estKey]float64, error) {
	corr := map[estKey]map[string]*correction{}
	for _, c := range es.Corr {
		var exposure float64
		switch {
		case version == 1 && c.Predicted != nil && c.Exposure == nil:
			exposure = *c.Predicted
		case version >= 2 && c.Exposure != nil && c.Predicted == nil:
			exposure = *c.Exposure
		default:
			return nil, nil, fmt.Errorf("engine snapshot: estimates of %s/%d/%s: version %d wants %s", c.Model, c.SF, c.Type, version,
				map[bool]string{true: "predicted_steps", false: "exposure_steps"}[version == 1])
		}
		for _, x := range []float64{c.Observed, exposure, c.Seconds} {
			if err := finite("estimates", x); err != nil {
				return nil, nil, err
			}
			if x < 0 {
				return nil, nil, fmt.Errorf("engine snapshot: estimates: %v below 0", x)
			}
		}
		k := estKey{c.Model, c.SF, c.Type}
		if version == 1 {
			b, ok, err := e.baseFigure(c.Model, c.SF, c.Type, false)
			if err != nil || !ok || !(b > 0) {
				continue
			}
			exposure /= b
		}
		if corr[k] == nil {
			corr[k] = map[string]*correction{}
		}
		if _, dup := corr[k][c.Job]; dup {
			return nil, nil, fmt.Errorf("engine snapshot: estimates: two ledgers of job %q for %s/%d/%s", c.Job, c.Model, c.SF, c.Type)
		}
		last := now // older snapshots: seen now
		if c.Last != nil {
			if err := finite("estimates", *c.Last); err != nil {
				return nil, nil, err
			}
			last = *c.Last
		}
		corr[k][c.Job] = &correction{Observed: c.Observed, Exposure: exposure, Seconds: c.Seconds, Seq: c.Seq, Last: last}
	}
	explore := map[estKey]float64{}
	for _, x := range es.Explore {
		if err := finite("explored estimate", x.Value); err != nil {
			return nil, nil, err
		}
		if !(x.Value > 0) || x.SF <= 0 {
			return nil, nil, fmt.Errorf("engine snapshot: explored %s/%d/%s at %v steps/s: want a positive figure and width", x.Model, x.SF, x.Type, x.Value)
		}
		explore[estKey{x.Model, x.SF, x.Type}] = x.Value
	}
	return corr, explore, nil
}
