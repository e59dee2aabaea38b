package sim

import (
	"fmt"
	"hash/fnv"
	"math"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/speed"
)

// EstimateConfig makes what the engine and the scheduler know wrong, the
// way a live cluster's is: profiled throughputs off by up to ProfileError
// and declared step counts off by up to StepError, as factors drawn
// log-uniformly in [1/(1+e), 1+e] (so 0.5 means between 0.67x and 1.5x),
// seeded per (model, workers, GPU type) and per job. With Learn the
// engine corrects throughputs from the progress it observes
// (engine.Estimates). The truth (Config.Speed, Config.Jobs) is unchanged.
type EstimateConfig struct {
	ProfileError float64
	StepError    float64
	Seed         uint64
	Learn        bool
	// Warmup and MinEvidence tune learning (engine.LearnConfig; 0 takes
	// its defaults).
	Warmup, MinEvidence float64
}

func (c EstimateConfig) validate() error {
	for _, e := range []float64{c.ProfileError, c.StepError} {
		if math.IsNaN(e) || e < 0 || e > 10 {
			return fmt.Errorf("estimate error %v: want a fraction between 0 and 10 (0.3 = up to 30 %% off)", e)
		}
	}
	return nil
}

// factor is a deterministic draw in [1/(1+e), 1+e], log-uniform, for key.
func factor(e float64, seed uint64, key string) float64 {
	if e == 0 {
		return 1
	}
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(seed >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(key))
	u := float64(h.Sum64()>>11) / (1 << 53) // uniform in [0, 1)
	return math.Exp((2*u - 1) * math.Log1p(e))
}

// declaredSteps is what the job's author declares: its true steps times
// the job's step-count error.
func (c EstimateConfig) declaredSteps(j planner.Job) float64 {
	if c.StepError == 0 {
		return j.TotalSteps
	}
	return math.Max(1, j.TotalSteps*factor(c.StepError, c.Seed, "steps\x00"+j.ID))
}

// perturbed is a profile whose figures are off by a seeded factor per
// (model, workers, type); consolidated and spread share it.
type perturbed struct {
	base speed.Profile
	err  float64
	seed uint64
}

func (p perturbed) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	v, err := p.base.Throughput(model, sf, t, spread)
	if err != nil {
		return 0, err
	}
	return v * factor(p.err, p.seed, fmt.Sprintf("profile\x00%s\x00%d\x00%s", model, sf, t)), nil
}

// EstimatedModel returns the speed model a scheduler plans with under c,
// given the true model: the true profile made wrong by c.ProfileError,
// inside estimates that learn when c.Learn; the network and spread
// settings are the true model's. Build the scheduler with it and pass it
// as Config.Plan.
func EstimatedModel(truth speed.Model, c EstimateConfig) (speed.Model, *engine.Estimates, error) {
	if err := c.validate(); err != nil {
		return speed.Model{}, nil, err
	}
	var declared speed.Profile = truth.Profile
	if c.ProfileError > 0 {
		declared = perturbed{base: truth.Profile, err: c.ProfileError, seed: c.Seed}
	}
	est, err := engine.NewEstimates(declared, engine.LearnConfig{On: c.Learn, Warmup: c.Warmup, MinEvidence: c.MinEvidence})
	if err != nil {
		return speed.Model{}, nil, err
	}
	m := truth
	m.Profile = est
	return m, est, nil
}
