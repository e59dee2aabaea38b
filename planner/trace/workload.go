package trace

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
)

// Workload is a named synthetic workload: a job count, a Poisson rate, a
// size mix and the cluster it was sized for. It is a recipe for hadar's
// own generator (Synthesize), never a copy of another project's files.
type Workload struct {
	Name        string
	Jobs        int
	RatePerHour float64
	Sizes       SizeMix
	// Samples, when set, replace Sizes and the generator's durations: each
	// job's run time and size are drawn together from these jobs.
	Samples []JobSample
	// Cluster is the default cluster, TYPE=COUNT,... as --cluster takes it.
	Cluster string
	// fromTrace marks the table's workloads drawn from PhillyJobs.
	fromTrace bool
}

// SiaCluster is the 64-GPU, three-type cluster of the Philly workloads:
// the shape of Sia's (SOSP'23) 24 T4 + 24 RTX 2080Ti + 16 A100, each type
// replaced by the Gavel-profiled type of the same speed rank (slowest K80,
// then P100, fastest V100), because Gavel's measured throughputs are the
// only figures hadar holds; Sia's own profiles carry no licence.
const SiaCluster = "k80=24,p100=24,v100=16"

// The Philly-derived workloads as Sia's paper sizes them (160 jobs at 20
// per hour, so about 8 busy hours; 960 jobs at the same rate over about 48
// hours), drawn by Synthesize: Philly job sizes (PhillySizes, capped to the
// cluster by CapSizes), Gavel's models and the durations of Gavel's
// generator (GavelDurations), drawn apart from the sizes, steps on the
// V100.
//
// The philly-trace ones have the same counts and rate, but each job's run
// time and size are drawn together from the Philly trace's jobs Gavel
// ships (PhillyJobs: 1 h to 60 days, 1 to 8 GPUs), so long jobs are the
// large ones, as in the trace.
var workloads = []Workload{
	{Name: "philly-8h", Jobs: 160, RatePerHour: 20, Cluster: SiaCluster},
	{Name: "philly-48h", Jobs: 960, RatePerHour: 20, Cluster: SiaCluster},
	{Name: "philly-trace-8h", Jobs: 160, RatePerHour: 20, Cluster: SiaCluster, fromTrace: true},
	{Name: "philly-trace-48h", Jobs: 960, RatePerHour: 20, Cluster: SiaCluster, fromTrace: true},
}

// Workloads lists the named workloads. Each call returns fresh values, so
// a caller may change them without changing the table.
func Workloads() []Workload {
	out := make([]Workload, len(workloads))
	for i, w := range workloads {
		if w.fromTrace {
			w.Samples = PhillyJobs()
		} else {
			w.Sizes = PhillySizes()
		}
		out[i] = w
	}
	return out
}

// WorkloadNames lists the names Workloads knows.
func WorkloadNames() []string {
	var out []string
	for _, w := range workloads {
		out = append(out, w.Name)
	}
	return out
}

// LookupWorkload returns the workload of that name (case-insensitive).
func LookupWorkload(name string) (Workload, error) {
	for _, w := range Workloads() {
		if strings.EqualFold(strings.TrimSpace(name), w.Name) {
			return w, nil
		}
	}
	return Workload{}, fmt.Errorf("workload %q: want one of %s", name, strings.Join(WorkloadNames(), ", "))
}

// SiaPhilly is the 160-job, 8-hour workload on SiaCluster (4-GPU servers).
func SiaPhilly(seed int64) ([]planner.Job, error) { return synthesizeNamed("philly-8h", seed) }

// SiaPhillyLong is the 960-job, 48-hour workload on SiaCluster.
func SiaPhillyLong(seed int64) ([]planner.Job, error) { return synthesizeNamed("philly-48h", seed) }

func synthesizeNamed(name string, seed int64) ([]planner.Job, error) {
	w, err := LookupWorkload(name)
	if err != nil {
		return nil, err
	}
	cluster, err := planner.ParseClusterSpec(w.Cluster, 4)
	if err != nil {
		return nil, fmt.Errorf("workload %s: cluster: %w", w.Name, err)
	}
	cfg, err := w.Config(seed, cluster, nil)
	if err != nil {
		return nil, err
	}
	jobs, err := Synthesize(cfg)
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", w.Name, err)
	}
	return jobs, nil
}

// Config is the SynthConfig that draws w on cluster with profile prof (nil:
// profile.Default()): w's size mix capped to the cluster, extrapolated
// throughputs for the sizes Gavel's profile lacks (16 GPUs), V100
// reference. Run its jobs with profile.Resolve in Extrapolate mode.
func (w Workload) Config(seed int64, cluster planner.Cluster, prof *profile.Profile) (SynthConfig, error) {
	if w.Samples != nil {
		samples, err := CapSamples(w.Samples, cluster)
		if err != nil {
			return SynthConfig{}, fmt.Errorf("workload %s: %w", w.Name, err)
		}
		return SynthConfig{Jobs: w.Jobs, RatePerHour: w.RatePerHour, Seed: seed, Profile: prof,
			Samples: samples, Extrapolate: true}, nil
	}
	sizes, err := CapSizes(w.Sizes, cluster)
	if err != nil {
		return SynthConfig{}, fmt.Errorf("workload %s: %w", w.Name, err)
	}
	return SynthConfig{Jobs: w.Jobs, RatePerHour: w.RatePerHour, Seed: seed, Profile: prof,
		ScaleFactors: sizes.ScaleFactors, ScaleFactorWeights: sizes.Weights, Extrapolate: true}, nil
}

// CapSizes folds every size of the mix larger than the cluster's largest
// type (a job runs on one type) into the largest size of the mix that fits
// there: on SiaCluster (24 GPUs at most of a type) the Philly mix's 32-GPU
// jobs (0.6 %) become 16-GPU jobs. A cap, not a drop, keeps the share of
// large jobs the trace has; capping to a size of the mix, not to 24, keeps
// the trace's own sizes.
func CapSizes(m SizeMix, cluster planner.Cluster) (SizeMix, error) {
	if len(m.ScaleFactors) == 0 || len(m.ScaleFactors) != len(m.Weights) {
		return SizeMix{}, fmt.Errorf("size mix %v with weights %v: want one weight per size, at least one", m.ScaleFactors, m.Weights)
	}
	largest := 0
	for _, t := range cluster.Types() {
		largest = max(largest, cluster.Capacity(t))
	}
	limit := 0
	for _, sf := range m.ScaleFactors {
		if sf <= largest {
			limit = max(limit, sf)
		}
	}
	if limit == 0 {
		return SizeMix{}, fmt.Errorf("size mix %v: no size fits the cluster's largest type (%d GPUs): want a cluster with at least %d GPUs of one type",
			m.ScaleFactors, largest, slices.Min(m.ScaleFactors))
	}
	var out SizeMix
	for i, sf := range m.ScaleFactors {
		sf = min(sf, limit)
		if k := slices.Index(out.ScaleFactors, sf); k >= 0 {
			out.Weights[k] += m.Weights[i]
			continue
		}
		out.ScaleFactors = append(out.ScaleFactors, sf)
		out.Weights = append(out.Weights, m.Weights[i])
	}
	return out, nil
}

// CapSamples is CapSizes for a job distribution: each job larger than the
// cluster's largest type runs on the largest size of the samples that
// fits, with its run time unchanged. samples is not modified.
func CapSamples(samples []JobSample, cluster planner.Cluster) ([]JobSample, error) {
	var m SizeMix
	for _, smp := range samples {
		if !slices.Contains(m.ScaleFactors, smp.GPUs) {
			m.ScaleFactors = append(m.ScaleFactors, smp.GPUs)
			m.Weights = append(m.Weights, 1)
		}
	}
	capped, err := CapSizes(m, cluster)
	if err != nil {
		return nil, err
	}
	limit := slices.Max(capped.ScaleFactors)
	out := slices.Clone(samples)
	for i := range out {
		out[i].GPUs = min(out[i].GPUs, limit)
	}
	return out, nil
}
