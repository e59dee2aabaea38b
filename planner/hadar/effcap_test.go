package hadar

import (
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// contestedView is one node of eight V100s: elastic a (widths 2, 4, 8,
// scale factor 2) running on 2 of them, and rigid jobs of 4 GPUs waiting
// (ids in waiting), at a round boundary.
func contestedView(prof widthRates, waiting []string) *round.View {
	c := planner.Cluster{Nodes: []planner.Node{node("v0", "v100", 8)}}
	v := &round.View{Now: 3600, Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c), Capacity: []float64{8}}
	held := planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 2}}}}}
	a := &round.JobView{Job: planner.Job{ID: "a", Model: "a", ScaleFactor: 2, Widths: []int{2, 4, 8}, TotalSteps: 1e9, Weight: 1},
		Remaining: prof["a"][2] * 360 * 100, Received: []float64{0}, Placement: held, Throughput: []float64{prof["a"][2]}}
	for _, w := range a.Widths {
		a.WidthThroughput = append(a.WidthThroughput, []float64{prof["a"][w]})
	}
	v.Jobs = append(v.Jobs, a)
	for _, id := range waiting {
		rounds := 20.0
		if id == "c" {
			rounds = 400
		}
		v.Jobs = append(v.Jobs, &round.JobView{Job: planner.Job{ID: id, Model: id, ScaleFactor: 4, TotalSteps: 1e9, Weight: 1},
			Remaining: prof[id][4] * 360 * rounds, Received: []float64{3600}, Throughput: []float64{prof[id][4]}})
	}
	v.Reasons = make([]round.Reason, len(v.Jobs))
	return v
}

// a's added GPUs make little: T = 10, 13, 16 at 2, 4, 8, so each GPU it
// adds at 4 makes 1.5 steps/s against 5 per GPU at 2 (0.3 of it, under
// effMarginal). With b waiting alone (a's 2 and b's 4 of the 8 GPUs) the
// cluster is not contested and a grows onto the idle 2 GPUs b leaves, as
// before; with c waiting too (10 GPUs wanted), c too long to pay today's
// prices, a stays at 2: the GPUs are kept for a waiting job.
func TestElasticNoInefficientGrowthWhileJobsWait(t *testing.T) {
	prof := widthRates{"a": {2: 10, 4: 13, 8: 16}, "b": {4: 20}, "c": {4: 20}}
	for _, tc := range []struct {
		waiting []string
		want    int
	}{
		{[]string{"b"}, 4},
		{[]string{"b", "c"}, 2},
	} {
		v := contestedView(prof, tc.waiting)
		got := planned(t, elasticSched(t, prof, Config{RestartCost: 20}), v)
		if got["a"] != tc.want || got["b"] != 4 {
			t.Fatalf("waiting %v: a on %d GPUs (want %d), b on %d (want 4): %s", tc.waiting, got["a"], tc.want, got["b"], why(v, "a"))
		}
	}
}

// effCap: the widest width each of whose steps up adds at least
// effMarginal of a GPU's progress at the narrowest width (5 steps/s per
// GPU at 2) per added GPU, only while the cluster is contested.
func TestEffCapWidths(t *testing.T) {
	for _, tc := range []struct {
		t4, t8 float64
		want   int
	}{
		{13, 16, 2}, // 1.5 per added GPU at 4
		{18, 22, 4}, // 4 at 4, 1 at 8
		{19, 36, 8}, // 4.5 at 4, 4.25 at 8
	} {
		prof := widthRates{"a": {2: 10, 4: tc.t4, 8: tc.t8}, "b": {4: 20}, "c": {4: 20}}
		for _, waiting := range [][]string{{"b"}, {"b", "c"}} {
			v := contestedView(prof, waiting)
			s := elasticSched(t, prof, Config{})
			infos := s.jobInfos(v)
			s.effCap(v, s.newGrid(v, 4), infos)
			want := tc.want
			if len(waiting) == 1 {
				want = 0
			}
			if infos[0].wmax != want {
				t.Fatalf("T = 10, %v, %v, waiting %v: cap %d, want %d", tc.t4, tc.t8, waiting, infos[0].wmax, want)
			}
		}
	}
}

// A job the tail guard or the makespan protects is not capped: the cap
// keeps GPUs for waiting jobs, and a protected job's remaining time is
// the tail's (philly-48h seed 1, half elastic: capped, its p99 rose from
// 971 to 1,012-1,147 h against Sia's 1,004).
func TestEffCapSparesProtectedJobs(t *testing.T) {
	prof := widthRates{"a": {2: 10, 4: 13, 8: 16}, "b": {4: 20}, "c": {4: 20}}
	v := contestedView(prof, []string{"b", "c"})
	s := elasticSched(t, prof, Config{})
	infos := s.jobInfos(v)
	infos[0].protected = true
	s.effCap(v, s.newGrid(v, 4), infos)
	if infos[0].wmax != 0 {
		t.Fatalf("protected a capped at %d, want no cap", infos[0].wmax)
	}
}
