package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
)

// TestJobPathsConfined holds hadar-train, on a real agent, to what the
// security review found it did as root with paths a job author wrote:
//   - checkpoint_dir (and hadare.merge_dir) naming a root-owned directory
//     outside the operator's roots: it was given to the task's user (on a
//     live agent a directory named that way became nobody's); now the task
//     fails with a Driver Failure saying why, and the directory is
//     untouched;
//   - a link the job's own task plants in its checkpoint directory, to
//     such a directory, named by the job's next run: never followed;
//   - progress_file naming a root-only file: the driver read it as root
//     to copy it into local/ (served by the alloc filesystem) and, at every
//     start, deleted it; now refused, the file untouched;
//   - every task ran as nobody, owner of every checkpoint directory: now a
//     job's task cannot list, read or write another job's checkpoints.
//
// The victims are temporary directories, never /etc: run against a
// driver without the fix, this test must not damage the machine.
func TestJobPathsConfined(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skipf("the agent would run as uid %d: a Nomad client needs root to switch users", os.Geteuid())
	}
	ckRoot, mergeRoot := harness.SharedDir(t), harness.SharedDir(t)
	a := startAgentMerge(t, "", ckRoot, mergeRoot)
	// A root-owned directory outside the roots, and a root-only file.
	victim := harness.SharedDir(t)
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("root's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "secret.json")
	const secretJSON = `{"steps_done":4242,"total_steps":4242,"checkpoint":"root-only"}`
	if err := os.WriteFile(secret, []byte(secretJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	untouched := func(t *testing.T) {
		t.Helper()
		if got := ownerMode(t, victim); got != "0:0 0755" {
			t.Errorf("victim directory %s is now %s, want 0:0 0755", victim, got)
		}
		if entries, _ := os.ReadDir(victim); len(entries) != 1 {
			t.Errorf("victim directory holds %d entries, want only its own file", len(entries))
		}
		if b, err := os.ReadFile(secret); err != nil || string(b) != secretJSON {
			t.Errorf("root-only file: %q, %v", b, err)
		}
	}

	refused := func(t *testing.T, id string, config map[string]interface{}, want string, notAlloc string) {
		t.Helper()
		job := trainJob(id, "exit 0", 100, 32, "")
		for k, v := range config {
			job.TaskGroups[0].Tasks[0].Config[k] = v
		}
		if _, _, err := a.Client.Jobs().Register(job, nil); err != nil {
			t.Fatal(err)
		}
		al := otherAlloc(t, a, id, notAlloc)
		ev := taskEventOf(t, a, al.ID, api.TaskDriverFailure)
		if !strings.Contains(ev.DisplayMessage, want) {
			t.Errorf("driver failure %q, want one containing %q", ev.DisplayMessage, want)
		}
		full, _, err := a.Client.Allocations().Info(al.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range full.TaskStates["trainer"].Events {
			if e.Type == api.TaskStarted {
				t.Errorf("a task with a path outside the roots started: %s", eventList(full.TaskStates["trainer"].Events))
			}
		}
	}

	t.Run("checkpoint_dir outside the roots", func(t *testing.T) {
		refused(t, "ckpt-outside", map[string]interface{}{"checkpoint_dir": victim}, "not under this job's directory", "")
		untouched(t)
	})
	t.Run("merge_dir outside the roots", func(t *testing.T) {
		refused(t, "merge-outside", map[string]interface{}{"hadare": []map[string]interface{}{{"copies": 1, "copy_index": 0, "merge_dir": victim}}}, "not under this job's directory", "")
		untouched(t)
	})
	t.Run("progress_file a root-only file", func(t *testing.T) {
		refused(t, "progress-outside", map[string]interface{}{"progress_file": secret}, "not under", "")
		untouched(t)
	})

	t.Run("a link the job planted", func(t *testing.T) {
		// The job's first run plants a link to the victim next to its
		// checkpoint directory, in its own job directory.
		plant := trainJob("escape", `ln -s "`+victim+`" "$HADAR_CHECKPOINT_DIR/../escape" && echo planted`, 100, 32, "")
		if _, _, err := a.Client.Jobs().Register(plant, nil); err != nil {
			t.Fatal(err)
		}
		done := waitDone(t, a, "escape")
		if ev := terminated(done); ev == nil || ev.ExitCode != 0 {
			t.Fatalf("planting task: %s", eventList(done.TaskStates["trainer"].Events))
		}
		link := filepath.Join(ckRoot, "default", "escape", "train", "escape")
		if target, err := os.Readlink(link); err != nil || target != victim {
			t.Fatalf("planted link %s: %q, %v", link, target, err)
		}
		if _, _, err := a.Client.Jobs().Deregister("escape", false, nil); err != nil {
			t.Fatal(err)
		}
		// Its next run names a path through it.
		refused(t, "escape", map[string]interface{}{"checkpoint_dir": "train/escape/x"}, `"escape" is a symbolic link`, done.ID)
		untouched(t)
	})

	t.Run("jobs cannot reach each other's checkpoints", func(t *testing.T) {
		bCkpt := filepath.Join(ckRoot, "default", "job-b", "train", "trainer", "ckpt")
		if _, _, err := a.Client.Jobs().Register(trainJob("job-b", `echo secret-weights > "$HADAR_CHECKPOINT_DIR/ckpt"`, 100, 32, ""), nil); err != nil {
			t.Fatal(err)
		}
		if ev := terminated(waitDone(t, a, "job-b")); ev == nil || ev.ExitCode != 0 {
			t.Fatalf("job B did not write its checkpoint: %+v", ev)
		}
		script := fmt.Sprintf(`id -u; ls %[1]q && echo LISTED; cat %[2]q && echo READ; echo x >> %[2]q && echo WROTE; touch "$HADAR_CHECKPOINT_DIR/mine" && echo OWN-OK`, filepath.Dir(bCkpt), bCkpt)
		if _, _, err := a.Client.Jobs().Register(trainJob("job-a", script, 100, 32, ""), nil); err != nil {
			t.Fatal(err)
		}
		done := waitDone(t, a, "job-a")
		out := taskLog(t, a, done, "stdout")
		for _, bad := range []string{"LISTED", "READ", "WROTE", "secret-weights"} {
			if strings.Contains(out, bad) {
				t.Errorf("job A's task reached job B's checkpoints (%s):\n%s", bad, out)
			}
		}
		if !strings.Contains(out, "OWN-OK") {
			t.Errorf("job A could not write its own checkpoint directory:\n%s\n%s", out, taskLog(t, a, done, "stderr"))
		}
		if b, err := os.ReadFile(bCkpt); err != nil || string(b) != "secret-weights\n" {
			t.Errorf("job B's checkpoint is now %q, %v", b, err)
		}
		t.Logf("job A (uid %s) could not reach job B's checkpoints: %s", strings.Fields(out + " ?")[0], strings.TrimSpace(taskLog(t, a, done, "stderr")))
	})
}

// otherAlloc waits for an allocation of the job other than notID.
func otherAlloc(t *testing.T, a *harness.Agent, jobID, notID string) *api.AllocationListStub {
	t.Helper()
	var found *api.AllocationListStub
	err := harness.Eventually(context.Background(), 30*time.Second, 250*time.Millisecond, func() error {
		allocs, _, err := a.Client.Jobs().Allocations(jobID, true, nil)
		if err != nil {
			return err
		}
		for _, al := range allocs {
			if al.ID != notID {
				found = al
				return nil
			}
		}
		return fmt.Errorf("no new allocation of %s yet", jobID)
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// waitDone waits for the job's first allocation to finish, and returns it.
func waitDone(t *testing.T, a *harness.Agent, jobID string) *api.Allocation {
	t.Helper()
	return waitAlloc(t, a, firstAlloc(t, a, jobID).ID, 60*time.Second, func(al *api.Allocation) bool {
		return al.ClientStatus == api.AllocClientStatusComplete || al.ClientStatus == api.AllocClientStatusFailed
	})
}

// terminated is the allocation's Terminated event of its trainer task.
func terminated(al *api.Allocation) *api.TaskEvent {
	if ts := al.TaskStates["trainer"]; ts != nil {
		for _, e := range ts.Events {
			if e.Type == api.TaskTerminated {
				return e
			}
		}
	}
	return nil
}

// ownerMode is "uid:gid mode" of path, not following a link.
func ownerMode(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d %#o", st.Uid, st.Gid, st.Mode&0o7777)
}

// TestAllocDirConfined holds hadar-train, on a real agent and the
// allocation directories Nomad made (alloc/, its logs and data, the task
// directory: 0777, nobody's, no sticky bit), to issue #30's items 1-3:
//   - a task that replaces its stdout FIFO with a link to a root-owned
//     file and exits non-zero: Nomad restarts it in the same allocation,
//     and the driver (root) must not write the task's output into that
//     file;
//   - a task that swaps alloc/data for a link: the driver must create
//     nothing at the link's target;
//   - default checkpoints (no checkpoint_root): another job's task can
//     neither list, read, write nor move them.
//
// The victims are temporary files and directories: run against a driver
// without the fixes, this test must not damage the machine.
func TestAllocDirConfined(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skipf("the agent would run as uid %d: a Nomad client needs root to switch users", os.Geteuid())
	}
	a := harness.StartAgent(t, harness.Options{Plugins: map[string]string{
		"hadar-gpu":   inventory,
		"hadar-train": `progress_poll_interval = "500ms"`,
	}})
	restarting := func(id, script string) *api.Job {
		j := trainJob(id, script, 100, 32, "")
		j.TaskGroups[0].RestartPolicy = &api.RestartPolicy{Attempts: pointerTo(2), Mode: pointerTo("fail"), Delay: pointerTo(time.Second), Interval: pointerTo(10 * time.Minute)}
		return j
	}
	events := func(al *api.Allocation) string {
		if ts := al.TaskStates["trainer"]; ts != nil {
			return eventList(ts.Events)
		}
		return "no task state"
	}

	t.Run("stdout FIFO replaced by a link", func(t *testing.T) {
		victim := filepath.Join(harness.SharedDir(t), "victim")
		const content = "root's\n"
		if err := os.WriteFile(victim, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf(`if [ -e "$NOMAD_ALLOC_DIR/data/swapped" ]; then echo TASK-OUTPUT; exit 0; fi
f="$NOMAD_ALLOC_DIR/logs/.trainer.stdout.fifo"
rm -f "$f" && ln -s %q "$f" && touch "$NOMAD_ALLOC_DIR/data/swapped" && echo swapped >&2
exit 1`, victim)
		if _, _, err := a.Client.Jobs().Register(restarting("fifo-link", script), nil); err != nil {
			t.Fatal(err)
		}
		done := waitAlloc(t, a, firstAlloc(t, a, "fifo-link").ID, 120*time.Second, func(al *api.Allocation) bool {
			return al.ClientStatus == api.AllocClientStatusComplete || al.ClientStatus == api.AllocClientStatusFailed
		})
		if !strings.Contains(taskLog(t, a, done, "stderr"), "swapped") {
			t.Fatalf("the task did not replace its FIFO: %s", events(done))
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != content {
			t.Errorf("victim file %s is now %q (%v), want %q: the driver wrote the task's output through its link; events: %s", victim, b, err, content, events(done))
		}
		t.Logf("events: %s", events(done))
	})

	t.Run("alloc/data replaced by a link", func(t *testing.T) {
		target := harness.SharedDir(t)
		script := fmt.Sprintf(`if [ -L "$NOMAD_ALLOC_DIR/data" ]; then echo second-run; exit 0; fi
mv "$NOMAD_ALLOC_DIR/data" "$NOMAD_ALLOC_DIR/data.real" && ln -s %q "$NOMAD_ALLOC_DIR/data" && echo swapped >&2
exit 1`, target)
		if _, _, err := a.Client.Jobs().Register(restarting("data-link", script), nil); err != nil {
			t.Fatal(err)
		}
		done := waitAlloc(t, a, firstAlloc(t, a, "data-link").ID, 120*time.Second, func(al *api.Allocation) bool {
			return al.ClientStatus == api.AllocClientStatusComplete || al.ClientStatus == api.AllocClientStatusFailed
		})
		if !strings.Contains(taskLog(t, a, done, "stderr"), "swapped") {
			t.Fatalf("the task did not swap alloc/data: %s", events(done))
		}
		restarted := false
		for _, e := range done.TaskStates["trainer"].Events {
			restarted = restarted || e.Type == api.TaskRestarting
		}
		if !restarted {
			t.Errorf("Nomad did not restart the task in its allocation: %s", events(done))
		}
		if entries, _ := os.ReadDir(target); len(entries) != 0 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("the link's target %s holds %v: the driver created through the task's link", target, names)
		}
		if got := ownerMode(t, target); got != "0:0 0755" {
			t.Errorf("the link's target is now %s, want 0:0 0755", got)
		}
	})

	t.Run("default checkpoints of another job", func(t *testing.T) {
		if _, _, err := a.Client.Jobs().Register(trainJob("dflt-b", `echo secret-weights > "$HADAR_CHECKPOINT_DIR/ckpt" && echo "$HADAR_CHECKPOINT_DIR"`, 100, 32, ""), nil); err != nil {
			t.Fatal(err)
		}
		doneB := waitDone(t, a, "dflt-b")
		if ev := terminated(doneB); ev == nil || ev.ExitCode != 0 {
			t.Fatalf("job B did not write its checkpoint: %s", events(doneB))
		}
		bDir := strings.TrimSpace(taskLog(t, a, doneB, "stdout"))
		bCkpt := filepath.Join(bDir, "ckpt")
		if b, err := os.ReadFile(bCkpt); err != nil || string(b) != "secret-weights\n" {
			t.Fatalf("job B's checkpoint %s: %q, %v", bCkpt, b, err)
		}
		if strings.Contains(bDir, "/alloc/"+doneB.ID+"/") {
			t.Errorf("job B's default checkpoints %s are in its allocation directory, which every task can write", bDir)
		}
		script := fmt.Sprintf(`id -u; ls %[1]q && echo LISTED; cat %[2]q && echo READ; echo x >> %[2]q && echo WROTE; mv %[1]q %[1]q.taken && echo MOVED; mv %[3]q %[3]q.taken && echo MOVED; touch "$HADAR_CHECKPOINT_DIR/mine" && echo OWN-OK`,
			bDir, bCkpt, filepath.Dir(bDir))
		if _, _, err := a.Client.Jobs().Register(trainJob("dflt-a", script, 100, 32, ""), nil); err != nil {
			t.Fatal(err)
		}
		done := waitDone(t, a, "dflt-a")
		out := taskLog(t, a, done, "stdout")
		for _, bad := range []string{"LISTED", "READ", "WROTE", "MOVED", "secret-weights"} {
			if strings.Contains(out, bad) {
				t.Errorf("job A's task reached job B's default checkpoints (%s):\n%s", bad, out)
			}
		}
		if !strings.Contains(out, "OWN-OK") {
			t.Errorf("job A could not write its own checkpoint directory:\n%s\n%s", out, taskLog(t, a, done, "stderr"))
		}
		if b, err := os.ReadFile(bCkpt); err != nil || string(b) != "secret-weights\n" {
			t.Errorf("job B's checkpoint is now %q, %v", b, err)
		}
		t.Logf("job A could not reach job B's default checkpoints in %s: %s", bDir, strings.TrimSpace(taskLog(t, a, done, "stderr")))
	})
}
