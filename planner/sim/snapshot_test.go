package sim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

// resumeCase names one configuration the resume test runs; the child
// process rebuilds it from the name alone.
type resumeCase struct {
	policy, place string
	fid           sim.Fidelity
	learn         bool
	// at is where in the run it is stopped and resumed: a fraction of its
	// makespan, or seconds when above 1.
	at float64
	// queues runs the policy inside two team queues (planner/queue).
	queues bool
	// elastic makes half the jobs elastic (trace.MakeElastic).
	elastic bool
}

func (c resumeCase) name() string {
	name := fmt.Sprintf("%s+%s/%s/learn=%v", c.policy, c.place, c.fid, c.learn)
	if c.queues {
		name += "/queues"
	}
	if c.elastic {
		name += "/elastic"
	}
	return name
}

var resumeCases = []resumeCase{
	{"gavel-maxmin", placement.Pack, sim.Improved, false, 0.3, false, false},
	{"gavel-makespan", placement.DelayAutotune, sim.Improved, false, 0.4, false, false},
	{"gavel-ftf", placement.Spread, sim.Improved, true, 0.5, false, false},
	{"gavel-maxmin", placement.Pack, sim.Gavel, false, 20000, false, false},
	{"hadar", placement.Delay, sim.Improved, false, 0.25, false, false},
	{"hadare", placement.Pack, sim.Improved, true, 0.35, false, false},
	{"fifo", placement.Pack, sim.Improved, false, 0.6, false, false},
	{"gavel-maxmin", placement.Pack, sim.Improved, false, 0.3, true, false},
	{"hadar", placement.Delay, sim.Improved, true, 0.4, true, false},
	{"sia", placement.Pack, sim.Improved, false, 0.3, false, false},
	{"hadar", placement.Pack, sim.Improved, false, 0.35, false, true},
	{"sia", placement.Pack, sim.Improved, false, 0.3, false, true},
}

func caseByName(name string) (resumeCase, bool) {
	for _, c := range resumeCases {
		if c.name() == name {
			return c, true
		}
	}
	return resumeCase{}, false
}

// build returns the run of case c: a continuous trace with estimate error,
// a node lost, a node drained and a node joining mid-run.
func (c resumeCase) build(t testing.TB) (sim.Config, round.Scheduler) {
	t.Helper()
	cl := cluster(t, "v100=12,p100=12,k80=12")
	jobs := synth(t, 150, 14, 11)
	if c.elastic {
		var err error
		if jobs, err = trace.MakeElastic(jobs, 0.5, 2, profile.Default().ScaleFactors); err != nil {
			t.Fatal(err)
		}
	}
	est := sim.EstimateConfig{ProfileError: 0.2, StepError: 0.2, Seed: 3, Learn: c.learn}
	truth := speedModel(c.fid)
	plan, _, err := sim.EstimatedModel(truth, est)
	if err != nil {
		t.Fatal(err)
	}
	o := registry.Options{Types: cl.Types(), GavelFidelity: c.fid == sim.Gavel, Speed: plan, RestartCost: 20, MergeCost: 10}
	if c.place != placement.Pack {
		pl, err := placement.New(c.place, placement.Config{Speed: plan, Seed: 5, RestartCost: 20})
		if err != nil {
			t.Fatal(err)
		}
		o.Placer = pl
	}
	var s round.Scheduler
	var qc queue.Config
	if c.queues {
		// Every third job is team b's, which is guaranteed a third of
		// each type; team a borrows the rest.
		for i := range jobs {
			jobs[i].Queue = "a"
			if i%3 == 0 {
				jobs[i].Queue = "b"
			}
		}
		qc = queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1}, {Name: "b", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 4, "p100": 4, "k80": 4}}}}
		pc := placement.Config{Speed: plan, Seed: 5, RestartCost: 20}
		s, err = registry.BuildQueues(qc, c.policy, c.place, o, pc)
	} else {
		s, err = registry.New(c.policy, o)
	}
	if err != nil {
		t.Fatal(err)
	}
	events := []sim.Event{
		{Time: 3 * 3600, Kind: sim.Lose, NodeID: "p100-1"},
		{Time: 5 * 3600, Kind: sim.Drain, NodeID: "v100-0"},
		{Time: 7 * 3600, Kind: sim.Join, Node: planner.Node{ID: "v100-9", Rack: "rack-v100-9", GPUs: map[planner.GPUType]int{"v100": 4}}},
		{Time: 9 * 3600, Kind: sim.Undrain, NodeID: "v100-0"},
	}
	cfg := sim.Config{Cluster: cl, Jobs: jobs, Speed: truth, Plan: plan, Estimate: est, Events: events, Fidelity: c.fid, RestartCost: 20, MergeCost: 10, Queues: qc}
	return cfg, s
}

func speedModel(fid sim.Fidelity) speed.Model {
	return speed.Model{Profile: profile.Default(), IgnoreSpread: fid == sim.Gavel}
}

func resultJSON(t testing.TB, r sim.Result) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMain lets the resume test re-run this binary as a fresh process that
// restores a snapshot and finishes the run.
func TestMain(m *testing.M) {
	if name := os.Getenv("HADAR_SIM_RESUME_CASE"); name != "" {
		os.Exit(resumeChild(name, os.Getenv("HADAR_SIM_RESUME_DIR")))
	}
	os.Exit(m.Run())
}

func resumeChild(name, dir string) int {
	c, ok := caseByName(name)
	if !ok {
		fmt.Fprintln(os.Stderr, "unknown case", name)
		return 2
	}
	tb := &childTB{}
	cfg, s := c.build(tb)
	snap, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.Resume = snap
	res, err := sim.Run(context.Background(), cfg, s)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(dir, "result.json"), resultJSON(tb, res), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestSnapshotResumeInFreshProcessEqualsUninterruptedRun(t *testing.T) {
	if testing.Short() {
		t.Skip("re-runs the test binary per case; skipped under -short")
	}
	for _, c := range resumeCases {
		t.Run(c.name(), func(t *testing.T) {
			cfg, s := c.build(t)
			full, err := sim.Run(context.Background(), cfg, s)
			if err != nil {
				t.Fatal(err)
			}
			if full.Completed != full.Total {
				t.Fatalf("%d of %d jobs completed", full.Completed, full.Total)
			}
			// Stop the same run in the middle, at the first round past
			// c.at of the makespan, and resume its snapshot.
			at := c.at
			if at <= 1 {
				at *= full.Makespan
			}
			resumeAt(t, c, at, resultJSON(t, full))
		})
	}
}

// resumeAt stops case c at the first round past at, resumes its snapshot
// in a fresh process and compares the result with want.
func resumeAt(t *testing.T, c resumeCase, at float64, want []byte) {
	t.Helper()
	cfg, s := c.build(t)
	var snap []byte
	cfg.Checkpoint = func(now float64, b []byte) (bool, error) {
		if now >= at {
			snap = b
			return true, nil
		}
		return false, nil
	}
	if _, err := sim.Run(context.Background(), cfg, s); !errors.Is(err, sim.ErrStopped) {
		t.Fatalf("the stopped run ended with %v, want sim.ErrStopped", err)
	}
	{
		{
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "snapshot.json"), snap, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "HADAR_SIM_RESUME_CASE="+c.name(), "HADAR_SIM_RESUME_DIR="+dir)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("resuming process: %v\n%s", err, out)
			}
			got, err := os.ReadFile(filepath.Join(dir, "result.json"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("run resumed at %.0f s differs from the uninterrupted one:\n resumed %.400s\n   whole %.400s", at, got, want)
			}
		}
	}
}

func TestSnapshotRefusesCorruptOrForeign(t *testing.T) {
	c := resumeCases[1]
	cfg, s := c.build(t)
	var snap []byte
	cfg.Checkpoint = func(now float64, b []byte) (bool, error) {
		if now >= 4*3600 {
			snap = b
			return true, nil
		}
		return false, nil
	}
	if _, err := sim.Run(context.Background(), cfg, s); !errors.Is(err, sim.ErrStopped) {
		t.Fatal(err)
	}
	corrupt := bytes.Replace(snap, []byte(`"rounds":`), []byte(`"rounds":1`), 1)
	future := bytes.Replace(snap, []byte(`"version":1`), []byte(`"version":7`), 1)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"truncated", snap[:len(snap)/2], "corrupt"},
		{"edited", corrupt, "checksum mismatch"},
		{"future version", future, "version 7"},
		{"not json", []byte("hello"), "not a snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, s := c.build(t)
			before, err := s.(round.Stateful).SaveState()
			if err != nil {
				t.Fatal(err)
			}
			cfg.Resume = tc.data
			_, err = sim.Run(context.Background(), cfg, s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
			after, err := s.(round.Stateful).SaveState()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Fatal("a refused snapshot changed the scheduler's state")
			}
		})
	}
	// Another scheduler's snapshot is refused too.
	other := resumeCases[0]
	cfg, s = other.build(t)
	cfg.Resume = snap
	if _, err := sim.Run(context.Background(), cfg, s); err == nil || !strings.Contains(err.Error(), "scheduler") {
		t.Fatalf("err = %v, want a scheduler mismatch", err)
	}
}

// childTB is the testing.TB the resuming child process builds its case
// with: a failure ends the process.
type childTB struct{ testing.TB }

func (childTB) Helper() {}
func (childTB) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, args...)
	os.Exit(1)
}
