package placement

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/hadar-sched/hadar/planner/round"
)

// policyState is what a placement policy remembers (the engine snapshot,
// docs/engine.md): per job its delay timer and preemption count, the
// preemptions so far, its random source, and the auto-tuner's state.
type policyState struct {
	Placement   string                  `json:"placement"`
	Jobs        map[string]jobStateJSON `json:"jobs"`
	Preemptions []Preemption            `json:"preemptions"`
	RNG         []byte                  `json:"rng"`
	Tuner       *tunerState             `json:"tuner,omitempty"`
}

type jobStateJSON struct {
	WaitSince float64 `json:"wait_since"` // -1: not waiting
	// LastStart is when the job last started on new GPUs; absent: never.
	LastStart   *float64 `json:"last_start,omitempty"`
	Preemptions int      `json:"preemptions"`
	Arm         int      `json:"arm"` // -1: no tuner arm
	Class       int      `json:"class"`
	IdealS      float64  `json:"ideal_s"`
}

type tunerState struct {
	RNG     []byte         `json:"rng"`
	Classes []tunerClassJS `json:"classes"`
	Traj    []tunerPointJS `json:"trajectory"`
}

type tunerClassJS struct {
	Cur   int       `json:"cur"`
	Mean  []float64 `json:"mean"`
	N     []int     `json:"n"`
	Since int       `json:"since"`
}

type tunerPointJS struct {
	Time  float64  `json:"time"`
	Class int      `json:"class"`
	Scale float64  `json:"scale"`
	Cost  *float64 `json:"cost,omitempty"` // absent: NaN (the start)
}

// SaveState implements round.Stateful.
func (p *Policy) SaveState() ([]byte, error) {
	rng, err := p.src.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("placement %s: random source: %w", p.name, err)
	}
	st := policyState{Placement: p.name, Jobs: make(map[string]jobStateJSON, len(p.jobs)), Preemptions: p.preempts, RNG: rng}
	for id, js := range p.jobs {
		j := jobStateJSON{WaitSince: js.waitSince, Preemptions: js.preemptions, Arm: js.arm, Class: js.class, IdealS: js.idealS}
		if !math.IsInf(js.lastStart, -1) {
			ls := js.lastStart
			j.LastStart = &ls
		}
		st.Jobs[id] = j
	}
	if p.tuner != nil {
		if st.Tuner, err = p.tuner.save(); err != nil {
			return nil, fmt.Errorf("placement %s: %w", p.name, err)
		}
	}
	return json.Marshal(st)
}

// LoadState implements round.Stateful.
func (p *Policy) LoadState(data []byte) error {
	var st policyState
	if err := round.StrictUnmarshal(data, &st); err != nil {
		return fmt.Errorf("placement %s state: %w", p.name, err)
	}
	if st.Placement != p.name {
		return fmt.Errorf("state of placement %q cannot be loaded into %q", st.Placement, p.name)
	}
	src := &rand.PCG{}
	if err := src.UnmarshalBinary(st.RNG); err != nil {
		return fmt.Errorf("placement %s state: random source: %w", p.name, err)
	}
	if (st.Tuner != nil) != (p.tuner != nil) {
		return fmt.Errorf("placement %s state: tuner state present=%v, but the policy has a tuner=%v", p.name, st.Tuner != nil, p.tuner != nil)
	}
	jobs := make(map[string]*jobState, len(st.Jobs))
	for id, j := range st.Jobs {
		js := &jobState{waitSince: j.WaitSince, lastStart: math.Inf(-1), preemptions: j.Preemptions, arm: j.Arm, class: j.Class, idealS: j.IdealS}
		if j.LastStart != nil {
			js.lastStart = *j.LastStart
		}
		if p.tuner != nil && (j.Arm >= len(p.tuner.cfg.Grid) || j.Class > len(p.tuner.cfg.Classes) || j.Class < 0) {
			return fmt.Errorf("placement %s state: job %s: tuner arm %d or class %d out of range", p.name, id, j.Arm, j.Class)
		}
		jobs[id] = js
	}
	var tuner *Tuner
	if p.tuner != nil {
		t, err := p.tuner.loaded(st.Tuner)
		if err != nil {
			return fmt.Errorf("placement %s state: %w", p.name, err)
		}
		tuner = t
	}
	p.src, p.rng, p.jobs, p.preempts = src, rand.New(src), jobs, slices.Clone(st.Preemptions)
	if tuner != nil {
		p.tuner = tuner
	}
	p.last = nil
	return nil
}

func (t *Tuner) save() (*tunerState, error) {
	rng, err := t.src.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("tuner random source: %w", err)
	}
	st := &tunerState{RNG: rng}
	for _, c := range t.classes {
		st.Classes = append(st.Classes, tunerClassJS{Cur: c.cur, Mean: c.mean, N: c.n, Since: c.since})
	}
	for _, pt := range t.traj {
		q := tunerPointJS{Time: pt.Time, Class: pt.Class, Scale: pt.Scale}
		if !math.IsNaN(pt.Cost) {
			c := pt.Cost
			q.Cost = &c
		}
		st.Traj = append(st.Traj, q)
	}
	return st, nil
}

// loaded returns a copy of t (same configuration) holding the saved state.
func (t *Tuner) loaded(st *tunerState) (*Tuner, error) {
	if len(st.Classes) != len(t.classes) {
		return nil, fmt.Errorf("tuner state has %d classes, the tuner %d", len(st.Classes), len(t.classes))
	}
	src := &rand.PCG{}
	if err := src.UnmarshalBinary(st.RNG); err != nil {
		return nil, fmt.Errorf("tuner random source: %w", err)
	}
	out := &Tuner{cfg: t.cfg, src: src, rng: rand.New(src)}
	for i, c := range st.Classes {
		if c.Cur < 0 || c.Cur >= len(t.cfg.Grid) || len(c.Mean) != len(t.cfg.Grid) || len(c.N) != len(t.cfg.Grid) {
			return nil, fmt.Errorf("tuner class %d: state does not match a grid of %d scales", i, len(t.cfg.Grid))
		}
		out.classes = append(out.classes, tunerClass{cur: c.Cur, mean: slices.Clone(c.Mean), n: slices.Clone(c.N), since: c.Since})
	}
	for _, q := range st.Traj {
		pt := TunerPoint{Time: q.Time, Class: q.Class, Scale: q.Scale, Cost: math.NaN()}
		if q.Cost != nil {
			pt.Cost = *q.Cost
		}
		out.traj = append(out.traj, pt)
	}
	return out, nil
}
