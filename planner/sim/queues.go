package sim

import (
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
)

// QueueResult is one queue's (team's) outcome: what its jobs got against
// what it was guaranteed and what a fair division would have given it.
type QueueResult struct {
	Queue     string
	Jobs      int
	Completed int
	AvgJCT    float64
	// GPUSeconds is the GPU time its jobs held; GuaranteedGPUSeconds its
	// guarantee (all types) over the makespan.
	GPUSeconds           float64
	GuaranteedGPUSeconds float64
	// FairGPUSeconds is the GPU time a weighted max-min division of the
	// cluster's GPUs among the queues' demands (the GPUs their active jobs
	// ask for) would have given it, at each instant.
	FairGPUSeconds float64
	// BelowGuaranteeS is the time it spent below its guarantee while it
	// had demand the guarantee covers (a waiting job that fits in the
	// GPUs of a type it runs on that the guarantee leaves after what the
	// queue holds); LongestBelowS the longest such stretch.
	BelowGuaranteeS float64
	LongestBelowS   float64
	// ReclaimWaitS is the part of that time in which such a job, one that
	// never ran yet, needed GPUs other queues held beyond their guarantees
	// (the idle ones were too few): the wait reclaim is there to bound.
	// LongestReclaimWaitS is its longest stretch.
	ReclaimWaitS        float64
	LongestReclaimWaitS float64
}

// queueMeter measures the queues during a run.
type queueMeter struct {
	names  []string
	idx    map[string]int
	guar   [][]int // per queue, per type of the simulation
	weight []float64
	// runs[j][t]: job j (by index in the trace) runs on type t at all.
	runs [][]bool
	acc  []queueAcc
	// busy sums GPU time held, and capacity GPU time, while some job
	// waited (in the snapshot).
	busy busyAcc
}

type busyAcc struct {
	Held     float64 `json:"held_gpu_s"`
	Capacity float64 `json:"capacity_gpu_s"`
}

// queueAcc is what the meter accumulates per queue (in the snapshot).
type queueAcc struct {
	Queue   string  `json:"queue"`
	Below   float64 `json:"below_s"`
	Stretch float64 `json:"stretch_s"`
	Longest float64 `json:"longest_s"`
	Fair    float64 `json:"fair_gpu_s"`
	// The same three for the wait on GPUs lent to other queues.
	Reclaim        float64 `json:"reclaim_s"`
	ReclaimStretch float64 `json:"reclaim_stretch_s"`
	ReclaimLongest float64 `json:"reclaim_longest_s"`
}

func queueName(j planner.Job) string {
	if j.Queue == "" {
		return queue.DefaultName
	}
	return j.Queue
}

// newQueueMeter returns the meter of s, or nil when neither the jobs nor
// the configuration name a queue.
func newQueueMeter(s *simulation) *queueMeter {
	named := len(s.cfg.Queues.Queues) > 0
	for _, js := range s.jobs {
		named = named || js.job.Queue != ""
	}
	if !named {
		return nil
	}
	m := &queueMeter{idx: map[string]int{}}
	add := func(name string) {
		if _, ok := m.idx[name]; !ok {
			m.idx[name] = len(m.names)
			m.names = append(m.names, name)
		}
	}
	for _, q := range s.cfg.Queues.Queues {
		add(q.Name)
	}
	var rest []string
	for _, js := range s.jobs {
		if _, ok := m.idx[queueName(js.job)]; !ok && !slices.Contains(rest, queueName(js.job)) {
			rest = append(rest, queueName(js.job))
		}
	}
	slices.Sort(rest)
	for _, n := range rest {
		add(n)
	}
	for _, n := range m.names {
		q, ok := s.cfg.Queues.Find(n)
		if !ok {
			q = queue.Queue{Name: n, Weight: 1}
		}
		g := make([]int, len(s.types))
		for k, t := range s.types {
			g[k] = q.Guarantee[t]
		}
		m.guar = append(m.guar, g)
		m.weight = append(m.weight, q.Weight)
		m.acc = append(m.acc, queueAcc{Queue: n})
	}
	m.runs = make([][]bool, len(s.jobs))
	for i, js := range s.jobs {
		m.runs[i] = make([]bool, len(s.types))
		for k, t := range s.types {
			tp, err := s.cfg.Speed.Profile.Throughput(js.job.Model, js.job.ScaleFactor, t, false)
			m.runs[i][k] = err == nil && tp > 0
		}
	}
	return m
}

// observe accounts dt seconds of the cluster as it is now.
func (m *queueMeter) observe(s *simulation, dt float64) {
	if dt <= 0 {
		return
	}
	nq, nt := len(m.names), len(s.types)
	held := make([][]int, nq)
	for q := range held {
		held[q] = make([]int, nt)
	}
	want := make([]float64, nq)
	anyWaits := false
	for _, js := range s.active {
		anyWaits = anyWaits || !js.running
		q := m.idx[queueName(js.job)]
		want[q] += float64(js.job.ScaleFactor)
		for _, u := range js.placement.Units {
			for _, sl := range u.Slots {
				held[q][s.typeIndex[sl.Type]] += sl.Count
			}
		}
	}
	// Idle GPUs per type, and those each queue holds beyond its
	// guarantee.
	idle := make([]int, nt)
	for t, ty := range s.types {
		idle[t] = int(s.capacity[ty])
		for q := range nq {
			idle[t] -= held[q][t]
		}
	}
	lent := make([]int, nt)
	for q := range nq {
		for t := range nt {
			lent[t] += max(0, held[q][t]-m.guar[q][t])
		}
	}
	below := make([]bool, nq)
	reclaim := make([]bool, nq)
	for _, js := range s.active {
		if js.running {
			continue
		}
		q := m.idx[queueName(js.job)]
		sf := js.job.ScaleFactor
		// It waits on lent GPUs when, on no type where it fits in the
		// guarantee left, the idle GPUs could hold it, and on some the
		// GPUs other queues borrow would.
		onIdle, onLent := false, false
		for t := range nt {
			if !m.runs[js.idx][t] || sf > m.guar[q][t]-held[q][t] {
				continue
			}
			below[q] = true
			others := lent[t] - max(0, held[q][t]-m.guar[q][t])
			onIdle = onIdle || idle[t] >= sf
			onLent = onLent || idle[t]+others >= sf
		}
		// Only a job that never started counts: one its own queue's
		// policy stopped to run another (time-slicing) waits by that
		// policy's choice, not for a reclaim.
		if onLent && !onIdle && !js.started {
			reclaim[q] = true
		}
	}
	for q := range nq {
		a := &m.acc[q]
		a.Below, a.Stretch, a.Longest = stretch(below[q], dt, a.Below, a.Stretch, a.Longest)
		a.Reclaim, a.ReclaimStretch, a.ReclaimLongest = stretch(reclaim[q], dt, a.Reclaim, a.ReclaimStretch, a.ReclaimLongest)
	}
	total := 0.0
	for _, c := range s.capacity {
		total += c
	}
	if anyWaits {
		for q := range nq {
			for t := range nt {
				m.busy.Held += float64(held[q][t]) * dt
			}
		}
		m.busy.Capacity += total * dt
	}
	for q, f := range waterFill(want, m.weight, total) {
		m.acc[q].Fair += f * dt
	}
}

// stretch adds dt to a total, a running stretch and the longest stretch
// while on, and ends the stretch when not.
func stretch(on bool, dt, total, cur, longest float64) (float64, float64, float64) {
	if !on {
		return total, 0, longest
	}
	return total + dt, cur + dt, math.Max(longest, cur+dt)
}

// waterFill divides total among demands by weight, max-min fair: no one
// gets more than it wants, and what one leaves goes to the others.
func waterFill(want, weight []float64, total float64) []float64 {
	out := make([]float64, len(want))
	open := make([]bool, len(want))
	n := 0
	for q, w := range want {
		if w > 0 {
			open[q] = true
			n++
		}
	}
	for n > 0 && total > 1e-9 {
		wsum := 0.0
		for q := range want {
			if open[q] {
				wsum += weight[q]
			}
		}
		level := total / wsum
		capped := false
		for q := range want {
			if open[q] && want[q]-out[q] <= level*weight[q]+1e-12 {
				total -= want[q] - out[q]
				out[q] = want[q]
				open[q] = false
				n--
				capped = true
			}
		}
		if !capped {
			for q := range want {
				if open[q] {
					out[q] += level * weight[q]
				}
			}
			break
		}
	}
	return out
}

// results turns the meter into per-queue results, Jain's fairness index
// across queues of GPU time received over fair GPU time, and the share of
// the GPUs held while some job waited.
func (m *queueMeter) results(jobs []*jobState, makespan float64) ([]QueueResult, float64, float64) {
	out := make([]QueueResult, len(m.names))
	jct := make([]float64, len(m.names))
	for q, n := range m.names {
		a := m.acc[q]
		out[q] = QueueResult{Queue: n, FairGPUSeconds: a.Fair, BelowGuaranteeS: a.Below, LongestBelowS: a.Longest, ReclaimWaitS: a.Reclaim, LongestReclaimWaitS: a.ReclaimLongest}
		for _, g := range m.guar[q] {
			out[q].GuaranteedGPUSeconds += float64(g) * makespan
		}
	}
	for _, js := range jobs {
		q := m.idx[queueName(js.job)]
		out[q].Jobs++
		out[q].GPUSeconds += js.gpuSeconds
		if js.done {
			out[q].Completed++
			jct[q] += js.finish - js.job.Arrival
		}
	}
	var xs []float64
	for q := range out {
		if out[q].Completed > 0 {
			out[q].AvgJCT = jct[q] / float64(out[q].Completed)
		}
		if out[q].FairGPUSeconds > 0 {
			xs = append(xs, out[q].GPUSeconds/out[q].FairGPUSeconds)
		}
	}
	busy := 0.0
	if m.busy.Capacity > 0 {
		busy = m.busy.Held / m.busy.Capacity
	}
	return out, Jain(xs), busy
}

// Jain is Jain's fairness index of xs: (sum x)^2 / (n sum x^2), 1 when all
// are equal, 1/n when one has everything (0 for none).
func Jain(xs []float64) float64 {
	sum, sq := 0.0, 0.0
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}
