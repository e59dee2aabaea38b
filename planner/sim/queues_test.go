package sim_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Team a floods 8 V100s at t=0; team b, guaranteed 4 of them, submits at
// t=1000. Flat, b waits for a's jobs to end; with queues, b gets its
// guarantee back at the next round boundary (t=1080).
func TestPerQueueResults(t *testing.T) {
	cl := cluster(t, "v100=8")
	var jobs []planner.Job
	for i := range 8 {
		jobs = append(jobs, planner.Job{ID: fmt.Sprintf("a%d", i), Model: "ResNet-18 (batch size 16)", ScaleFactor: 1, TotalSteps: 500000, Weight: 1, Queue: "a"})
	}
	for i := range 2 {
		jobs = append(jobs, planner.Job{ID: fmt.Sprintf("b%d", i), Model: "ResNet-18 (batch size 16)", ScaleFactor: 2, TotalSteps: 200000, Weight: 1, Arrival: 1000, Queue: "b"})
	}
	qc := queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1}, {Name: "b", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 4}}}}
	m := speed.Model{Profile: profile.Default()}
	o := registry.Options{Types: cl.Types(), Speed: m, RestartCost: 20, MinRunTime: 1800}
	run := func(s round.Scheduler) sim.Result {
		t.Helper()
		res, err := sim.Run(context.Background(), sim.Config{Cluster: cl, Jobs: jobs, Speed: m, RestartCost: 20, MinRunTime: 1800, Queues: qc}, s)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Queues) != 2 || res.Queues[0].Queue != "a" || res.Queues[1].Queue != "b" || res.Queues[0].Jobs != 8 || res.Queues[1].Completed != 2 {
			t.Fatalf("per-queue results %+v", res.Queues)
		}
		total := 0.0
		for _, j := range res.Jobs {
			total += j.GPUSeconds
		}
		if got := res.Queues[0].GPUSeconds + res.Queues[1].GPUSeconds; math.Abs(got-total) > 1e-6 {
			t.Fatalf("queues' GPU time %v, jobs' %v", got, total)
		}
		if g := res.Queues[1].GuaranteedGPUSeconds; math.Abs(g-4*res.Makespan) > 1e-6 || res.Queues[0].GuaranteedGPUSeconds != 0 {
			t.Fatalf("guaranteed GPU time %v and %v, want 0 and 4 x makespan %v", res.Queues[0].GuaranteedGPUSeconds, g, res.Makespan)
		}
		if !(res.BusyWhileWaiting > 0 && res.BusyWhileWaiting <= 1) {
			t.Fatalf("busy while waiting %v", res.BusyWhileWaiting)
		}
		return res
	}
	flatSched, err := registry.New("fifo", o)
	if err != nil {
		t.Fatal(err)
	}
	flat := run(flatSched)
	qs, err := registry.BuildQueues(qc, "fifo", placement.Pack, o, placement.Config{})
	if err != nil {
		t.Fatal(err)
	}
	queued := run(qs)
	if b := flat.Queues[1]; b.LongestReclaimWaitS < 10000 {
		t.Fatalf("flat FIFO: b waited on a's borrowed GPUs at most %.0f s, want until a's jobs end", b.LongestReclaimWaitS)
	}
	if b := queued.Queues[1]; b.LongestReclaimWaitS != 80 || b.BelowGuaranteeS != 80 {
		t.Fatalf("queues: b waited %.0f s on a's borrowed GPUs (%.0f s below its guarantee), want 80 s: until the boundary at 1080 s", b.LongestReclaimWaitS, b.BelowGuaranteeS)
	}
	if !(queued.QueueFairness > flat.QueueFairness) || queued.QueueFairness < 0.99 {
		t.Fatalf("Jain's index %.3f with queues, %.3f flat", queued.QueueFairness, flat.QueueFairness)
	}
	if queued.Queues[1].AvgJCT >= flat.Queues[1].AvgJCT {
		t.Fatalf("b's average JCT %.0f s with queues, %.0f s flat", queued.Queues[1].AvgJCT, flat.Queues[1].AvgJCT)
	}
	// Without queues anywhere, nothing is measured per queue.
	for i := range jobs {
		jobs[i].Queue = ""
	}
	qc = queue.Config{}
	s, _ := registry.New("fifo", o)
	res, err := sim.Run(context.Background(), sim.Config{Cluster: cl, Jobs: jobs, Speed: m}, s)
	if err != nil {
		t.Fatal(err)
	}
	if res.Queues != nil || res.QueueFairness != 0 {
		t.Fatalf("a run without queues measured %+v", res.Queues)
	}
}
