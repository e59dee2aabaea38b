package trace

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
)

// DurationDist is the distribution of a synthetic job's run time on the
// reference GPU type: Unit * 10^U(ShortMinExp, ShortMaxExp) seconds with
// probability 1-LongProb, Unit * 10^U(LongMinExp, LongMaxExp) with LongProb.
type DurationDist struct {
	Unit                     float64 // seconds per unit (60: the exponents are in minutes)
	ShortMinExp, ShortMaxExp float64
	LongMinExp, LongMaxExp   float64
	LongProb                 float64 // in [0, 1]
}

// GavelDurations is the Philly-derived distribution Gavel's simulator uses:
// 60*10^U(1.5,3) s (about 32 min to 17 h) with p=0.8, 60*10^U(3,4) s
// (17 h to 7 days) with p=0.2.
func GavelDurations() DurationDist {
	return DurationDist{Unit: 60, ShortMinExp: 1.5, ShortMaxExp: 3, LongMinExp: 3, LongMaxExp: 4, LongProb: 0.2}
}

func (d DurationDist) validate() error {
	ok := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !ok(d.Unit) || d.Unit <= 0:
		return fmt.Errorf("SynthConfig.Durations: Unit %v: want a positive number of seconds", d.Unit)
	case !ok(d.ShortMinExp) || !ok(d.ShortMaxExp) || d.ShortMinExp > d.ShortMaxExp:
		return fmt.Errorf("SynthConfig.Durations: short exponents [%v, %v]: want finite ShortMinExp <= ShortMaxExp", d.ShortMinExp, d.ShortMaxExp)
	case !ok(d.LongMinExp) || !ok(d.LongMaxExp) || d.LongMinExp > d.LongMaxExp:
		return fmt.Errorf("SynthConfig.Durations: long exponents [%v, %v]: want finite LongMinExp <= LongMaxExp", d.LongMinExp, d.LongMaxExp)
	case !(d.LongProb >= 0 && d.LongProb <= 1):
		return fmt.Errorf("SynthConfig.Durations: LongProb %v: want a probability in [0, 1]", d.LongProb)
	case math.Pow(10, max(d.ShortMaxExp, d.LongMaxExp))*d.Unit > math.MaxFloat64/1e6:
		return fmt.Errorf("SynthConfig.Durations: exponents up to %v overflow: want durations of at most ~1e300 s", max(d.ShortMaxExp, d.LongMaxExp))
	}
	return nil
}

func (d DurationDist) draw(r *rand.Rand) float64 {
	lo, hi := d.ShortMinExp, d.ShortMaxExp
	if r.Float64() < d.LongProb {
		lo, hi = d.LongMinExp, d.LongMaxExp
	}
	return d.Unit * math.Pow(10, lo+(hi-lo)*r.Float64())
}

// SynthConfig describes a synthetic workload in the style of Gavel's
// simulator. Zero values take the defaults noted.
type SynthConfig struct {
	Jobs int // number of jobs, > 0
	// RatePerHour: 0 means static (every job arrives at t=0); > 0 means a
	// Poisson process at this many jobs per hour, the first job at t=0.
	RatePerHour float64
	Seed        int64
	// Profile gives total_steps = duration * Throughput(model, sf,
	// Reference); nil means profile.Default().
	Profile   *profile.Profile
	Reference planner.GPUType // "" means "v100", as in Gavel
	// Models to draw from, uniformly among those runnable on Reference at
	// the drawn scale factor (Gavel re-draws the model until it fits; this
	// is the same distribution). nil means every model of the profile.
	Models []string
	// ScaleFactors and their relative weights; nil means Gavel's 1/2/4/8 at
	// 70/10/15/5 % (GavelSizes; PhillySizes and ParseSizeMix give others).
	ScaleFactors       []int
	ScaleFactorWeights []float64
	// Extrapolate: a model the profile holds at two or more scale factors
	// (so with evidence of how it scales) is also drawn at the sizes of the
	// mix it lacks, its throughput extrapolated by profile.(*Profile).Extend
	// (docs/formats.md). Models profiled at one size only stay there, as
	// in Gavel's generator, so the draws at profiled sizes do not change.
	// Without it a size no model is profiled at is an error. Run the jobs
	// with profile.Resolve in Extrapolate mode: it derives the same figures.
	Extrapolate bool
	// Durations: nil means GavelDurations().
	Durations *DurationDist
	// Samples, when set, give each job its run time and size together,
	// drawn uniformly from these jobs (PhillyJobs: Gavel's later generator
	// draws so), instead of from ScaleFactors and Durations apart, which
	// must then be unset.
	Samples []JobSample
	// HighPriorityFraction of the jobs get weight HighPriorityWeight, the
	// others 1 (Gavel's multi-priority mode: 0.2 and 5). 0 means all 1.
	HighPriorityFraction float64
	HighPriorityWeight   float64
	// SLOFactors: when set, each job's SLO is a factor drawn uniformly from
	// this list times its duration (Gavel: 1.2, 2, 10). nil means no SLOs.
	SLOFactors []float64
}

// Random streams, one per drawn quantity, so that changing one distribution
// (say the scale-factor mix) leaves the others' draws unchanged for a seed.
const (
	streamArrival uint64 = iota + 1
	streamScale
	streamModel
	streamDuration
	streamPriority
	streamSLO
)

// Synthesize draws cfg.Jobs jobs. It is deterministic for a given config and
// seed; jobs are sorted by arrival with IDs "job-0000", ... in that order.
// total_steps is the drawn duration times the reference throughput, rounded
// to whole steps (at least 1).
func Synthesize(cfg SynthConfig) ([]planner.Job, error) {
	s, err := newSynth(cfg)
	if err != nil {
		return nil, fmt.Errorf("synthesize: %w", err)
	}
	rng := func(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(uint64(cfg.Seed), stream)) }
	arrivals, scales, models, durations, priorities, slos :=
		rng(streamArrival), rng(streamScale), rng(streamModel), rng(streamDuration), rng(streamPriority), rng(streamSLO)
	jobs := make([]planner.Job, cfg.Jobs)
	t := 0.0
	for i := range jobs {
		if i > 0 && cfg.RatePerHour > 0 {
			t += arrivals.ExpFloat64() * 3600 / cfg.RatePerHour
		}
		// Each quantity has its own stream, so the order of the draws
		// does not matter.
		var sf int
		var d float64
		if s.samples != nil {
			smp := s.samples[durations.IntN(len(s.samples))]
			sf, d = smp.GPUs, smp.Seconds
		} else {
			sf, d = s.scaleFactors[pick(scales, s.cumWeights)], s.durations.draw(durations)
		}
		cands := s.candidates[sf]
		model := cands[models.IntN(len(cands))]
		thr, err := s.profile.Throughput(model, sf, s.reference, false)
		if err != nil {
			return nil, fmt.Errorf("synthesize: %w", err)
		}
		j := planner.Job{
			ID:          fmt.Sprintf("job-%04d", i),
			Model:       model,
			ScaleFactor: sf,
			TotalSteps:  max(1, math.Round(d*thr)),
			Weight:      1,
			Arrival:     t,
		}
		if priorities.Float64() < cfg.HighPriorityFraction {
			j.Weight = cfg.HighPriorityWeight
		}
		if len(cfg.SLOFactors) > 0 {
			j.SLO = cfg.SLOFactors[slos.IntN(len(cfg.SLOFactors))] * d
		}
		if err := j.Validate(); err != nil {
			return nil, fmt.Errorf("synthesize: %w", err)
		}
		jobs[i] = j
	}
	if last := jobs[len(jobs)-1].Arrival; checkArrival(last) != nil {
		return nil, fmt.Errorf("synthesize: %d jobs at %v per hour arrive over %s, past trace.MaxArrival (%.0f years): raise RatePerHour or draw fewer jobs",
			cfg.Jobs, cfg.RatePerHour, span(last), MaxArrival/year)
	}
	return jobs, nil
}

// synth is a validated SynthConfig with its defaults filled in.
type synth struct {
	profile      *profile.Profile
	reference    planner.GPUType
	scaleFactors []int
	weights      []float64
	cumWeights   []float64
	candidates   map[int][]string // runnable models per scale factor
	durations    DurationDist
	samples      []JobSample // nil: scaleFactors and durations apart
}

func newSynth(cfg SynthConfig) (*synth, error) {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if cfg.Jobs <= 0 {
		return nil, fmt.Errorf("SynthConfig.Jobs %d: want a positive number of jobs", cfg.Jobs)
	}
	if !finite(cfg.RatePerHour) || cfg.RatePerHour < 0 {
		return nil, fmt.Errorf("SynthConfig.RatePerHour %v: want 0 (all jobs at t=0) or a positive rate", cfg.RatePerHour)
	}
	s := &synth{profile: cfg.Profile, reference: cfg.Reference, durations: GavelDurations()}
	if s.profile == nil {
		s.profile = profile.Default()
	}
	if s.reference == "" {
		s.reference = "v100"
	}
	if !s.profile.HasType(s.reference) {
		return nil, fmt.Errorf("SynthConfig.Reference %q is not a GPU type of the profile (%v): pick one of those", s.reference, s.profile.Types())
	}
	if cfg.Durations != nil {
		s.durations = *cfg.Durations
	}
	if err := s.durations.validate(); err != nil {
		return nil, err
	}
	if cfg.Samples != nil {
		if cfg.Durations != nil || cfg.ScaleFactors != nil || cfg.ScaleFactorWeights != nil {
			return nil, errors.New("SynthConfig.Samples draws each job's run time and size together: leave Durations, ScaleFactors and ScaleFactorWeights unset")
		}
		sfs, counts, err := sampleSizes(cfg.Samples)
		if err != nil {
			return nil, err
		}
		cfg.ScaleFactors, cfg.ScaleFactorWeights = sfs, counts
		s.samples = cfg.Samples
	}
	if !(cfg.HighPriorityFraction >= 0 && cfg.HighPriorityFraction <= 1) {
		return nil, fmt.Errorf("SynthConfig.HighPriorityFraction %v: want a fraction in [0, 1]", cfg.HighPriorityFraction)
	}
	if cfg.HighPriorityFraction > 0 && (!finite(cfg.HighPriorityWeight) || cfg.HighPriorityWeight <= 0) {
		return nil, fmt.Errorf("SynthConfig.HighPriorityWeight %v: want a positive weight when HighPriorityFraction is %v", cfg.HighPriorityWeight, cfg.HighPriorityFraction)
	}
	for _, f := range cfg.SLOFactors {
		if !finite(f) || f <= 0 {
			return nil, fmt.Errorf("SynthConfig.SLOFactors: %v: want positive multiples of the job's duration", f)
		}
	}

	weights := cfg.ScaleFactorWeights
	s.scaleFactors = cfg.ScaleFactors
	if s.scaleFactors == nil && weights == nil {
		s.scaleFactors, weights = []int{1, 2, 4, 8}, []float64{0.70, 0.10, 0.15, 0.05}
	}
	if len(s.scaleFactors) == 0 || len(s.scaleFactors) != len(weights) {
		return nil, fmt.Errorf("SynthConfig.ScaleFactors %v with ScaleFactorWeights %v: want one weight per scale factor, at least one", s.scaleFactors, weights)
	}
	total := 0.0
	for i, sf := range s.scaleFactors {
		w := weights[i]
		if sf <= 0 || slices.Contains(s.scaleFactors[:i], sf) {
			return nil, fmt.Errorf("SynthConfig.ScaleFactors %v: want distinct positive integers", s.scaleFactors)
		}
		if !finite(w) || w < 0 {
			return nil, fmt.Errorf("SynthConfig.ScaleFactorWeights[%d] = %v: want a weight >= 0", i, w)
		}
		total += w
		s.cumWeights = append(s.cumWeights, total)
	}
	if !(total > 0) || math.IsInf(total, 0) {
		return nil, fmt.Errorf("SynthConfig.ScaleFactorWeights %v: want a finite positive sum", weights)
	}
	s.weights = weights

	models := cfg.Models
	if models == nil {
		models = s.profile.Models()
	}
	if len(models) == 0 {
		return nil, errors.New("SynthConfig.Models is empty: want nil (every model of the profile) or at least one model")
	}
	for _, m := range models {
		if s.profile.ScaleFactors(m) == nil {
			return nil, fmt.Errorf("SynthConfig.Models: %q is not in the profile: want one of %q", m, s.profile.Models())
		}
	}
	if cfg.Extrapolate {
		var pairs []profile.Pair
		for i, sf := range s.scaleFactors {
			for _, m := range models {
				if weights[i] > 0 && len(s.profile.ScaleFactors(m)) > 1 {
					pairs = append(pairs, profile.Pair{Model: m, ScaleFactor: sf})
				}
			}
		}
		var err error
		if s.profile, _, err = s.profile.Extend(pairs); err != nil {
			return nil, fmt.Errorf("SynthConfig.Extrapolate: %w", err)
		}
	}
	s.candidates = map[int][]string{}
	for i, sf := range s.scaleFactors {
		for _, m := range models {
			if s.profile.Runnable(m, sf, s.reference) && !slices.Contains(s.candidates[sf], m) {
				s.candidates[sf] = append(s.candidates[sf], m)
			}
		}
		if weights[i] > 0 && len(s.candidates[sf]) == 0 {
			hint := ", or set Extrapolate to extrapolate the profile there (hadar sim --unprofiled extrapolate)"
			if cfg.Extrapolate {
				hint = ""
			}
			return nil, fmt.Errorf("no model of %q runs on the reference %s at scale factor %d: drop %d from ScaleFactors, give it weight 0, or add a model profiled there%s",
				models, s.reference, sf, sf, hint)
		}
	}
	return s, nil
}

// sampleSizes checks samples and returns their distinct sizes, ascending,
// with each size's job count.
func sampleSizes(samples []JobSample) ([]int, []float64, error) {
	if len(samples) == 0 {
		return nil, nil, errors.New("SynthConfig.Samples is empty: want nil (ScaleFactors and Durations) or at least one job")
	}
	count := map[int]float64{}
	for i, smp := range samples {
		if !(smp.Seconds > 0) || math.IsInf(smp.Seconds, 0) || smp.GPUs <= 0 {
			return nil, nil, fmt.Errorf("SynthConfig.Samples[%d] = %+v: want a positive run time and GPU count", i, smp)
		}
		count[smp.GPUs]++
	}
	sfs := slices.Sorted(maps.Keys(count))
	counts := make([]float64, len(sfs))
	for i, sf := range sfs {
		counts[i] = count[sf]
	}
	return sfs, counts, nil
}

// gpuSeconds is the mean of a job's run time times its size: with samples
// the two are drawn together, so the mean of the product, not the product
// of the means.
func (s *synth) gpuSeconds() float64 {
	if s.samples != nil {
		sum := 0.0
		for _, smp := range s.samples {
			sum += smp.Seconds * float64(smp.GPUs)
		}
		return sum / float64(len(s.samples))
	}
	var sfSum, wSum float64
	for i, sf := range s.scaleFactors {
		sfSum += s.weights[i] * float64(sf)
		wSum += s.weights[i]
	}
	return s.durations.mean() * sfSum / wSum
}

// pick returns the index drawn from cumulative weights cum.
func pick(r *rand.Rand, cum []float64) int {
	x := r.Float64() * cum[len(cum)-1]
	i, _ := slices.BinarySearchFunc(cum, x, func(c, x float64) int {
		if c <= x {
			return -1
		}
		return 1
	})
	return min(i, len(cum)-1)
}
