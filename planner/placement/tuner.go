package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// TunerConfig sets the online auto-tuner of the delay timers' scale. Zero
// fields take the defaults noted.
type TunerConfig struct {
	// Grid lists the timer scales tried, increasing (default 0, 1/64,
	// 1/32, 1/16, 1/8, 1/4, 1/2, 1).
	Grid []float64
	// StartScale is the scale every class starts at (the nearest grid
	// value; default DefaultScale; negative means 0).
	StartScale float64
	start      int
	// Explore is the probability that a waiting job tries a neighbouring
	// scale instead of the class's current one (default 0.25).
	Explore float64
	// Window is how many ended waits of a class the tuner waits for
	// between two moves (default 25).
	Window int
	// Decay weighs a new outcome in an arm's running mean (default 0.3):
	// recent outcomes count more, so the tuner follows time-varying
	// congestion.
	Decay float64
	// Classes are the sensitivity bounds (spread slowdown) between the
	// tuner's classes (default 1.2 and 1.6: low, medium, high).
	Classes []float64
	Seed    int64
}

func (c TunerConfig) withDefaults() TunerConfig {
	if len(c.Grid) == 0 {
		c.Grid = []float64{0, 1.0 / 64, 1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1}
	}
	if c.StartScale == 0 {
		c.StartScale = DefaultScale
	}
	c.start = 0
	for i, g := range c.Grid {
		// Nearest on a log scale; 0 only for a start <= 0.
		if c.StartScale > 0 && g > 0 && (c.Grid[c.start] == 0 || math.Abs(math.Log(g/c.StartScale)) < math.Abs(math.Log(c.Grid[c.start]/c.StartScale))) {
			c.start = i
		}
	}
	if c.Explore <= 0 {
		c.Explore = 0.25
	}
	if c.Window <= 0 {
		c.Window = 25
	}
	if c.Decay <= 0 || c.Decay > 1 {
		c.Decay = 0.3
	}
	if len(c.Classes) == 0 {
		c.Classes = []float64{1.2, 1.6}
	}
	return c
}

// Validate reports the first bad field.
func (c TunerConfig) Validate() error {
	for i, g := range c.Grid {
		if math.IsNaN(g) || g < 0 || (i > 0 && g <= c.Grid[i-1]) {
			return fmt.Errorf("tuner grid %v: want increasing scales >= 0", c.Grid)
		}
	}
	if c.Explore < 0 || c.Explore >= 1 {
		return fmt.Errorf("tuner explore %v: want a probability in [0, 1)", c.Explore)
	}
	return nil
}

// TunerPoint is one step of the tuner's trajectory: from Time on, jobs of
// Class (0 = least sensitive) use timer scale Scale; Cost is the running
// mean outcome that made it move there (NaN at the start).
type TunerPoint struct {
	Time  float64
	Class int
	Scale float64
	Cost  float64
}

// Tuner adapts the delay timers' scale online, per sensitivity class, by
// hill climbing on the grid: most jobs use the class's current scale, a
// few try a neighbour, and every Window finished jobs the class moves to
// whichever of the current scale and its two neighbours has the lowest
// running mean cost (a job's wait plus what its placement's observed
// slowdown costs it over its remaining run time, relative to its whole
// run time, known when the wait ends). It learns only from outcomes
// observed online: no oracle, no replay.
type Tuner struct {
	cfg     TunerConfig
	src     *rand.PCG // rng's source, saved in the engine snapshot
	rng     *rand.Rand
	classes []tunerClass
	traj    []TunerPoint
}

type tunerClass struct {
	cur   int
	mean  []float64
	n     []int
	since int
}

// NewTuner returns a tuner at its start scale.
func NewTuner(cfg TunerConfig) (*Tuner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	src := rand.NewPCG(uint64(cfg.Seed), 0x7475_6e65)
	t := &Tuner{cfg: cfg, src: src, rng: rand.New(src)}
	for c := 0; c <= len(cfg.Classes); c++ {
		t.classes = append(t.classes, tunerClass{cur: cfg.start, mean: make([]float64, len(cfg.Grid)), n: make([]int, len(cfg.Grid))})
		t.traj = append(t.traj, TunerPoint{Time: 0, Class: c, Scale: cfg.Grid[cfg.start], Cost: math.NaN()})
	}
	return t, nil
}

// Class maps a spread slowdown to a class index.
func (t *Tuner) Class(sensitivity float64) int {
	c := 0
	for _, b := range t.cfg.Classes {
		if sensitivity >= b {
			c++
		}
	}
	return c
}

// Pick returns the grid index a new waiting job of class c uses.
func (t *Tuner) Pick(c int) int {
	cl := &t.classes[c]
	if t.rng.Float64() < t.cfg.Explore {
		if t.rng.IntN(2) == 0 && cl.cur > 0 {
			return cl.cur - 1
		}
		if cl.cur+1 < len(t.cfg.Grid) {
			return cl.cur + 1
		}
		return cl.cur - 1
	}
	return cl.cur
}

// Scale is the timer scale of grid index arm.
func (t *Tuner) Scale(arm int) float64 { return t.cfg.Grid[arm] }

// Current is class c's current scale.
func (t *Tuner) Current(c int) float64 { return t.cfg.Grid[t.classes[c].cur] }

// Observe records that a job of class c whose wait used arm ended with cost,
// at time now, and moves the class when a window is complete.
func (t *Tuner) Observe(now float64, c, arm int, cost float64) {
	cl := &t.classes[c]
	if cl.n[arm] == 0 {
		cl.mean[arm] = cost
	} else {
		cl.mean[arm] += t.cfg.Decay * (cost - cl.mean[arm])
	}
	cl.n[arm]++
	cl.since++
	if cl.since < t.cfg.Window {
		return
	}
	cl.since = 0
	best := cl.cur
	for _, a := range []int{cl.cur - 1, cl.cur + 1} {
		if a >= 0 && a < len(cl.n) && cl.n[a] > 0 && (cl.n[best] == 0 || cl.mean[a] < cl.mean[best]) {
			best = a
		}
	}
	if best != cl.cur {
		cl.cur = best
		t.traj = append(t.traj, TunerPoint{Time: now, Class: c, Scale: t.cfg.Grid[best], Cost: cl.mean[best]})
	}
}

// Trajectory returns the scale changes so far, in time order (a copy).
func (t *Tuner) Trajectory() []TunerPoint { return append([]TunerPoint(nil), t.traj...) }
