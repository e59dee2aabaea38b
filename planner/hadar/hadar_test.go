package hadar

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

func testView(t testing.TB, spec string, n int) *round.View {
	t.Helper()
	c, err := planner.ParseClusterSpec(spec, 4)
	if err != nil {
		t.Fatal(err)
	}
	prof := profile.Default()
	jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: n, Seed: 5, Profile: prof, Reference: "v100"})
	if err != nil {
		t.Fatal(err)
	}
	v := &round.View{Now: 0, Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c)}
	for _, ty := range v.Types {
		v.Capacity = append(v.Capacity, float64(c.Capacity(ty)))
	}
	for _, jb := range jobs {
		jv := &round.JobView{Job: jb, Remaining: jb.TotalSteps, Received: make([]float64, len(v.Types))}
		for _, ty := range v.Types {
			x, err := prof.Throughput(jb.Model, jb.ScaleFactor, ty, false)
			if err != nil {
				t.Fatal(err)
			}
			jv.Throughput = append(jv.Throughput, x)
		}
		v.Jobs = append(v.Jobs, jv)
	}
	return v
}

// checkPlacements verifies capacity, widths and that every unit runs.
func checkPlacements(t *testing.T, v *round.View, ps []planner.Placement, model speed.Model, fork bool) {
	t.Helper()
	pool := round.NewPool(v.Cluster)
	for i, p := range ps {
		if !fork && len(p.Units) > 1 {
			t.Fatalf("job %s has %d units without forking", v.Jobs[i].ID, len(p.Units))
		}
		nodes := map[string]bool{}
		for q, u := range p.Units {
			if !pool.Fits(u) {
				t.Fatalf("job %s: unit %v exceeds free capacity", v.Jobs[i].ID, u.Slots)
			}
			pool.Take(u)
			if q == 0 && u.GPUs() != v.Jobs[i].ScaleFactor {
				t.Fatalf("job %s: first unit has %d GPUs, want %d", v.Jobs[i].ID, u.GPUs(), v.Jobs[i].ScaleFactor)
			}
			if q > 0 {
				for _, sl := range u.Slots {
					if nodes[sl.Node] {
						t.Fatalf("job %s: copy %d shares node %s with another unit", v.Jobs[i].ID, q, sl.Node)
					}
				}
			}
			for _, sl := range u.Slots {
				nodes[sl.Node] = true
			}
			r, err := model.UnitRate(v.Jobs[i].Job, u, 0)
			if err != nil || r <= 0 {
				t.Fatalf("job %s: unit %v runs at %v (%v)", v.Jobs[i].ID, u.Slots, r, err)
			}
		}
	}
}

func TestScheduleRespectsCapacity(t *testing.T) {
	for _, fork := range []bool{false, true} {
		for _, n := range []int{5, 40, 400} {
			t.Run(fmt.Sprintf("fork=%v/jobs=%d", fork, n), func(t *testing.T) {
				v := testView(t, "v100=12,p100=12,k80=12", n)
				model := speed.Model{Profile: profile.Default()}
				s, err := New(Config{Speed: model, Fork: fork})
				if err != nil {
					t.Fatal(err)
				}
				ps, err := s.Schedule(v)
				if err != nil {
					t.Fatal(err)
				}
				checkPlacements(t, v, ps, model, fork)
				// Work conservation, what backfill exists for: no job the
				// dual subroutine did not postpone is left waiting while
				// its types have enough idle GPUs to hold it (Hadar may
				// mix types and nodes).
				free := round.NewPool(v.Cluster)
				for _, p := range ps {
					for _, u := range p.Units {
						free.Take(u)
					}
				}
				for i, p := range ps {
					if len(p.Units) > 0 || len(s.jobs[v.Jobs[i].ID].Segs) > 0 {
						continue
					}
					idle := 0
					for k, ty := range v.Types {
						if v.Jobs[i].Throughput[k] > 0 {
							idle += free.FreeOfType(ty)
						}
					}
					if idle >= v.Jobs[i].ScaleFactor {
						t.Fatalf("job %s (%d GPUs) waits while %d GPUs of its types are idle", v.Jobs[i].ID, v.Jobs[i].ScaleFactor, idle)
					}
				}
			})
		}
	}
}

func TestMixedPlacementWhenNoTypeHasRoom(t *testing.T) {
	// Two nodes: 2 free V100s and 2 free P100s. A 4-GPU job fits only
	// by mixing types: Hadar places it; NoMixing cannot.
	c := planner.Cluster{Nodes: []planner.Node{
		{ID: "a", Rack: "r", GPUs: map[planner.GPUType]int{"v100": 2}},
		{ID: "b", Rack: "r", GPUs: map[planner.GPUType]int{"p100": 2}},
	}}
	prof := profile.Default()
	model := "ResNet-50 (batch size 64)"
	job := planner.Job{ID: "j", Model: model, ScaleFactor: 4, TotalSteps: 1e6, Weight: 1}
	v := &round.View{Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c), Capacity: []float64{2, 2}}
	jv := &round.JobView{Job: job, Remaining: job.TotalSteps, Received: make([]float64, 2)}
	for _, ty := range v.Types {
		x, _ := prof.Throughput(model, 4, ty, false)
		jv.Throughput = append(jv.Throughput, x)
	}
	v.Jobs = []*round.JobView{jv}
	sm := speed.Model{Profile: prof}
	for _, noMix := range []bool{false, true} {
		v.Pool = round.NewPool(c)
		s, _ := New(Config{Speed: sm, NoMixing: noMix})
		ps, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		placed := len(ps[0].Units) == 1
		if placed == noMix {
			t.Fatalf("NoMixing=%v: placed=%v", noMix, placed)
		}
		if placed {
			u := ps[0].Units[0]
			if len(u.Types()) != 2 {
				t.Fatalf("want a mixed placement, got %v", u.Slots)
			}
			// Documented model: the slowest type's spread throughput.
			p100, _ := prof.Throughput(model, 4, "p100", true)
			v100, _ := prof.Throughput(model, 4, "v100", true)
			got, _ := sm.UnitRate(job, u, 0)
			if want := math.Min(p100, v100); math.Abs(got-want) > 1e-9 {
				t.Fatalf("mixed speed %v, want min(spread p100, spread v100) = %v", got, want)
			}
		}
	}
}

func TestForkUsesIdleNodes(t *testing.T) {
	// One single-GPU job on an idle 3-node cluster: HadarE forks it onto
	// the other nodes, Hadar does not.
	v := testView(t, "v100=12", 1)
	sm := speed.Model{Profile: profile.Default()}
	v.Jobs[0].ScaleFactor = 1
	for _, fork := range []bool{false, true} {
		v.Pool = round.NewPool(v.Cluster)
		s, _ := New(Config{Speed: sm, Fork: fork, MaxCopies: 3})
		ps, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		want := 1
		if fork {
			want = 3
		}
		if got := len(ps[0].Units); got != want {
			t.Fatalf("fork=%v: %d units, want %d", fork, got, want)
		}
		checkPlacements(t, v, ps, sm, fork)
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := New(Config{Speed: speed.Model{Profile: profile.Default()}, Utility: "fastest"}); err == nil {
		t.Fatal("want an error for an unknown utility")
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("want an error for a missing profile")
	}
}

func BenchmarkRound(b *testing.B) {
	for _, n := range []int{100, 500, 2048, 10000} {
		v := testView(b, "v100=36,p100=36,k80=36", n)
		for _, fork := range []bool{false, true} {
			name := "hadar"
			if fork {
				name = "hadare"
			}
			b.Run(fmt.Sprintf("%s/jobs=%d", name, n), func(b *testing.B) {
				for b.Loop() {
					// A fresh scheduler each time: the fluid warm start
					// (an LP over all jobs) is part of the decision cost.
					s, _ := New(Config{Speed: speed.Model{Profile: profile.Default()}, Fork: fork})
					v.Pool = round.NewPool(v.Cluster)
					if _, err := s.Schedule(v); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func TestForkRespectsTheJobsCopyLimit(t *testing.T) {
	sm := speed.Model{Profile: profile.Default()}
	for _, limit := range []int{1, 2} {
		v := testView(t, "v100=12", 1)
		v.Jobs[0].ScaleFactor = 1
		v.Jobs[0].MaxCopies = limit
		s, _ := New(Config{Speed: sm, Fork: true, MaxCopies: 3})
		ps, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(ps[0].Units); got != limit {
			t.Fatalf("job limit %d: %d units", limit, got)
		}
	}
}

// On the first call the price bounds are empty; a lone job is critical
// for the makespan (it is the makespan) and must be worth twice its own
// value, not zero: it is admitted by the dual, not left to backfill.
func TestFirstCallCriticalJobHasValue(t *testing.T) {
	v := testView(t, "v100=4,p100=4,k80=4", 1)
	v.Reasons = make([]round.Reason, len(v.Jobs))
	s, err := New(Config{Speed: speed.Model{Profile: profile.Default()}})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := s.Schedule(v)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps[0].Units) == 0 {
		t.Fatalf("the lone job waits: %s", v.Reasons[0].Why)
	}
	if w := v.Reasons[0].Why; !strings.HasPrefix(w, "admitted") || !strings.Contains(w, "critical for the makespan") {
		t.Fatalf("the lone job's reason %q: want it admitted as critical", w)
	}
}

// A critical job running at its best speed slips just under the threshold
// each round; it stays critical within criticalBand of it, so it is not
// preempted and readmitted round after round (docs/results.md, "Restarts
// at the critical threshold"). A job not yet critical is judged at the
// threshold itself, and one whose share falls below the band is no longer
// critical.
func TestCriticalJobStaysCriticalWithinTheBand(t *testing.T) {
	for _, tc := range []struct {
		share      float64 // job 0's remaining time over the time left
		was, wantC bool
	}{
		{0.9 - criticalBand/2, true, true},
		{0.9 - criticalBand/2, false, false},
		{0.9 - 2*criticalBand, true, false},
		{0.9 + criticalBand/2, false, true},
	} {
		v := testView(t, "v100=4,p100=4,k80=4", 2)
		// Job 1 is job 0 three times as long: it sets the makespan bound,
		// so the target below stands.
		long := *v.Jobs[0]
		long.Job.ID = v.Jobs[1].ID
		long.Remaining *= 3
		v.Jobs[1] = &long
		s, err := New(Config{Speed: speed.Model{Profile: profile.Default()}})
		if err != nil {
			t.Fatal(err)
		}
		infos := s.jobInfos(v)
		for _, ji := range infos {
			s.jobs[ji.view.ID] = &record{Critical: tc.was}
		}
		s.target, s.hasTarget = v.Now+infos[0].remTime/tc.share, true
		s.value(v, infos)
		if infos[0].critical != tc.wantC || infos[0].protected != tc.wantC {
			t.Errorf("share %.4f, critical before %v: critical %v, protected %v, want %v", tc.share, tc.was, infos[0].critical, infos[0].protected, tc.wantC)
		}
		if s.jobs[v.Jobs[0].ID].Critical != tc.wantC {
			t.Errorf("share %.4f: the record keeps critical %v, want %v", tc.share, s.jobs[v.Jobs[0].ID].Critical, tc.wantC)
		}
	}
}
