package confine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// idsEnv makes the test binary print a job's ids: root, first, count,
// namespace, job separated by "|" (the stability test's other process).
const idsEnv = "HADAR_CONFINE_TEST_IDS"

func TestMain(m *testing.M) {
	if v := os.Getenv(idsEnv); v != "" {
		f := strings.Split(v, "|")
		first, _ := strconv.Atoi(f[1])
		count, _ := strconv.Atoi(f[2])
		root, err := OpenRoot("checkpoint_root", f[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		a, err := NewAllocator(root, IDRange{first, count})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		uid, gid, err := a.IDs(f[3], f[4])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(uid, gid)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rng is a block of ids no account on a test machine has.
var rng = IDRange{First: 3000000, Count: 1000}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("creates directories for other uids and runs processes as them, which needs root; this test runs as uid %d (CI runs as root)", os.Geteuid())
	}
}

// testRoot is a checkpoint root that other uids can reach (a
// t.TempDir() is private to root), removed when the test ends.
func testRoot(t *testing.T) (*Dir, string) {
	t.Helper()
	needRoot(t)
	top, err := os.MkdirTemp("", "hadar-confine-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o711); err != nil {
		t.Fatal(err)
	}
	root, err := OpenRoot("checkpoint_root", filepath.Join(top, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root, top
}

// both runs f with openat2 and with the element-by-element walk.
func both(t *testing.T, f func(t *testing.T, walk bool)) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "walk"
		}
		t.Run(name, func(t *testing.T) { f(t, walk) })
	}
}

func jobDir(t *testing.T, root *Dir, ns, job string, walk bool) *Dir {
	t.Helper()
	a, err := NewAllocator(root, rng)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	uid, gid, err := a.IDs(ns, job)
	if err != nil {
		t.Fatal(err)
	}
	d, err := root.JobDir(ns, job, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	d.walk = walk
	t.Cleanup(func() { d.Close() })
	return d
}

func TestResolve(t *testing.T) {
	root := &Dir{path: "/srv/hadar/checkpoints", base: "/srv/hadar/checkpoints", field: "checkpoint_root", root: true}
	job := &Dir{path: "/srv/hadar/checkpoints/default/train", base: "/srv/hadar/checkpoints", field: "checkpoint_root", job: true, root: true}
	for _, tc := range []struct {
		d          *Dir
		value, rel string
		err        string
	}{
		{root, "/etc", "", `checkpoint_dir "/etc": not under the plugin's checkpoint_root "/srv/hadar/checkpoints"; use a relative path or one under it`},
		{root, "resnet", "resnet", ""},
		{root, "/srv/hadar/checkpoints/a/b", "a/b", ""},
		{root, "/srv/hadar/checkpoints", ".", ""},
		{root, "/srv/hadar/checkpoints-other/x", "", "not under"},
		{root, "../etc", "", `"..": is not allowed`},
		{root, "a/../../etc", "", `".." is not allowed`},
		{root, "/srv/hadar/checkpoints/../../../etc", "", `".." is not allowed`},
		{root, "a/..", "", `".." is not allowed`},
		{root, "", "", "empty"},
		{root, "a\x00b", "", "NUL"},
		{job, "/srv/hadar/checkpoints/default/other", "", `not under this job's directory "/srv/hadar/checkpoints/default/train" (in the plugin's checkpoint_root "/srv/hadar/checkpoints")`},
		{job, "run-1/", "run-1", ""},
		{job, "./run-1//x", "run-1/x", ""},
	} {
		rel, err := tc.d.Resolve("checkpoint_dir", tc.value)
		if tc.err != "" {
			want := strings.ReplaceAll(tc.err, `"..": is`, `".." is`)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Resolve(%q): %q, %v; want error %q", tc.value, rel, err, want)
			}
			continue
		}
		if err != nil || rel != tc.rel {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.value, rel, err, tc.rel)
		}
	}
}

func TestElement(t *testing.T) {
	for in, want := range map[string]string{
		"train": "train", "my-job_1.v2": "my-job_1.v2", "a/b": "a%2Fb", "..": "%2E.", ".hadar-ids": "%2Ehadar-ids",
		"100%": "100%25", "": "error", "a\x00": "error", strings.Repeat("x", 300): "error",
	} {
		got, err := Element(in)
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("Element(%q) = %q, want %q", in, got, want)
		}
	}
}

func statOf(t *testing.T, p string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("mode %o uid %d gid %d mtime %v nlink %d", st.Mode, st.Uid, st.Gid, st.Mtim, st.Nlink)
}

// checkpoint_dir = "/etc" is refused and /etc is left as it was (the
// old driver made it and gave it to the task's user).
func TestAbsoluteOutsideRefused(t *testing.T) {
	root, _ := testRoot(t)
	job := jobDir(t, root, "default", "train", false)
	before := statOf(t, "/etc")
	for _, d := range []*Dir{root, job} {
		if p, err := d.MkdirAll("checkpoint_dir", "/etc"); err == nil || !strings.Contains(err.Error(), `checkpoint_dir "/etc": not under`) {
			t.Errorf("MkdirAll(/etc) in %s = %q, %v; want refused", d.Path(), p, err)
		}
		if _, err := d.MkdirAll("checkpoint_dir", "/etc/hadar"); err == nil {
			t.Errorf("MkdirAll(/etc/hadar) in %s succeeded", d.Path())
		}
	}
	if after := statOf(t, "/etc"); after != before {
		t.Errorf("/etc changed: %s -> %s", before, after)
	}
	if _, err := os.Stat("/etc/hadar"); err == nil {
		t.Errorf("/etc/hadar created")
	}
}

// ".." cannot climb out of the job's directory, to the root or beyond.
func TestDotDotRefused(t *testing.T) {
	root, top := testRoot(t)
	job := jobDir(t, root, "default", "train", false)
	for _, v := range []string{"../other", "../../default", "x/../../../escape", job.Path() + "/../other"} {
		if p, err := job.MkdirAll("checkpoint_dir", v); err == nil || !strings.Contains(err.Error(), `".." is not allowed`) {
			t.Errorf("MkdirAll(%q) = %q, %v; want refused", v, p, err)
		}
	}
	for _, p := range []string{filepath.Join(root.Path(), "default", "other"), filepath.Join(top, "escape")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s created", p)
		}
	}
}

// A link inside the job's directory is never followed: not to outside
// the root, and not to another job's directory inside it; for
// directories, for files the driver reads and for files it writes.
func TestSymlinksRefused(t *testing.T) {
	both(t, func(t *testing.T, walk bool) {
		root, top := testRoot(t)
		job := jobDir(t, root, "default", "train", walk)
		other := jobDir(t, root, "default", "other", walk)
		outside := filepath.Join(top, "outside")
		if err := os.Mkdir(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		secret := filepath.Join(outside, "secret")
		if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		for name, target := range map[string]string{"out": outside, "rel-out": "../../../outside", "next-door": other.Path(), "file": secret} {
			if err := os.Symlink(target, filepath.Join(job.Path(), name)); err != nil {
				t.Fatal(err)
			}
		}
		for _, v := range []string{"out", "out/x", "rel-out/x", "next-door/x", filepath.Join(job.Path(), "out", "x")} {
			if p, err := job.MkdirAll("checkpoint_dir", v); err == nil || !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("MkdirAll(%q) = %q, %v; want refused as a link", v, p, err)
			}
		}
		for _, v := range []string{"file", "out/secret", "rel-out/secret"} {
			if b, err := job.ReadFile("progress_file", v, 1<<20); err == nil || !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("ReadFile(%q) = %q, %v; want refused as a link", v, b, err)
			}
			if err := job.WriteFile("progress_file", v, []byte("x"), 0o644); v != "file" && err == nil {
				t.Errorf("WriteFile(%q) succeeded through a link", v)
			}
		}
		// Writing over a link replaces the link, not its target.
		if got := statOf(t, filepath.Join(job.Path(), "file")); !strings.HasPrefix(got, "mode 100644") {
			t.Errorf("the link written over: %s", got)
		}
		if b, _ := os.ReadFile(secret); string(b) != "secret" {
			t.Errorf("the file outside was changed: %q", b)
		}
		for _, d := range []string{outside, other.Path()} {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				if e.Name() != "secret" {
					t.Errorf("%s: %s created through a link", d, e.Name())
				}
			}
		}
		// The root itself may be reached through a link: it is the
		// operator's.
		alias := filepath.Join(top, "alias")
		if err := os.Symlink(root.Path(), alias); err != nil {
			t.Fatal(err)
		}
		r2, err := OpenRoot("checkpoint_root", alias)
		if err != nil {
			t.Fatalf("root through a link: %v", err)
		}
		r2.Close()
	})
}

// What the driver reads as root must be a regular file with one link,
// and a FIFO does not block it.
func TestReadFile(t *testing.T) {
	both(t, func(t *testing.T, walk bool) {
		root, _ := testRoot(t)
		job := jobDir(t, root, "default", "train", walk)
		p := filepath.Join(job.Path(), "progress.json")
		if err := os.WriteFile(p, []byte(`{"steps_done":3}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, err := job.ReadFile("progress_file", "progress.json", 1<<20); err != nil || string(b) != `{"steps_done":3}` {
			t.Errorf("ReadFile = %q, %v", b, err)
		}
		if _, err := job.ReadFile("progress_file", "progress.json", 4); err == nil || !strings.Contains(err.Error(), "more than") {
			t.Errorf("ReadFile past max: %v", err)
		}
		if err := os.Link(p, filepath.Join(job.Path(), "hard")); err != nil {
			t.Fatal(err)
		}
		if _, err := job.ReadFile("progress_file", "hard", 1<<20); err == nil || !strings.Contains(err.Error(), "hard links") {
			t.Errorf("ReadFile of a hard link: %v", err)
		}
		if err := syscall.Mkfifo(filepath.Join(job.Path(), "fifo"), 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := job.ReadFile("progress_file", "fifo", 1<<20); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("ReadFile of a FIFO: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("ReadFile blocked on a FIFO")
		}
		if _, err := job.ReadFile("progress_file", "missing", 1<<20); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("ReadFile of a missing file: %v, want ErrNotExist", err)
		}
		if err := job.WriteFile("progress_file", "out/mirror.json", []byte("{}"), 0o644); err == nil {
			t.Error("WriteFile into a missing directory succeeded")
		}
		if err := job.WriteFile("progress_file", "mirror.json", []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := statOf(t, filepath.Join(job.Path(), "mirror.json")); !strings.HasPrefix(got, "mode 100644 uid 0") {
			t.Errorf("mirror: %s", got)
		}
	})
}

// Two jobs get different ids and directories that the other's uid
// cannot enter; each job's uid can use its own.
func TestJobsIsolated(t *testing.T) {
	root, _ := testRoot(t)
	a := jobDir(t, root, "default", "job-a", false)
	b := jobDir(t, root, "default", "job-b", false)
	ua, ga := a.IDs()
	ub, gb := b.IDs()
	if ua == ub || ga == gb || ua < rng.First || ub >= rng.First+rng.Count {
		t.Fatalf("ids: a %d:%d, b %d:%d; want distinct ids in %s", ua, ga, ub, gb, rng)
	}
	var files []string
	for _, d := range []*Dir{a, b} {
		ckpt, err := d.MkdirAll("checkpoint_dir", "run/ckpt")
		if err != nil {
			t.Fatal(err)
		}
		uid, gid := d.IDs()
		if got, want := statOf(t, ckpt), fmt.Sprintf("mode 42770 uid %d gid %d", uid, gid); !strings.HasPrefix(got, want) {
			t.Errorf("%s: %s, want %s", ckpt, got, want)
		}
		if got, want := statOf(t, d.Path()), fmt.Sprintf("mode 42770 uid %d gid %d", uid, gid); !strings.HasPrefix(got, want) {
			t.Errorf("%s: %s, want %s", d.Path(), got, want)
		}
		// Written by the job's own task, as its uid.
		f := filepath.Join(ckpt, "ckpt-1.pt")
		if out, err := runAs(uid, gid, "/bin/sh", "-c", "umask 022; echo weights > "+f); err != nil {
			t.Fatalf("job's own uid cannot write its checkpoint: %v: %s", err, out)
		}
		files = append(files, f)
	}
	if got := statOf(t, filepath.Dir(a.Path())); !strings.HasPrefix(got, "mode 40711 uid 0") {
		t.Errorf("namespace dir: %s, want root's 0711", got)
	}
	for i, tc := range []struct {
		uid, gid int
		own      string
	}{{ua, ga, files[0]}, {ub, gb, files[1]}} {
		if out, err := runAs(tc.uid, tc.gid, "/bin/cat", tc.own); err != nil || strings.TrimSpace(out) != "weights" {
			t.Errorf("uid %d cannot read its own checkpoint: %v: %s", tc.uid, err, out)
		}
		theirs := files[1-i]
		for _, args := range [][]string{{"/bin/cat", theirs}, {"/bin/ls", filepath.Dir(theirs)}, {"/bin/ls", filepath.Dir(filepath.Dir(filepath.Dir(theirs)))}} {
			out, err := runAs(tc.uid, tc.gid, args...)
			if err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("uid %d: %v: %v: %s; want EACCES", tc.uid, args, err, out)
			}
		}
	}
	// Listing the namespace (to find other jobs) is refused too.
	if out, err := runAs(ua, ga, "/bin/ls", filepath.Dir(a.Path())); err == nil {
		t.Errorf("job a lists the namespace: %s", out)
	}
	// A task run as a named user with the job's gid as a supplementary
	// group reaches the job's directory.
	if out, err := runAsGroups(4000123, 4000123, []int{ga}, "/bin/cat", files[0]); err != nil || strings.TrimSpace(out) != "weights" {
		t.Errorf("a named user with job a's group cannot read a's checkpoint: %v: %s", err, out)
	}
	if out, err := runAsGroups(4000123, 4000123, []int{ga}, "/bin/cat", files[1]); err == nil {
		t.Errorf("a named user with job a's group reads b's checkpoint: %s", out)
	}
}

func runAs(uid, gid int, args ...string) (string, error) {
	return runAsGroups(uid, gid, []int{gid}, args...)
}

func runAsGroups(uid, gid int, groups []int, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	gs := make([]uint32, len(groups))
	for i, g := range groups {
		gs[i] = uint32(g)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: gs}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A job directory someone else owns (made before per-job ownership, as
// nobody) is refused, saying how to adopt it.
func TestForeignJobDirRefused(t *testing.T) {
	root, _ := testRoot(t)
	old := filepath.Join(root.Path(), "default", "legacy")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(old, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, err := root.JobDir("default", "legacy", rng.First+7, rng.First+7)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("chown -R %d:%d %s", rng.First+7, rng.First+7, old)) {
		t.Errorf("JobDir over a nobody-owned directory: %v", err)
	}
	if got := statOf(t, old); !strings.Contains(got, "uid 65534") {
		t.Errorf("the old directory was changed: %s", got)
	}
}

func TestOpenRootRefusesWritable(t *testing.T) {
	needRoot(t)
	top, err := os.MkdirTemp("", "hadar-confine-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	for _, tc := range []struct {
		mode     os.FileMode
		uid      int
		wantFail bool
	}{{0o755, 0, false}, {0o711, 0, false}, {0o777, 0, true}, {0o775, 0, true}, {0o755, 65534, true}} {
		p := filepath.Join(top, fmt.Sprintf("root-%o-%d", tc.mode, tc.uid))
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, tc.uid, 0); err != nil {
			t.Fatal(err)
		}
		d, err := OpenRoot("merge_root", p)
		if (err != nil) != tc.wantFail {
			t.Errorf("mode %o uid %d: %v", tc.mode, tc.uid, err)
		}
		if err == nil {
			d.Close()
		}
	}
	if _, err := OpenRoot("merge_root", "relative/root"); err == nil {
		t.Error("relative root accepted")
	}
}

// A job's ids are the same across calls, allocators and processes, and
// after the index entry is lost.
func TestIDsStable(t *testing.T) {
	root, _ := testRoot(t)
	a, err := NewAllocator(root, rng)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	uid, gid, err := a.IDs("default", "train")
	if err != nil {
		t.Fatal(err)
	}
	if uid != gid {
		t.Errorf("uid %d gid %d: want the same number", uid, gid)
	}
	a2, err := NewAllocator(root, rng)
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	for i := 0; i < 3; i++ {
		if u, g, err := a2.IDs("default", "train"); err != nil || u != uid || g != gid {
			t.Errorf("call %d: %d:%d, %v; want %d:%d", i, u, g, err, uid, gid)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), idsEnv+"="+strings.Join([]string{root.Path(), strconv.Itoa(rng.First), strconv.Itoa(rng.Count), "default", "train"}, "|"))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != fmt.Sprintf("%d %d", uid, gid) {
		t.Errorf("another process: %q, %v; want %d %d", out, err, uid, gid)
	}
	ents, err := os.ReadDir(filepath.Join(root.Path(), idsDir, "by-job"))
	if err != nil || len(ents) != 1 {
		t.Fatalf("index: %v %v", ents, err)
	}
	if err := os.Remove(filepath.Join(root.Path(), idsDir, "by-job", ents[0].Name())); err != nil {
		t.Fatal(err)
	}
	if u, _, err := a.IDs("default", "train"); err != nil || u != uid {
		t.Errorf("after losing the index: %d, %v; want %d", u, err, uid)
	}
	// The same job name in another namespace is another job.
	if u, _, err := a.IDs("other-ns", "train"); err != nil || u == uid {
		t.Errorf("train in another namespace: %d, %v; want an id other than %d", u, err, uid)
	}
}

// Concurrent allocations (as from several nodes) in a small range give
// every job its own id until the range is full.
func TestIDsConcurrent(t *testing.T) {
	root, _ := testRoot(t)
	small := IDRange{First: 3100000, Count: 8}
	var wg sync.WaitGroup
	ids := make([]int, small.Count)
	errs := make([]error, small.Count)
	for i := range small.Count {
		wg.Go(func() {
			a, err := NewAllocator(root, small)
			if err != nil {
				errs[i] = err
				return
			}
			defer a.Close()
			ids[i], _, errs[i] = a.IDs("default", fmt.Sprintf("job-%d", i))
		})
	}
	wg.Wait()
	seen := map[int]bool{}
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("job-%d: %v", i, errs[i])
		}
		if seen[id] || id < small.First || id >= small.First+small.Count {
			t.Errorf("job-%d got %d (ids %v)", i, id, ids)
		}
		seen[id] = true
	}
	a, err := NewAllocator(root, small)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, _, err := a.IDs("default", "one-too-many"); err == nil || !strings.Contains(err.Error(), "is full") {
		t.Errorf("allocation past the range: %v", err)
	}
	if id, _, err := a.IDs("default", "job-3"); err != nil || id != ids[3] {
		t.Errorf("job-3 again: %d, %v; want %d", id, err, ids[3])
	}
}

func TestAllocatorRefusesUsedRange(t *testing.T) {
	root, _ := testRoot(t)
	for _, r := range []IDRange{{0, 10}, {65000, 1000}, {1, 0}} {
		if a, err := NewAllocator(root, r); err == nil {
			a.Close()
			t.Errorf("range %v accepted", r)
		}
	}
	// root's own group, 0, is in /etc/group; uid 1 (daemon) usually too.
	if _, err := NewAllocator(root, IDRange{1, 5}); err == nil || !strings.Contains(err.Error(), "/etc/") {
		t.Errorf("range over system accounts: %v", err)
	}
}

// A task swapping an element of the path between a directory and a link
// out, while the driver creates and reads below it, never gets the
// driver to work outside.
func TestSwapRace(t *testing.T) {
	both(t, func(t *testing.T, walk bool) {
		root, top := testRoot(t)
		job := jobDir(t, root, "default", "train", walk)
		outside := filepath.Join(top, "outside")
		if err := os.Mkdir(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, "progress.json"), []byte("outside"), 0o644); err != nil {
			t.Fatal(err)
		}
		sw := filepath.Join(job.Path(), "sw")
		if err := os.Mkdir(sw, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sw, "progress.json"), []byte("inside"), 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(job.Path(), "sw-link")
		if err := os.Symlink(outside, link); err != nil {
			t.Fatal(err)
		}
		if b, err := job.ReadFile("progress_file", "sw/progress.json", 1<<10); err != nil || string(b) != "inside" {
			t.Fatalf("before the race: %q, %v", b, err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			// Swap sw between the real directory and the link, atomically
			// (sw is always one or the other), as fast as it goes.
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := unix.Renameat2(unix.AT_FDCWD, sw, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE); err != nil {
					t.Errorf("swap: %v", err)
					return
				}
			}
		})
		deadline := time.Now().Add(time.Second)
		created, read := 0, 0
		for i := 0; time.Now().Before(deadline); i++ {
			if _, err := job.MkdirAll("checkpoint_dir", fmt.Sprintf("sw/run-%d", i)); err == nil {
				created++
			}
			if b, err := job.ReadFile("progress_file", "sw/progress.json", 1<<10); err == nil {
				read++
				if string(b) != "inside" {
					t.Errorf("read %q through the link", b)
				}
			}
		}
		close(stop)
		wg.Wait()
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("created outside through the link: %v", names)
		}
		t.Logf("%d directories made and %d reads inside while the path was swapped", created, read)
	})
}

// WithIDs gives what it creates to the job, in a directory the driver
// trusts; Remove and Lstat never go through a link.
func TestWithIDsRemoveLstat(t *testing.T) {
	both(t, func(t *testing.T, walk bool) {
		root, top := testRoot(t)
		victim := filepath.Join(top, "victim")
		if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := root.WithIDs(0, 0); err == nil {
			t.Error("WithIDs(0, 0) accepted: directories made for a job are never root's")
		}
		d, err := root.WithIDs(rng.First, rng.First)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		d.walk = walk
		p, err := d.Mkdir("checkpoints", "trainer")
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{filepath.Dir(p), p} {
			if got, want := statOf(t, q), fmt.Sprintf("mode 42770 uid %d gid %d", rng.First, rng.First); !strings.HasPrefix(got, want) {
				t.Errorf("%s: %s, want %s", q, got, want)
			}
		}
		// A link to a file outside: Remove takes the link, not the file.
		if err := os.Symlink(victim, filepath.Join(p, "progress.json")); err != nil {
			t.Fatal(err)
		}
		if st, err := d.Lstat("progress_file", "checkpoints/trainer/progress.json"); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("Lstat of a link: mode %#o, %v; want the link's own status", st.Mode, err)
		}
		if err := d.Remove("progress_file", "checkpoints/trainer/progress.json"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(p, "progress.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("link not removed: %v", err)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
			t.Errorf("the link's target: %q, %v", b, err)
		}
		// A link in the path: neither followed by Remove nor by Lstat.
		if err := os.Symlink(top, filepath.Join(p, "up")); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove("progress_file", "checkpoints/trainer/up/victim"); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("Remove through a link: %v", err)
		}
		if _, err := d.Lstat("checkpoint", "checkpoints/trainer/up/victim"); err == nil {
			t.Error("Lstat through a link succeeded")
		}
		if _, err := os.Stat(victim); err != nil {
			t.Errorf("victim: %v", err)
		}
		if err := d.Remove("progress_file", "checkpoints/trainer/missing"); err != nil {
			t.Errorf("Remove of a missing file: %v", err)
		}
		if err := d.Remove("progress_file", "checkpoints/none/missing"); err != nil {
			t.Errorf("Remove in a missing directory: %v", err)
		}
		if err := d.Remove("progress_file", "/etc/passwd"); err == nil {
			t.Error("Remove outside the directory accepted")
		}
	})
}

// Two tasks of one job starting at once on a node both make its directory:
// the one that finds it still being given to the job waits for that
// instead of refusing the job its own directory (make test: a two-worker
// start on one node failed "owned by 0:0, not this job's").
func TestJobDirMadeConcurrently(t *testing.T) {
	root, _ := testRoot(t)
	const n = 16
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			d, err := root.JobDir("default", "together", rng.First+9, rng.First+9)
			if err != nil {
				errs <- err
				return
			}
			defer d.Close()
			// Each worker's task of the same name: one directory.
			dir, err := d.Mkdir("checkpoints", "trainer")
			if err == nil {
				var st unix.Stat_t
				if st, err = d.Lstat("checkpoint directory", dir); err == nil && (int(st.Uid) != rng.First+9 || int(st.Gid) != rng.First+9) {
					err = fmt.Errorf("%s owned by %d:%d", dir, st.Uid, st.Gid)
				}
			}
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Errorf("JobDir %d: %v", i, err)
		}
	}
}

// A plugin killed between mkdirat and fchown leaves a directory of root's
// below the job's directory; there (setgid) it is 02700, not 0700. It is
// given to the job once no sibling is giving it (it is empty: nothing
// but the driver writes a directory of root's there), never handed on as
// root's: the task could not enter its own checkpoint directory.
func TestLeftoverDirBelowJobDir(t *testing.T) {
	root, _ := testRoot(t)
	id := rng.First + 11
	d, err := root.JobDir("default", "killed", id, id)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := unix.Mkdirat(d.fd, "checkpoints", 0o700); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, "checkpoints", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o2700 {
		t.Fatalf("leftover made %#o, want 02700 below the setgid job directory", st.Mode&0o7777)
	}
	dir, err := d.Mkdir("checkpoints", "trainer")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Dir(dir), dir} {
		if st, err = d.Lstat("checkpoint directory", p); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != id || int(st.Gid) != id || st.Mode&0o7777 != 0o2770 {
			t.Errorf("%s: owned by %d:%d mode %#o, want %d:%d 02770", p, st.Uid, st.Gid, st.Mode&0o7777, id, id)
		}
	}

	// A directory of root's that holds something is no leftover of
	// mkdirOne (it gives a directory away before filling it): refused,
	// naming the fix.
	if err := unix.Mkdirat(d.fd, "other", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.path, "other", "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Mkdir("other", "x"); err == nil || !strings.Contains(err.Error(), "chown") {
		t.Errorf("a non-empty directory of root's below the job's: err %v, want a refusal naming chown", err)
	}
}

// An id in the range that the system's user database knows (NSS: LDAP,
// SSSD) but /etc/passwd and /etc/group do not is never given to a job:
// the job would own that account's files (issue #30, item 8). NSS is
// stood in for: no test machine has an LDAP account in the range.
func TestIDKnownToNSS(t *testing.T) {
	root, _ := testRoot(t)
	a, err := NewAllocator(root, rng)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	orig := accountOf
	t.Cleanup(func() { accountOf = orig })
	accountOf = func(id int) string {
		if id >= rng.First && id < rng.First+rng.Count {
			return fmt.Sprintf("user %q (uid %d)", "ldap-alice", id)
		}
		return ""
	}
	if uid, _, err := a.IDs("default", "nss"); err == nil || !strings.Contains(err.Error(), "ldap-alice") || !strings.Contains(err.Error(), "id_range") {
		t.Errorf("IDs with every id of the range an NSS account's: uid %d, %v; want a refusal naming the account and id_range", uid, err)
	}
	accountOf = orig
	if _, _, err := a.IDs("default", "nss"); err != nil {
		t.Errorf("IDs without NSS accounts in the range: %v", err)
	}
}

// The ids of a job that is gone (nothing of it left under any root, its
// claim not used for the grace period) go to a new job once the range is
// full; a job that is not gone, or whose claim is recent, keeps its id;
// a claim checks a bounded number of candidates; InUse counts the ids
// claimed (issue #30, item 5).
func TestReclaimGoneJobs(t *testing.T) {
	root, _ := testRoot(t)
	small := IDRange{First: rng.First + 500, Count: 3}
	a, err := NewAllocator(root, small)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var held []int
	for _, j := range []string{"old-1", "old-2", "live"} {
		id, _, err := a.IDs("default", j)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, id)
	}
	if n, err := a.InUse(); err != nil || n != 3 {
		t.Errorf("InUse %d, %v; want 3", n, err)
	}
	// Nothing of old-1 and old-2 is left; live has a directory.
	asked := map[string]int{}
	a.Reclaim(time.Hour, func(ns, job string) (bool, error) {
		asked[job]++
		return strings.HasPrefix(job, "old-"), nil
	})
	if _, _, err := a.IDs("default", "new-0"); err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("a claim used within the grace period was reclaimed: %v", err)
	}
	// The claims age past the grace period.
	past := time.Now().Add(-2 * time.Hour)
	for _, id := range held {
		ts := []unix.Timespec{unix.NsecToTimespec(past.UnixNano()), unix.NsecToTimespec(past.UnixNano())}
		if err := unix.UtimesNanoAt(a.byID, strconv.Itoa(id), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
	got := map[int]bool{}
	for _, j := range []string{"new-1", "new-2"} {
		id, _, err := a.IDs("default", j)
		if err != nil {
			t.Fatalf("%s: %v", j, err)
		}
		got[id] = true
	}
	if len(got) != 2 || got[held[2]] {
		t.Errorf("new jobs got %v; want the two gone jobs' ids %v, not the live job's %d", got, held[:2], held[2])
	}
	if id, _, err := a.IDs("default", "live"); err != nil || id != held[2] {
		t.Errorf("the live job: %d, %v; want its id %d", id, err, held[2])
	}
	if _, _, err := a.IDs("default", "new-3"); err == nil {
		t.Error("a job not gone had its id taken")
	}
	for j, n := range asked {
		if n > maxReclaimChecks*4 {
			t.Errorf("asked about %s %d times over four claims", j, n)
		}
	}
	if n, err := a.InUse(); err != nil || n != 3 {
		t.Errorf("InUse %d, %v; want 3", n, err)
	}
	// A gone job that comes back gets a fresh id, not a record of the
	// one taken from it.
	if _, _, err := a.IDs("default", "old-1"); err == nil {
		t.Error("old-1 came back with an id although the range is full")
	}
}
