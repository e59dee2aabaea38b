package hadar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sia"
	"github.com/hadar-sched/hadar/planner/speed"
)

// elasticRound is a round at now of elastic jobs (widths 2, 4 and 8,
// steps/s 1, 1.8 and 3) on one node of eight V100s, none running, with
// the given steps left (an hour per 3,600 at width 2).
func elasticRound(now float64, ids []string, steps []float64) *round.View {
	return elasticRoundAt(now, ids, steps, elasticRates())
}

// elasticRates is the steps/s of elasticRound's jobs at widths 2, 4 and
// 8, which the tests' profiles give the scheduler too.
func elasticRates() map[int]float64 { return map[int]float64{2: 1, 4: 1.8, 8: 3} }

// elasticRoundAt is elasticRound with the jobs' steps/s at each width.
func elasticRoundAt(now float64, ids []string, steps []float64, rate map[int]float64) *round.View {
	c := planner.Cluster{Nodes: []planner.Node{node("v0", "v100", 8)}}
	v := &round.View{Now: now, Round: 360, Types: c.Types(), Cluster: c, Pool: round.NewPool(c), Capacity: []float64{8}}
	for n, id := range ids {
		jv := &round.JobView{Job: planner.Job{ID: id, Model: "m", ScaleFactor: 2, Widths: []int{2, 4, 8}, TotalSteps: steps[n], Weight: 1},
			Remaining: steps[n], Received: []float64{0}, Throughput: []float64{rate[2]}}
		for _, w := range jv.Widths {
			jv.WidthThroughput = append(jv.WidthThroughput, []float64{rate[w]})
		}
		v.Jobs = append(v.Jobs, jv)
	}
	v.Reasons = make([]round.Reason, len(v.Jobs))
	return v
}

// tailRates is the steps/s of the tail tests' jobs at widths 2, 4 and 8:
// eight GPUs are worth less to the makespan's job than four to it and
// two to each of two others (2.4 x 100 against 1.8 x 100 + 2 x 50).
func tailRates() map[int]float64 { return map[int]float64{2: 1, 4: 1.8, 8: 2.4} }

// programView is three long jobs (100 h left at width 2) and three short
// ones (2.5 h).
func programView() *round.View {
	return elasticRoundAt(3600, []string{"short1", "long1", "short2", "long2", "short3", "long3"}, []float64{9000, 360000, 9000, 360000, 9000, 360000}, tailRates())
}

// In a round with elastic jobs the configuration program chooses: the
// tail jobs (the longest projected JCTs, which make the p99 and the
// makespan) are worth Smith's rule times tailBoost (the first, here
// long1: the three tie and keep their order) or tailBoostRest (the
// others, whose projections equal the second-longest's), so the three
// long jobs take the eight GPUs (4 + 2 + 2, gains 1.8 + 0.5 + 0.5 per
// hour, against 2.4 for long1 alone on eight or 0.4 for a short job on
// two) while the short ones, first by remaining time alone, wait. The
// primal-dual (NoProgram) serves the short jobs first.
func TestProgramRunsTheTailJobs(t *testing.T) {
	prof := widthRates{"m": tailRates()}
	s, err := New(Config{Speed: speed.Model{Profile: prof}, MinRunTime: -1})
	if err != nil {
		t.Fatal(err)
	}
	v := programView()
	got := planned(t, s, v)
	if v.Reasons[1].Why == "" || !strings.Contains(v.Reasons[1].Why, "configuration program") {
		t.Errorf("long1's reason %q does not name the configuration program", v.Reasons[1].Why)
	}
	sum := 0
	for _, id := range []string{"long1", "long2", "long3"} {
		if got[id] == 0 {
			t.Fatalf("%s waits: %v (%s)", id, got, v.Reasons[1].Why)
		}
		sum += got[id]
	}
	if sum != 8 {
		t.Fatalf("long jobs on %v, want all eight GPUs (4 + 2 + 2)", got)
	}
	if got["long1"] != 4 {
		t.Errorf("long1, the makespan's tail job, on %d GPUs, want 4 (%v)", got["long1"], got)
	}
	// Each reason says what the program weighed: a long job's hours of
	// work at its width (100 h at 2 GPUs, 55.6 h at 4) and its tail
	// boost; a short one's that it was left out.
	hours := map[int]string{2: "100.0 h", 4: "55.6 h"}
	boost := map[string]string{"long1": "the longest projected JCT (x100)", "long2": "its projected JCT 100 % of the second-longest (x50)", "long3": "its projected JCT 100 % of the second-longest (x50)"}
	for i, jb := range v.Jobs {
		why := v.Reasons[i].Why
		if n := got[jb.ID]; strings.HasPrefix(jb.ID, "long") {
			if want := fmt.Sprintf("%d GPUs of v100 by the configuration program: %s of work left there", n, hours[n]); !strings.Contains(why, want) || !strings.Contains(why, boost[jb.ID]) {
				t.Errorf("%s's reason %q, want %q and that it is a tail job %s", jb.ID, why, want, boost[jb.ID])
			}
		} else if n == 0 && !strings.Contains(why, "left out by the configuration program") {
			t.Errorf("%s waits, its reason %q", jb.ID, why)
		}
	}
}

// The p99's boost falls with a job's projected JCT (age plus its time
// at its best, 41.7 h for long1 and long2 an hour into the run): x50 at
// the second-longest's, x14.1 at 90 % of it, x3.44 at 80 %, none at
// 70 %; the longest's is x100. A running job's projection counts 20 %
// more (tailStick): at 80 % it is 96 % running, x30.6. By rank, the
// jobs after the third lost all their boost at once.
func TestTailBoostFallsWithTheProjection(t *testing.T) {
	s, err := New(Config{Speed: speed.Model{Profile: widthRates{"m": tailRates()}}, MinRunTime: -1})
	if err != nil {
		t.Fatal(err)
	}
	// Steps for projections of 153,600 s (the two longest) and 90, 80
	// and 70 % of it at 2.4 steps/s, an hour into the run.
	steps := func(share float64) float64 { return (share*153600 - 3600) * 2.4 }
	ids := []string{"far", "p80", "long1", "p90", "long2", "run80"}
	v := elasticRoundAt(3600, ids, []float64{steps(0.7), steps(0.8), steps(1), steps(0.9), steps(1), steps(0.8)}, tailRates())
	v.Jobs[5].Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 2}}}}}
	best := make([]float64, len(v.Jobs))
	for i, jb := range v.Jobs {
		ws, rows := configurations(jb)
		best[i], _ = bestRates(jb.Remaining, ws, rows)
	}
	boost, share := s.tail(v, best)
	want := map[string][2]float64{"long1": {100, 1}, "long2": {50, 1}, "p90": {14.12, 0.9}, "p80": {3.44, 0.8}, "far": {0, 0.7}, "run80": {30.6, 0.96}}
	for i, id := range ids {
		if w := want[id]; math.Abs(boost[i]-w[0]) > 0.01*w[0] || math.Abs(share[i]-w[1]) > 1e-9 {
			t.Errorf("%s: boost %.4g, share %.4g; want %.4g, %.4g", id, boost[i], share[i], w[0], w[1])
		}
	}
	if want := []string{"long1", "long2", "run80"}; !slices.Equal(s.held, want) {
		t.Errorf("the tail held for the next boundary %v, want %v", s.held, want)
	}
}

// manyElasticView is a round at now of n elastic jobs, 2 h to 2n h left.
func manyElasticView(now float64, n int) *round.View {
	ids, steps := make([]string, n), make([]float64, n)
	for i := range n {
		ids[i], steps[i] = fmt.Sprintf("job-%03d", i), 7200*float64(i+1)
	}
	return elasticRound(now, ids, steps)
}

// A backlog is not the configuration program's: a round of more than
// backlogJobs jobs is not planned by it, nor are the rounds after it
// until fewer than resumeJobs jobs are left (they are Sia's program's,
// TestDrainIsSiasProgram), and a snapshot keeps that (a sidecar
// restarted in a backlog goes on with the backlog's planning).
func TestProgramGivesWayToABacklog(t *testing.T) {
	cfg := Config{Speed: speed.Model{Profile: widthRates{"m": elasticRates()}}, MinRunTime: -1}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := 0.0
	byProgram := func(s *Scheduler, n int) bool {
		t.Helper()
		now += 3600
		v := manyElasticView(now, n)
		if _, err := s.Schedule(v); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(v.Reasons, func(r round.Reason) bool { return strings.Contains(r.Why, "configuration program") })
	}
	if !byProgram(s, 20) {
		t.Fatal("a round of 20 elastic jobs is not the configuration program's")
	}
	if byProgram(s, backlogJobs+1) {
		t.Fatalf("a round of %d jobs is the configuration program's, want a backlog's", backlogJobs+1)
	}
	if byProgram(s, 20) {
		t.Fatalf("a round of 20 jobs after a backlog is the configuration program's, want a backlog's until fewer than %d are left", resumeJobs)
	}
	data, err := s.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.LoadState(data); err != nil {
		t.Fatal(err)
	}
	if byProgram(r, 20) {
		t.Fatal("restored from a snapshot taken in a backlog, a round of 20 jobs is the configuration program's")
	}
	if !byProgram(r, resumeJobs-1) {
		t.Fatalf("a round of %d jobs after the backlog is not the configuration program's", resumeJobs-1)
	}
	if !byProgram(r, 20) {
		t.Fatal("a round of 20 jobs after the backlog ended is not the configuration program's")
	}
}

// A throughput that is not a positive number (a figure the engine could
// not learn) is no configuration: the program neither chooses it nor
// weighs a gain from it.
func TestProgramSkipsNonFiniteThroughput(t *testing.T) {
	prof := widthRates{"m": elasticRates()}
	s, err := New(Config{Speed: speed.Model{Profile: prof}, MinRunTime: -1})
	if err != nil {
		t.Fatal(err)
	}
	v := elasticRound(3600, []string{"only"}, []float64{360000})
	v.Jobs[0].WidthThroughput[2] = []float64{math.NaN()}
	v.Jobs[0].WidthThroughput[1] = []float64{math.Inf(1)}
	got := planned(t, s, v)
	if got["only"] != 2 {
		t.Fatalf("the job alone on 8 V100s with figures only at width 2 runs on %d GPUs, want 2 (%q)", got["only"], v.Reasons[0].Why)
	}
	if u := v.Reasons[0].Utility; math.IsNaN(u) || math.IsInf(u, 0) {
		t.Fatalf("gain %v weighed from a non-finite throughput (%q)", u, v.Reasons[0].Why)
	}
}

// A move is charged the hours the job would still need where it moves
// times moveShare, between one and moveRuns of its minimum run time:
// elastic a, running alone at width 2 on eight V100s (3 times as fast at
// width 8), stays where it would be done before the charge pays back
// and grows otherwise. Under the default 30 minutes: 30 min left at
// width 2 (10 min at 8, charged the floor of 30 min) it stays, 1.1 / 30
// min against 1 / 40 min; 2 h left (40 min at 8, charged 30 min) it
// grows, where the charge of four minimum run times kept it (1 / 2 h 40
// min); 6 h left (2 h at 8) it is charged half, 60 min; 24 h left (8 h
// at 8) the cap, 2 h. The job's own minimum run time counts over the
// configuration's; none charges nothing.
func TestProgramChargesAMoveItsMinimumRunTimes(t *testing.T) {
	for _, tc := range []struct {
		name          string
		cfgMin, own   float64
		steps         float64 // seconds left at width 2
		want          int
		charge, spent string
	}{
		{"default 30 min, 30 min left", 0, 0, 1800, 2, "", ""},
		{"default 30 min, 2 h left", 0, 0, 7200, 8, "the move charged 30 min", "(2.0 h on its 2 GPUs of v100)"},
		{"default 30 min, 6 h left", 0, 0, 6 * 3600, 8, "the move charged 60 min", "(6.0 h on its 2 GPUs of v100)"},
		{"default 30 min, 24 h left", 0, 0, 24 * 3600, 8, "the move charged 2.0 h", "(24.0 h on its 2 GPUs of v100)"},
		{"5 min, 30 min left", 300, 0, 1800, 8, "the move charged 5 min", "(30 min on its 2 GPUs of v100)"},
		{"5 min, the job's own 30 min", 300, 1800, 1800, 2, "", ""},
		{"none", -1, 0, 1800, 8, "the move charged 0 s", "(30 min on its 2 GPUs of v100)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{Speed: speed.Model{Profile: widthRates{"m": elasticRates()}}, MinRunTime: tc.cfgMin})
			if err != nil {
				t.Fatal(err)
			}
			v := elasticRound(7200, []string{"a"}, []float64{tc.steps})
			v.Jobs[0].MinRunTime = tc.own
			v.Jobs[0].Placement = planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 2}}}}}
			got := planned(t, s, v)
			why := v.Reasons[0].Why
			if got["a"] != tc.want {
				t.Fatalf("a on %d GPUs, want %d (%s)", got["a"], tc.want, why)
			}
			if tc.charge != "" && (!strings.Contains(why, tc.charge) || !strings.Contains(why, tc.spent)) {
				t.Errorf("a grew, its reason %q: want %q and %q", why, tc.charge, tc.spent)
			}
		})
	}
}

// tailRound is a round at now of four waiting elastic jobs whose
// projected JCTs (age plus the hours left at width 8, 2.4 steps/s) are
// the given hours.
func tailRound(now float64, proj map[string]float64) *round.View {
	ids := []string{"a", "b", "c", "d"}
	steps := make([]float64, len(ids))
	for i, id := range ids {
		steps[i] = (proj[id]*3600 - now) * tailRates()[8]
	}
	return elasticRoundAt(now, ids, steps, tailRates())
}

// The tail changes hands only when a job passes one of its members by
// tailHold: a waiting job's projection grows while a running tail job's
// holds, so without the hold two long jobs whose projections are close
// would take turns at the GPUs, a restart each, every minimum run time.
// The held tail survives a snapshot (a sidecar restarted between two
// rounds keeps it) and a fill mid-round does not change it.
func TestProgramTailChangesHandsByItsHold(t *testing.T) {
	cfg := Config{Speed: speed.Model{Profile: widthRates{"m": tailRates()}}, MinRunTime: -1}
	newSched := func() *Scheduler {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	waits := func(s *Scheduler, v *round.View) string {
		t.Helper()
		got := planned(t, s, v)
		var out []string
		for _, jb := range v.Jobs {
			if got[jb.ID] == 0 {
				out = append(out, jb.ID)
			}
		}
		return strings.Join(out, ",")
	}
	first := tailRound(3600, map[string]float64{"a": 100, "b": 99, "c": 98, "d": 97})
	// d passes c by 1 % (less than tailHold), then by 4 % (more).
	closeBy := map[string]float64{"a": 100, "b": 99, "c": 98, "d": 99}
	farBy := map[string]float64{"a": 100, "b": 99, "c": 98, "d": 102}

	s := newSched()
	if w := waits(s, first); w != "d" {
		t.Fatalf("first round: %q waits, want d (the shortest projection)", w)
	}
	saved, err := s.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	// A fill mid-round: the waiting job may take idle GPUs, but the held
	// tail stays the boundary's.
	fill := tailRound(3780, closeBy)
	fill.MidRound = true
	if _, err := s.Schedule(fill); err != nil {
		t.Fatal(err)
	}
	if w := waits(s, tailRound(3960, closeBy)); w != "d" {
		t.Errorf("d 1 %% past c: %q waits, want d (c holds its place in the tail)", w)
	}
	if w := waits(newSched(), tailRound(3960, closeBy)); w != "c" {
		t.Errorf("without a held tail, d 1 %% past c: %q waits, want c", w)
	}
	restored := newSched()
	if err := restored.LoadState(saved); err != nil {
		t.Fatal(err)
	}
	if w := waits(restored, tailRound(3960, closeBy)); w != "d" {
		t.Errorf("after a snapshot, d 1 %% past c: %q waits, want d", w)
	}
	// No scheduler holds a tail of more than tailJobs jobs.
	bad := bytes.Replace(saved, []byte(`"tail":["a","b","c"]`), []byte(`"tail":["a","b","c","d"]`), 1)
	if bytes.Equal(bad, saved) {
		t.Fatalf("the snapshot does not hold the tail a, b, c: %s", saved)
	}
	if err := newSched().LoadState(bad); err == nil || !strings.Contains(err.Error(), "tail of 4 jobs") {
		t.Errorf("a snapshot with a tail of four jobs: %v, want refused", err)
	}
	if w := waits(s, tailRound(4320, farBy)); w != "c" {
		t.Errorf("d 4 %% past c: %q waits, want c (d takes its place)", w)
	}
}

// A backlog is Sia's program's: in a backlog, a round of at most
// drainJobs jobs with an elastic one (its drain) is planned as
// planner/sia plans it (growth not limited), each reason saying so; a
// wider one by the same program with each job's weight leaning toward
// the short jobs and the makespan's critical job weighted as one an
// hour from its end (backlogWeights); a round with no elastic job and
// the nodrain ablation stay the primal-dual's, and a snapshot carries
// the drain's Sia (its restart counts).
func TestDrainIsSiasProgram(t *testing.T) {
	prof := widthRates{"m": elasticRates()}
	cfg := Config{Speed: speed.Model{Profile: prof}, MinRunTime: -1, RestartCost: 30}
	now := 0.0
	plan := func(s *Scheduler, v *round.View) []planner.Placement {
		t.Helper()
		out, err := s.Schedule(v)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	inBacklog := func(cfg Config) *Scheduler {
		t.Helper()
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		now += 3600
		plan(s, manyElasticView(now, backlogJobs+1))
		return s
	}
	says := func(v *round.View, what string) bool {
		return slices.ContainsFunc(v.Reasons, func(r round.Reason) bool { return strings.Contains(r.Why, what) })
	}
	const drained = "a backlog's drain planned by Sia's program"

	s := inBacklog(cfg)
	now += 3600
	v := manyElasticView(now, 20)
	got := plan(s, v)
	ref, err := sia.New(sia.Config{RestartCost: cfg.RestartCost, Backfill: true, FreeGrowth: true})
	if err != nil {
		t.Fatal(err)
	}
	w := manyElasticView(now, 20)
	want, err := ref.Schedule(w)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the drain's round of 20 jobs placed\n%v\nwant Sia's\n%v", got, want)
	}
	running := 0
	for i, p := range got {
		if v.Reasons[i].Why != "hadar, "+drained+": "+strings.TrimPrefix(w.Reasons[i].Why, "sia: ") || strings.Contains(v.Reasons[i].Why, "sia: ") {
			t.Errorf("%s's reason %q, want Sia's %q after %q", v.Jobs[i].ID, v.Reasons[i].Why, w.Reasons[i].Why, drained)
		}
		if len(p.Units) > 0 {
			running++
		}
	}
	// Sia's fairness shares the eight GPUs: four jobs at two each (the
	// primal-dual, below, runs fewer, wider).
	if running != 4 {
		t.Errorf("the drain runs %d of 20 jobs on 8 GPUs, want Sia's share of four at 2 GPUs each: %v", running, got)
	}

	// The node loses half its GPUs: the drain's Sia stops two of the
	// four jobs and counts their restarts (its restart factor's N_i).
	// The snapshot keeps those counts: restored, the scheduler saves the
	// same state and plans the next round as the original does.
	at := func(ps []planner.Placement, gpus int) *round.View {
		now += 3600
		v := manyElasticView(now, 20)
		c := planner.Cluster{Nodes: []planner.Node{node("v0", "v100", gpus)}}
		v.Cluster, v.Types, v.Pool, v.Capacity = c, c.Types(), round.NewPool(c), []float64{float64(gpus)}
		for i, p := range ps { // the jobs run where the drain put them
			v.Jobs[i].Placement, v.Jobs[i].Running = p, len(p.Units) > 0
		}
		return v
	}
	v = at(got, 4)
	half := plan(s, v)
	if !says(v, drained) {
		t.Fatalf("the drain's next round is not the drain's: %v", v.Reasons)
	}
	data, err := s.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(st.Drain, []byte(`"job-`)) {
		t.Fatalf("after two jobs stopped, the snapshot's drain state %s counts no job's restarts", st.Drain)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.LoadState(data); err != nil {
		t.Fatal(err)
	}
	if again, err := r.SaveState(); err != nil || !bytes.Equal(again, data) {
		t.Fatalf("restored and saved again, the state is\n%s\nwant\n%s (%v)", again, data, err)
	}
	a := at(half, 4)
	now -= 3600
	b := at(half, 4)
	if pa, pb := plan(s, a), plan(r, b); fmt.Sprint(pa) != fmt.Sprint(pb) || !says(b, drained) {
		t.Fatalf("restored from a snapshot in the drain, the next round placed %v, want %v, by the drain", pb, pa)
	}

	// More than drainJobs jobs: Sia's program with each job's weight
	// leaning toward the short ones, and the makespan's critical job (the
	// last, a thousand times longer) weighted as a job an hour from its
	// end. Every job has the same goodputs, so the weights alone choose
	// the four that run: the three shortest (the three before the last,
	// the remaining times being reversed) and the critical one. Sia
	// unweighted runs the first four (its ties broken in the jobs' order).
	s = inBacklog(cfg)
	now += 3600
	wide := func() *round.View {
		v := manyElasticView(now, drainJobs+1)
		for i := range drainJobs / 2 {
			a, b := v.Jobs[i], v.Jobs[drainJobs-1-i]
			a.Remaining, b.Remaining = b.Remaining, a.Remaining
		}
		v.Jobs[drainJobs].Remaining *= 1000
		return v
	}
	v = wide()
	runs := func(ps []planner.Placement) []string {
		var ids []string
		for i, p := range ps {
			if len(p.Units) > 0 {
				ids = append(ids, v.Jobs[i].ID)
			}
		}
		return ids
	}
	first := plan(s, v)
	weighted := runs(first)
	if want := []string{v.Jobs[drainJobs-3].ID, v.Jobs[drainJobs-2].ID, v.Jobs[drainJobs-1].ID, v.Jobs[drainJobs].ID}; !slices.Equal(weighted, want) {
		t.Errorf("a backlog's round of %d jobs runs %v, want %v", drainJobs+1, weighted, want)
	}
	for i, jb := range v.Jobs {
		why := v.Reasons[i].Why
		switch {
		case strings.Contains(why, "sia: ") || says(v, drained) || says(v, "configuration program"):
			t.Fatalf("a backlog's round of %d jobs: %s's reason %q, want Sia's program weighted", drainJobs+1, jb.ID, why)
		case i == drainJobs && !strings.Contains(why, "a backlog planned by Sia's program, its weight x1 as critical for the makespan"):
			t.Errorf("the critical job's reason %q", why)
		case i < drainJobs && !strings.Contains(why, "a backlog planned by Sia's program, its weight x") || i < drainJobs && strings.Contains(why, "critical"):
			t.Errorf("%s's reason %q, want its weight toward short jobs", jb.ID, why)
		}
	}
	ref, err = sia.New(sia.Config{RestartCost: cfg.RestartCost, Backfill: true, FreeGrowth: true})
	if err != nil {
		t.Fatal(err)
	}
	w = wide()
	plain, err := ref.Schedule(w)
	if err != nil {
		t.Fatal(err)
	}
	if fair := runs(plain); slices.Equal(fair, weighted) {
		t.Errorf("Sia unweighted runs the same jobs %v: the round does not show the weights", fair)
	}
	// A waiting job becomes a little shorter than a running one (by 5 %:
	// its weight 0.5 % higher). Waiting and running alike, the weights
	// alone run the newcomer in its place; the four running, the stay
	// holds them where they are, and their reasons say so.
	now += 3600
	closer := func(ps []planner.Placement) *round.View {
		v := wide()
		v.Jobs[drainJobs-4].Remaining = v.Jobs[drainJobs-3].Remaining * 0.95
		for i, p := range ps {
			v.Jobs[i].Placement, v.Jobs[i].Running = p, len(p.Units) > 0
		}
		return v
	}
	v = closer(nil)
	if got, want := runs(plan(inBacklog(cfg), v)), []string{v.Jobs[drainJobs-4].ID, v.Jobs[drainJobs-2].ID, v.Jobs[drainJobs-1].ID, v.Jobs[drainJobs].ID}; !slices.Equal(got, want) {
		t.Fatalf("with no job running, a backlog's round runs %v, want the shorter newcomer's %v", got, want)
	}
	v = closer(first)
	if kept := runs(plan(inBacklog(cfg), v)); !slices.Equal(kept, weighted) {
		t.Errorf("with the four running, a backlog's round runs %v, want them kept by the stay: %v", kept, weighted)
	}
	for i := drainJobs - 3; i <= drainJobs; i++ {
		if !strings.Contains(v.Reasons[i].Why, fmt.Sprintf("its term x%g to stay", 1+backlogStay)) {
			t.Errorf("%s's reason %q: want its stay named", v.Jobs[i].ID, v.Reasons[i].Why)
		}
	}
	// No elastic job: the primal-dual's.
	now += 3600
	v = manyElasticView(now, 20)
	for _, jb := range v.Jobs {
		jb.Widths, jb.WidthThroughput = nil, nil
	}
	if plan(s, v); says(v, drained) {
		t.Fatal("a backlog's round of 20 rigid jobs is the drain's")
	}
	// The ablation.
	off := cfg
	off.NoDrain = true
	s = inBacklog(off)
	now += 3600
	v = manyElasticView(now, 20)
	pd := plan(s, v)
	if says(v, drained) {
		t.Fatal("with nodrain a backlog's round of 20 elastic jobs is the drain's")
	}
	running = 0
	for _, p := range pd {
		if len(p.Units) > 0 {
			running++
		}
	}
	if running >= 4 {
		t.Errorf("the primal-dual runs %d of the 20 jobs, want fewer than the drain's four: %v", running, pd)
	}
	if s.Name() != "hadar:nodrain" {
		t.Errorf("the ablation is named %q, want hadar:nodrain", s.Name())
	}
}
