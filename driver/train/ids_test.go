package train

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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
