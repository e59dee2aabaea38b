package sim_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

func cluster(t testing.TB, spec string) planner.Cluster {
	t.Helper()
	c, err := planner.ParseClusterSpec(spec, 4)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func synth(t testing.TB, n int, rate float64, seed int64) []planner.Job {
	t.Helper()
	jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: n, RatePerHour: rate, Seed: seed, Profile: profile.Default(), Reference: "v100"})
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

// lowerBound is what no scheduler can beat: each job from its arrival on
// `copies` units at its fastest width and type, and the whole work at each
// job's best steps per GPU-second spread over every GPU. A scheduler that
// forks (HadarE) may run up to `copies` units of a job, each as wide as the
// job or narrower.
func lowerBound(t *testing.T, c planner.Cluster, jobs []planner.Job, copies int) float64 {
	t.Helper()
	prof := profile.Default()
	first := math.Inf(1)
	for _, j := range jobs {
		first = math.Min(first, j.Arrival)
	}
	lb, gpuSeconds := 0.0, 0.0
	for _, j := range jobs {
		bestRate, bestPerGPU := 0.0, 0.0
		for w := j.ScaleFactor; w >= 1; w /= 2 {
			if copies == 1 && w != j.ScaleFactor {
				break
			}
			for _, ty := range c.Types() {
				for _, spread := range []bool{false, true} {
					v, err := prof.Throughput(j.Model, w, ty, spread)
					if err != nil {
						continue // width not profiled
					}
					bestRate = math.Max(bestRate, v)
					bestPerGPU = math.Max(bestPerGPU, v/float64(w))
				}
			}
		}
		lb = math.Max(lb, j.Arrival-first+j.TotalSteps/(float64(copies)*bestRate))
		gpuSeconds += j.TotalSteps / bestPerGPU
	}
	return math.Max(lb, gpuSeconds/float64(c.TotalGPUs()))
}

// checkingScheduler wraps a scheduler and fails the test when a placement
// exceeds the cluster or when a job is placed twice.
type checkingScheduler struct {
	round.Scheduler
	t *testing.T
}

func (c checkingScheduler) Schedule(v *round.View) ([]planner.Placement, error) {
	before := v.Pool.Clone()
	ps, err := c.Scheduler.Schedule(v)
	if err != nil {
		return nil, err
	}
	for i, p := range ps {
		if v.MidRound && v.Jobs[i].Running {
			continue
		}
		for _, u := range p.Units {
			if !before.Fits(u) {
				c.t.Fatalf("t=%v: job %s placed on busy or missing GPUs %v", v.Now, v.Jobs[i].ID, u.Slots)
			}
			before.Take(u)
		}
	}
	return ps, nil
}

func TestEveryJobCompletesAboveLowerBound(t *testing.T) {
	c := cluster(t, "v100=12,p100=12,k80=12")
	for _, fid := range []sim.Fidelity{sim.Improved, sim.Gavel} {
		for _, rate := range []float64{0, 4} {
			jobs := synth(t, 60, rate, 3)
			for _, name := range registry.Names() {
				copies := 1
				if strings.HasPrefix(name, "hadare") {
					copies = 4 // hadar.Config's default MaxCopies
				}
				lb := lowerBound(t, c, jobs, copies)
				t.Run(fmt.Sprintf("%s/rate=%v/%s", fid, rate, name), func(t *testing.T) {
					model := speed.Model{Profile: profile.Default(), IgnoreSpread: fid == sim.Gavel}
					s, err := registry.New(name, registry.Options{Types: c.Types(), GavelFidelity: fid == sim.Gavel, Speed: model, RestartCost: 20, MergeCost: 10})
					if err != nil {
						t.Fatal(err)
					}
					res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: model, Fidelity: fid, RestartCost: 20, MergeCost: 10}, checkingScheduler{s, t})
					if err != nil {
						t.Fatal(err)
					}
					if res.Completed != len(jobs) {
						t.Fatalf("%d of %d jobs completed", res.Completed, len(jobs))
					}
					if res.Makespan < lb*(1-1e-9) {
						t.Fatalf("makespan %.0f s is below the physical lower bound %.0f s", res.Makespan, lb)
					}
					if res.Utilization <= 0 || res.Utilization > 1+1e-9 {
						t.Fatalf("utilization %v outside (0, 1]", res.Utilization)
					}
					for _, j := range res.Jobs {
						if j.Finish < j.Arrival || j.Start < j.Arrival {
							t.Fatalf("job %s: arrival %v start %v finish %v", j.ID, j.Arrival, j.Start, j.Finish)
						}
					}
				})
			}
		}
	}
}

func TestGavelFidelityWaitsForRoundBoundaries(t *testing.T) {
	c := cluster(t, "v100=4")
	prof := profile.Default()
	model := "ResNet-18 (batch size 16)"
	v, err := prof.Throughput(model, 1, "v100", false)
	if err != nil {
		t.Fatal(err)
	}
	// One job arriving at t=100 that needs exactly 1000 s on one V100.
	jobs := []planner.Job{
		{ID: "a", Model: model, ScaleFactor: 1, TotalSteps: 10 * v, Weight: 1, Arrival: 0},
		{ID: "b", Model: model, ScaleFactor: 1, TotalSteps: 1000 * v, Weight: 1, Arrival: 100},
	}
	run := func(fid sim.Fidelity) sim.Result {
		s, err := registry.New("gavel-maxmin", registry.Options{Types: c.Types(), GavelFidelity: fid == sim.Gavel})
		if err != nil {
			t.Fatal(err)
		}
		res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: speed.Model{Profile: prof}, Fidelity: fid, RestartCost: 0}, s)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	imp := run(sim.Improved)
	if got := imp.Jobs[1].Start; math.Abs(got-100) > 1e-6 {
		t.Fatalf("improved: job b started at %v, want at its arrival (100)", got)
	}
	if got := imp.Jobs[1].JCT; math.Abs(got-1000) > 1e-6 {
		t.Fatalf("improved: job b JCT %v, want 1000", got)
	}
	gav := run(sim.Gavel)
	// Gavel only admits at round boundaries (360 s) and the allocation
	// made at t=0 cannot be recomputed before 1920 s: the first round
	// boundary after that is 6*360 = 2160 s.
	if got := gav.Jobs[1].Start; math.Abs(got-2160) > 1e-6 {
		t.Fatalf("gavel: job b started at %v, want 2160", got)
	}
}

func TestRestartCostIsCharged(t *testing.T) {
	c := cluster(t, "v100=1")
	prof := profile.Default()
	model := "ResNet-18 (batch size 16)"
	v, _ := prof.Throughput(model, 1, "v100", false)
	jobs := []planner.Job{{ID: "a", Model: model, ScaleFactor: 1, TotalSteps: 100 * v, Weight: 1}}
	s, _ := registry.New("fifo", registry.Options{Types: c.Types()})
	res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: speed.Model{Profile: prof}, RestartCost: 30}, s)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Jobs[0].JCT; math.Abs(got-130) > 1e-6 {
		t.Fatalf("JCT %v, want 100 s of work + 30 s start cost", got)
	}
}

func TestUnrunnableJobIsAnError(t *testing.T) {
	c := cluster(t, "v100=4")
	jobs := []planner.Job{{ID: "big", Model: "ResNet-18 (batch size 16)", ScaleFactor: 8, TotalSteps: 10, Weight: 1}}
	s, _ := registry.New("fifo", registry.Options{Types: c.Types()})
	_, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: speed.Model{Profile: profile.Default()}}, s)
	if err == nil || !strings.Contains(err.Error(), "cannot run") {
		t.Fatalf("err = %v, want a job-cannot-run error", err)
	}
}

// benchSim replays jobs through each named policy, with the simulator's
// default restart and merge costs.
func benchSim(b *testing.B, jobs []planner.Job, names ...string) {
	c := cluster(b, "v100=36,p100=36,k80=36")
	for _, name := range names {
		b.Run("policy="+name, func(b *testing.B) {
			for b.Loop() {
				model := speed.Model{Profile: profile.Default()}
				s, err := registry.New(name, registry.Options{Types: c.Types(), Speed: model, RestartCost: 20, MergeCost: 10})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: model, RestartCost: 20, MergeCost: 10}, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkContinuousTrace: 1,000 jobs arriving at 6 per hour on 108 GPUs.
func BenchmarkContinuousTrace(b *testing.B) {
	benchSim(b, synth(b, 1000, 6, 1), "fifo", "gavel-maxmin", "gavel-makespan", "gavel-ftf", "hadar", "hadare")
}

// BenchmarkStatic: 300 jobs at t=0.
func BenchmarkStatic(b *testing.B) {
	benchSim(b, synth(b, 300, 0, 1), "gavel-makespan", "hadar", "hadare")
}
