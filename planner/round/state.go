package round

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// policyState is PolicyScheduler's saved state (version 1 of the engine
// snapshot, docs/engine.md).
type policyState struct {
	Policy    string               `json:"policy"`
	Alloc     map[string][]float64 `json:"alloc"`
	LastReset float64              `json:"last_reset"`
	// JobSet is the key of the job set the allocation was computed for,
	// as bytes: job IDs need not be valid UTF-8.
	JobSet  []byte            `json:"job_set"`
	Started bool              `json:"started"`
	Types   []planner.GPUType `json:"types"`
	Placer  json.RawMessage   `json:"placer,omitempty"`
	// Book is Gavel's per-job accounting (PolicyScheduler.Gavel).
	Book map[string]*gavelBook `json:"book,omitempty"`
}

// SaveState implements Stateful.
func (s *PolicyScheduler) SaveState() ([]byte, error) {
	st := policyState{Policy: s.Name(), Alloc: s.alloc, LastReset: s.lastReset, JobSet: []byte(s.jobSet), Started: s.started, Types: s.types, Book: s.book}
	if p, ok := s.Placer.(Stateful); ok {
		b, err := p.SaveState()
		if err != nil {
			return nil, fmt.Errorf("placer %s: %w", s.Placer.Name(), err)
		}
		st.Placer = b
	}
	return json.Marshal(st)
}

// LoadState implements Stateful.
func (s *PolicyScheduler) LoadState(data []byte) error {
	var st policyState
	if err := strictUnmarshal(data, &st); err != nil {
		return fmt.Errorf("%s state: %w", s.Name(), err)
	}
	if st.Policy != s.Name() {
		return fmt.Errorf("state of policy %q cannot be loaded into %q", st.Policy, s.Name())
	}
	for id, row := range st.Alloc {
		if len(row) != len(st.Types) {
			return fmt.Errorf("%s state: job %s has %d shares for %d GPU types", s.Name(), id, len(row), len(st.Types))
		}
		for _, x := range row {
			if !(x >= 0) || x > 1+1e-9 || math.IsInf(x, 0) {
				return fmt.Errorf("%s state: job %s has a time share %v outside [0, 1]", s.Name(), id, x)
			}
		}
	}
	for id, b := range st.Book {
		if b == nil || b.AtReset == nil || b.Deficit == nil {
			return fmt.Errorf("%s state: job %s has no Gavel accounting", s.Name(), id)
		}
		for _, m := range []map[planner.GPUType]float64{b.AtReset, b.Deficit} {
			for t, x := range m {
				if math.IsNaN(x) || math.IsInf(x, 0) {
					return fmt.Errorf("%s state: job %s has a non-finite Gavel figure %v on %s", s.Name(), id, x, t)
				}
			}
		}
	}
	p, stateful := s.Placer.(Stateful)
	switch {
	case st.Placer != nil && !stateful:
		return fmt.Errorf("%s state carries placer state but the scheduler has no stateful placer", s.Name())
	case st.Placer == nil && stateful:
		return fmt.Errorf("%s state lacks the state of placer %s", s.Name(), s.Placer.Name())
	case stateful:
		// The placer loads all or nothing; ours is assigned only after it.
		if err := p.LoadState(st.Placer); err != nil {
			return fmt.Errorf("%s state: placer: %w", s.Name(), err)
		}
	}
	s.alloc, s.lastReset, s.jobSet, s.started, s.types = st.Alloc, st.LastReset, string(st.JobSet), st.Started, st.Types
	s.book = st.Book
	return nil
}

// strictUnmarshal decodes one JSON value, refusing unknown fields and
// trailing data: a state written by another version is an error, not a
// silent partial load.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the state")
	}
	return nil
}

// StrictUnmarshal is strictUnmarshal for the other state owners of the
// planner (Hadar, the placement policies, the engine).
func StrictUnmarshal(data []byte, v any) error { return strictUnmarshal(data, v) }

// explainShares fills v.Reasons from the allocation x and the placements.
func explainShares(v *View, x [][]float64, out []planner.Placement) {
	for i, jb := range v.Jobs {
		if v.MidRound && jb.Running {
			continue
		}
		r := Reason{Share: x[i]}
		if v.Reasons[i].Timer > 0 && len(out[i].Units) == 0 {
			// The placer delayed it: its reason says more than the shares.
			r.Timer, r.Waited, r.Why = v.Reasons[i].Timer, v.Reasons[i].Waited, v.Reasons[i].Why
			v.Reasons[i] = r
			continue
		}
		total := 0.0
		for _, f := range x[i] {
			total += f
		}
		placed := ""
		if len(out[i].Units) > 0 && len(out[i].Units[0].Slots) > 0 {
			placed = string(out[i].Units[0].Slots[0].Type)
		}
		for j, t := range v.Types {
			if string(t) == placed && x[i][j] > 0 {
				age := math.Max(v.Age(jb), 1e-9)
				if share := jb.Received[j] / age; share > 0 {
					r.Priority = x[i][j] / share
				} else {
					r.Priority = math.Inf(1)
				}
			}
		}
		switch {
		case placed != "" && total > 0:
			r.Why = fmt.Sprintf("allocated %s; runs on %s this round", shares(v.Types, x[i]), placed)
		case placed != "":
			r.Why = fmt.Sprintf("no share in the allocation; backfilled onto idle %s GPUs", placed)
		case total > 0:
			r.Why = fmt.Sprintf("allocated %s; waits this round: jobs of higher priority hold those GPUs, or its placement is delayed", shares(v.Types, x[i]))
		default:
			r.Why = "the allocation gives it no GPU time now (recomputed when the job set changes)"
		}
		if math.IsInf(r.Priority, 1) {
			r.Priority = 0 // never served: JSON has no infinity
		}
		v.Explain(i, r)
	}
}

func shares(types []planner.GPUType, row []float64) string {
	var parts []string
	for j, f := range row {
		if f > 1e-6 {
			parts = append(parts, fmt.Sprintf("%.0f%% of time on %s", 100*f, types[j]))
		}
	}
	return strings.Join(parts, ", ")
}
