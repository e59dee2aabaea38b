package queue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
)

const model = "ResNet-18 (batch size 16)"

// fleet is an engine on the cluster spec with the queues of qc over
// policy, and a minimum run time of 30 minutes.
type fleet struct {
	t     *testing.T
	e     *engine.Engine
	s     *queue.Scheduler
	speed speed.Model
}

func newFleet(t *testing.T, spec string, qc queue.Config, policy string) *fleet {
	t.Helper()
	cl, err := planner.ParseClusterSpec(spec, 4)
	if err != nil {
		t.Fatal(err)
	}
	m := speed.Model{Profile: profile.Default()}
	s, err := registry.BuildQueues(qc, policy, placement.Pack, registry.Options{Types: cl.Types(), Speed: m, MinRunTime: 1800}, placement.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Round: 360, Speed: m, MinRunTime: 1800}, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetNodes(cl.Nodes, 0); err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, e: e, s: s, speed: m}
}

func (f *fleet) admit(now float64, q string, n, sf int, prio int) []string {
	f.t.Helper()
	var ids []string
	for range n {
		id := fmt.Sprintf("%s-%d", q, f.e.Active())
		for {
			if _, ok := f.e.Job(id); !ok {
				break
			}
			id += "x"
		}
		if err := f.e.Admit(planner.Job{ID: id, Model: model, ScaleFactor: sf, TotalSteps: 1e9, Weight: 1, Arrival: now, Queue: q, Priority: prio}, now); err != nil {
			f.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func (f *fleet) plan(now float64, kind engine.Kind) engine.Decision {
	f.t.Helper()
	d, err := f.e.Plan(context.Background(), now, kind)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(d.Repairs) > 0 {
		f.t.Fatalf("t=%.0f: the engine repaired the queues' answer: %+v", now, d.Repairs)
	}
	return d
}

// gpus counts the GPUs each queue's jobs hold.
func (f *fleet) gpus() map[string]int {
	out := map[string]int{}
	for _, j := range f.e.Jobs() {
		out[j.Job.Queue] += j.Placement.GPUs()
	}
	return out
}

func actions(d engine.Decision, ids []string) map[engine.Action]int {
	out := map[engine.Action]int{}
	for _, jd := range d.Jobs {
		for _, id := range ids {
			if jd.Job == id {
				out[jd.Action]++
			}
		}
	}
	return out
}

func queueStatus(t *testing.T, s *queue.Scheduler, name string) queue.QueueStatus {
	t.Helper()
	for _, q := range s.Status().Queues {
		if q.Name == name {
			return q
		}
	}
	t.Fatalf("no queue %s in %+v", name, s.Status().Queues)
	return queue.QueueStatus{}
}

func twoTeams(reclaimAfter float64) queue.Config {
	return queue.Config{Queues: []queue.Queue{
		{Name: "a", Weight: 1},
		{Name: "b", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 4}, ReclaimAfter: reclaimAfter},
	}}
}

// Team a borrows every GPU; team b submits mid-round: b waits for the
// reclaim, and at the next round boundary a's newest jobs stop although
// they are within their minimum run time, and b runs its guarantee.
func TestReclaimWithinOneRound(t *testing.T) {
	for _, policy := range []string{"fifo", "gavel-maxmin", "hadar"} {
		t.Run(policy, func(t *testing.T) {
			f := newFleet(t, "v100=8", twoTeams(0), policy)
			a := f.admit(0, "a", 8, 1, 0)
			f.plan(0, engine.Boundary)
			if g := f.gpus(); g["a"] != 8 {
				t.Fatalf("a holds %d GPUs of 8 idle ones, want all: borrowing b's guarantee", g["a"])
			}
			b := f.admit(100, "b", 2, 2, 0)
			f.plan(100, engine.Fill)
			for _, id := range b {
				js := f.s.Status().Jobs[id]
				if js.Code != queue.ReasonReclaim {
					t.Fatalf("b's job %s waits with %+v, want code %s", id, js, queue.ReasonReclaim)
				}
				if j, _ := f.e.Job(id); !strings.Contains(j.Reason.Why, "waiting for reclaim") {
					t.Fatalf("b's job %s explains %q", id, j.Reason.Why)
				}
			}
			d := f.plan(360, engine.Boundary)
			if got := actions(d, b); got[engine.Start] != 2 {
				t.Fatalf("b's jobs at the boundary: %v, want 2 starts", got)
			}
			if got := actions(d, a); got[engine.Stop] != 4 || got[engine.Keep] != 4 {
				t.Fatalf("a's jobs at the boundary: %v, want 4 stopped (reclaimed), 4 kept", got)
			}
			if g := f.gpus(); g["b"] != 4 || g["a"] != 4 {
				t.Fatalf("after the reclaim: %v, want a 4, b 4", g)
			}
			qa := queueStatus(t, f.s, "a")
			if qa.Reclaimed != 4 || qa.Borrowed["v100"] != 4 || qa.Admitted != 4 || qa.Pending != 4 {
				t.Fatalf("queue a's status %+v: want 4 reclaimed, 4 borrowed, 4 admitted, 4 pending", qa)
			}
			qb := queueStatus(t, f.s, "b")
			if qb.Used["v100"] != 4 || qb.Guarantee["v100"] != 4 || qb.Borrowed["v100"] != 0 {
				t.Fatalf("queue b's status %+v", qb)
			}
			stopped := 0
			for _, id := range a {
				if js := f.s.Status().Jobs[id]; js.Code == queue.ReasonReclaimed {
					stopped++
				}
			}
			if stopped != 4 {
				t.Fatalf("%d of a's jobs say they were reclaimed, want 4", stopped)
			}
		})
	}
}

// reclaim_after bounds how long a borrower keeps the GPUs once their
// owner wants them, below the minimum run time; above it, the minimum run
// time holds.
func TestReclaimAfterBoundsTheMinimumRunTime(t *testing.T) {
	for _, c := range []struct {
		after float64
		// at is the boundary at which b gets its guarantee.
		at float64
	}{
		{0, 360},
		{900, 1080},  // a's jobs have run 1080 s >= 900 there
		{7200, 1800}, // the minimum run time (1800 s) is reached first
	} {
		t.Run(fmt.Sprint(c.after), func(t *testing.T) {
			f := newFleet(t, "v100=8", twoTeams(c.after), "fifo")
			f.admit(0, "a", 8, 1, 0)
			f.plan(0, engine.Boundary)
			f.admit(100, "b", 1, 4, 0)
			f.plan(100, engine.Fill)
			for now := 360.0; now <= 2160; now += 360 {
				f.plan(now, engine.Boundary)
				got := f.gpus()["b"]
				switch {
				case now < c.at && got != 0:
					t.Fatalf("t=%.0f: b holds %d GPUs before a's jobs may be preempted (at %.0f)", now, got, c.at)
				case now >= c.at && got != 4:
					t.Fatalf("t=%.0f: b holds %d GPUs, want its guarantee of 4", now, got)
				}
			}
		})
	}
}

// Without guarantees, what the queues want is shared by weight; a queue
// above its share yields only after the minimum run time of its jobs.
func TestFairSharingByWeight(t *testing.T) {
	qc := queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}}
	f := newFleet(t, "v100=8", qc, "fifo")
	f.admit(0, "a", 8, 1, 0)
	f.plan(0, engine.Boundary)
	b := f.admit(10, "b", 8, 1, 0)
	f.plan(10, engine.Fill)
	f.plan(360, engine.Boundary)
	if g := f.gpus(); g["a"] != 8 {
		t.Fatalf("t=360: %v: a's jobs are within their minimum run time, want a keeping 8", g)
	}
	if js := f.s.Status().Jobs[b[0]]; js.Code != queue.ReasonFairShare && js.Code != queue.ReasonMinRun {
		t.Fatalf("b's job waits with %+v", js)
	}
	f.plan(1800, engine.Boundary)
	if g := f.gpus(); g["a"] != 6 || g["b"] != 2 {
		t.Fatalf("t=1800: %v, want a 6 and b 2 (weights 3:1)", g)
	}
	if qa := queueStatus(t, f.s, "a"); qa.FairSharePreempted != 2 || qa.Reclaimed != 0 {
		t.Fatalf("queue a: %+v, want 2 preempted for fair sharing", qa)
	}
}

// A queue at its limit waits, with that reason, while GPUs idle.
func TestLimitHoldsWhileGPUsIdle(t *testing.T) {
	qc := queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1, Limit: map[planner.GPUType]int{"v100": 2}}}}
	f := newFleet(t, "v100=8", qc, "gavel-maxmin")
	ids := f.admit(0, "a", 4, 1, 0)
	f.plan(0, engine.Boundary)
	if g := f.gpus(); g["a"] != 2 {
		t.Fatalf("a holds %d GPUs, want its limit 2", g["a"])
	}
	limited := 0
	for _, id := range ids {
		if js := f.s.Status().Jobs[id]; js.Code == queue.ReasonAtLimit {
			limited++
			if j, _ := f.e.Job(id); !strings.Contains(j.Reason.Why, "at its limit (v100 2 of 2)") {
				t.Fatalf("reason %q", j.Reason.Why)
			}
		}
	}
	if limited != 2 {
		t.Fatalf("%d jobs wait at the limit, want 2", limited)
	}
}

// spy records the weights and priorities its inner scheduler is shown.
type spy struct {
	round.Scheduler
	seen map[string]float64
	ids  []string
}

func (s *spy) Schedule(v *round.View) ([]planner.Placement, error) {
	s.ids = s.ids[:0]
	for _, j := range v.Jobs {
		s.seen[j.ID] = j.Weight
		s.ids = append(s.ids, j.ID)
	}
	return s.Scheduler.Schedule(v)
}

func TestJobWeightIsClampedToTheQueueCap(t *testing.T) {
	sp := &spy{seen: map[string]float64{}}
	factory := func(policy string) (round.Scheduler, error) {
		s, err := registry.New(policy, registry.Options{Types: []planner.GPUType{"v100"}, Speed: speed.Model{Profile: profile.Default()}})
		sp.Scheduler = s
		return sp, err
	}
	qc := queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1, MaxJobWeight: 10}}}
	s, err := queue.New(qc, queue.Options{Default: "gavel-maxmin", Factory: factory})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Round: 360, Speed: speed.Model{Profile: profile.Default()}}, s)
	if err != nil {
		t.Fatal(err)
	}
	e.SetNodes([]planner.Node{{ID: "n", GPUs: map[planner.GPUType]int{"v100": 4}}}, 0)
	for id, w := range map[string]float64{"heavy": 50, "light": 2} {
		if err := e.Admit(planner.Job{ID: id, Model: model, ScaleFactor: 1, TotalSteps: 1e6, Weight: w, Queue: "a"}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Plan(context.Background(), 0, engine.Boundary); err != nil {
		t.Fatal(err)
	}
	if sp.seen["heavy"] != 10 || sp.seen["light"] != 2 {
		t.Fatalf("the queue's policy saw weights %v, want heavy clamped to 10", sp.seen)
	}
	js := s.Status().Jobs["heavy"]
	if !js.Clamped || js.Weight != 10 {
		t.Fatalf("status %+v, want clamped to 10", js)
	}
	if j, _ := e.Job("heavy"); !strings.Contains(j.Reason.Why, "weight 50 clamped to queue a's cap 10") {
		t.Fatalf("reason %q", j.Reason.Why)
	}
	if j, _ := e.Job("heavy"); j.Job.Weight != 50 {
		t.Fatalf("the engine's job was changed: weight %v", j.Job.Weight)
	}
}

// Nomad's job priority orders jobs inside a queue: higher ones fill its
// share, lower ones wait (and give up their GPUs after the minimum run
// time).
func TestPriorityInsideAQueue(t *testing.T) {
	f := newFleet(t, "v100=4", queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1}}}, "gavel-maxmin")
	low := f.admit(0, "a", 4, 1, 10)
	f.plan(0, engine.Boundary)
	high := f.admit(60, "a", 2, 2, 90)
	f.plan(60, engine.Fill)
	d := f.plan(1800, engine.Boundary)
	if got := actions(d, high); got[engine.Start] != 2 {
		t.Fatalf("high-priority jobs: %v, want both started", got)
	}
	if got := actions(d, low); got[engine.Stop] != 4 {
		t.Fatalf("low-priority jobs: %v, want all stopped", got)
	}
	if js := f.s.Status().Jobs[low[0]]; js.Code != queue.ReasonPriority || js.Priority != 10 {
		t.Fatalf("low job status %+v", js)
	}
}

// A queue's guarantee lent while it is idle keeps the fleet busy: the
// other queue's jobs use every GPU.
func TestIdleGuaranteesAreLent(t *testing.T) {
	qc := queue.Config{Queues: []queue.Queue{
		{Name: "a", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 2, "k80": 2}},
		{Name: "b", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 2, "k80": 2}},
	}}
	f := newFleet(t, "v100=4,k80=4", qc, "fifo")
	f.admit(0, "a", 8, 1, 0)
	f.plan(0, engine.Boundary)
	if g := f.gpus(); g["a"] != 8 {
		t.Fatalf("a holds %d of 8 GPUs with b idle", g["a"])
	}
	if qa := queueStatus(t, f.s, "a"); qa.Borrowed["v100"] != 2 || qa.Borrowed["k80"] != 2 {
		t.Fatalf("a borrows %v, want 2 of each type", qa.Borrowed)
	}
}

// Static partitioning, the baseline: a queue never runs beyond its
// guarantee, even on idle GPUs.
func TestStaticPartitionLendsNothing(t *testing.T) {
	qc := twoTeams(0)
	qc.Queues[0].Guarantee = map[planner.GPUType]int{"v100": 4}
	qc.Static = true
	f := newFleet(t, "v100=8", qc, "fifo")
	f.admit(0, "a", 8, 1, 0)
	f.plan(0, engine.Boundary)
	if g := f.gpus(); g["a"] != 4 {
		t.Fatalf("static: a holds %d GPUs, want its guarantee 4", g["a"])
	}
	if !strings.HasPrefix(f.s.Name(), "static(") {
		t.Fatalf("name %q", f.s.Name())
	}
}

// The queues' state (each queue's scheduler's, the start of every
// placement, the counters) survives an engine snapshot: a restored engine
// decides as the original does.
func TestSnapshotRestoreDecidesAlike(t *testing.T) {
	for _, policy := range []string{"gavel-maxmin", "hadar"} {
		t.Run(policy, func(t *testing.T) {
			f := newFleet(t, "v100=8,k80=8", twoTeams(0), policy)
			f.admit(0, "a", 12, 1, 0)
			f.plan(0, engine.Boundary)
			f.admit(200, "b", 3, 2, 0)
			f.admit(200, "c", 2, 1, 0) // a queue of its own, built on demand
			f.plan(200, engine.Fill)
			f.plan(360, engine.Boundary)
			snap, err := f.e.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			g := newFleet(t, "v100=8,k80=8", twoTeams(0), policy)
			if g.e, err = engine.Restore(snap, engine.Config{Round: 360, Speed: g.speed, MinRunTime: 1800}, g.s); err != nil {
				t.Fatal(err)
			}
			for _, now := range []float64{720, 1080, 1440, 1800, 2160} {
				d1, d2 := f.plan(now, engine.Boundary), g.plan(now, engine.Boundary)
				if fmt.Sprint(d1) != fmt.Sprint(d2) {
					t.Fatalf("t=%.0f: restored engine decided\n%v\nthe original\n%v", now, d2, d1)
				}
			}
			if a, b := queueStatus(t, f.s, "a"), queueStatus(t, g.s, "a"); a.Reclaimed != b.Reclaimed || a.Reclaimed == 0 {
				t.Fatalf("reclaim counters %d and %d", a.Reclaimed, b.Reclaimed)
			}
		})
	}
}

func TestLoadStateIsAllOrNothing(t *testing.T) {
	f := newFleet(t, "v100=8", twoTeams(0), "gavel-maxmin")
	f.admit(0, "a", 8, 1, 0)
	f.plan(0, engine.Boundary)
	good, err := f.s.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		`{}`,
		`{"version":2,"queues":[],"since":[]}`,
		`{"version":1,"queues":[{"name":"a","policy":"gavel-maxmin","epoch":1,"key":"","state":{"x":1}}],"since":[]}`,
		`{"version":1,"queues":[],"since":[{"job":"YQ==","placement":{"Units":null},"at":0}]}`,
		`{"version":1,"queues":[],"since":[],"extra":1}`,
		string(good) + "x",
	} {
		if err := f.s.LoadState([]byte(bad)); err == nil {
			t.Fatalf("loaded %s", bad)
		}
		again, err := f.s.SaveState()
		if err != nil || string(again) != string(good) {
			t.Fatalf("a refused state changed the scheduler:\n%s\n%s", again, good)
		}
	}
	// A queue whose policy changed since starts afresh, not with an error.
	other := newFleet(t, "v100=8", queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1, Policy: "fifo"}, {Name: "b", Weight: 1}}}, "gavel-maxmin")
	if err := other.s.LoadState(good); err != nil {
		t.Fatalf("a changed queue configuration stopped the restore: %v", err)
	}
}

// A node drained under borrowed jobs: they move at the next boundary, the
// queues' shares shrink to the GPUs left, and nothing needs repair.
func TestDrainedNodeUnderQueues(t *testing.T) {
	f := newFleet(t, "v100=12", twoTeams(0), "fifo")
	f.admit(0, "a", 12, 1, 0)
	f.plan(0, engine.Boundary)
	f.admit(50, "b", 2, 2, 0)
	if err := f.e.Drain("v100-0", true, 100); err != nil {
		t.Fatal(err)
	}
	f.plan(100, engine.Fill)
	f.plan(360, engine.Boundary)
	for _, j := range f.e.Jobs() {
		for _, u := range j.Placement.Units {
			for _, sl := range u.Slots {
				if sl.Node == "v100-0" {
					t.Fatalf("job %s still on the drained node", j.Job.ID)
				}
			}
		}
	}
	if g := f.gpus(); g["b"] != 4 || g["a"] != 4 {
		t.Fatalf("after the drain: %v, want b its 4, a the 4 left", g)
	}
}

// Every policy runs inside queues, Hadar's and HadarE's stateful
// calendars and the locality-aware placers included: a two-team run
// completes without an answer the engine must repair (the simulator stops
// at the first).
func TestEveryPolicyRunsInsideQueues(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a policy and placement pair at a time")
	}
	cl, err := planner.ParseClusterSpec("v100=8,p100=8,k80=8", 4)
	if err != nil {
		t.Fatal(err)
	}
	jobs := teamJobs(t, []team{{"flood", 40, 0, 0, 1}, {"burst", 12, 20, 6 * 3600, 2}})
	qc := queue.Config{Queues: []queue.Queue{
		{Name: "flood", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 4, "p100": 4, "k80": 4}},
		{Name: "burst", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 4, "p100": 4, "k80": 4}},
	}}
	m := speed.Model{Profile: profile.Default()}
	for _, policy := range []string{"fifo", "gavel-maxmin", "gavel-makespan", "hadar", "hadare"} {
		for _, place := range []string{placement.Pack, placement.Delay} {
			t.Run(policy+"+"+place, func(t *testing.T) {
				o := registry.Options{Types: cl.Types(), Speed: m, RestartCost: 20, MergeCost: 10, MinRunTime: 1800}
				s, err := registry.BuildQueues(qc, policy, place, o, placement.Config{Speed: m, Seed: 1, RestartCost: 20})
				if err != nil {
					t.Fatal(err)
				}
				res, err := sim.Run(context.Background(), sim.Config{Cluster: cl, Jobs: jobs, Speed: m, RestartCost: 20, MergeCost: 10, MinRunTime: 1800, Queues: qc}, s)
				if err != nil {
					t.Fatal(err)
				}
				if res.Completed != len(jobs) || len(res.Queues) != 2 {
					t.Fatalf("%d of %d jobs, queues %+v", res.Completed, len(jobs), res.Queues)
				}
			})
		}
	}
}

// A queue's max_min_run_time caps its jobs' own minimum run time: a job
// whose author asked for 720h yields its queue's fair share once the cap
// has passed, and its queue's policy is shown the capped value.
func TestMaxMinRunTimeCapsAQueuesJobs(t *testing.T) {
	qc := queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1, MaxMinRunTime: 720}, {Name: "b", Weight: 3}}}
	f := newFleet(t, "v100=8", qc, "fifo")
	for k := range 8 {
		if err := f.e.Admit(planner.Job{ID: fmt.Sprint("a-", k), Model: model, ScaleFactor: 1, TotalSteps: 1e9, Weight: 1, Queue: "a", MinRunTime: 720 * 3600}, 0); err != nil {
			t.Fatal(err)
		}
	}
	f.plan(0, engine.Boundary)
	f.admit(10, "b", 8, 1, 0)
	f.plan(10, engine.Fill)
	f.plan(360, engine.Boundary)
	if g := f.gpus(); g["a"] != 8 {
		t.Fatalf("t=360: %v: a's jobs are within the capped minimum run time, want a keeping 8", g)
	}
	if b, ok := f.s.MinRunBound("a-0"); !ok || b != 720 {
		t.Fatalf("the engine's bound on a-0: %v %v, want 720 s", b, ok)
	}
	f.plan(720, engine.Boundary)
	if g := f.gpus(); g["a"] != 2 || g["b"] != 6 {
		t.Fatalf("t=720: %v, want a 2 and b 6 (weights 1:3) once a's jobs ran their capped 720 s", g)
	}
}

// One team's backlog is its own: hadar inside queues counts its queue's
// jobs, so team a's 151 jobs (one elastic) make a's rounds the
// primal-dual's, while team b's elastic jobs stay the configuration
// program's (docs/policies.md, "The configuration program for elastic
// rounds").
func TestABacklogIsItsQueues(t *testing.T) {
	f := newFleet(t, "v100=8,p100=8", twoTeams(0), "hadar")
	f.admit(0, "a", 150, 1, 0)
	for _, id := range []string{"a-elastic", "b-0", "b-1", "b-2"} {
		q := id[:1]
		if err := f.e.Admit(planner.Job{ID: id, Model: model, ScaleFactor: 1, Widths: []int{1, 2, 4}, TotalSteps: 1e6, Weight: 1, Queue: q}, 0); err != nil {
			t.Fatal(err)
		}
	}
	d := f.plan(0, engine.Boundary)
	seen := 0
	for _, jd := range d.Jobs {
		byProgram := strings.Contains(jd.Reason.Why, "configuration program")
		switch {
		case jd.Job == "a-elastic" && byProgram:
			t.Errorf("team a's elastic job, in a backlog of 151 jobs, planned by the configuration program: %q", jd.Reason.Why)
		case strings.HasPrefix(jd.Job, "b-"):
			seen++
			if !byProgram {
				t.Errorf("team b's elastic job %s not planned by the configuration program beside team a's backlog: %q", jd.Job, jd.Reason.Why)
			}
		}
	}
	if seen != 3 {
		t.Fatalf("decisions for %d of team b's 3 jobs: %+v", seen, d.Jobs)
	}
}
