package hadar

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/hadar-sched/hadar/planner/round"
)

// state is what a Hadar scheduler remembers between rounds (the engine
// snapshot's scheduler section, docs/engine.md): the fluid guide's support
// per job and the key of the job set it was solved for; the primal-dual
// state — the calendar position, every job's committed schedule and
// admission, the price bounds derived from the workload so far; and the
// state of its placement filter when that remembers anything.
type state struct {
	Scheduler string             `json:"scheduler"`
	Fluid     map[string][]bool  `json:"fluid"`
	FluidKey  []byte             `json:"fluid_key"`
	FluidRate map[string]float64 `json:"fluid_rate,omitempty"`
	// FluidUse is the GPUs of each type the fluid solution keeps busy.
	FluidUse []float64       `json:"fluid_use,omitempty"`
	Filter   json.RawMessage `json:"filter,omitempty"`
	// Slot is the absolute number of the current slot, which started at
	// Base (seconds); Started is false before the first round.
	Slot    int64              `json:"slot"`
	Base    float64            `json:"base"`
	Started bool               `json:"started"`
	Seq     int64              `json:"seq"`
	Bounds  bounds             `json:"bounds"`
	Jobs    map[string]*record `json:"jobs"`
	// Target is the makespan the makespan utility aims at (seconds);
	// HasTarget is false before it is first set.
	Target    float64 `json:"target"`
	HasTarget bool    `json:"has_target"`
	// LastCall is the time of the previous plan (HasLast once there was
	// one).
	LastCall float64 `json:"last_call,omitempty"`
	HasLast  bool    `json:"has_last,omitempty"`
	// Backlog says rounds with elastic jobs are the primal-dual's until
	// the active jobs fall under resumeJobs (programRound).
	Backlog bool `json:"backlog,omitempty"`
	// Tail is the configuration program's tail at its last round
	// boundary, which a job must pass by tailHold to join.
	Tail []string `json:"tail,omitempty"`
	// Drain is the state of the Sia that plans a backlog (its restart
	// count per job); absent in snapshots from before it.
	Drain json.RawMessage `json:"drain,omitempty"`
}

// SaveState implements round.Stateful.
func (s *Scheduler) SaveState() ([]byte, error) {
	st := state{Scheduler: s.Name(), Fluid: s.fluid, FluidKey: []byte(s.fluidKey), FluidRate: s.fluidRate, FluidUse: s.fluidUse,
		Slot: s.cur, Base: s.base, Started: s.started, Seq: s.seq, Bounds: s.bounds, Jobs: s.jobs, Target: s.target, HasTarget: s.hasTarget,
		LastCall: s.lastCall, HasLast: s.hasLast, Backlog: s.backlog, Tail: s.held}
	d, err := s.sia.SaveState()
	if err != nil {
		return nil, fmt.Errorf("%s: the drain's Sia: %w", s.Name(), err)
	}
	st.Drain = d
	if f, ok := s.cfg.Filter.(round.Stateful); ok {
		b, err := f.SaveState()
		if err != nil {
			return nil, fmt.Errorf("%s: placement filter: %w", s.Name(), err)
		}
		st.Filter = b
	}
	return json.Marshal(st)
}

// LoadState implements round.Stateful.
func (s *Scheduler) LoadState(data []byte) error {
	var st state
	if err := round.StrictUnmarshal(data, &st); err != nil {
		return fmt.Errorf("%s state: %w", s.Name(), err)
	}
	if st.Scheduler != s.Name() {
		return fmt.Errorf("state of scheduler %q cannot be loaded into %q", st.Scheduler, s.Name())
	}
	if err := st.check(); err != nil {
		return fmt.Errorf("%s state: %w", s.Name(), err)
	}
	f, stateful := s.cfg.Filter.(round.Stateful)
	switch {
	case st.Filter != nil && !stateful:
		return fmt.Errorf("%s state carries placement state but the scheduler has no stateful placement filter", s.Name())
	case st.Filter == nil && stateful:
		return fmt.Errorf("%s state lacks the state of its placement filter", s.Name())
	case stateful:
		if err := f.LoadState(st.Filter); err != nil {
			return fmt.Errorf("%s state: placement filter: %w", s.Name(), err)
		}
	}
	if st.Drain != nil {
		if err := s.sia.LoadState(st.Drain); err != nil {
			return fmt.Errorf("%s state: the drain's Sia: %w", s.Name(), err)
		}
	}
	if st.Jobs == nil {
		st.Jobs = map[string]*record{}
	}
	s.fluid, s.fluidKey, s.fluidRate, s.fluidUse = st.Fluid, string(st.FluidKey), st.FluidRate, st.FluidUse
	s.cur, s.base, s.started, s.seq, s.bounds, s.jobs = st.Slot, st.Base, st.Started, st.Seq, st.Bounds, st.Jobs
	s.target, s.hasTarget = st.Target, st.HasTarget
	s.lastCall, s.hasLast = st.LastCall, st.HasLast
	s.backlog = st.Backlog
	s.held = st.Tail
	return nil
}

// check refuses a state no scheduler could have written.
func (st *state) check() error {
	b := st.Bounds
	for _, x := range []float64{st.Base, st.Target, st.LastCall, b.Lo, b.Hi, b.LogDur} {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("non-finite number %v", x)
		}
	}
	if b.Jobs < 0 || b.Lo < 0 || b.Hi < b.Lo {
		return fmt.Errorf("price bounds L=%v U=%v over %d jobs: want 0 <= L <= U", b.Lo, b.Hi, b.Jobs)
	}
	for id, x := range st.FluidRate {
		if !(x >= 0) || math.IsInf(x, 0) {
			return fmt.Errorf("job %s: fluid throughput %v", id, x)
		}
	}
	for k, x := range st.FluidUse {
		if !(x >= 0) || math.IsInf(x, 0) {
			return fmt.Errorf("type %d: fluid use %v", k, x)
		}
	}
	if len(st.Tail) > tailJobs {
		return fmt.Errorf("a tail of %d jobs, want at most %d", len(st.Tail), tailJobs)
	}
	for id, r := range st.Jobs {
		if r == nil || math.IsNaN(r.Density) || math.IsInf(r.Density, 0) || math.IsNaN(r.Since) || math.IsInf(r.Since, 0) || r.Seq < 0 || r.Seq >= st.Seq {
			return fmt.Errorf("job %s: bad record", id)
		}
		last := int64(math.MinInt64)
		for _, sg := range r.Segs {
			if sg.From >= sg.To || sg.From < last || sg.From < st.Slot {
				return fmt.Errorf("job %s: commitment [%d, %d) out of order or in the past (slot %d)", id, sg.From, sg.To, st.Slot)
			}
			last = sg.To
			for _, sl := range sg.Unit.Slots {
				if sl.Count <= 0 || sl.Node == "" || sl.Type == "" {
					return fmt.Errorf("job %s: commitment holds %d GPUs of %q on node %q", id, sl.Count, sl.Type, sl.Node)
				}
			}
		}
	}
	return nil
}
