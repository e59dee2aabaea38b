package trace

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// SizeMix is a distribution of job sizes (scale factors) for Synthesize:
// SynthConfig.ScaleFactors and ScaleFactorWeights.
type SizeMix struct {
	ScaleFactors []int
	Weights      []float64 // relative, one per scale factor
}

// GavelSizes is the mix of Gavel's generator (and SynthConfig's default):
// 1, 2, 4 and 8 GPUs at 70, 10, 15 and 5 %. Gavel's code calls it "the
// Philly distribution"; it stops at 8 GPUs.
func GavelSizes() SizeMix {
	return SizeMix{ScaleFactors: []int{1, 2, 4, 8}, Weights: []float64{0.70, 0.10, 0.15, 0.05}}
}

// PhillySizes is the job-size mix of the Philly trace as Gavel's
// Philly-derived per-virtual-cluster traces carry it, counted from them
// (the 15 VCs of scheduler/traces/msr/seed=0, 15,264 jobs, cut from the
// trace released with Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU
// Clusters for DNN Training Workloads", ATC'19). The weights are the job counts at
// 1, 2, 4, 8, 16 and 32 GPUs: 68.7, 3.0, 13.4, 12.6, 1.7 and 0.6 %. The 15
// jobs of other sizes (7, 12, 20, 24, 64 GPUs; 0.1 %) are left out. Jobs of
// 16 and 32 GPUs are 2.3 % of the jobs but 17 % of the GPUs asked for.
// Gavel's profiles stop at 8 GPUs: synthesize with Extrapolate.
func PhillySizes() SizeMix {
	return SizeMix{ScaleFactors: []int{1, 2, 4, 8, 16, 32}, Weights: []float64{10480, 463, 2044, 1916, 255, 91}}
}

// ParseSizeMix reads a size mix: "gavel" (GavelSizes), "philly"
// (PhillySizes), or "SF=WEIGHT,..." with positive integer scale factors and
// relative weights >= 0, e.g. "1=70,2=10,4=15,8=5".
func ParseSizeMix(s string) (SizeMix, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "gavel", "":
		return GavelSizes(), nil
	case "philly":
		return PhillySizes(), nil
	}
	var m SizeMix
	for _, part := range strings.Split(s, ",") {
		sf, w, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(strings.TrimSpace(sf))
		if !ok || err != nil || n <= 0 {
			return SizeMix{}, fmt.Errorf("size mix %q: entry %q: want gavel, philly, or SCALE_FACTOR=WEIGHT,... with positive integer scale factors, e.g. 1=70,2=10,4=15,8=5", s, part)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return SizeMix{}, fmt.Errorf("size mix %q: weight %q of scale factor %d: want a number >= 0", s, w, n)
		}
		if slices.Contains(m.ScaleFactors, n) {
			return SizeMix{}, fmt.Errorf("size mix %q: scale factor %d given twice", s, n)
		}
		m.ScaleFactors = append(m.ScaleFactors, n)
		m.Weights = append(m.Weights, v)
	}
	return m, nil
}

// mean is the expected duration in seconds.
func (d DurationDist) mean() float64 {
	// E[10^U(a, b)] = (10^b - 10^a) / ((b - a) ln 10).
	e := func(a, b float64) float64 {
		if b == a {
			return math.Pow(10, a)
		}
		return (math.Pow(10, b) - math.Pow(10, a)) / ((b - a) * math.Ln10)
	}
	return d.Unit * ((1-d.LongProb)*e(d.ShortMinExp, d.ShortMaxExp) + d.LongProb*e(d.LongMinExp, d.LongMaxExp))
}

// RateForLoad returns the Poisson arrival rate (jobs per hour) at which the
// workload of cfg offers the given load to cluster; cfg.RatePerHour and
// cfg.Jobs are ignored. The load is nominal, in reference-GPU terms:
//
//	load = rate/3600 * E[duration] * E[scale factor] / C
//
// E[duration] is the mean of cfg's duration distribution (on the reference
// type, which is what durations mean), E[scale factor] the mean of its size
// mix (with Samples the two are drawn together, so their product is
// E[duration * scale factor] over the samples), and C the cluster's GPUs
// with each of type t counted at r_t, the mean over the workload of
// T(model, sf, t)/T(model, sf, reference), consolidated, weighted as the
// work is (by the size mix times sf, and uniformly over the models drawn
// at each sf; 0 where a job cannot run on t). So a V100 counts 1 with a
// V100 reference, and slower types less. Placement is ignored: a job
// spread over servers runs slower than this assumes, so the real load is
// somewhat higher.
func RateForLoad(cfg SynthConfig, cluster planner.Cluster, load float64) (float64, error) {
	if math.IsNaN(load) || math.IsInf(load, 0) || load <= 0 {
		return 0, fmt.Errorf("rate for load: load %v: want a positive number, e.g. 0.95", load)
	}
	cfg.Jobs, cfg.RatePerHour = 1, 0
	s, err := newSynth(cfg)
	if err != nil {
		return 0, fmt.Errorf("rate for load: %w", err)
	}
	types := cluster.Types()
	if len(types) == 0 {
		return 0, fmt.Errorf("rate for load: the cluster has no GPUs: want at least one node")
	}
	var sfSum float64
	speed := map[planner.GPUType]float64{}
	for i, sf := range s.scaleFactors {
		w := s.weights[i]
		if w == 0 {
			continue
		}
		sfSum += w * float64(sf)
		cands := s.candidates[sf]
		for _, t := range types {
			if !s.profile.HasType(t) {
				return 0, fmt.Errorf("rate for load: cluster type %q is not in the profile (it has %v): add it to the profile or drop it from the cluster", t, s.profile.Types())
			}
			for _, m := range cands {
				ref, err := s.profile.Throughput(m, sf, s.reference, false)
				if err != nil {
					return 0, fmt.Errorf("rate for load: %w", err)
				}
				v, err := s.profile.Throughput(m, sf, t, false)
				if err != nil {
					v = 0 // no figure for t: cannot run there
				}
				speed[t] += w * float64(sf) / float64(len(cands)) * v / ref
			}
		}
	}
	capacity := 0.0
	for _, t := range types {
		capacity += float64(cluster.Capacity(t)) * speed[t] / sfSum
	}
	if capacity <= 0 {
		return 0, fmt.Errorf("rate for load: no job of the workload runs on the cluster's types %v", types)
	}
	return load * capacity * 3600 / s.gpuSeconds(), nil
}
