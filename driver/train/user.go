package train

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"

	"github.com/hadar-sched/hadar/driver/supervise"
)

// taskUser is who a task runs as.
type taskUser struct {
	// name is the account the task runs as; "" for a job's own uid
	// (no account has it) or the client's own user.
	name     string
	uid, gid int
	// groups are exactly the supplementary groups.
	groups []int
	home   string
}

// spec is u as the supervisor takes it.
func (u taskUser) spec(allowRoot bool) supervise.User {
	return supervise.User{UID: u.uid, GID: u.gid, Groups: u.groups, AllowRoot: allowRoot, Name: u.name, Home: u.home, LoginEnv: u.name != ""}
}

// resolveUser decides who a task runs as, given its job's ids (see
// jobIDs): its `user`, else the plugin's default_user, each with the
// job's group as its only supplementary group so that it reaches the
// job's directories (and none of the account's other groups); else the job's own uid and gid. A client that is not root
// cannot switch users: it runs tasks as itself and refuses a `user`
// naming someone else. Running as root needs allow_root.
func resolveUser(s *settings, taskUserName string, job ids) (taskUser, error) {
	if os.Geteuid() != 0 {
		self, err := user.Current()
		if err != nil {
			return taskUser{}, fmt.Errorf("user: look up the client's own user: %w", err)
		}
		if taskUserName != "" && taskUserName != self.Username && taskUserName != self.Uid {
			return taskUser{}, fmt.Errorf("user %q: the Nomad client runs as %q (uid %s), not root, so it cannot run tasks as another user; remove the task's user or run the client as root", taskUserName, self.Username, self.Uid)
		}
		uid, err1 := strconv.Atoi(self.Uid)
		gid, err2 := strconv.Atoi(self.Gid)
		if err := errors.Join(err1, err2); err != nil {
			return taskUser{}, fmt.Errorf("user: the client's uid/gid: %w", err)
		}
		return taskUser{uid: uid, gid: gid}, nil
	}
	name := taskUserName
	if name == "" {
		name = s.defaultUser
	}
	if name == "" {
		return taskUser{uid: job.uid, gid: job.gid, groups: []int{job.gid}}, nil
	}
	u, err := supervise.LookupUser(name)
	if err != nil {
		return taskUser{}, fmt.Errorf("user %q: %w; set the task's user (or the plugin's default_user) to an existing user, or leave both unset to run the task as its job's own uid", name, err)
	}
	if (u.UID == 0 || u.GID == 0) && !s.allowRoot {
		return taskUser{}, fmt.Errorf("user: the task would run as root (%q, uid %d gid %d); set the task's user to an unprivileged user, or allow root tasks with allow_root = true in the %s plugin block", name, u.UID, u.GID, PluginName)
	}
	// Only the job's group beside the user's own: the account's
	// supplementary groups (docker, disk, shadow, adm) would reach the
	// node, and a job author picks the account.
	return taskUser{name: u.Name, uid: u.UID, gid: u.GID, groups: []int{job.gid}, home: u.Home}, nil
}
