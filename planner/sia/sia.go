// Package sia is a baseline: Sia (Jayaram Subramanya et al., SOSP 2023,
// "Sia: Heterogeneity-aware, goodput-optimized ML-cluster scheduling"),
// rigid mode, implemented from the paper's text (docs/policies.md, "Sia").
//
// Each round every job gets at most one configuration: a GPU type at its
// own width, packed on as few nodes as the placer finds, or none. A
// configuration is worth the job's goodput there normalized by its best
// goodput, scaled by a restart factor when it differs from the one the job
// runs on, raised to the fairness exponent p; the round picks the
// configurations that maximize the sum under each type's GPU count.
package sia

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// DefaultP is the paper's fairness exponent: below 0 the objective is
// concave in each job's normalized goodput, so a job far from its best
// configuration weighs more than one already near it.
const DefaultP = -0.5

// DefaultFloor is the normalized goodput "not scheduled" counts as: with
// p < 0 a goodput of 0 is worth minus infinity, so leaving a job out is
// priced as running it at 1% of its best speed. A configuration worse
// than that is never offered.
const DefaultFloor = 0.01

// Config of a Sia scheduler.
type Config struct {
	// P is the fairness exponent, not 0; 0 means DefaultP.
	P float64
	// RestartCost is the paper's R: seconds of progress a job loses when
	// its configuration changes. 0 or less: no restart factor.
	RestartCost float64
	// Floor is the normalized goodput of "not scheduled" (0 < Floor < 1);
	// 0 means DefaultFloor.
	Floor float64
	// Backfill hands GPUs the solver left idle (a type too fragmented
	// for the jobs it chose) to jobs it left out, as the other policies
	// of hadar sim do outside Gavel's fidelity.
	Backfill bool
	// Placer places the chosen jobs of each type (nil: lease extension,
	// then packing onto as few servers as possible).
	Placer round.Placer
}

// Scheduler is Sia as a round.Scheduler. It remembers how many times it
// changed each job's configuration (the paper's N_i in the restart
// factor), which it saves with the engine's snapshot (round.Stateful).
type Scheduler struct {
	cfg Config
	// restarts[id] counts the rounds Sia moved or stopped the running job.
	restarts map[string]int
}

// New checks cfg and returns a scheduler.
func New(cfg Config) (*Scheduler, error) {
	if cfg.P == 0 {
		cfg.P = DefaultP
	}
	if cfg.Floor == 0 {
		cfg.Floor = DefaultFloor
	}
	switch {
	case math.IsNaN(cfg.P) || math.IsInf(cfg.P, 0):
		return nil, fmt.Errorf("sia: fairness exponent p = %v: want a finite number, not 0", cfg.P)
	case !(cfg.Floor > 0 && cfg.Floor < 1):
		return nil, fmt.Errorf("sia: floor %v: want 0 < floor < 1 (the normalized goodput of not running)", cfg.Floor)
	case math.IsNaN(cfg.RestartCost) || math.IsInf(cfg.RestartCost, 0):
		return nil, fmt.Errorf("sia: restart cost %v s: want a finite number of seconds", cfg.RestartCost)
	}
	return &Scheduler{cfg: cfg, restarts: map[string]int{}}, nil
}

// Name implements round.Scheduler.
func (s *Scheduler) Name() string { return "sia" }

// utility is the paper's per-job term for normalized goodput e: e^p,
// negated when p < 0 so that more goodput is always worth more.
func (s *Scheduler) utility(e float64) float64 {
	u := math.Pow(e, s.cfg.P)
	if s.cfg.P < 0 {
		return -u
	}
	return u
}

// restartFactor is the paper's r_i = (T_i - N_i R) / (T_i + R), clamped
// to [0, 1]: T_i the job's age, N_i its restarts so far, R the restart
// cost. A young job, or one moved often, gains little from a move.
func (s *Scheduler) restartFactor(age float64, n int) float64 {
	r := s.cfg.RestartCost
	if r <= 0 {
		return 1
	}
	return math.Min(1, math.Max(0, (age-float64(n)*r)/(age+r)))
}

// Schedule implements round.Scheduler.
func (s *Scheduler) Schedule(v *round.View) ([]planner.Placement, error) {
	k := len(v.Types)
	fixed := make([]bool, len(v.Jobs))
	cur := make([]int, len(v.Jobs))
	capacity := make([]float64, k)
	for j, t := range v.Types {
		capacity[j] = float64(v.Pool.FreeOfType(t))
	}
	for i, jb := range v.Jobs {
		cur[i] = -1
		if v.MidRound {
			// Running jobs keep their GPUs mid-round; the pool holds
			// only the idle ones, and the jobs placed on them wait now:
			// no configuration of theirs is a restart more than another.
			fixed[i] = jb.Running
			continue
		}
		cur[i] = oneType(v.Types, jb.Placement)
		if jb.Pinned && cur[i] >= 0 {
			// Held by its minimum run time: its GPUs are capacity taken.
			fixed[i] = true
			capacity[cur[i]] = math.Max(0, capacity[cur[i]]-float64(jb.ScaleFactor))
		}
	}

	p := problem{k: k, capacity: capacity}
	var idx []int // problem job -> view job
	ratio := make([][]float64, len(v.Jobs))
	for i, jb := range v.Jobs {
		if fixed[i] {
			continue
		}
		best := 0.0
		for _, tp := range jb.Throughput {
			best = math.Max(best, tp)
		}
		gain := make([]float64, k)
		ratio[i] = make([]float64, k)
		r := s.restartFactor(v.Age(jb), s.restarts[jb.ID])
		w := jb.Weight
		if !(w > 0) {
			w = 1
		}
		for j := range k {
			if best <= 0 || j >= len(jb.Throughput) || jb.Throughput[j] <= 0 || float64(jb.ScaleFactor) > capacity[j] {
				continue
			}
			e := jb.Throughput[j] / best
			if cur[i] >= 0 && j != cur[i] {
				e *= r
			}
			ratio[i][j] = e
			if e > s.cfg.Floor {
				gain[j] = w * (s.utility(e) - s.utility(s.cfg.Floor))
			}
		}
		p.width = append(p.width, float64(jb.ScaleFactor))
		p.gain = append(p.gain, gain...)
		idx = append(idx, i)
	}
	p.n = len(idx)
	sol, err := solve(p)
	if err != nil {
		return nil, fmt.Errorf("sia round at t=%.0fs: %w", v.Now, err)
	}

	x := make([][]float64, len(v.Jobs))
	for i := range v.Jobs {
		x[i] = make([]float64, k)
		if fixed[i] && cur[i] >= 0 {
			x[i][cur[i]] = 1
		}
	}
	for q, i := range idx {
		c := sol.choice[q]
		if c >= 0 {
			x[i][c] = 1
		}
		if !v.MidRound && cur[i] >= 0 && c != cur[i] {
			s.restarts[v.Jobs[i].ID]++
		}
	}
	s.prune(v)
	out := round.Assign(v, x, round.AssignOptions{Backfill: s.cfg.Backfill, Placer: s.cfg.Placer})
	if v.Reasons != nil {
		for q, i := range idx {
			r := round.Reason{Share: x[i], Why: "sia: left out: every type's GPUs are worth more to others"}
			if c := sol.choice[q]; c >= 0 {
				r.Utility = p.gain[q*k+c]
				r.Why = fmt.Sprintf("sia: on %s at %.2f of its best goodput (after the restart factor), p = %g", v.Types[c], ratio[i][c], s.cfg.P)
			}
			v.Explain(i, r)
		}
	}
	return out, nil
}

// prune forgets the restart counts of jobs no longer active.
func (s *Scheduler) prune(v *round.View) {
	active := make(map[string]bool, len(v.Jobs))
	for _, jb := range v.Jobs {
		active[jb.ID] = true
	}
	for id := range s.restarts {
		if !active[id] {
			delete(s.restarts, id)
		}
	}
}

// oneType is the index in ts of the one GPU type placement p runs on, or
// -1 (no placement, several types, a type not in ts).
func oneType(ts []planner.GPUType, p planner.Placement) int {
	j := -1
	for _, u := range p.Units {
		for _, sl := range u.Slots {
			k := slices.Index(ts, sl.Type)
			if k < 0 || j >= 0 && k != j {
				return -1
			}
			j = k
		}
	}
	return j
}

// SaveState implements round.Stateful: the restart counts.
func (s *Scheduler) SaveState() ([]byte, error) {
	b, err := json.Marshal(s.restarts)
	if err != nil {
		return nil, fmt.Errorf("sia: save state: %w", err)
	}
	return b, nil
}

// LoadState implements round.Stateful.
func (s *Scheduler) LoadState(data []byte) error {
	m := map[string]int{}
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("sia: load state: %w", err)
	}
	s.restarts = m
	return nil
}
