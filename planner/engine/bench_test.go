package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

// bigCluster is 500 nodes of 8 GPUs (4,000 GPUs) of three types in 20
// racks.
func bigCluster() []planner.Node {
	types := []planner.GPUType{"v100", "p100", "k80"}
	var ns []planner.Node
	for i := range 500 {
		ns = append(ns, planner.Node{ID: fmt.Sprintf("n%03d", i), Rack: fmt.Sprintf("r%02d", i%20), GPUs: map[planner.GPUType]int{types[i%3]: 8}})
	}
	return ns
}

// loaded returns an engine on bigCluster with n active jobs after one
// round, and the jobs still to admit.
func loaded(b *testing.B, policy string, n int) (*engine.Engine, []planner.Job) {
	b.Helper()
	return loadedOn(b, policy, n, bigCluster())
}

// clusterOf is gpus GPUs in 8-GPU nodes of three types (v100, p100, k80
// in turn), 20 nodes to a rack.
func clusterOf(gpus int) []planner.Node {
	types := []planner.GPUType{"v100", "p100", "k80"}
	var ns []planner.Node
	for i := range gpus / 8 {
		ns = append(ns, planner.Node{ID: fmt.Sprintf("n%04d", i), Rack: fmt.Sprintf("r%02d", i/20), GPUs: map[planner.GPUType]int{types[i%3]: 8}})
	}
	return ns
}

func loadedOn(b *testing.B, policy string, n int, nodes []planner.Node) (*engine.Engine, []planner.Job) {
	b.Helper()
	return loadedJobs(b, policy, n, nodes, false)
}

// loadedJobs is loadedOn with, when elastic, every job elastic
// (trace.MakeElastic with fraction 1: the profiled widths from 1 to twice
// its scale factor, as `hadar sim --elastic 1` draws them).
func loadedJobs(b *testing.B, policy string, n int, nodes []planner.Node, elastic bool) (*engine.Engine, []planner.Job) {
	b.Helper()
	prof := profile.Default()
	jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: n + 200, Seed: 1, Profile: prof, Reference: "v100"})
	if err != nil {
		b.Fatal(err)
	}
	if elastic {
		if jobs, err = trace.MakeElastic(jobs, 1, 1, prof.ScaleFactors); err != nil {
			b.Fatal(err)
		}
		if !slices.ContainsFunc(jobs[:n], func(j planner.Job) bool { return len(j.Widths) > 1 }) {
			b.Fatal("no job made elastic")
		}
	}
	est, err := engine.NewEstimates(prof, engine.LearnConfig{})
	if err != nil {
		b.Fatal(err)
	}
	model := speed.Model{Profile: est}
	s, err := registry.New(policy, registry.Options{Types: []planner.GPUType{"k80", "p100", "v100"}, Speed: model, RestartCost: 20, MergeCost: 10})
	if err != nil {
		b.Fatal(err)
	}
	e, err := engine.New(engine.Config{Speed: model}, s)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.SetNodes(nodes, 0); err != nil {
		b.Fatal(err)
	}
	for _, jb := range jobs[:n] {
		if err := e.Admit(jb, 0); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		b.Fatal(err)
	}
	return e, jobs[n:]
}

// BenchmarkPlan is one round boundary for 1,000 active jobs on 500 nodes:
// each iteration one job completes and one arrives (so allocation
// policies solve again), every job reports progress, and the engine plans
// and diffs.
func BenchmarkPlan(b *testing.B) {
	for _, policy := range []string{"gavel-maxmin", "hadar", "hadare"} {
		b.Run(fmt.Sprintf("policy=%s/jobs=1000/nodes=500", policy), func(b *testing.B) {
			e, more := loaded(b, policy, 1000)
			ctx := context.Background()
			now := 0.0
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				now += 360
				js := e.Jobs()
				for _, st := range js {
					if st.Running {
						if err := e.Progress(st.Job.ID, st.Done+1, now); err != nil {
							b.Fatal(err)
						}
					}
				}
				turnover(ctx, b, e, js[0].Job.ID, more, i, now)
			}
		})
	}
}

// turnover is one iteration's change at a boundary: job done completes,
// the i-th arrival of more is admitted, and the engine plans.
func turnover(ctx context.Context, b *testing.B, e *engine.Engine, done string, more []planner.Job, i int, now float64) {
	b.Helper()
	if err := e.Complete(done, now); err != nil {
		b.Fatal(err)
	}
	jb := more[i%len(more)]
	jb.ID = fmt.Sprintf("%s-%d", jb.ID, i)
	if err := e.Admit(jb, now); err != nil {
		b.Fatal(err)
	}
	if _, err := e.Plan(ctx, now, engine.Boundary); err != nil {
		b.Fatal(err)
	}
}

// rounds runs b's iterations as round boundaries of e, each with one job
// completed and one of more admitted, so that every policy decides again.
func rounds(b *testing.B, e *engine.Engine, more []planner.Job) {
	b.Helper()
	ctx := context.Background()
	now := 0.0
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		now += 360
		turnover(ctx, b, e, e.Jobs()[0].Job.ID, more, i, now)
	}
}

// BenchmarkSiaDecision is one round boundary of Sia (planner/sia) beside
// Hadar's and Gavel's max-min on 64, 512 and 2,048 GPUs, with as many
// active jobs as half the GPUs (about one GPU asked per GPU held): each
// iteration one job completes and one arrives, so every policy decides
// again. The jobs=elastic variants run the same rounds with every job
// elastic (trace.MakeElastic at fraction 1) for sia and hadar
// (docs/results.md, "Decision time, rigid and elastic").
func BenchmarkSiaDecision(b *testing.B) {
	type variant struct {
		policy  string
		elastic bool
	}
	variants := []variant{{"sia", false}, {"hadar", false}, {"gavel-maxmin", false}, {"sia", true}, {"hadar", true}}
	for _, gpus := range []int{64, 512, 2048} {
		for _, v := range variants {
			name := fmt.Sprintf("gpus=%d/policy=%s", gpus, v.policy)
			if v.elastic {
				name += "/jobs=elastic"
			}
			b.Run(name, func(b *testing.B) {
				e, more := loadedJobs(b, v.policy, gpus/2, clusterOf(gpus), v.elastic)
				rounds(b, e, more)
			})
		}
	}
}

// BenchmarkHadarProgram is one round boundary of hadar's configuration
// program at its largest: 150 active jobs, all elastic where their model
// allows (a round of more is a backlog, planned by Sia's program), on
// 64, 512 and 2,048 GPUs (docs/results.md, "Decision time, rigid and
// elastic").
func BenchmarkHadarProgram(b *testing.B) {
	for _, gpus := range []int{64, 512, 2048} {
		b.Run(fmt.Sprintf("gpus=%d/jobs=150", gpus), func(b *testing.B) {
			e, more := loadedJobs(b, "hadar", 150, clusterOf(gpus), true)
			rounds(b, e, more)
		})
	}
}

// BenchmarkSnapshot saves and restores the state of BenchmarkPlan.
func BenchmarkSnapshot(b *testing.B) {
	for _, policy := range []string{"gavel-maxmin", "hadar", "hadare"} {
		e, _ := loaded(b, policy, 1000)
		data, err := e.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("policy=%s/save", policy), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Snapshot(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(data)), "bytes")
		})
		b.Run(fmt.Sprintf("policy=%s/restore", policy), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				est, _ := engine.NewEstimates(profile.Default(), engine.LearnConfig{})
				model := speed.Model{Profile: est}
				s, err := registry.New(policy, registry.Options{Types: []planner.GPUType{"k80", "p100", "v100"}, Speed: model, RestartCost: 20, MergeCost: 10})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := engine.Restore(data, engine.Config{Speed: model}, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var _ round.Scheduler = (*scripted)(nil)
