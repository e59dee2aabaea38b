// Package sia is a baseline: Sia (Jayaram Subramanya et al., SOSP 2023,
// "Sia: Heterogeneity-aware, goodput-optimized ML-cluster scheduling"),
// rigid mode, implemented from the paper's text (docs/policies.md, "Sia").
//
// Each round every job gets at most one configuration: a GPU type at its
// own width, packed on as few nodes as the placer finds, or none. A
// configuration's goodput is normalized so that the job's slowest type is
// worth its width (Sia's rigid jobs: goodput is throughput, the batch being
// fixed), scaled by a restart factor when it differs from the one the job
// runs on, and raised to the fairness exponent p. With p < 0 the round
// minimizes the sum of those terms plus a penalty lambda_n for each job
// left out; with p > 0 it maximizes the sum less lambda_n per job left
// out; under each type's GPU count either way.
package sia

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// DefaultP is Sia's default fairness exponent: below 0 a job's term
// shrinks less and less as its goodput grows, so giving a slow or waiting
// job GPUs gains more than speeding up one that has them.
const DefaultP = -0.5

// DefaultNoAlloc is Sia's default lambda_n, the cost of leaving a job
// out: above 1, the term of a job's worst configuration at p < 0 (a
// normalized goodput of 1 or more raised to p), so running a job anywhere
// beats not running it unless a restart factor has made that worse.
const DefaultNoAlloc = 1.1

// clip bounds a configuration's term, as Sia's artifact does (3000): a
// tiny goodput raised to a negative p would otherwise dwarf every other.
const clip = 3000.0

// Config of a Sia scheduler.
type Config struct {
	// P is the fairness exponent, not 0; 0 means DefaultP.
	P float64
	// RestartCost is the paper's R: seconds of progress a job loses when
	// its configuration changes. 0 or less: no restart factor.
	RestartCost float64
	// NoAlloc is lambda_n, the cost of a job left out (> 0); 0 means
	// DefaultNoAlloc.
	NoAlloc float64
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
	if cfg.NoAlloc == 0 {
		cfg.NoAlloc = DefaultNoAlloc
	}
	switch {
	case math.IsNaN(cfg.P) || math.IsInf(cfg.P, 0):
		return nil, fmt.Errorf("sia: fairness exponent p = %v: want a finite number, not 0", cfg.P)
	case !(cfg.NoAlloc > 0) || math.IsInf(cfg.NoAlloc, 0):
		return nil, fmt.Errorf("sia: no-allocation penalty lambda_n %v: want a finite number > 0", cfg.NoAlloc)
	case math.IsNaN(cfg.RestartCost) || math.IsInf(cfg.RestartCost, 0):
		return nil, fmt.Errorf("sia: restart cost %v s: want a finite number of seconds", cfg.RestartCost)
	}
	return &Scheduler{cfg: cfg, restarts: map[string]int{}}, nil
}

// Name implements round.Scheduler.
func (s *Scheduler) Name() string { return "sia" }

// gain is what choosing a configuration of normalized goodput e (restart
// factor applied) is worth against leaving the job out, the solver
// maximizing the sum: with p < 0 Sia minimizes sum(e^p) + lambda_n *
// (jobs left out), so a choice gains lambda_n - e^p; with p > 0 it
// maximizes sum(e^p) - lambda_n * (jobs left out), a gain of e^p +
// lambda_n. A configuration gaining nothing is not offered.
func (s *Scheduler) gain(e float64) float64 {
	if !(e > 0) {
		return 0
	}
	a := math.Min(math.Pow(e, s.cfg.P), clip)
	if s.cfg.P < 0 {
		return math.Max(0, s.cfg.NoAlloc-a)
	}
	return a + s.cfg.NoAlloc
}

// restartFactor is Sia's r_i = max(T_i - N_i R, 0) / (T_i + R): T_i the
// job's age, N_i its restarts so far, R the restart cost; 1 for a job
// younger than R, which has nothing yet to lose. A job moved often gains
// little from one more move.
func (s *Scheduler) restartFactor(age float64, n int) float64 {
	r := s.cfg.RestartCost
	if r <= 0 || age < r {
		return 1
	}
	return math.Max(0, age-float64(n)*r) / (age + r)
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
		// Normalized to the job's slowest type, worth its width.
		worst := math.Inf(1)
		for _, tp := range jb.Throughput {
			if tp > 0 {
				worst = math.Min(worst, tp)
			}
		}
		gain := make([]float64, k)
		ratio[i] = make([]float64, k)
		r := s.restartFactor(v.Age(jb), s.restarts[jb.ID])
		w := jb.Weight
		if !(w > 0) {
			w = 1
		}
		for j := range k {
			if math.IsInf(worst, 1) || j >= len(jb.Throughput) || jb.Throughput[j] <= 0 || float64(jb.ScaleFactor) > capacity[j] {
				continue
			}
			e := float64(jb.ScaleFactor) * jb.Throughput[j] / worst
			if cur[i] >= 0 && j != cur[i] {
				e *= r
			}
			ratio[i][j] = e
			gain[j] = w * s.gain(e)
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
				r.Why = fmt.Sprintf("sia: on %s, normalized goodput %.2f (its slowest type = its width; after the restart factor), p = %g", v.Types[c], ratio[i][c], s.cfg.P)
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
