package sim

import (
	"fmt"
	"hash/fnv"
	"math"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/estimate"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/speed"
)

// EstimateConfig makes what the engine and the scheduler know wrong, the
// way a live cluster's is: profiled throughputs off by up to ProfileError
// and declared step counts off by up to StepError, as factors drawn
// log-uniformly in [1/(1+e), 1+e] (so 0.5 means between 0.67x and 1.5x),
// seeded per (model, workers, GPU type) and per job. With Learn the
// engine corrects throughputs from the progress it observes
// (engine.Estimates). The truth (Config.Speed, Config.Jobs) is unchanged.
//
// Known is what the schedulers are told instead of the truth (nil: the
// true profile, full knowledge; NoProfile(): nothing at all): the world
// runs on the true profile whatever they are told, and whatever Known
// lacks is estimated (engine.Estimates), learned with Learn.
type EstimateConfig struct {
	ProfileError float64
	StepError    float64
	Seed         uint64
	Learn        bool
	// Warmup and MinEvidence tune learning (engine.LearnConfig; 0 takes
	// its defaults).
	Warmup, MinEvidence float64
	Known               speed.Profile
	// Estimator is the method that estimates what Known lacks ("" the
	// default); NoExplore turns exploration off; RestartCost is what
	// exploration weighs a restart at (the simulation's restart cost).
	Estimator   estimate.Method
	NoExplore   bool
	RestartCost float64
}

func (c EstimateConfig) validate() error {
	for _, e := range []float64{c.ProfileError, c.StepError} {
		if math.IsNaN(e) || e < 0 || e > 10 {
			return fmt.Errorf("estimate error %v: want a fraction between 0 and 10 (0.3 = up to 30 %% off)", e)
		}
	}
	if c.Estimator != "" {
		if _, err := estimate.ParseMethod(string(c.Estimator)); err != nil {
			return err
		}
	}
	return nil
}

// NoProfile is a profile with no figure at all: what schedulers know with
// --known-profile none.
func NoProfile() speed.Profile { return noProfile{} }

type noProfile struct{}

// errNoProfile is one value: this profile is asked on every estimate.
var errNoProfile = fmt.Errorf("no profile (--known-profile none): %w", profile.ErrNoFigure)

func (noProfile) Throughput(string, int, planner.GPUType, bool) (float64, error) {
	return 0, errNoProfile
}

func (noProfile) Entries() []profile.Entry { return nil }

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
	return v * p.off(model, sf, t), nil
}

func (p perturbed) off(model string, sf int, t planner.GPUType) float64 {
	return factor(p.err, p.seed, fmt.Sprintf("profile\x00%s\x00%d\x00%s", model, sf, t))
}

// Entries are the base's, made wrong the same way.
func (p perturbed) Entries() []profile.Entry {
	l, ok := p.base.(interface{ Entries() []profile.Entry })
	if !ok {
		return nil
	}
	out := l.Entries()
	for _, e := range out {
		for t, v := range e.Consolidated {
			e.Consolidated[t] = v * p.off(e.Model, e.ScaleFactor, t)
		}
		for t, v := range e.Spread {
			e.Spread[t] = v * p.off(e.Model, e.ScaleFactor, t)
		}
	}
	return out
}

// RelativeSpeeds are the base's.
func (p perturbed) RelativeSpeeds() map[planner.GPUType]profile.RelativeSpeed {
	if l, ok := p.base.(interface {
		RelativeSpeeds() map[planner.GPUType]profile.RelativeSpeed
	}); ok {
		return l.RelativeSpeeds()
	}
	return nil
}

// EstimatedModel returns the speed model a scheduler plans with under c,
// given the true model: the known profile (c.Known, else the true one)
// made wrong by c.ProfileError,
// inside estimates that learn when c.Learn; the network and spread
// settings are the true model's. Build the scheduler with it and pass it
// as Config.Plan.
func EstimatedModel(truth speed.Model, c EstimateConfig) (speed.Model, *engine.Estimates, error) {
	if err := c.validate(); err != nil {
		return speed.Model{}, nil, err
	}
	var declared speed.Profile = truth.Profile
	if c.Known != nil {
		declared = c.Known
	}
	if c.ProfileError > 0 {
		declared = perturbed{base: declared, err: c.ProfileError, seed: c.Seed}
	}
	est, err := engine.NewEstimates(declared, engine.LearnConfig{On: c.Learn, Warmup: c.Warmup, MinEvidence: c.MinEvidence,
		Estimator: c.Estimator, NoExplore: c.NoExplore, RestartCost: c.RestartCost})
	if err != nil {
		return speed.Model{}, nil, err
	}
	m := truth
	m.Profile = est
	return m, est, nil
}
