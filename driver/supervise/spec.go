package supervise

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/driver/supervise/cgroup"
)

// Spec is one task for a supervisor to run. Start writes it into the
// state directory, where the supervisor reads it.
type Spec struct {
	// Command is the program's absolute path; Args are its arguments
	// (argv[0] is Command).
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	// Env is the program's whole environment (KEY=value); nothing of the
	// supervisor's is added but what User.LoginEnv asks for.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory (absolute), entered as the task's user.
	Dir  string `json:"dir"`
	User User   `json:"user"`
	// Stdout and Stderr are Nomad's log FIFOs (logmon makes them before
	// the task starts), opened for writing and given to the program;
	// anything else there (a link, a file) is refused, not written: the
	// directory they are in is writable by every task. "" is /dev/null.
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
	// OutputRoot is a directory Stdout and Stderr are below, trusted up
	// to itself (Nomad's allocation directory, root's): links are
	// followed up to it, none below it. "" trusts the outputs' own
	// directories.
	OutputRoot string `json:"output_root,omitempty"`
	Cgroup     Cgroup `json:"cgroup"`
	// StateDir belongs to the task's supervisor: its spec, log and the
	// task's result. Start creates it (0700); Destroy removes it.
	StateDir string `json:"state_dir"`
}

// User is who the task runs as.
type User struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Groups are the supplementary groups, exactly these: the primary
	// GID is not added, and an empty list drops every group.
	Groups []int `json:"groups,omitempty"`
	// AllowRoot must be set for UID 0: a task never runs as root by
	// accident.
	AllowRoot bool `json:"allow_root,omitempty"`
	// Name and Home are the user's login name and home directory; with
	// LoginEnv, USER and LOGNAME (Name) and HOME (Home) are set, as a
	// login would, unless Env sets them.
	Name     string `json:"name,omitempty"`
	Home     string `json:"home,omitempty"`
	LoginEnv bool   `json:"login_env,omitempty"`
}

// Cgroup is the task's cgroup: an existing one (Path) or one the
// supervisor creates (Parent/Name) and removes when the task ends. With
// neither, the task runs without one (a client that is not root cannot
// make cgroups): no limits, no statistics, and Stop kills the process
// group only.
type Cgroup struct {
	// Path is an existing cgroup to run the task in: relative to the
	// cgroup root ("nomad.slice/share.slice/<alloc>.<task>.scope" on v2,
	// "nomad/<alloc>.<task>" in every v1 hierarchy), or absolute under it
	// (Nomad's LinuxResources.CpusetCgroupPath on v2). It is left in place.
	Path string `json:"path,omitempty"`
	// Parent and Name: create Parent/Name (relative to the cgroup root),
	// the parent too if missing.
	Parent string `json:"parent,omitempty"`
	Name   string `json:"name,omitempty"`
	cgroup.Limits
	// Hierarchy is where the cgroup filesystems are; nil detects them.
	Hierarchy *cgroup.Hierarchy `json:"hierarchy,omitempty"`
}

func (c Cgroup) none() bool { return c.Path == "" && c.Parent == "" && c.Name == "" }

// validate checks what can be checked before anything starts.
func (s *Spec) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !filepath.IsAbs(s.Command) {
		bad("command %q: want an absolute path (resolve it against the task's PATH first)", s.Command)
	}
	if !filepath.IsAbs(s.Dir) {
		bad("dir %q: want an absolute working directory", s.Dir)
	}
	for _, o := range []struct{ name, path string }{{"stdout", s.Stdout}, {"stderr", s.Stderr}} {
		switch {
		case o.path != "" && !filepath.IsAbs(o.path):
			bad("%s %q: want an absolute path", o.name, o.path)
		case o.path != "" && s.OutputRoot != "" && !under(s.OutputRoot, o.path):
			bad("%s %q: not below output_root %q", o.name, o.path, s.OutputRoot)
		}
	}
	if s.OutputRoot != "" && !filepath.IsAbs(s.OutputRoot) {
		bad("output_root %q: want an absolute path", s.OutputRoot)
	}
	if !filepath.IsAbs(s.StateDir) {
		bad("state_dir %q: want an absolute path", s.StateDir)
	}
	for _, kv := range s.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			bad("env entry %q: want KEY=value without NUL bytes", kv)
		}
	}
	for _, a := range append([]string{s.Command, s.Dir}, s.Args...) {
		if strings.ContainsRune(a, 0) {
			bad("argument %q: contains a NUL byte", a)
		}
	}
	u := s.User
	if u.UID < 0 || u.GID < 0 {
		bad("user: uid %d, gid %d: want ids >= 0", u.UID, u.GID)
	}
	for _, g := range u.Groups {
		if g < 0 {
			bad("user: group %d: want ids >= 0", g)
		}
	}
	if (u.UID == 0 || u.GID == 0) && !u.AllowRoot {
		bad("user: uid %d gid %d would run the task as root; give an unprivileged user, or set AllowRoot", u.UID, u.GID)
	}
	if os.Geteuid() != 0 && (u.UID != os.Geteuid() || u.GID != os.Getegid()) {
		bad("user: uid %d gid %d: this process runs as uid %d, not root, so it can only run tasks as itself", u.UID, u.GID, os.Geteuid())
	}
	if u.LoginEnv && u.Name == "" {
		bad("user: login_env needs the user's name (and home)")
	}
	c := s.Cgroup
	switch {
	case c.Path != "" && (c.Parent != "" || c.Name != ""):
		bad("cgroup: give either path (an existing cgroup) or parent and name (one to create), not both")
	case c.Path == "" && (c.Parent == "") != (c.Name == ""):
		bad("cgroup: parent %q and name %q: give both to create a cgroup", c.Parent, c.Name)
	case c.Name != "" && (strings.Contains(c.Name, "/") || c.Name == "." || c.Name == ".."):
		bad("cgroup: name %q: want one path element", c.Name)
	case c.none() && !c.Limits.Zero():
		bad("cgroup: limits given but no cgroup to put them on; give a path or a parent and name")
	}
	return errors.Join(errs...)
}

// under tells whether path is strictly below dir (both absolute).
func under(dir, path string) bool {
	r, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && r != "." && r != ".." && !strings.HasPrefix(r, "../")
}

// env is the program's environment: Env, plus the login variables.
func (s *Spec) env() []string {
	env := append([]string(nil), s.Env...)
	if !s.User.LoginEnv {
		return env
	}
	has := func(k string) bool {
		for _, kv := range s.Env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	for _, kv := range [][2]string{{"USER", s.User.Name}, {"LOGNAME", s.User.Name}, {"HOME", s.User.Home}} {
		if kv[1] != "" && !has(kv[0]) {
			env = append(env, kv[0]+"="+kv[1])
		}
	}
	return env
}

const (
	specFile   = "spec.json"
	resultFile = "result.json"
	logFile    = "supervisor.log"
)

func readSpec(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("spec %s: %w", path, err)
	}
	return &s, nil
}

// Result is how a task ended.
type Result struct {
	// ExitCode is the program's exit status; 128+Signal when a signal
	// killed it (as a shell says); -1 when unknown (Err says why).
	ExitCode int `json:"exit_code"`
	// Signal is the signal that killed the program, 0 if it exited.
	Signal int `json:"signal,omitempty"`
	// OOMKilled: the kernel's OOM killer killed a process of the task's
	// cgroup (the task hit its memory limit) while it ran.
	OOMKilled bool      `json:"oom_killed,omitempty"`
	StartedAt time.Time `json:"started_at"`
	ExitedAt  time.Time `json:"exited_at"`
	// Err is set when the exit status was lost (the supervisor died).
	Err string `json:"error,omitempty"`
}

// LookupUser returns name's ids, groups (the primary one included) and
// home from the system's user database, for a User with LoginEnv.
func LookupUser(name string) (User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return User{}, fmt.Errorf("user %q: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return User{}, fmt.Errorf("user %q: ids %s:%s: %w", name, u.Uid, u.Gid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return User{}, fmt.Errorf("groups of user %q: %w", name, err)
	}
	out := User{UID: uid, GID: gid, Name: u.Username, Home: u.HomeDir, LoginEnv: true}
	for _, id := range ids {
		g, err := strconv.Atoi(id)
		if err != nil {
			return User{}, fmt.Errorf("groups of user %q: %q: %w", name, id, err)
		}
		out.Groups = append(out.Groups, g)
	}
	return out, nil
}
