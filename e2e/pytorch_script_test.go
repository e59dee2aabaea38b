package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
)

// docsPage is the page for job authors the test takes its script and the
// exec clients' chroot_env from.
const docsPage = "docs/pytorch.md"

// docsScript is docs/pytorch.md's whole script ("A whole script:
// train.py"), the first python block after that heading, as the page
// shows it.
func docsScript(t *testing.T, page string) string {
	t.Helper()
	const heading, fence = "### A whole script: `train.py`\n", "```python\n"
	i := strings.Index(page, heading)
	if i < 0 {
		t.Fatalf("%s has no %q", docsPage, strings.TrimSpace(heading))
	}
	rest := page[i:]
	j := strings.Index(rest, fence)
	if j < 0 {
		t.Fatalf("%s: no python block after %q", docsPage, strings.TrimSpace(heading))
	}
	rest = rest[j+len(fence):]
	k := strings.Index(rest, "\n```")
	if k < 0 {
		t.Fatalf("%s: the script's block does not end", docsPage)
	}
	return rest[:k+1]
}

// docsChroot is the chroot_env the page recommends for exec clients
// ("Jobspecs"), one `"host" = "chroot"` line per entry, comments and
// blank lines dropped.
func docsChroot(t *testing.T, page string) []string {
	t.Helper()
	i := strings.Index(page, "chroot_env {\n")
	if i < 0 {
		t.Fatalf("%s shows no chroot_env block", docsPage)
	}
	var out []string
	for _, l := range strings.Split(page[i+len("chroot_env {\n"):], "\n") {
		l = strings.TrimSpace(l)
		if c := strings.Index(l, "#"); c >= 0 {
			l = strings.TrimSpace(l[:c])
		}
		if l == "}" {
			return out
		}
		if l != "" {
			out = append(out, l)
		}
	}
	t.Fatalf("%s: the chroot_env block does not end", docsPage)
	return nil
}

// TestPyTorchScriptFromTheDocs is issue 32's done-when, live: the whole
// script docs/pytorch.md shows (a character-level Transformer language
// model with AdamW, a warm-up/cosine schedule and dropout, DDP over
// gloo; no signal handler of its own, no hard exit), read from the page,
// runs as three 2-worker jobs started under the launcher as the page
// says: two on hadar-train, one on exec with exactly the chroot_env the
// page recommends (its /srv/training holding the script, the library
// where pip would put it). One dev agent declares 2 V100 and 2 K80, room
// for two of the three units: gavel-maxmin in 30 s rounds (min_run_time
// 30s, from a placement's first step: counted from when the workers ran,
// on a machine loaded enough that a worker's start-up took more than a
// round, every job was stopped before it trained a step, round after
// round) stops and resumes them across rounds. Every job completes, every
// task ends 0 (a stop lost on exec's PID 1, or an exit that hangs, ends in
// SIGKILL: 137), at least one job is stopped and resumed from its
// checkpoint, and each job's rank-0 losses, all its allocations in
// order, are the local launcher's uninterrupted run of the same script,
// digit for digit (the same seed; two ranks' gloo all-reduce sums the same
// two gradients whatever the order; one torch thread, deterministic
// algorithms). Each allocation's stdout and stderr are kept under
// out/e2e-logs when it fails.
func TestPyTorchScriptFromTheDocs(t *testing.T) {
	skipShort(t)
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, docsPage))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	script := docsScript(t, page)
	for _, bad := range []string{"signal.", "os._exit", "sys.exit"} {
		if strings.Contains(script, bad) {
			t.Fatalf("the page's script uses %s: the done-when wants a script without a handler or an exit of its own", bad)
		}
	}
	// The users' scripts: /srv/training in the page's chroot_env, here a
	// directory of the test's (hadar-train's job users read it too).
	scripts := harness.SharedDir(t)
	if err := os.WriteFile(filepath.Join(scripts, "train.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	var chroot strings.Builder
	srv := false
	for _, e := range docsChroot(t, page) {
		if strings.HasPrefix(e, `"/srv/training"`) {
			e, srv = fmt.Sprintf("%q = %q", scripts, "/srv/training"), true
		}
		fmt.Fprintf(&chroot, "    %s\n", e)
	}
	if !srv {
		t.Fatalf("the page's chroot_env has no /srv/training for the users' scripts")
	}
	// What pip install ./python would have put in /usr/local/lib/python3.11.
	fmt.Fprintf(&chroot, "    %q = %q\n", filepath.Join(root, "python", "hadar_train"), "/usr/local/lib/python3.11/dist-packages/hadar_train")

	// 80 s of training a job at the pace. Its minimum run time counts
	// from its first step, so a job is preemptible from 30 s to 80 s
	// into its training: a window longer than a round, so some round
	// falls in it however long the machine takes to start the workers,
	// and gavel-maxmin gives the waiting job GPUs then. (With 60 s the
	// window was 20 s: on a quick machine the rounds at +60 s and +90 s
	// both missed it, and no job was stopped.)
	const steps = 160
	const pace = "2" // steps/s
	// The reference: the script uninterrupted, a unit of two on this
	// machine through the library's local launcher, as the page shows.
	ref := exec.Command(debianPython, "-m", "hadar_train.local", "-n", "2", "--steps", strconv.Itoa(steps), filepath.Join(scripts, "train.py"))
	ref.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "python"), "OMP_NUM_THREADS=1")
	var refErr strings.Builder
	ref.Stderr = &refErr
	refStart := time.Now()
	out, err := ref.Output()
	if err != nil {
		t.Fatalf("the reference run: %v\n%s", err, refErr.String())
	}
	want := lossLines(string(out))
	if len(want) != steps {
		t.Fatalf("the reference run printed %d losses, want %d\n%s", len(want), steps, out)
	}
	t.Logf("the reference run: %d steps in %s", steps, time.Since(refStart).Round(time.Second))

	c, p := startTorch(t, []torchNode{
		{"", "sv", modelV100, "16GiB", 2},
		{"", "sk", modelK80, "12GiB", 2},
	}, "", "docs-dev", chroot.String())
	a := c.startSidecar(config.Config{
		Scheduling: config.Scheduling{Policy: "gavel-maxmin", Round: "30s"},
		RunLimits:  config.RunLimits{MinRunTime: "30s", GangTimeout: "2m", StopTimeout: "2m"},
		Workers:    config.Workers{Storage: &config.StorageConfig{}},
	})
	emulate := fmt.Sprintf("        emulate {\n          steps_per_sec = {\n            %q = %s\n            %q = %s\n          }\n        }\n", modelV100, pace, modelK80, pace)
	// The exec job first: it starts in the first round, and is the one
	// whose stop the kernel would drop without the launcher.
	jobs := []torchJob{
		{id: "docs-exec", driver: "exec", script: "/srv/training/train.py", env: map[string]string{"HADAR_STEPS_PER_SEC": pace}},
		{id: "docs-a", driver: "hadar-train", script: filepath.Join(scripts, "train.py"), config: emulate},
		{id: "docs-b", driver: "hadar-train", script: filepath.Join(scripts, "train.py"), config: emulate},
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		j.steps, j.workers, j.throughput, j.memory = steps, 2, "v100="+pace+",k80="+pace, 1024
		c.submitTorch(p, j)
		ids[i] = j.id
	}

	kept := map[string]bool{}
	keep := func(al *api.AllocationListStub) {
		if kept[al.ID] {
			return
		}
		kept[al.ID] = true
		for _, stream := range []string{"stderr", "stdout"} {
			harness.KeepLog(t, filepath.Join("allocs", al.JobID+"-"+al.TaskGroup+"-"+al.ID[:8]+"."+stream), []byte(c.logOf(al.ID, stream)))
		}
	}
	ordered := func(id string) []*api.AllocationListStub {
		as := c.allocs(id)
		sort.Slice(as, func(i, j int) bool { return as[i].CreateIndex < as[j].CreateIndex })
		return as
	}
	summary := func() string {
		var b strings.Builder
		for _, id := range ids {
			jv := c.planOf(a, id)
			fmt.Fprintf(&b, "job %s: %s, plan state %s done %.0f/%.0f reason %+v\n", id, c.jobStatus(id), jv.State, jv.StepsDone, jv.Steps, jv.Reason)
			for _, al := range ordered(id) {
				fmt.Fprintf(&b, "  %s %s %s/%s %s\n", al.ID[:8], al.TaskGroup, al.DesiredStatus, al.ClientStatus, taskEvents(al.TaskStates))
			}
		}
		return b.String()
	}
	fail := func(format string, args ...any) {
		t.Helper()
		for _, id := range ids {
			for _, al := range c.allocs(id) {
				keep(al)
			}
		}
		t.Fatalf(format+"\n%s", append(args, summary())...)
	}

	start := time.Now()
	done := map[string]time.Duration{}
	var logged time.Time
	err = harness.Eventually(t.Context(), 15*time.Minute, 2*time.Second, func() error {
		if time.Since(logged) > 30*time.Second {
			logged = time.Now()
			for _, id := range ids {
				jv := c.planOf(a, id)
				t.Logf("PLAN %s: state %s action %s done %.0f/%.0f units %v reason %+v", id, jv.State, jv.Action, jv.StepsDone, jv.Steps, jv.Units, jv.Reason)
			}
		}
		// The minimum run time counts from a placement's first step: no
		// job is stopped or moved before it trained, however long the
		// machine takes to start its workers. (Counted from when the
		// workers ran, under load every job was, round after round, and
		// none finished in 15 minutes.)
		for _, ev := range a.History() {
			if strings.Contains(ev.Why, "stopped before it") {
				fail("%s at %s: %s: %s", ev.Job, ev.Time.Format(time.TimeOnly), ev.Action, ev.Why)
			}
		}
		for _, id := range ids {
			for _, al := range c.allocs(id) {
				if al.ClientStatus == api.AllocClientStatusFailed {
					return fmt.Errorf("job %s: allocation %s (%s) failed: %s", id, al.ID[:8], al.TaskGroup, taskEvents(al.TaskStates))
				}
			}
			if _, ok := done[id]; !ok && c.jobStatus(id) == "dead" {
				done[id] = time.Since(start)
			}
		}
		if len(done) < len(ids) {
			return fmt.Errorf("%d of %d jobs done (%v)", len(done), len(ids), done)
		}
		return nil
	})
	if err != nil {
		fail("%v after %s", err, time.Since(start).Round(time.Second))
	}
	t.Logf("all done in %s: %v; writes %v", time.Since(start).Round(time.Second), done, a.Applier().Writes())

	resumedRe := regexp.MustCompile(`resumed from checkpoint \S+ at step (\d+)`)
	resumes := 0
	for _, id := range ids {
		var got []string
		runs, stints, resumed := 0, 0, 0
		for _, al := range ordered(id) {
			w, ok := groupname.Parse(al.TaskGroup)
			if !ok {
				continue
			}
			full := c.allocInfo(al.ID)
			ev := terminated(full)
			if ev == nil {
				// Stopped before its task started: nothing ran.
				continue
			}
			runs++
			if ev.ExitCode != 0 || ev.Signal != 0 {
				fail("job %s: %s (%s) ended with exit %d signal %d: %s", id, al.ID[:8], al.TaskGroup, ev.ExitCode, ev.Signal, taskEvents(full.TaskStates))
			}
			if w.Rank != 0 {
				continue
			}
			losses := lossLines(c.logOf(al.ID, "stdout"))
			if len(losses) > 0 {
				stints++
			}
			if m := resumedRe.FindStringSubmatch(c.logOf(al.ID, "stderr")); m != nil {
				resumes++
				resumed++
				if at, _ := strconv.Atoi(m[1]); at != len(got) {
					fail("job %s: %s resumed at step %s after %d losses", id, al.ID[:8], m[1], len(got))
				}
			}
			got = append(got, losses...)
		}
		if !slices.Equal(got, want) {
			for i := range min(len(got), len(want)) {
				if got[i] != want[i] {
					fail("job %s: rank 0's losses leave the uninterrupted run's at %q (want %q)", id, got[i], want[i])
				}
			}
			fail("job %s: %d losses, %d in the uninterrupted run", id, len(got), len(want))
		}
		t.Logf("job %s: done after %s; %d tasks ran, rank 0 trained in %d allocations, resumed %d times; %d losses equal the uninterrupted run's", id, done[id].Round(time.Second), runs, stints, resumed, len(got))
	}
	if resumes == 0 {
		fail("no job was stopped and resumed: the fleet never time-sliced")
	}
	t.Logf("%d resumes from a checkpoint in all", resumes)
}
