package hadar

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

// why is job id's reason in v.
func why(v *round.View, id string) string {
	for i, jb := range v.Jobs {
		if jb.ID == id {
			return v.Reasons[i].Why
		}
	}
	return ""
}

// A running job is preempted only when the job that takes its GPUs gains
// more completion time than the running job loses (restart included),
// and never within its minimum run time; the reasons carry the
// arithmetic.
func TestPreemptionPaysForItself(t *testing.T) {
	const rate = 10.0
	round := 360.0
	for _, tc := range []struct {
		name     string
		kRounds  float64 // the newcomer's work, in rounds on the V100s
		at       float64 // when it arrives (the long job started at 0)
		minRun   float64
		preempts bool
	}{
		{"a much shorter job preempts", 10, 6 * round, 1800, true},
		{"a longer job waits", 120, 6 * round, 1800, false},
		{"not within the minimum run time", 10, 2 * round, 1800, false},
		{"no minimum run time", 10, 2 * round, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBench(t, node("v0", "v100", 4))
			b.prof["long"] = map[planner.GPUType]float64{"v100": rate}
			b.prof["k"] = map[planner.GPUType]float64{"v100": rate}
			s := b.sched(Config{RestartCost: 20, MinRunTime: tc.minRun})
			long := tj{"long", 4, rate * round * 100}
			first := b.run(s, b.view(0, false, nil, long))
			if len(first["long"].Units) != 1 {
				t.Fatalf("the long job was not placed: %v", first)
			}
			long.rem -= rate * tc.at
			k := tj{"k", 4, rate * round * tc.kRounds}
			v := b.view(tc.at, false, first, long, k)
			got := b.run(s, v)
			if took := len(got["k"].Units) == 1; took != tc.preempts {
				t.Fatalf("k placed=%v, want %v (k: %s; long: %s)", took, tc.preempts, why(v, "k"), why(v, "long"))
			}
			if !tc.preempts {
				if !got["long"].Units[0].Equal(first["long"].Units[0]) {
					t.Fatalf("long moved to %v", got["long"])
				}
				return
			}
			if len(got["long"].Units) != 0 {
				t.Fatalf("long still runs on %v beside k", got["long"])
			}
			if w := why(v, "k"); !strings.Contains(w, "preempts long") || !strings.Contains(w, "a gain of") {
				t.Fatalf("k's reason %q lacks the arithmetic", w)
			}
			if w := why(v, "long"); !strings.Contains(w, "preempted for k") {
				t.Fatalf("long's reason %q does not name k", w)
			}
		})
	}
}

// A job postponed for GPUs that free later starts now on idle slower ones
// only when that finishes it sooner: with a restart cost and a minimum run
// time that would hold it on GPUs twenty times slower, it waits and says
// what for; when starting costs nothing, it runs there until its committed
// schedule starts.
func TestPostponedJobUsesIdleGPUsOnlyWhenItPays(t *testing.T) {
	for _, tc := range []struct {
		name            string
		restart, minRun float64
		starts          bool
	}{
		{"restart and minimum run time", 20, 1800, false},
		{"free starts", 0, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBench(t, node("v0", "v100", 4), node("k0", "k80", 4))
			b.prof["a"] = map[planner.GPUType]float64{"v100": 10}
			b.prof["b"] = map[planner.GPUType]float64{"v100": 10, "k80": 0.5}
			a := tj{"a", 4, 10 * 360 * 1.5} // two rounds left
			bj := tj{"b", 4, 10 * 360 * 40}
			s := b.sched(Config{RestartCost: tc.restart, MinRunTime: tc.minRun})
			first := b.run(s, b.view(0, false, nil, a))
			v := b.view(0, true, first, a, bj)
			got := b.run(s, v)
			r := s.jobs["b"]
			if len(r.Segs) == 0 || r.Segs[len(r.Segs)-1].Unit.Slots[0].Type != "v100" {
				t.Fatalf("b's schedule %+v: want the v100s once a is done", r.Segs)
			}
			if started := len(got["b"].Units) == 1; started != tc.starts {
				t.Fatalf("b started=%v, want %v: %s", started, tc.starts, why(v, "b"))
			}
			w := why(v, "b")
			if tc.starts && !strings.Contains(w, "starts now on idle GPUs") {
				t.Fatalf("b's reason %q", w)
			}
			if !tc.starts && !strings.Contains(w, "waits for its committed GPUs") {
				t.Fatalf("b's reason %q does not say what it waits for", w)
			}
		})
	}
}

// A running job moves to faster idle GPUs only when the time it saves
// exceeds its restart.
func TestMoveOnlyWhenItSavesMoreThanTheRestart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rounds float64 // work left, in rounds on the K80s
		moves  bool
	}{
		{"nearly done", 0.1, false},
		{"long", 50, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBench(t, node("v0", "v100", 2), node("k0", "k80", 2))
			b.prof["j"] = map[planner.GPUType]float64{"v100": 2, "k80": 1}
			s := b.sched(Config{RestartCost: 60, MinRunTime: -1})
			prev := map[string]planner.Placement{"j": {Units: []planner.Unit{{Slots: []planner.Slot{{Node: "k0", Type: "k80", Count: 2}}}}}}
			v := b.view(360, false, prev, tj{"j", 2, 360 * tc.rounds})
			got := b.run(s, v)
			if moved := typeOf(got["j"]) == "v100"; moved != tc.moves {
				t.Fatalf("moved=%v, want %v: %s", moved, tc.moves, why(v, "j"))
			}
			if w := why(v, "j"); tc.moves && (!strings.Contains(w, "a gain of") || !strings.Contains(w, "restart")) {
				t.Fatalf("j's reason %q lacks the arithmetic of the move", w)
			}
		})
	}
}

// The engine enforces the minimum run time whatever a policy answers and
// repairs what breaks it: Hadar's and HadarE's answers must never need
// that. A wrapper checks, at every plan, that the placements the
// scheduler gave at the previous one are what the jobs hold.
func TestPlansRespectTheMinimumRunTime(t *testing.T) {
	c, err := planner.ParseClusterSpec("v100=8,p100=8,k80=8", 4)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: 60, RatePerHour: 10, Seed: 4, Profile: profile.Default(), Reference: "v100"})
	if err != nil {
		t.Fatal(err)
	}
	model := speed.Model{Profile: profile.Default()}
	// Every job elastic too: a width change is a move the engine holds to
	// the minimum run time as well.
	elastic, err := trace.MakeElastic(jobs, 1, 4, profile.Default().ScaleFactors)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		fork bool
		jobs []planner.Job
		name string
	}{{false, jobs, "rigid"}, {true, jobs, "rigid"}, {false, elastic, "elastic"}, {true, elastic, "elastic"}} {
		fork, jobs := tc.fork, tc.jobs
		t.Run(fmt.Sprintf("fork=%v/%s", fork, tc.name), func(t *testing.T) {
			s, err := New(Config{Speed: model, RestartCost: 20, MergeCost: 10, Fork: fork, MinRunTime: 1800})
			if err != nil {
				t.Fatal(err)
			}
			w := &applied{t: t, inner: s}
			res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: model, RestartCost: 20, MergeCost: 10, MinRunTime: 1800}, w)
			if err != nil {
				t.Fatal(err)
			}
			if res.Completed != len(jobs) {
				t.Fatalf("%d of %d jobs completed", res.Completed, len(jobs))
			}
			if w.checked == 0 {
				t.Fatal("no placement was checked")
			}
			if (w.resized > 0) != (tc.name == "elastic") {
				t.Fatalf("%d placements at a width other than the scale factor", w.resized)
			}
		})
	}
}

// applied is a scheduler wrapper that fails the test when a job does not
// hold, at a plan, the placement the scheduler gave it at the previous one.
type applied struct {
	t       *testing.T
	inner   round.Scheduler
	last    map[string]planner.Placement
	checked int
	// resized counts placements whose first unit is not the job's scale
	// factor wide.
	resized int
}

func (a *applied) Name() string { return a.inner.Name() }

func (a *applied) Schedule(v *round.View) ([]planner.Placement, error) {
	for _, jb := range v.Jobs {
		want, ok := a.last[jb.ID]
		if !ok {
			continue
		}
		got := jb.Placement
		if !sameUnits(got, want) {
			a.t.Fatalf("t=%.0f: job %s holds %v, the scheduler gave it %v", v.Now, jb.ID, got.Units, want.Units)
		}
		a.checked++
	}
	ps, err := a.inner.Schedule(v)
	a.last = map[string]planner.Placement{}
	for i, jb := range v.Jobs {
		if !(v.MidRound && jb.Running) && err == nil {
			a.last[jb.ID] = ps[i]
			if len(ps[i].Units) > 0 && ps[i].Units[0].GPUs() != jb.ScaleFactor {
				a.resized++
			}
		}
	}
	return ps, err
}

func sameUnits(a, b planner.Placement) bool {
	if len(a.Units) != len(b.Units) {
		return false
	}
	for i := range a.Units {
		if !a.Units[i].Equal(b.Units[i]) {
			return false
		}
	}
	return true
}

// A running rigid job moves to idle GPUs (upgrade) only when they are at
// least upgradeSpeedup times faster: a move that gains a little is undone
// as soon as a job of more value wants them. An elastic job's moves are
// weighed as resizes.
func TestMoveToIdleGPUsOnlyWhenMuchFaster(t *testing.T) {
	rigid, elastic := &jobInfo{}, &jobInfo{at: map[int]*widthFigures{}}
	for _, tc := range []struct {
		name string
		ji   *jobInfo
		to   float64 // steps/s there; 1 where it runs
		want bool
	}{
		{"rigid, a fifth faster", rigid, 1.2, false},
		{"rigid, twice as fast", rigid, 2, true},
		{"elastic, a fifth faster", elastic, 1.2, true},
		{"slower", rigid, 0.5, false},
	} {
		if got := fastEnough(tc.ji, 1, tc.to); got != tc.want {
			t.Errorf("%s: fastEnough=%v, want %v", tc.name, got, tc.want)
		}
	}
}

// A running rigid job takes a running job's faster GPUs only when its gain
// exceeds the victim's loss and restartCharge per restart the swap causes
// (the victim's and its own), not merely their 20 s restarts; and it does
// not preempt at all where idle GPUs as fast let it move without stopping
// anyone.
func TestSwapPaysForItsRestarts(t *testing.T) {
	const round = 360.0
	for _, tc := range []struct {
		name     string
		k80      float64 // k's steps/s on the K80s; 10 on the V100s
		idle     bool    // an idle V100 server, and three more held (prices rise: k's plan keeps its K80s)
		preempts bool
	}{
		// k has 25 rounds of work at 10 steps/s: on K80s at 9 it
		// gains 1,000 s by the swap, above the victim's 20 s restart
		// and its own but below two charges.
		{"small gain", 9, false, false},
		{"large gain", 5, false, true},
		{"idle GPUs as fast", 5, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []planner.Node{node("v0", "v100", 4), node("k0", "k80", 4)}
			b := newBench(t)
			on := func(n string, ty planner.GPUType) planner.Placement {
				return planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: n, Type: ty, Count: 4}}}}}
			}
			prev := map[string]planner.Placement{"long": on("v0", "v100"), "k": on("k0", "k80")}
			jobs := []tj{{"long", 4, 10 * round * 100}, {"k", 4, 10 * round * 25}}
			b.prof["long"] = map[planner.GPUType]float64{"v100": 10, "k80": 10}
			b.prof["k"] = map[planner.GPUType]float64{"v100": 10, "k80": tc.k80}
			if tc.idle {
				nodes = append(nodes, node("v1", "v100", 4))
				for _, id := range []string{"l0", "l1", "l2"} {
					nodes = append(nodes, node("n"+id, "v100", 4))
					b.prof[id] = b.prof["long"]
					prev[id] = on("n"+id, "v100")
					jobs = append(jobs, tj{id, 4, 10 * round * 100})
				}
			}
			b.cluster = planner.Cluster{Nodes: nodes}
			s := b.sched(Config{RestartCost: 20, MinRunTime: -1})
			v := b.view(10*round, false, prev, jobs...)
			got := b.run(s, v)
			took := got["k"].Units != nil && got["k"].Units[0].Slots[0].Node == "v0"
			if took != tc.preempts {
				t.Fatalf("k took long's GPUs=%v, want %v (k: %s; long: %s)", took, tc.preempts, why(v, "k"), why(v, "long"))
			}
			if tc.idle && typeOf(got["k"]) != "v100" {
				t.Fatalf("k stays on %v beside idle V100s: %s", got["k"], why(v, "k"))
			}
			if !tc.preempts && !got["long"].Units[0].Equal(prev["long"].Units[0]) {
				t.Fatalf("long moved to %v: %s", got["long"], why(v, "long"))
			}
		})
	}
}
