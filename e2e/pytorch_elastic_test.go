package e2e

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// elasticLossTolerance is how far, relatively, a resized run's rank-0
// loss may be from the unresized run's at any step: the global batch is
// the same at every width, only the order of float sums differs (width 1
// against width 2 on 600 steps: 7e-7 at most).
const elasticLossTolerance = 1e-4

// TestPyTorchElasticResizedTwice (issue 35, item 4): an elastic job of the
// elastic example (real torch, gloo) declared hadar.workers = "1-2" under
// sia:free (Sia without its growth limit, which would start the job at
// width 1 and grow it first: planner/sia's TestSiaElasticGrowsByDoublings)
// on one dev agent with 2 V100 declared, restart_cost 1h (the job is
// younger than it, so Sia's restart factor is 1) and min_run_time 20s:
// alone it runs at width 2; a rigid job arrives and sia shrinks it to 1
// (a move through its checkpoint); the rigid job completes and sia grows
// it back to 2. It completes; its rank-0 losses, across the three runs,
// are every step once, each within elasticLossTolerance of an unresized
// run of the same seed (python -m hadar_train.local -n 1), the final loss
// too; the plan shows its widths and sia's reason. The script is given no
// --widths: each unit's rank 0 says it checked the global batch against
// 1,2, the HADAR_WIDTHS the sidecar set from hadar.workers.
func TestPyTorchElasticResizedTwice(t *testing.T) {
	skipShort(t)
	resizedTwice(t, "el-dev", "sia:free", "ResNet-50 (batch size 16)", "20s", func(n int) string { return fmt.Sprintf("sia: %d GPUs", n) }, "after the restart factor")
}

// TestPyTorchElasticResizedByHadar is the same story under hadar, the
// default policy: its configuration program charges a move half the time
// the job would still need where it moves, between one and four minimum
// run times (10 s to 40 s at min_run_time 10s; 40 s while el needs more
// than 80 s there, 231 steps at width 2), on top of that time. The job is
// declared as Transformer (batch size 256), whose figures in the profile
// (1.60 steps/s on one V100, 2.89 on two) make a move pay within the
// test's minutes: alone it takes both GPUs (it is done sooner); when the
// rigid job (26 s of work) arrives, running both beats keeping el at 2
// (el gives up 1 / 0.130 h, pays 40 s); when it has gone, growing back
// pays while el has more than 45 steps left (1.1 / h1 against 1 / (h2 +
// charge)), and the charge is 40 s while it has more than 231: el,
// shrunk with over 1,000 steps left, runs at width 1 while the rigid
// job does its 300 steps at the same emulated pace (8 steps/s), so it
// does about as many and has hundreds left when it grows back. The
// emulated pace sets only how fast the test runs. Each reason is the
// program's.
func TestPyTorchElasticResizedByHadar(t *testing.T) {
	skipShort(t)
	resizedTwice(t, "elh-dev", "hadar", "Transformer (batch size 256)", "10s", func(n int) string {
		return fmt.Sprintf("hadar: %d GPUs of ", n)
	}, "the move charged 40 s")
}

// resizedTwice runs the elastic example (1500 steps, model as the job's
// declared model) under policy, with the sidecar's min_run_time minRun,
// on one dev agent named dc with 2 V100s:
// alone at width 2, shrunk to 1 when a rigid job arrives, grown back to
// 2 when it has gone; why(n) is the start of the policy's reason for a
// start or move to width n, and charged is in each move's reason. It
// checks the losses against an unresized run.
func resizedTwice(t *testing.T, dc, policy, model string, minRun config.Duration, why func(n int) string, charged string) {
	c, p := startTorchDev(t, dc, []torchNode{{"", "ev", modelV100, "16GiB", 2}})
	const steps = 1500
	// No --widths: the example checks the global batch against
	// HADAR_WIDTHS, which the sidecar sets from hadar.workers.
	args := []string{"--log-every", "1"}
	ref := exec.Command(debianPython, append([]string{"-m", "hadar_train.local", "-n", "1", "--steps", strconv.Itoa(steps), "-m", "hadar_train.examples.elastic"}, args...)...)
	ref.Env = append(os.Environ(), "PYTHONPATH="+p.python, "OMP_NUM_THREADS=1")
	out, err := ref.Output()
	if err != nil {
		t.Fatalf("the unresized run: %v", err)
	}
	want := elasticLosses(t, string(out))
	if len(want) != steps {
		t.Fatalf("the unresized run printed %d losses", len(want))
	}
	learn := false
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: policy, Round: "10s"},
		RunLimits: config.RunLimits{GangTimeout: "2m", StopTimeout: "2m", MinRunTime: minRun, RestartCost: "1h"}, Learning: config.Learning{Learn: &learn}})
	pace := fmt.Sprintf("        emulate {\n          steps_per_sec = {\n            %q = 8\n          }\n        }\n", modelV100)
	c.submitTorch(p, torchJob{id: "el", driver: "hadar-train", steps: steps, widths: "1-2", model: model, module: "elastic", args: args, config: pace})
	width := func(n int, after int) func() error {
		return func() error {
			ws := c.workersOf("el")
			if len(ws) != n || ws[0].unit <= after {
				return fmt.Errorf("el's workers %v (want %d of a unit after %d); plan %+v", ws, n, after, c.planOf(a, "el"))
			}
			return nil
		}
	}
	unitOf := func() int { return c.workersOf("el")[0].unit }
	trains := func(min int64) func() error {
		return func() error {
			ws := c.workersOf("el")
			if len(ws) == 0 {
				return fmt.Errorf("el not running")
			}
			pr, err := c.progressOf(ws[0].alloc.ID)
			if err != nil || pr.StepsDone < min {
				return fmt.Errorf("progress %+v, %v", pr, err)
			}
			return nil
		}
	}
	c.waitFor("el runs alone at width 2", 3*time.Minute, width(2, -1))
	first := unitOf()
	jv := c.planOf(a, "el")
	if !slices.Equal(jv.Widths, []int{1, 2}) {
		t.Fatalf("el's plan: widths %v, reason %q", jv.Widths, jv.Reason.Why)
	}
	c.waitFor("el trains at width 2", 3*time.Minute, trains(150))
	c.submitTorch(p, torchJob{id: "other", driver: "hadar-train", steps: 300, model: "ResNet-50 (batch size 16)", module: "single", args: []string{"--log-every", "0"}, config: pace})
	c.waitFor(policy+" shrinks el to width 1", 4*time.Minute, width(1, first))
	second := unitOf()
	c.waitFor("el trains at width 1", 3*time.Minute, trains(0))
	c.waitDead("other", 5*time.Minute)
	c.waitFor(policy+" grows el back to width 2", 4*time.Minute, width(2, second))
	c.waitDead("el", 8*time.Minute)

	// The decisions that started and moved el, with the policy's reasons
	// (from the history: a plan read later may already say that el keeps
	// its GPUs within its minimum run time).
	var decided []string
	for _, ev := range a.History() {
		if ev.Job == "default/el" && (ev.Action == wire.ActionStart || ev.Action == wire.ActionMove) {
			decided = append(decided, string(ev.Action)+": "+ev.Why)
		}
	}
	if len(decided) != 3 {
		t.Fatalf("el's starts and moves: %q, want a start and two moves", decided)
	}
	for n, w := range []int{2, 1, 2} {
		want := "move: " + why(w)
		if n == 0 {
			want = "start: " + why(w)
		}
		if !strings.HasPrefix(decided[n], want) || n > 0 && !strings.Contains(decided[n], charged) {
			t.Errorf("el's decision %d: %q, want %q... and %q", n, decided[n], want, charged)
		}
	}

	// Rank 0 of each unit, in order: the losses of the three runs.
	var rank0 []*api.AllocationListStub
	for _, al := range c.allocs("el") {
		if w, ok := groupname.Parse(al.TaskGroup); ok && w.Rank == 0 {
			rank0 = append(rank0, al)
		}
	}
	sort.Slice(rank0, func(i, j int) bool { return rank0[i].CreateIndex < rank0[j].CreateIndex })
	got := map[int]float64{}
	var widths []string
	dups := 0
	for _, al := range rank0 {
		log := c.logOf(al.ID, "stdout")
		if m := regexp.MustCompile(`(?m)^width (\d+):.*, widths checked (.*)$`).FindStringSubmatch(log); m != nil {
			widths = append(widths, m[1])
			if m[2] != "1,2" {
				// The example has no --widths: they come from HADAR_WIDTHS.
				t.Errorf("unit of rank-0 alloc %s checked the global batch against widths %q, want 1,2 (HADAR_WIDTHS from hadar.workers)", al.ID, m[2])
			}
		}
		for s, l := range elasticLosses(t, log) {
			if _, ok := got[s]; ok {
				dups++
			}
			got[s] = l
		}
	}
	t.Logf("el ran at widths %v (units %d, %d, then the last); %d losses, %d steps logged twice", widths, first, second, len(got), dups)
	if !slices.Equal(widths, []string{"2", "1", "2"}) {
		t.Fatalf("el ran at widths %v, want 2, 1, 2", widths)
	}
	worst, at := 0.0, 0
	for s := 1; s <= steps; s++ {
		l, ok := got[s]
		if !ok {
			t.Fatalf("step %d: no loss logged: the curve breaks", s)
		}
		if d := math.Abs(l-want[s]) / math.Abs(want[s]); d > worst {
			worst, at = d, s
		}
	}
	t.Logf("largest relative difference from the unresized run: %.3g at step %d; final loss %v, unresized %v", worst, at, got[steps], want[steps])
	if worst > elasticLossTolerance {
		t.Fatalf("step %d: loss %v, the unresized run's %v: relative difference %.3g above %g", at, got[at], want[at], worst, elasticLossTolerance)
	}
}

// elasticLosses are the "step N loss L" lines of a log, by step.
func elasticLosses(t *testing.T, log string) map[int]float64 {
	out := map[int]float64{}
	for _, m := range regexp.MustCompile(`(?m)^step (\d+) loss (\S+)$`).FindAllStringSubmatch(log, -1) {
		s, err1 := strconv.Atoi(m[1])
		l, err2 := strconv.ParseFloat(m[2], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("loss line %q", m[0])
		}
		out[s] = l
	}
	return out
}
