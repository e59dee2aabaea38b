package train

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// ckDir makes a checkpoint directory holding files, and returns it
// opened below its base.
func ckDir(t *testing.T, files map[string]string) (string, func() []string) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "ns", "job", "train", "t")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list := func() []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	return base, list
}

func begin(t *testing.T, base, run string, resume bool, total int64) ([]string, error) {
	t.Helper()
	ck, err := openCheckpointDir(filepath.Join(base, "ns", "job", "train", "t"), base)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	return beginRun(ck, run, resume, total)
}

func finish(t *testing.T, base, run string) {
	t.Helper()
	ck, err := openCheckpointDir(filepath.Join(base, "ns", "job", "train", "t"), base)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if err := finishRun(ck, run); err != nil {
		t.Fatal(err)
	}
}

// TestRerunAfterFinishStartsFresh: issue 33 item 7. A run of a job after
// one that finished (or one of another Nomad job, purged and registered
// again) does not find the old run's checkpoints; one that asks to resume
// does, and is refused when they hold more steps than it asks for.
func TestRerunAfterFinishStartsFresh(t *testing.T) {
	ckpts := map[string]string{"ckpt-3000.json": "a", "ckpt-4000.json": "b", "notes.txt": "mine"}

	t.Run("first run, then the same run again", func(t *testing.T) {
		base, list := ckDir(t, ckpts)
		// No record: the run that wrote them (a release without records).
		if aside, err := begin(t, base, "12", false, 5000); err != nil || len(aside) > 0 {
			t.Fatalf("aside %v, err %v", aside, err)
		}
		if aside, err := begin(t, base, "12", false, 5000); err != nil || len(aside) > 0 {
			t.Fatalf("the same run again: aside %v, err %v", aside, err)
		}
		if !slices.Contains(list(), "ckpt-4000.json") {
			t.Fatalf("checkpoints of the run itself went: %v", list())
		}
	})

	t.Run("after a finished run", func(t *testing.T) {
		base, list := ckDir(t, ckpts)
		if _, err := begin(t, base, "12", false, 4000); err != nil {
			t.Fatal(err)
		}
		finish(t, base, "12")
		aside, err := begin(t, base, "12", false, 2000)
		if err != nil {
			t.Fatalf("a rerun with fewer steps that starts fresh was refused: %v", err)
		}
		slices.Sort(aside)
		if !slices.Equal(aside, []string{"ckpt-3000.json", "ckpt-4000.json"}) {
			t.Fatalf("set aside %v", aside)
		}
		got := list()
		for _, n := range got {
			if strings.HasPrefix(n, "ckpt-") {
				t.Fatalf("a checkpoint of the finished run is left to resume from: %v", got)
			}
		}
		if !slices.Contains(got, "notes.txt") || !slices.Contains(got, ".run-12.0-ckpt-4000.json") {
			t.Fatalf("files now %v", got)
		}
		// The rerun's own tasks (other ranks, restarts) keep its files.
		if err := os.WriteFile(filepath.Join(base, "ns", "job", "train", "t", "ckpt-100.json"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if aside, err := begin(t, base, "12", false, 2000); err != nil || len(aside) > 0 {
			t.Fatalf("a restart within the rerun: aside %v, err %v", aside, err)
		}
		// The run after removes what the finished one left.
		finish(t, base, "12")
		if _, err := begin(t, base, "12", false, 2000); err != nil {
			t.Fatal(err)
		}
		got = list()
		if slices.Contains(got, ".run-12.0-ckpt-4000.json") || !slices.Contains(got, ".run-12.1-ckpt-100.json") {
			t.Fatalf("files now %v", got)
		}
	})

	t.Run("purged and registered again", func(t *testing.T) {
		base, list := ckDir(t, ckpts)
		if _, err := begin(t, base, "12", false, 5000); err != nil {
			t.Fatal(err)
		}
		if aside, err := begin(t, base, "40", false, 5000); err != nil || len(aside) != 2 {
			t.Fatalf("aside %v, err %v", aside, err)
		}
		if slices.Contains(list(), "ckpt-4000.json") {
			t.Fatalf("files now %v", list())
		}
	})

	t.Run("resume asked", func(t *testing.T) {
		base, list := ckDir(t, ckpts)
		if _, err := begin(t, base, "12", false, 4000); err != nil {
			t.Fatal(err)
		}
		finish(t, base, "12")
		if aside, err := begin(t, base, "40", true, 8000); err != nil || len(aside) > 0 {
			t.Fatalf("aside %v, err %v", aside, err)
		}
		if !slices.Contains(list(), "ckpt-4000.json") {
			t.Fatalf("files now %v", list())
		}
		finish(t, base, "40")
		_, err := begin(t, base, "41", true, 2000)
		if err == nil || !strings.Contains(err.Error(), "ckpt-4000.json") || !strings.Contains(err.Error(), "more than the 2000") {
			t.Fatalf("a resumed run asking for fewer steps than its checkpoint holds: err %v", err)
		}
	})

	t.Run("a link planted as a checkpoint", func(t *testing.T) {
		base, list := ckDir(t, nil)
		target := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(base, "ns", "job", "train", "t", "ckpt-5.json")); err != nil {
			t.Fatal(err)
		}
		if _, err := begin(t, base, "1", false, 10); err != nil {
			t.Fatal(err)
		}
		finish(t, base, "1")
		if _, err := begin(t, base, "1", false, 10); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(target); err != nil || !slices.Contains(list(), ".run-1.0-ckpt-5.json") {
			t.Fatalf("the link's target: %v; files %v", err, list())
		}
	})

	t.Run("a link planted as the run record", func(t *testing.T) {
		// A task writes its checkpoint directory: a .hadar-run linking to a
		// file of root's saying its run finished must be neither read
		// through (its checkpoints would be set aside) nor written through.
		base, list := ckDir(t, map[string]string{"ckpt-5.json": "{}"})
		target := filepath.Join(t.TempDir(), "roots")
		const roots = `{"run":"1","finished":true}`
		if err := os.WriteFile(target, []byte(roots), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(base, "ns", "job", "train", "t", runRecordName)); err != nil {
			t.Fatal(err)
		}
		// Refusing the start hurts the task's own job only.
		if _, err := begin(t, base, "1", false, 10); err == nil {
			if !slices.Contains(list(), "ckpt-5.json") {
				t.Fatalf("files now %v: the record was read through the planted link", list())
			}
			finish(t, base, "1")
		}
		if b, err := os.ReadFile(target); err != nil || string(b) != roots {
			t.Fatalf("the link's target now %q, %v: written through the planted link", b, err)
		}
	})
}
