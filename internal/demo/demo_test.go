package demo

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// nomad is a server-only Nomad agent the tests that parse jobspecs share
// (its /v1/jobs/parse is the parser the demo itself uses): it starts on
// first use, in seconds once bin/nomad is built, and harness.Main stops it
// and checks that nothing is left behind.
var nomad = harness.NewShared(harness.Options{Name: "demo-parser", Mode: harness.ModeServer})

func TestMain(m *testing.M) { os.Exit(harness.Main(m, nomad)) }

// parseLocal parses a submission's jobspec from jobspecs/ as the demo
// does (Submission.Parse, through a real agent), with /bin/true as the
// trainer. -short skips the tests that need it.
func parseLocal(t *testing.T, s Submission) *api.Job {
	t.Helper()
	if testing.Short() {
		t.Skip("parses jobspecs through a real Nomad agent; skipped with -short")
	}
	job, err := s.Parse(nomad.Agent(t).Client, filepath.Join("..", "..", "jobspecs"), "/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func workloadInfos(t *testing.T, w Workload) []JobInfo {
	t.Helper()
	var out []JobInfo
	for _, s := range w.Jobs {
		ji, err := Describe(s, parseLocal(t, s))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ji)
	}
	return out
}

// TestWorkloads: every job of both workloads parses, is described, and
// both predictions finish every one of them; on the full workload the
// simulator has hadar fork and finish before the model of Nomad's own
// placement, which is what the demo sets out to show.
func TestWorkloads(t *testing.T) {
	for _, name := range []string{"short", "full"} {
		t.Run(name, func(t *testing.T) {
			infos := workloadInfos(t, Workloads[name])
			kinds := map[string]bool{}
			for _, ji := range infos {
				switch {
				case !ji.Managed:
					kinds["plain"] = true
				case ji.Spec.Forkable:
					kinds["forkable"] = true
				case ji.Spec.Workers > 1:
					kinds["distributed"] = true
				default:
					kinds["single"] = true
				}
			}
			h, err := PredictHadar(context.Background(), Cluster, infos, DefaultSettings)
			if err != nil {
				t.Fatal(err)
			}
			n, err := PredictNomad(context.Background(), Cluster, infos, DefaultSettings.Round)
			if err != nil {
				t.Fatal(err)
			}
			for _, ji := range infos {
				if h.JCT[ji.ID] <= 0 || n.JCT[ji.ID] <= 0 {
					t.Errorf("%s: predicted JCT hadar %v, nomad %v", ji.ID, h.JCT[ji.ID], n.JCT[ji.ID])
				}
			}
			if name != "full" {
				return
			}
			for _, k := range []string{"plain", "forkable", "distributed", "single"} {
				if !kinds[k] {
					t.Errorf("the full workload has no %s job", k)
				}
			}
			if h.Forks == 0 {
				t.Error("hadare forks nothing in the prediction")
			}
			if h.Makespan >= n.Makespan {
				t.Errorf("predicted makespan: hadar %.0f s, Nomad's model %.0f s", h.Makespan, n.Makespan)
			}
		})
	}
}

// TestNomadOwn: a managed gang job as a person would give stock Nomad:
// no hadar meta, no gate, count = workers, torchrun's variables from
// Nomad's interpolation; a plain job is left as it is.
func TestNomadOwn(t *testing.T) {
	s := Submission{ID: "lm2", File: "gang.nomad.hcl", Vars: map[string]string{"steps": "100"}}
	job := parseLocal(t, s)
	own, err := NomadOwn(job, 28600)
	if err != nil {
		t.Fatal(err)
	}
	if jobspec.IsManaged(own) {
		t.Fatal("still managed")
	}
	for k := range own.Meta {
		if strings.HasPrefix(k, "hadar.") {
			t.Errorf("meta %s kept", k)
		}
	}
	all := append([]*api.Constraint(nil), own.Constraints...)
	for _, g := range own.TaskGroups {
		all = append(all, g.Constraints...)
	}
	for _, c := range all {
		if c.LTarget == jobspec.GateAttribute {
			t.Error("the gate is kept")
		}
	}
	g := own.TaskGroups[0]
	if *g.Count != 2 {
		t.Errorf("count %d, want 2", *g.Count)
	}
	env := g.Tasks[0].Env
	if env["RANK"] != "${NOMAD_ALLOC_INDEX}" || env["WORLD_SIZE"] != "2" || env["MASTER_PORT"] != "28600" {
		t.Errorf("worker environment %v", env)
	}
	if !jobspec.IsManaged(job) || *job.TaskGroups[0].Count != 1 {
		t.Error("NomadOwn changed the job it was given")
	}
	plain := parseLocal(t, Submission{ID: "plain", File: "stock-device.nomad.hcl"})
	if got, _ := NomadOwn(plain, 1); got != plain {
		t.Error("a plain job was changed")
	}
}

// TestNomadModel: first fit over nodes in order, blind to speed, all of
// a job's workers or none: a one-GPU job takes the K80 of the first node
// although V100s are free, a two-GPU job the two V100s, and a third job
// waits for them.
func TestNomadModel(t *testing.T) {
	nodes := []NodeSpec{{Name: "k", Rack: "r1", GPUs: []GPUs{{K80, 1}}}, {Name: "v", Rack: "r1", GPUs: []GPUs{{V100, 2}}}}
	job := func(id string, gpus int, steps float64) JobInfo {
		return JobInfo{Submission: Submission{ID: id}, Managed: true, GPUs: gpus, Steps: steps,
			Spec:  jobspec.Spec{Workers: gpus, Weight: 1, Throughput: map[string]float64{"v100": 10, "k80": 1}},
			Paces: map[planner.GPUType]float64{"v100": 10, "k80": 1}}
	}
	p, err := PredictNomad(context.Background(), nodes, []JobInfo{job("a", 1, 10), job("b", 2, 20), job("c", 2, 20)}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if p.JCT["a"] < 9 || p.JCT["a"] > 11 {
		t.Errorf("a on the K80: JCT %.1f s, want 10", p.JCT["a"])
	}
	if p.JCT["b"] > 3 {
		t.Errorf("b on the two V100s at once: JCT %.1f s, want 2", p.JCT["b"])
	}
	if p.JCT["c"] < p.JCT["b"]+1.5 {
		t.Errorf("c waits for b's V100s: JCT %.1f s, b's %.1f s", p.JCT["c"], p.JCT["b"])
	}
}

// TestSummary: measured, cut-off and predicted values side by side, the
// files written, a cut-off run shown as a lower bound with its estimate.
func TestSummary(t *testing.T) {
	infos := []JobInfo{{Submission: Submission{ID: "a", Kind: "1 GPU"}, Steps: 100}, {Submission: Submission{ID: "b", Kind: "gang", At: 10 * time.Second}, Steps: 100}}
	hadar := &runResult{jct: map[string]time.Duration{"a": 60 * time.Second, "b": 90 * time.Second}, forks: 2, merges: 3}
	nomad := &runResult{jct: map[string]time.Duration{"a": 70 * time.Second}, done: map[string]float64{"b": 25}, failed: map[string]string{}, cutOff: 130 * time.Second}
	hp := Prediction{Policy: "hadare", JCT: map[string]float64{"a": 58, "b": 85}}
	np := Prediction{JCT: map[string]float64{"a": 70, "b": 400}}
	s := summarize(infos, hadar, nomad, hp, np)
	b := s.Jobs[1]
	if !b.NomadCut || b.NomadS != 120 || b.NomadEst != 480 {
		t.Fatalf("b under Nomad: %+v, want cut at 120 s (2:10 less its 10 s arrival) and ~480 s", b)
	}
	if s.Makespan[colHadar] != 100 || s.AvgJCT[colHadar] != 75 {
		t.Errorf("hadar makespan %v, average JCT %v", s.Makespan[colHadar], s.AvgJCT[colHadar])
	}
	var out bytes.Buffer
	dir := t.TempDir()
	files, err := s.write(&out, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"summary.txt", "summary.json", "summary.csv", "jct.svg", "jct.png"} {
		if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
			t.Errorf("%s: %v (files %v)", want, err, files)
		}
	}
	for _, want := range []string{"> 2:00 (~8:00)", "> 2:10", "1:30", "6:40", "2 forks", "3 merges", "stopped after 2m10s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// TestScreenPlain: off a terminal, events as lines and a status line,
// no escape sequences.
func TestScreenPlain(t *testing.T) {
	var out bytes.Buffer
	s := newScreen(&out, map[planner.GPUType]int{"v100": 2, "k80": 2})
	snap := Snapshot{Elapsed: 75 * time.Second, Busy: map[planner.GPUType]int{"v100": 1},
		Jobs:   []JobRow{{ID: "a", State: "running", Types: []string{"v100"}, Done: 50, Total: 100}},
		Events: []string{"0:01  start    a on 1xv100@v100-a"}}
	s.show("hadar", snap)
	s.show("hadar", snap) // within s.every: no second status line
	got := out.String()
	if strings.Contains(got, "\x1b") {
		t.Fatalf("escape sequences off a terminal: %q", got)
	}
	want := "  0:01  start    a on 1xv100@v100-a\n[1:15] hadar | a running@v100 50% | GPUs busy v100 1/2   k80 0/2\n"
	if got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}

// TestFindClean: what a demo leaves (a process carrying its run's
// variable, a directory) is found and removed; another run's process is
// not touched.
func TestFindClean(t *testing.T) {
	dir := t.TempDir()
	mine := filepath.Join(dir, "mine")
	if err := os.Mkdir(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(run string) *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		cmd.Env = append(os.Environ(), RunEnv+"="+run)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	run := "999999999-1"
	ours, other := start(run), start("999999999-2")
	// Reaped as soon as killed, so that Find sees it gone, not a zombie.
	exited := make(chan struct{})
	go func() { _ = ours.Wait(); close(exited) }()
	scope := Scope{Run: run, Dirs: []string{mine}}
	found := Find(scope)
	var kinds []string
	for _, l := range found {
		kinds = append(kinds, l.Kind)
		if l.Kind == "process" && l.pid != ours.Process.Pid {
			t.Errorf("found another process: %s", l)
		}
	}
	if strings.Join(kinds, ",") != "process,directory" {
		t.Fatalf("found %v", found)
	}
	if left := Clean(scope); len(left) > 0 {
		t.Fatalf("left after Clean: %v", left)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the demo's process survived Clean")
	}
	if _, err := os.Stat(mine); err == nil {
		t.Error("the directory survived Clean")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("another run's process was killed: %v", err)
	}
}
