// Package cgroup puts a task's processes in a Linux cgroup, sets its CPU
// and memory limits, kills every process in it, and reads its usage. It
// works on the cgroup filesystem directly, in both layouts a Nomad client
// meets: the unified cgroup v2 hierarchy mounted at /sys/fs/cgroup, and
// cgroup v1 (one hierarchy per controller under /sys/fs/cgroup, as on
// hybrid hosts).
//
// Why the filesystem and not a library: github.com/containerd/cgroups/v3
// and github.com/opencontainers/cgroups are not in the project's package
// list, and what hadar needs is a handful of files (a few hundred lines
// here); a library would bring systemd/dbus code paths hadar does not use.
//
// How a process gets in without ever running outside the cgroup:
//   - v2: the child is cloned straight into it (clone3 CLONE_INTO_CGROUP,
//     Linux 5.7+, through SysProcAttr.UseCgroupFD);
//   - v1: there is no such flag, but v1 places threads, not only
//     processes: one locked OS thread joins the cgroups (their "tasks"
//     files), forks the child there (a child inherits its forking
//     thread's cgroups) and goes back to its own cgroups (or, if it
//     cannot, ends with its goroutine), so the starting process never
//     stays in the task's group: Kill would otherwise freeze it too.
package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hadar-sched/hadar/driver/mountinfo"
)

// Version is the cgroup layout.
type Version int

// The layouts.
const (
	V1 Version = 1
	V2 Version = 2
)

// DefaultMount is where cgroup filesystems are mounted.
const DefaultMount = "/sys/fs/cgroup"

// v1Controllers are the v1 controllers a task's group spans: limits
// (cpu, memory), accounting (cpuacct), process count (pids, optional) and
// killing without races (freezer).
var (
	v1Required = []string{"cpu", "cpuacct", "memory", "freezer"}
	v1Optional = []string{"pids"}
)

// Hierarchy says where the cgroup filesystems are.
type Hierarchy struct {
	Version Version `json:"version"`
	// Root is the cgroup2 mount (v2).
	Root string `json:"root,omitempty"`
	// Mounts maps each v1 controller to its hierarchy's mount (v1);
	// controllers mounted together share a directory.
	Mounts map[string]string `json:"mounts,omitempty"`
}

// Detect reads /proc/self/mountinfo: v2 when a cgroup2 filesystem is
// mounted at /sys/fs/cgroup, v1 when the v1 controllers are mounted
// (under /sys/fs/cgroup on hybrid hosts).
func Detect() (*Hierarchy, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup: read mounts: %w", err)
	}
	return parseMountinfo(b)
}

func parseMountinfo(b []byte) (*Hierarchy, error) {
	v1 := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || f[3] != "/" {
			continue
		}
		mnt := mountinfo.Unescape(f[4])
		switch g[0] {
		case "cgroup2":
			if mnt == DefaultMount {
				return &Hierarchy{Version: V2, Root: mnt}, nil
			}
		case "cgroup":
			for _, opt := range strings.Split(g[2], ",") {
				if _, seen := v1[opt]; !seen && slices.Contains(append(v1Required, v1Optional...), opt) {
					v1[opt] = mnt
				}
			}
		}
	}
	if len(v1) == 0 {
		return nil, errors.New("cgroup: no cgroup2 filesystem at /sys/fs/cgroup and no v1 controllers mounted; mount cgroup2 at /sys/fs/cgroup")
	}
	return &Hierarchy{Version: V1, Mounts: v1}, nil
}

// Limits are a task's resources. Zero leaves a setting as it is.
type Limits struct {
	// CPUShares is Nomad's relative CPU weight (its cpu.shares, 2 to
	// 262144): cpu.shares on v1, cpu.weight (1 to 10000) on v2.
	CPUShares int64 `json:"cpu_shares,omitempty"`
	// CPUQuota and CPUPeriod cap CPU time: at most CPUQuota per CPUPeriod
	// (cpu.max, or cpu.cfs_quota_us and cpu.cfs_period_us). Period
	// defaults to 100ms.
	CPUQuota  time.Duration `json:"cpu_quota,omitempty"`
	CPUPeriod time.Duration `json:"cpu_period,omitempty"`
	// MemoryMax is the hard limit in bytes: past it the kernel's OOM
	// killer kills a process of the group (memory.max,
	// memory.limit_in_bytes). -1 is no limit (Nomad's memory_max = -1).
	MemoryMax int64 `json:"memory_max,omitempty"`
	// MemoryLow is the memory reserved for the group in bytes (Nomad's
	// memory when memory_max is set above it): memory.low on v2 (the
	// kernel reclaims from others first), memory.soft_limit_in_bytes on
	// v1. memory.high is not used: it throttles the group at that size,
	// which is not what oversubscription promises.
	MemoryLow int64 `json:"memory_low,omitempty"`
}

// Zero tells whether l sets nothing.
func (l Limits) Zero() bool { return l == Limits{} }

func (l Limits) validate() error {
	switch {
	case l.CPUShares < 0 || l.CPUShares > 262144:
		return fmt.Errorf("cpu shares %d: want 2 to 262144 (or 0 to leave it)", l.CPUShares)
	case l.CPUQuota < 0 || l.CPUPeriod < 0:
		return fmt.Errorf("cpu quota %v per %v: want positive durations", l.CPUQuota, l.CPUPeriod)
	case l.CPUPeriod != 0 && (l.CPUPeriod < time.Millisecond || l.CPUPeriod > time.Second):
		return fmt.Errorf("cpu period %v: want 1ms to 1s", l.CPUPeriod)
	case l.CPUQuota != 0 && l.CPUQuota < time.Millisecond:
		return fmt.Errorf("cpu quota %v: want at least 1ms", l.CPUQuota)
	case l.MemoryMax < -1 || l.MemoryLow < 0:
		return fmt.Errorf("memory max %d, low %d: want bytes (-1 for no hard limit)", l.MemoryMax, l.MemoryLow)
	case l.MemoryMax > 0 && l.MemoryLow > l.MemoryMax:
		return fmt.Errorf("memory low %d is above memory max %d", l.MemoryLow, l.MemoryMax)
	}
	return nil
}

// Weight converts cgroup v1 CPU shares (2..262144) to a v2 cpu.weight
// (1..10000), the linear map the container runtimes use.
func Weight(shares int64) int64 {
	if shares <= 2 {
		return 1
	}
	if shares >= 262144 {
		return 10000
	}
	return 1 + (shares-2)*9999/262142
}

// State is a group in a form that survives a restart of whoever holds it.
type State struct {
	Version Version `json:"version"`
	// Rel is the group's path relative to the hierarchy root.
	Rel string `json:"rel"`
	// Dirs maps each controller to the group's directory in it; v2 has
	// one, under the key "".
	Dirs map[string]string `json:"dirs"`
	// Created are the directories this group made; Remove removes them,
	// and nothing else.
	Created []string `json:"created,omitempty"`
}

// Group is one task's cgroup (one directory per v1 hierarchy).
type Group struct {
	st State
}

// FromState is the group st describes.
func FromState(st State) *Group { return &Group{st: st} }

// State is the group's serialisable form.
func (g *Group) State() State {
	st := g.st
	st.Dirs = maps.Clone(st.Dirs)
	st.Created = slices.Clone(st.Created)
	return st
}

// Create makes rel (a path relative to the hierarchy root, its parents
// included) and returns it as a group that Remove deletes. On v2 it
// first enables the cpu, memory and pids controllers for the parent's
// children where the parent offers them.
func Create(h *Hierarchy, rel string) (*Group, error) {
	if err := checkRel(rel); err != nil {
		return nil, err
	}
	g, err := open(h, rel, true)
	if err != nil {
		return nil, err
	}
	if len(g.st.Created) != len(g.dirs()) {
		g.discard()
		return nil, fmt.Errorf("cgroup %s already exists (a task of the same name is running, or an earlier one was not cleaned up): remove it, or use it as an existing cgroup", rel)
	}
	return g, nil
}

// Open returns the existing group at path (relative to the hierarchy
// root, or absolute under it: Nomad's client creates a cgroup for every
// task and may pass its path). On v1, the hierarchies where the group
// does not exist yet (Nomad makes freezer, cpu and memory ones) get
// their directory made, and only those are removed by Remove.
func Open(h *Hierarchy, path string) (*Group, error) {
	rel, err := h.relative(path)
	if err != nil {
		return nil, err
	}
	return open(h, rel, false)
}

func (h *Hierarchy) relative(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return path, checkRel(path)
	}
	var roots []string
	if h.Version == V2 {
		roots = []string{h.Root}
	} else {
		for _, m := range h.Mounts {
			roots = append(roots, m)
		}
	}
	for _, r := range roots {
		if rel, err := filepath.Rel(r, filepath.Clean(path)); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			return rel, checkRel(rel)
		}
	}
	return "", fmt.Errorf("cgroup path %q: not under the cgroup filesystem (%s); give a path relative to it", path, strings.Join(roots, ", "))
}

func checkRel(rel string) error {
	if rel == "" || filepath.IsAbs(rel) || filepath.Clean(rel) != rel || rel == "." || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("cgroup path %q: want a clean path relative to the cgroup root, like \"hadar/task-1\"", rel)
	}
	return nil
}

func open(h *Hierarchy, rel string, create bool) (*Group, error) {
	g := &Group{st: State{Version: h.Version, Rel: rel, Dirs: map[string]string{}}}
	switch h.Version {
	case V2:
		if h.Root == "" {
			return nil, errors.New("cgroup: v2 hierarchy without a root")
		}
		dir := filepath.Join(h.Root, rel)
		g.st.Dirs[""] = dir
		if create {
			if err := enableControllers(h.Root, filepath.Dir(rel)); err != nil {
				return nil, err
			}
		}
		made, err := mkdir(dir, create)
		if err != nil {
			return nil, err
		}
		if made {
			g.st.Created = append(g.st.Created, dir)
		}
	case V1:
		for _, c := range v1Required {
			if h.Mounts[c] == "" {
				return nil, fmt.Errorf("cgroup v1 controller %q is not mounted; mount it (hadar needs %s) or use cgroup v2", c, strings.Join(v1Required, ", "))
			}
		}
		for _, c := range append(slices.Clone(v1Required), v1Optional...) {
			m := h.Mounts[c]
			if m == "" {
				continue
			}
			dir := filepath.Join(m, rel)
			g.st.Dirs[c] = dir
			if slices.Contains(g.st.Created, dir) {
				continue
			}
			// v1 hierarchies hold the group whether we are asked to
			// create it or not: a given group may lack some of ours.
			made, err := mkdir(dir, true)
			if err != nil {
				g.discard()
				return nil, err
			}
			if made {
				g.st.Created = append(g.st.Created, dir)
			}
		}
		if !create && len(g.st.Created) == len(g.dirs()) {
			g.discard()
			return nil, fmt.Errorf("cgroup %s: does not exist in any hierarchy; create it first or let hadar create one under a parent", rel)
		}
	default:
		return nil, fmt.Errorf("cgroup: unknown version %d", h.Version)
	}
	return g, nil
}

// mkdir makes dir's parents and, if create, dir itself; made says
// whether dir is new.
func mkdir(dir string, create bool) (made bool, err error) {
	if !create {
		fi, err := os.Stat(dir)
		if err != nil {
			return false, fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if !fi.IsDir() {
			return false, fmt.Errorf("cgroup %s: not a directory", dir)
		}
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return false, fmt.Errorf("cgroup parent %s: %w", filepath.Dir(dir), err)
	}
	err = os.Mkdir(dir, 0o755)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrExist):
		return false, nil
	}
	return false, fmt.Errorf("cgroup %s: %w", dir, err)
}

// enableControllers turns on, down from the root to parent (made if
// missing), the controllers a task's limits need, wherever they are
// offered and off.
func enableControllers(root, parent string) error {
	dirs := []string{root}
	if parent != "." {
		for _, e := range strings.Split(parent, "/") {
			dirs = append(dirs, filepath.Join(dirs[len(dirs)-1], e))
		}
	}
	for i, dir := range dirs {
		if i > 0 {
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cgroup parent %s: %w", dir, err)
			}
		}
		avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err != nil {
			return fmt.Errorf("cgroup parent %s: %w", dir, err)
		}
		on, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		if err != nil {
			return fmt.Errorf("cgroup parent %s: %w", dir, err)
		}
		var add []string
		for _, c := range []string{"cpu", "memory", "pids"} {
			if slices.Contains(strings.Fields(string(avail)), c) && !slices.Contains(strings.Fields(string(on)), c) {
				add = append(add, "+"+c)
			}
		}
		if len(add) > 0 {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0); err != nil {
				return fmt.Errorf("cgroup parent %s: enable %s for its children: %w (a cgroup v2 parent with processes of its own cannot: give hadar a parent that holds none)", dir, strings.Join(add, " "), err)
			}
		}
	}
	return nil
}

func (g *Group) dirs() []string {
	var out []string
	for _, d := range g.st.Dirs {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// dir is the group's directory for controller (v2: the only one).
func (g *Group) dir(controller string) string {
	if g.st.Version == V2 {
		return g.st.Dirs[""]
	}
	return g.st.Dirs[controller]
}

func (g *Group) write(controller, file, value string) error {
	p := filepath.Join(g.dir(controller), file)
	if err := os.WriteFile(p, []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup: set %s to %q: %w", p, value, err)
	}
	return nil
}

func (g *Group) read(controller, file string) (string, error) {
	b, err := os.ReadFile(filepath.Join(g.dir(controller), file))
	return strings.TrimSpace(string(b)), err
}

// Apply sets the limits. A limit the kernel does not offer is an error:
// a task is not run without the limit it was given.
func (g *Group) Apply(l Limits) error {
	if err := l.validate(); err != nil {
		return fmt.Errorf("cgroup limits: %w", err)
	}
	period := l.CPUPeriod
	if period == 0 {
		period = 100 * time.Millisecond
	}
	var err error
	set := func(controller, file, value string) {
		if err == nil {
			err = g.write(controller, file, value)
		}
	}
	if g.st.Version == V2 {
		if l.CPUShares > 0 {
			set("cpu", "cpu.weight", strconv.FormatInt(Weight(l.CPUShares), 10))
		}
		if l.CPUQuota > 0 {
			set("cpu", "cpu.max", fmt.Sprintf("%d %d", l.CPUQuota.Microseconds(), period.Microseconds()))
		}
		switch {
		case l.MemoryMax > 0:
			set("memory", "memory.max", strconv.FormatInt(l.MemoryMax, 10))
		case l.MemoryMax == -1:
			set("memory", "memory.max", "max")
		}
		if l.MemoryLow > 0 {
			set("memory", "memory.low", strconv.FormatInt(l.MemoryLow, 10))
		}
		// Swap counts apart from memory.max on v2: without this a task
		// goes past its limit by swapping. The file is missing only
		// where the kernel does not account swap (nothing to set).
		if l.MemoryMax > 0 && g.has("memory", "memory.swap.max") {
			set("memory", "memory.swap.max", "0")
		}
		return err
	}
	if l.CPUShares > 0 {
		set("cpu", "cpu.shares", strconv.FormatInt(max(l.CPUShares, 2), 10))
	}
	if l.CPUQuota > 0 {
		set("cpu", "cpu.cfs_period_us", strconv.FormatInt(period.Microseconds(), 10))
		set("cpu", "cpu.cfs_quota_us", strconv.FormatInt(l.CPUQuota.Microseconds(), 10))
	}
	// memsw (memory and swap together) must stay >= limit_in_bytes: it
	// follows the limit down and goes first up. Where the kernel
	// accounts swap (the file exists), the limit holds swap too, else a
	// task would go past it by swapping.
	memsw := g.has("memory", "memory.memsw.limit_in_bytes")
	switch {
	case l.MemoryMax > 0:
		if memsw {
			set("memory", "memory.memsw.limit_in_bytes", "-1")
		}
		set("memory", "memory.limit_in_bytes", strconv.FormatInt(l.MemoryMax, 10))
		if memsw {
			set("memory", "memory.memsw.limit_in_bytes", strconv.FormatInt(l.MemoryMax, 10))
		}
	case l.MemoryMax == -1:
		if memsw {
			set("memory", "memory.memsw.limit_in_bytes", "-1")
		}
		set("memory", "memory.limit_in_bytes", "-1")
	}
	if l.MemoryLow > 0 {
		set("memory", "memory.soft_limit_in_bytes", strconv.FormatInt(l.MemoryLow, 10))
	}
	return err
}

// has tells whether the group has file in controller's directory.
func (g *Group) has(controller, file string) bool {
	_, err := os.Stat(filepath.Join(g.dir(controller), file))
	return err == nil
}

// Start starts cmd inside the group (see the package doc for how).
func (g *Group) Start(cmd *exec.Cmd) error {
	if g.st.Version == V2 {
		fd, err := unix.Open(g.dir(""), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", g.dir(""), err)
		}
		defer unix.Close(fd)
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		// The thread goes back to where it was once the child is
		// forked; if it cannot, it stays locked and ends with this
		// goroutine instead of going back to the scheduler.
		runtime.LockOSThread()
		back, err := g.joinThread()
		if err == nil {
			err = cmd.Start()
		}
		if back() {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// joinThread moves the calling OS thread into the group (v1), and
// returns how to move it back to the cgroups it was in.
func (g *Group) joinThread() (back func() bool, err error) {
	tid := strconv.Itoa(unix.Gettid())
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return func() bool { return false }, fmt.Errorf("cgroup: the starting thread's cgroups: %w", err)
	}
	// hierarchy-id:controllers:path
	was := map[string]string{}
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) == 3 {
			for _, c := range strings.Split(f[1], ",") {
				was[c] = f[2]
			}
		}
	}
	var joined []string // the original dirs of the hierarchies joined
	back = func() bool {
		ok := true
		for _, d := range joined {
			if os.WriteFile(filepath.Join(d, "tasks"), []byte(tid), 0) != nil {
				ok = false
			}
		}
		return ok
	}
	done := map[string]bool{}
	for _, c := range slices.Sorted(maps.Keys(g.st.Dirs)) {
		d := g.st.Dirs[c]
		if done[d] {
			continue
		}
		done[d] = true
		path, ok := was[c]
		if !ok {
			return back, fmt.Errorf("cgroup: the starting thread is in no %s cgroup", c)
		}
		mount := strings.TrimSuffix(d, "/"+g.st.Rel)
		if err := os.WriteFile(filepath.Join(d, "tasks"), []byte(tid), 0); err != nil {
			return back, fmt.Errorf("cgroup %s: join: %w", d, err)
		}
		joined = append(joined, filepath.Join(mount, path))
	}
	return back, nil
}

// Procs are the processes in the group.
func (g *Group) Procs() ([]int, error) {
	dir := g.dir("freezer")
	if g.st.Version == V2 {
		dir = g.dir("")
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// Kill sends SIGKILL to every process in the group and waits until it is
// empty: cgroup.kill on v2 (5.14+); otherwise the group is frozen, so no
// process can fork while its pids are read and killed, and thawed.
func (g *Group) Kill(ctx context.Context) error {
	if g.st.Version == V2 {
		err := g.write("", "cgroup.kill", "1")
		if err == nil {
			return g.waitEmpty(ctx)
		}
		if !gone(err) {
			return err
		}
		// No cgroup.kill before Linux 5.14: freeze and kill below.
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		pids, err := g.Procs()
		if gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		// Never freeze or kill the caller: one of its threads may be in
		// the group for a moment while it starts a task (v1).
		self := slices.Contains(pids, os.Getpid())
		frozen := !self && g.freeze(ctx) == nil
		if pids, err = g.Procs(); gone(err) {
			return nil
		} else if err != nil {
			return err
		}
		for _, p := range pids {
			if p != os.Getpid() {
				_ = unix.Kill(p, unix.SIGKILL)
			}
		}
		if self && len(pids) == 1 {
			return nil
		}
		if frozen {
			g.thaw()
		}
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("cgroup %s: %d processes still there after SIGKILL: %w", g.dirs()[0], len(pids), err)
		}
	}
}

func (g *Group) freeze(ctx context.Context) error {
	file, on, done := "freezer.state", "FROZEN", "FROZEN"
	ctl := "freezer"
	if g.st.Version == V2 {
		file, on, ctl = "cgroup.freeze", "1", ""
	}
	if err := g.write(ctl, file, on); err != nil {
		return err
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		if g.st.Version == V2 {
			if ev, err := g.read("", "cgroup.events"); err != nil || kv(ev, "frozen") == 1 {
				return err
			}
		} else if s, err := g.read(ctl, file); err != nil || s == done {
			return err
		}
		// A process in uninterruptible sleep holds a freeze off; give up
		// after a while and kill what is there.
		if delay >= 20*time.Millisecond {
			return errors.New("cgroup: not frozen yet")
		}
		if err := sleep(ctx, delay); err != nil {
			return err
		}
	}
}

func (g *Group) thaw() {
	if g.st.Version == V2 {
		_ = g.write("", "cgroup.freeze", "0")
		return
	}
	_ = g.write("freezer", "freezer.state", "THAWED")
}

// gone tells whether err says the group was removed (by whoever made
// it, while we looked): ENOENT, or ENODEV from a file of a cgroup being
// removed.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV)
}

func (g *Group) waitEmpty(ctx context.Context) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		ev, err := g.read("", "cgroup.events")
		if gone(err) || (err == nil && kv(ev, "populated") == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", g.dir(""), err)
		}
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("cgroup %s: still populated after cgroup.kill: %w", g.dir(""), err)
		}
	}
}

// Remove deletes the directories the group made, waiting (until ctx
// ends) for the kernel to let go of processes that just died. A group
// opened from an existing path leaves that path to whoever made it.
func (g *Group) Remove(ctx context.Context) error {
	var errs []error
	for _, d := range slices.Backward(g.st.Created) {
		for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				errs = append(errs, fmt.Errorf("cgroup: remove %s: %w", d, err))
				break
			}
			if serr := sleep(ctx, delay); serr != nil {
				errs = append(errs, fmt.Errorf("cgroup: remove %s: %w (processes still in it): %w", d, err, serr))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// discard removes what a failed Create or Open made: empty directories,
// so the kernel lets them go at once.
func (g *Group) discard() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = g.Remove(ctx)
}

// Exists tells whether any of the group's directories is still there.
func (g *Group) Exists() bool {
	for _, d := range g.dirs() {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// OOMKills is how many processes the kernel's OOM killer killed in the
// group because it hit its memory limit (memory.events oom_kill on v2,
// memory.oom_control oom_kill on v1, Linux 4.13+).
func (g *Group) OOMKills() (uint64, error) {
	file := "memory.oom_control"
	if g.st.Version == V2 {
		file = "memory.events"
	}
	s, err := g.read("memory", file)
	if err != nil {
		return 0, fmt.Errorf("cgroup: OOM kills: %w", err)
	}
	return kv(s, "oom_kill"), nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// kv is the number after key in a "key value" per line file; 0 if absent.
func kv(s, key string) uint64 {
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
