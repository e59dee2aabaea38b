// Package sia is a baseline: Sia (Jayaram Subramanya et al., SOSP 2023,
// "Sia: Heterogeneity-aware, goodput-optimized ML-cluster scheduling"),
// implemented from the paper's text (docs/policies.md, "Sia"), rigid and
// elastic in GPU count.
//
// Each round every job gets at most one configuration: a GPU type at its
// own width (an elastic job: at one of its widths), packed on as few nodes
// as the placer finds, or none. A configuration's goodput is normalized so
// that the job's slowest configuration is worth its smallest width (a
// rigid job: its slowest type is worth its width; goodput is throughput,
// the global batch being fixed), scaled by a restart factor when it differs from the one the job
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
	"github.com/hadar-sched/hadar/planner/assign"
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
	// Rigid runs every job at its scale factor, elastic or not (Sia's
	// rigid mode); false lets elastic jobs (planner.Job.Widths) run at
	// any of their widths, a configuration per (width, type).
	Rigid bool
	// FreeGrowth lifts Sia's growth limit: by default an elastic job is
	// offered, on each type, widths up to twice the widest it has run at
	// there (its smallest width on a type it has not run on), as Sia's
	// simulator does (its throughput model knows only what the job has
	// run at, so it grows by doublings).
	FreeGrowth bool
}

// Scheduler is Sia as a round.Scheduler. It remembers how many times it
// changed each job's configuration (the paper's N_i in the restart
// factor) and the widest an elastic job has run at on each type (its
// growth limit), which it saves with the engine's snapshot
// (round.Stateful).
type Scheduler struct {
	cfg Config
	// restarts[id] counts the rounds Sia moved or stopped the running job.
	restarts map[string]int
	// widest[id][type] is the most GPUs elastic job id has run on of type.
	widest map[string]map[planner.GPUType]int
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
	return &Scheduler{cfg: cfg, restarts: map[string]int{}, widest: map[string]map[planner.GPUType]int{}}, nil
}

// Name implements round.Scheduler: sia, or sia:rigid in rigid mode.
func (s *Scheduler) Name() string {
	if s.cfg.Rigid {
		return "sia:rigid"
	}
	return "sia"
}

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

// widths is what Sia may run job jb at: its widths and their estimated
// throughput per type when it is elastic and the scheduler is not rigid;
// else its scale factor alone.
func (s *Scheduler) widths(jb *round.JobView) ([]int, [][]float64) {
	if s.cfg.Rigid || len(jb.Widths) == 0 || len(jb.WidthThroughput) != len(jb.Widths) {
		return []int{jb.ScaleFactor}, [][]float64{jb.Throughput}
	}
	return jb.Widths, jb.WidthThroughput
}

// grown records the width elastic job jb runs at on its one type.
func (s *Scheduler) grown(v *round.View, jb *round.JobView) {
	j := oneType(v.Types, jb.Placement)
	if !jb.Running || j < 0 || len(jb.Widths) < 2 {
		return
	}
	m := s.widest[jb.ID]
	if m == nil {
		m = map[planner.GPUType]int{}
		s.widest[jb.ID] = m
	}
	m[v.Types[j]] = max(m[v.Types[j]], jb.Placement.GPUs())
}

// limit is the widest configuration Sia offers job jb on type t: twice
// the widest it ran at there, at least its smallest width; unlimited for
// a rigid job or with FreeGrowth.
func (s *Scheduler) limit(jb *round.JobView, ws []int, t planner.GPUType) int {
	if s.cfg.FreeGrowth || len(ws) < 2 {
		return math.MaxInt
	}
	return max(2*s.widest[jb.ID][t], ws[0])
}

// current is the configuration slot (wi*k + type) job jb runs in, or -1:
// its one type, and the index in ws of its one unit's width (0 for a
// rigid job, whatever its units).
func current(v *round.View, ws []int, jb *round.JobView) int {
	j := oneType(v.Types, jb.Placement)
	if j < 0 || len(ws) == 1 {
		return j
	}
	if len(jb.Placement.Units) != 1 {
		return -1
	}
	wi := slices.Index(ws, jb.Placement.Units[0].GPUs())
	if wi < 0 {
		return -1
	}
	return wi*len(v.Types) + j
}

// Schedule implements round.Scheduler.
func (s *Scheduler) Schedule(v *round.View) ([]planner.Placement, error) {
	return s.ScheduleStaying(v, 0)
}

// ScheduleStaying is Schedule with a running job's present
// configuration's gain multiplied by 1 + stay (0: Sia's own). Sia has no
// such term: its weights are fixed, so its solution changes only as jobs
// come and go. A caller whose weights move every round (hadar's backlog)
// holds a running job where it is unless a move gains more than the stay.
func (s *Scheduler) ScheduleStaying(v *round.View, stay float64) ([]planner.Placement, error) {
	if !(stay >= 0) || math.IsInf(stay, 1) {
		return nil, fmt.Errorf("sia round at t=%.0fs: stay %v: want a finite number >= 0", v.Now, stay)
	}
	// m configuration slots per job: slot wi*k + j is width wi on type j.
	cf := round.PoseConfigs(v, func(jb *round.JobView) ([]int, [][]float64) {
		ws, rows := s.widths(jb)
		s.grown(v, jb)
		return ws, rows
	}, func(ws []int, jb *round.JobView) int { return current(v, ws, jb) })
	k, m, ws, rows, cur, fixed, capacity := cf.K, cf.M, cf.Widths, cf.Rows, cf.Cur, cf.Fixed, cf.Capacity

	p := assign.Slots(k, m, capacity)
	var idx []int // problem job -> view job
	ratio := make([][]float64, len(v.Jobs))
	for i, jb := range v.Jobs {
		if fixed[i] {
			continue
		}
		// Normalized to the job's slowest configuration, worth its
		// smallest width (a rigid job: its slowest type, worth its width).
		worst, least := math.Inf(1), 0
		for wi, row := range rows[i] {
			for _, tp := range row {
				if tp > 0 {
					worst = math.Min(worst, tp)
					if least == 0 {
						least = ws[i][wi]
					}
				}
			}
		}
		gain := make([]float64, len(rows[i])*k)
		width := make([]float64, len(rows[i])*k)
		ratio[i] = make([]float64, m)
		r := s.restartFactor(v.Age(jb), s.restarts[jb.ID])
		w := jb.WeightOr1()
		for wi, row := range rows[i] {
			n := ws[i][wi]
			for j := range k {
				c := wi*k + j
				width[c] = float64(n)
				if math.IsInf(worst, 1) || j >= len(row) || row[j] <= 0 || float64(n) > capacity[j] || n > s.limit(jb, ws[i], v.Types[j]) {
					continue
				}
				e := float64(least) * row[j] / worst
				if cur[i] >= 0 && c != cur[i] {
					e *= r
				}
				ratio[i][c] = e
				gain[c] = w * s.gain(e)
				if c == cur[i] {
					gain[c] *= 1 + stay
				}
			}
		}
		p.Add(gain, width, jb.ScaleFactor)
		idx = append(idx, i)
	}
	sol, err := assign.Solve(p)
	if err != nil {
		return nil, fmt.Errorf("sia round at t=%.0fs: %w", v.Now, err)
	}

	choice := sol.ByJob(idx, len(v.Jobs))
	for _, i := range idx {
		if c := choice[i]; !v.MidRound && cur[i] >= 0 && c != cur[i] {
			s.restarts[v.Jobs[i].ID]++
		}
	}
	s.prune(v)
	out, x := cf.Assign(v, choice, round.AssignOptions{Backfill: s.cfg.Backfill, Placer: s.cfg.Placer})
	if v.Reasons != nil {
		for q, i := range idx {
			r := round.Reason{Share: x[i], Why: "sia: left out: every type's GPUs are worth more to others"}
			if c := sol.Choice[q]; c >= 0 {
				r.Utility = p.G(q, c)
				if len(ws[i]) > 1 {
					r.Why = fmt.Sprintf("sia: %d GPUs of %s, normalized goodput %.2f (its slowest configuration = its smallest width; after the restart factor), p = %g", ws[i][c/k], v.Types[c%k], ratio[i][c], s.cfg.P)
				} else {
					r.Why = fmt.Sprintf("sia: on %s, normalized goodput %.2f (its slowest type = its width; after the restart factor), p = %g", v.Types[c], ratio[i][c], s.cfg.P)
				}
				if c == cur[i] && stay != 0 {
					r.Why += fmt.Sprintf("; where it runs, its term x%.3g to stay", 1+stay)
				}
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
	for id := range s.widest {
		if !active[id] {
			delete(s.widest, id)
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

// state is what a Sia scheduler saves. An older state was the restart
// counts alone (a JSON object of numbers), which LoadState still reads.
type state struct {
	Restarts map[string]int                     `json:"restarts"`
	Widest   map[string]map[planner.GPUType]int `json:"widest,omitempty"`
}

// SaveState implements round.Stateful: the restart counts and growth.
func (s *Scheduler) SaveState() ([]byte, error) {
	b, err := json.Marshal(state{Restarts: s.restarts, Widest: s.widest})
	if err != nil {
		return nil, fmt.Errorf("sia: save state: %w", err)
	}
	return b, nil
}

// LoadState implements round.Stateful.
func (s *Scheduler) LoadState(data []byte) error {
	old := map[string]int{}
	if err := json.Unmarshal(data, &old); err == nil {
		s.restarts, s.widest = old, map[string]map[planner.GPUType]int{}
		return nil
	}
	var st state
	if err := round.StrictUnmarshal(data, &st); err != nil {
		return fmt.Errorf("sia: load state: %w", err)
	}
	s.restarts, s.widest = st.Restarts, st.Widest
	if s.restarts == nil {
		s.restarts = map[string]int{}
	}
	if s.widest == nil {
		s.widest = map[string]map[planner.GPUType]int{}
	}
	return nil
}
