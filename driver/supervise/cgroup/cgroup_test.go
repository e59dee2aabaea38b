package cgroup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseMountinfo(t *testing.T) {
	hybrid := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	for _, tc := range []struct {
		name, in string
		want     *Hierarchy
		err      string
	}{
		{"v2", "30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n", &Hierarchy{Version: V2, Root: "/sys/fs/cgroup"}, ""},
		{"hybrid is v1", hybrid, &Hierarchy{Version: V1, Mounts: map[string]string{
			"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct", "memory": "/sys/fs/cgroup/memory",
			"freezer": "/sys/fs/cgroup/freezer", "pids": "/sys/fs/cgroup/pids"}}, ""},
		{"controllers mounted together", `25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
26 24 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
26 24 0:23 /sub /mnt/elsewhere rw - cgroup cgroup rw,freezer
27 24 0:24 / /sys/fs/cgroup/free\040zer rw - cgroup cgroup rw,freezer
`, &Hierarchy{Version: V1, Mounts: map[string]string{
			"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "memory": "/sys/fs/cgroup/memory",
			"freezer": "/sys/fs/cgroup/free zer"}}, ""},
		{"none", "22 1 0:21 / / rw - ext4 /dev/vda rw\n", nil, "no cgroup2 filesystem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseMountinfo([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(*h) != fmt.Sprint(*tc.want) {
				t.Errorf("got %+v, want %+v", *h, *tc.want)
			}
		})
	}
}

func TestWeight(t *testing.T) {
	for shares, want := range map[int64]int64{0: 1, 2: 1, 1024: 39, 262144: 10000, 500000: 10000} {
		if got := Weight(shares); got != want {
			t.Errorf("Weight(%d) = %d, want %d", shares, got, want)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		l   Limits
		err string
	}{
		{Limits{}, ""},
		{Limits{CPUShares: 1024, CPUQuota: 50 * time.Millisecond, MemoryMax: 1 << 30, MemoryLow: 1 << 29}, ""},
		{Limits{MemoryMax: -1, MemoryLow: 1 << 29}, ""},
		{Limits{CPUShares: -1}, "cpu shares"},
		{Limits{CPUShares: 300000}, "cpu shares"},
		{Limits{CPUQuota: time.Microsecond}, "cpu quota"},
		{Limits{CPUQuota: time.Millisecond, CPUPeriod: 2 * time.Second}, "cpu period"},
		{Limits{MemoryMax: -2}, "memory max"},
		{Limits{MemoryMax: 1 << 20, MemoryLow: 1 << 21}, "above memory max"},
	} {
		err := tc.l.validate()
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: error %v, want %q", tc.l, err, tc.err)
		}
	}
}

func TestRelative(t *testing.T) {
	v2 := &Hierarchy{Version: V2, Root: "/sys/fs/cgroup"}
	for in, want := range map[string]string{
		"/sys/fs/cgroup/nomad.slice/share.slice/a.t.scope": "nomad.slice/share.slice/a.t.scope",
		"nomad.slice/x.scope":                              "nomad.slice/x.scope",
		"/etc/passwd":                                      "error",
		"/sys/fs/cgroup":                                   "error",
		"../etc":                                           "error",
		"a/../../b":                                        "error",
	} {
		got, err := v2.relative(in)
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("relative(%q) = %q (%v), want %q", in, got, err, want)
		}
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("makes cgroups, which needs root; this test runs as uid %d (CI runs as root)", os.Geteuid())
	}
}

// testGroup creates a group for the test and removes it (failing the
// test if it cannot) when the test ends.
func testGroup(t *testing.T, h *Hierarchy) *Group {
	t.Helper()
	rel := fmt.Sprintf("hadar-cgroup-test-%d/%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
	g, err := Create(h, rel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := g.Kill(ctx); err != nil {
			t.Error(err)
		}
		if err := g.Remove(ctx); err != nil {
			t.Error(err)
		}
		if g.Exists() {
			t.Errorf("group %s still there", rel)
		}
		// The parent made for the test, in every hierarchy.
		for _, d := range g.dirs() {
			_ = syscall.Rmdir(filepath.Dir(d))
		}
	})
	return g
}

// hierarchies are the layouts this machine can test: the detected one,
// and on a hybrid host also its cgroup2 mount (no controllers there, but
// creating, entering, killing and removing work the same).
func hierarchies(t *testing.T) map[string]*Hierarchy {
	t.Helper()
	needRoot(t)
	h, err := Detect()
	if err != nil {
		t.Skipf("no cgroups here: %v", err)
	}
	out := map[string]*Hierarchy{fmt.Sprintf("v%d", h.Version): h}
	if h.Version == V1 {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for line := range strings.Lines(string(b)) {
			pre, post, _ := strings.Cut(line, " - ")
			if f := strings.Fields(pre); strings.HasPrefix(post, "cgroup2 ") && len(f) > 4 && f[3] == "/" {
				out["v2 without controllers"] = &Hierarchy{Version: V2, Root: f[4]}
			}
		}
	}
	return out
}

// A process started in a group is in it (and only it: the starter is
// not), is listed, is accounted for, and Kill leaves none of a process
// tree that keeps forking.
func TestStartKillRemove(t *testing.T) {
	for name, h := range hierarchies(t) {
		t.Run(name, func(t *testing.T) {
			g := testGroup(t, h)
			cmd := exec.Command("/bin/sh", "-c", `i=0; while [ $i -lt 3000 ]; do sleep 100 & i=$((i+1)); sleep 0.01; done`)
			if err := g.Start(cmd); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), ":/"+g.st.Rel+"\n") {
				t.Errorf("process not in %s:\n%s", g.st.Rel, b)
			}
			self, _ := os.ReadFile("/proc/self/cgroup")
			if strings.Contains(string(self), g.st.Rel) {
				t.Errorf("the starting process stayed in the group:\n%s", self)
			}
			time.Sleep(200 * time.Millisecond)
			pids, err := g.Procs()
			if err != nil {
				t.Fatal(err)
			}
			if len(pids) < 3 || !slices.Contains(pids, cmd.Process.Pid) || slices.Contains(pids, os.Getpid()) {
				t.Errorf("procs %v: want the shell %d and its sleeps, not this process", pids, cmd.Process.Pid)
			}
			if s, err := g.Stats(); err != nil || s.CPUTotal == 0 {
				t.Errorf("stats %+v, %v: want CPU time", s, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := g.Kill(ctx); err != nil {
				t.Fatal(err)
			}
			if pids, _ := g.Procs(); len(pids) != 0 {
				t.Errorf("after Kill: %v", pids)
			}
			<-done
			for _, p := range pids {
				// Gone, or a zombie waiting for init to reap it.
				b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
				if i := strings.LastIndexByte(string(b), ')'); err == nil && i > 0 && !strings.HasPrefix(string(b[i+1:]), " Z") {
					t.Errorf("process %d of the group survived: %s", p, b)
				}
			}
			if err := g.Remove(ctx); err != nil || g.Exists() {
				t.Errorf("Remove: %v (exists %v)", err, g.Exists())
			}
		})
	}
}

// Open of an existing group uses it and leaves it; Create of one refuses.
func TestOpenExisting(t *testing.T) {
	for name, h := range hierarchies(t) {
		t.Run(name, func(t *testing.T) {
			g := testGroup(t, h)
			if _, err := Create(h, g.st.Rel); err == nil || !strings.Contains(err.Error(), "already exists") {
				t.Errorf("Create of an existing group: %v", err)
			}
			o, err := Open(h, g.st.Rel)
			if err != nil {
				t.Fatal(err)
			}
			if len(o.st.Created) != 0 {
				t.Errorf("Open made %v", o.st.Created)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := o.Remove(ctx); err != nil || !g.Exists() {
				t.Errorf("Remove of an opened group removed it (%v)", err)
			}
			if _, err := Open(h, g.st.Rel+"-missing"); err == nil {
				t.Error("Open of a missing group succeeded")
			}
			for _, d := range g.dirs() {
				if _, err := os.Stat(d + "-missing"); err == nil {
					t.Errorf("Open of a missing group left %s", d+"-missing")
				}
			}
		})
	}
}

// A memory limit holds swap too: without it a task exceeds its limit by
// swapping (issue #30). memory.swap.max is 0 on v2, and on v1
// memory.memsw.limit_in_bytes is the memory limit, where the kernel
// accounts swap (the files exist).
func TestNoSwapPastLimit(t *testing.T) {
	for name, h := range hierarchies(t) {
		t.Run(name, func(t *testing.T) {
			g := testGroup(t, h)
			const limit = 64 << 20
			if c, _ := os.ReadFile(filepath.Join(g.dir("memory"), "cgroup.controllers")); g.st.Version == V2 && !strings.Contains(string(c), "memory") {
				t.Skip("no memory controller in this v2 hierarchy")
			}
			if err := g.Apply(Limits{MemoryMax: limit}); err != nil {
				t.Fatal(err)
			}
			file, want := "memory.memsw.limit_in_bytes", strconv.Itoa(limit)
			if g.st.Version == V2 {
				file, want = "memory.swap.max", "0"
			}
			if _, err := os.Stat(filepath.Join(g.dir("memory"), file)); err != nil {
				t.Skipf("%s: this kernel does not account swap (%v)", file, err)
			}
			if got, err := g.read("memory", file); err != nil || strings.TrimSpace(got) != want {
				t.Errorf("%s = %q (%v), want %s", file, got, err, want)
			}
			if err := g.Apply(Limits{MemoryMax: -1}); err != nil {
				t.Errorf("lifting the limit: %v", err)
			}
		})
	}
}
