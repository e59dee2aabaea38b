package train

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hadar-sched/hadar/driver/confine"
	"github.com/hadar-sched/hadar/driver/plugin"
)

// Two nodes, each with its own (node-local) checkpoint_root, share
// merge_root, as docs/driver.md asks for HadarE across nodes. A job gets
// the same ids on both, and two jobs never one id, because the ids are
// recorded in the root both share: with them recorded in each node's
// checkpoint_root, a one-id range gave both jobs that id (issue #30,
// item 4).
func TestJobIDsAcrossNodesSharingMergeRoot(t *testing.T) {
	needRoot(t)
	merge := rootDir(t, 0o711)
	node := func() *settings {
		return &settings{checkpointRoot: rootDir(t, 0o711), mergeRoot: merge, idRange: confine.IDRange{First: testFirstID + 900, Count: 1}}
	}
	a, b := node(), node()
	cfg := func(job string) *plugin.TaskConfig {
		return &plugin.TaskConfig{Namespace: "default", JobID: job, AllocDir: filepath.Join(rootDir(t, 0o711), "alloc", "x")}
	}
	x, err := jobIDs(a, cfg("x"), rootDir(t, 0o711))
	if err != nil {
		t.Fatal(err)
	}
	if y, err := jobIDs(b, cfg("y"), rootDir(t, 0o711)); err == nil {
		t.Errorf("job y on the second node got %v, job x's %v on the first: two jobs share a uid where they meet (merge_root)", y, x)
	} else if !strings.Contains(err.Error(), "full") {
		t.Errorf("job y: %v, want the range full", err)
	}
	if again, err := jobIDs(b, cfg("x"), rootDir(t, 0o711)); err != nil || again != x {
		t.Errorf("job x on the second node: %v, %v; want %v, as on the first", again, err, x)
	}
	if _, err := os.Lstat(filepath.Join(merge, ".hadar-ids")); err != nil {
		t.Errorf("ids not recorded in the shared merge_root: %v", err)
	}
}

// A job whose ids an earlier release recorded in checkpoint_root (set
// beside merge_root) keeps them once they are recorded in merge_root:
// its directories are owned by them.
func TestJobIDsKeptFromCheckpointRoot(t *testing.T) {
	needRoot(t)
	ck, merge := rootDir(t, 0o711), rootDir(t, 0o711)
	rng := confine.IDRange{First: testFirstID + 910, Count: 2}
	ids := func(dir, job string) int {
		t.Helper()
		root, err := confine.OpenRoot("checkpoint_root", dir)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		a, err := confine.NewAllocator(root, rng)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		id, _, err := a.IDs("default", job)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// In checkpoint_root another job took this job's first choice, so
	// it got the other id; a fresh claim in merge_root would differ.
	first := ids(rootDir(t, 0o711), "kept")
	for i := 0; ; i++ {
		other := "other-" + strconv.Itoa(i)
		if ids(rootDir(t, 0o711), other) == first {
			ids(ck, other)
			break
		}
	}
	before := ids(ck, "kept")
	if before == first {
		t.Fatal("setup: the job got its first choice")
	}
	s := &settings{checkpointRoot: ck, mergeRoot: merge, idRange: rng}
	cfg := &plugin.TaskConfig{Namespace: "default", JobID: "kept"}
	got, err := jobIDs(s, cfg, rootDir(t, 0o711))
	if err != nil || got.uid != before {
		t.Errorf("ids %v, %v; want %d, recorded before in checkpoint_root", got, err, before)
	}
}

// A checkpoint_root on a filesystem nodes share with merge_root, where
// ids are recorded, node-local cannot give a job one id everywhere:
// refused at load, naming the fix.
func TestSharedCheckpointRootLocalMergeRoot(t *testing.T) {
	ck, merge := t.TempDir(), t.TempDir()
	orig := filesystemOf
	t.Cleanup(func() { filesystemOf = orig })
	filesystemOf = func(path string) (string, bool) {
		if path == ck {
			return "nfs", true
		}
		return "ext4", false
	}
	err := checkIDRoot(&settings{checkpointRoot: ck, mergeRoot: merge})
	if err == nil || !strings.Contains(err.Error(), "merge_root") || !strings.Contains(err.Error(), "every node shares") {
		t.Errorf("shared checkpoint_root, local merge_root: %v; want a refusal naming merge_root and the fix", err)
	}
	filesystemOf = func(path string) (string, bool) {
		if path == merge {
			return "nfs", true
		}
		return "ext4", false
	}
	if err := checkIDRoot(&settings{checkpointRoot: ck, mergeRoot: merge}); err != nil {
		t.Errorf("local checkpoint_root, shared merge_root (ids there): %v", err)
	}
}

// With the range full, a new job gets the id of a job that is gone: its
// claim unused past the grace period and nothing of it left (its default
// checkpoints reaped, its allocations collected), never that of a job
// whose allocation is still on the node (issue #30, item 5).
func TestJobIDsReclaimed(t *testing.T) {
	needRoot(t)
	data := rootDir(t, 0o711)
	stateRoot := filepath.Join(data, PluginName)
	s := &settings{idRange: confine.IDRange{First: testFirstID + 920, Count: 1}}
	cfg := func(job, alloc string) *plugin.TaskConfig {
		return &plugin.TaskConfig{Namespace: "default", JobID: job, AllocID: alloc, Name: "trainer", AllocDir: filepath.Join(data, "alloc", alloc)}
	}
	old := cfg("old", "a1")
	if err := os.MkdirAll(old.AllocDir, 0o755); err != nil {
		t.Fatal(err)
	}
	x, err := jobIDs(s, old, stateRoot)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := allocCheckpointDir(filepath.Join(stateRoot, checkpointsDir), old, x)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ck, "weights"), []byte("old's"), 0o600); err != nil {
		t.Fatal(err)
	}
	past := unix.NsecToTimespec(time.Now().Add(-2 * idReclaimGrace).UnixNano())
	age := func() {
		t.Helper()
		rec := filepath.Join(stateRoot, ".hadar-ids", "by-id", strconv.Itoa(x.uid))
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, rec, []unix.Timespec{past, past}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
	age()
	// Its allocation is still on the node: not gone.
	if y, err := jobIDs(s, cfg("new", "b1"), stateRoot); err == nil {
		t.Fatalf("a new job got %v, the id of a job whose allocation is still here", y)
	}
	if _, err := os.Stat(filepath.Join(ck, "weights")); err != nil {
		t.Fatalf("the live job's checkpoint: %v", err)
	}
	// Nomad collected it: its checkpoints go, and its id to a new job.
	if err := os.RemoveAll(old.AllocDir); err != nil {
		t.Fatal(err)
	}
	age()
	y, err := jobIDs(s, cfg("new", "b1"), stateRoot)
	if err != nil || y != x {
		t.Fatalf("new job: %v, %v; want the gone job's %v", y, err, x)
	}
	if _, err := os.Lstat(filepath.Join(stateRoot, checkpointsDir, "default", "old")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the gone job's directory, which the new owner could read: %v", err)
	}
	if n, total := idsInUse(s, stateRoot); n != 1 || total != 1 {
		t.Errorf("ids in use %d of %d, want 1 of 1", n, total)
	}
}

// The node's fingerprint says how full job_id_range is (issue #30,
// item 5): nomad node status -verbose shows it.
func TestIDsMetric(t *testing.T) {
	needRoot(t)
	r := newRig(t, "")
	cfg := r.task(`exit 0`, "", nil)
	r.start(cfg)
	r.wait(cfg.ID, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := r.d.Fingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fp := <-ch
	in, total := fp.Attributes["driver."+PluginName+".job_ids_in_use"], fp.Attributes["driver."+PluginName+".job_ids_total"]
	if n, ok := in.Value().(int64); !ok || n < 1 {
		t.Errorf("job_ids_in_use %v, want at least this job's", in.Value())
	}
	if n, ok := total.Value().(int64); !ok || n != testIDCount {
		t.Errorf("job_ids_total %v, want %d", total.Value(), testIDCount)
	}
}
