package sim_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
)

var updateKnown = flag.Bool("update-known", false, "rewrite testdata/known/*.json from the embedded profile")

// knownProfiles are the partial profiles docs/results.md tells schedulers
// ("What schedulers know: none, part, all"), derived from Gavel's
// simulation profile.
func knownProfiles(t *testing.T) map[string]*profile.Profile {
	t.Helper()
	full := profile.Default()
	models := full.Models()
	var half, noV100, width1 []profile.Entry
	for _, e := range full.Entries() {
		if slices.Index(models, e.Model)%2 == 0 {
			half = append(half, e)
		}
		if e.ScaleFactor == 1 {
			width1 = append(width1, e)
		}
		delete(e.Consolidated, "v100")
		delete(e.Spread, "v100")
		noV100 = append(noV100, e)
	}
	out := map[string]*profile.Profile{}
	for name, es := range map[string][]profile.Entry{"half-models": half, "no-v100": noV100, "width-1": width1} {
		p, err := profile.New("Gavel's simulation throughputs, "+name+" (planner/sim/known_test.go)", es)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = p
	}
	return out
}

// The committed partial profiles are the ones the code derives.
func TestKnownProfilesAreDerivedFromGavels(t *testing.T) {
	for name, p := range knownProfiles(t) {
		var b bytes.Buffer
		if err := p.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "known", name+".json")
		if *updateKnown {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (write it with -update-known)", err)
		}
		if !bytes.Equal(got, b.Bytes()) {
			t.Errorf("%s differs from what the code derives: rewrite it with -update-known", path)
		}
	}
}

func runKnown(t *testing.T, policy string, c planner.Cluster, jobs []planner.Job, known speed.Profile, learn bool) sim.Result {
	t.Helper()
	truth := speed.Model{Profile: profile.Default()}
	est := sim.EstimateConfig{Known: known, Learn: learn, RestartCost: 20}
	plan, _, err := sim.EstimatedModel(truth, est)
	if err != nil {
		t.Fatal(err)
	}
	sched, _, err := registry.Build(policy, placement.Pack, registry.Options{Types: c.Types(), Speed: plan, RestartCost: 20, MergeCost: 10},
		placement.Config{Speed: plan, RestartCost: 20})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: truth, Plan: plan, Estimate: est,
		RestartCost: 20, MergeCost: 10}, checkingScheduler{sched, t})
	if err != nil {
		t.Fatalf("%s: %v", policy, err)
	}
	if res.Completed != len(jobs) {
		t.Fatalf("%s: %d of %d jobs completed", policy, res.Completed, len(jobs))
	}
	return res
}

// Told nothing, and learning, every policy schedules the trace to within
// a margin of what it does knowing every figure (docs/results.md holds
// the measurement at 1,000 jobs; this is the regression check).
func TestNothingKnownLearnsCloseToFullKnowledge(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a trace four times")
	}
	c := cluster(t, "v100=12,p100=12,k80=12")
	jobs := synth(t, 80, 3, 4)
	for _, tc := range []struct {
		policy        string
		jct, makespan float64 // the most told-nothing may cost, as factors
	}{
		{"gavel-maxmin", 1.1, 1.05},
		{"fifo", 1.1, 1.05},
		// Hadar commits a job to a schedule at admission and keeps a
		// running job on it: a wide job committed on a guess stays on the
		// type the guess chose (docs/results.md, "What schedulers know").
		{"hadar", 1.3, 1.35},
	} {
		full := runKnown(t, tc.policy, c, jobs, nil, false)
		none := runKnown(t, tc.policy, c, jobs, sim.NoProfile(), true)
		t.Logf("%s: makespan %.1f h / %.1f h, avg JCT %.2f h / %.2f h (full / none + learn)", tc.policy, full.Makespan/3600, none.Makespan/3600, full.AvgJCT/3600, none.AvgJCT/3600)
		if none.AvgJCT > tc.jct*full.AvgJCT || none.Makespan > tc.makespan*full.Makespan {
			t.Errorf("%s told nothing: makespan %.1f h, avg JCT %.2f h; with every figure %.1f h, %.2f h", tc.policy, none.Makespan/3600, none.AvgJCT/3600, full.Makespan/3600, full.AvgJCT/3600)
		}
	}
}

// A GPU type in the cluster that the known profile lacks is used about as
// much as when it is known: learning finds it.
func TestATypeTheKnownProfileLacksIsUsed(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a trace twice")
	}
	c := cluster(t, "v100=8,p100=8,k80=8")
	jobs := synth(t, 60, 4, 5)
	known := knownProfiles(t)["no-v100"]
	busy := func(r sim.Result) float64 {
		k := slices.Index(r.Types, "v100")
		sum, n := 0.0, 0
		for _, s := range r.Samples {
			sum += s.Busy[k]
			n++
		}
		return sum / float64(n)
	}
	full := runKnown(t, "gavel-maxmin", c, jobs, nil, false)
	lacking := runKnown(t, "gavel-maxmin", c, jobs, known, true)
	t.Logf("v100 busy %.2f / %.2f, avg JCT %.2f h / %.2f h (known / lacking + learn)", busy(full), busy(lacking), full.AvgJCT/3600, lacking.AvgJCT/3600)
	if busy(lacking) < 0.8*busy(full) || lacking.AvgJCT > 1.25*full.AvgJCT {
		t.Errorf("v100 lacking from the known profile: busy %.2f (known: %.2f), avg JCT %.2f h (known: %.2f h)", busy(lacking), busy(full), lacking.AvgJCT/3600, full.AvgJCT/3600)
	}
}

// Without learning, a placement where the job truly cannot run stops the
// simulation with the reason; told nothing, schedulers still place every
// job.
func TestNothingKnownWithoutLearningStillPlans(t *testing.T) {
	c := cluster(t, "v100=8,p100=8")
	jobs := synth(t, 15, 0, 6)
	res := runKnown(t, "fifo", c, jobs, sim.NoProfile(), false)
	if res.Completed != len(jobs) {
		t.Fatalf("%d of %d", res.Completed, len(jobs))
	}
}
