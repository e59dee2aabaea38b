package hadar

import (
	"encoding/json"
	"fmt"

	"github.com/hadar-sched/hadar/planner/round"
)

// state is what a Hadar scheduler remembers between rounds (the engine
// snapshot's scheduler section, docs/engine.md): the fluid guide's support
// per job and the key of the job set it was solved for, plus the state of
// its placement filter when that remembers anything.
type state struct {
	Scheduler string            `json:"scheduler"`
	Fluid     map[string][]bool `json:"fluid"`
	FluidKey  []byte            `json:"fluid_key"`
	Filter    json.RawMessage   `json:"filter,omitempty"`
}

// SaveState implements round.Stateful.
func (s *Scheduler) SaveState() ([]byte, error) {
	st := state{Scheduler: s.Name(), Fluid: s.fluid, FluidKey: []byte(s.fluidKey)}
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
	s.fluid, s.fluidKey = st.Fluid, string(st.FluidKey)
	return nil
}
