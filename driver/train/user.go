package train

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"

	"github.com/hashicorp/nomad/helper/users"
)

// taskUser is who a task runs as.
type taskUser struct {
	// name is the user to switch to; "" runs the task as the client's
	// own user.
	name     string
	home     string
	uid, gid int
}

// switches tells whether the task runs as another user than the client.
func (u taskUser) switches() bool { return u.name != "" && u.uid != os.Geteuid() }

// resolveUser decides who a task runs as: its `user`, else the plugin's
// default_user, else the client's user. A client that is not root cannot
// switch users: it runs tasks as itself and refuses a `user` naming
// someone else. Running as root needs allow_root.
func resolveUser(s *settings, taskUserName string) (taskUser, error) {
	self, err := user.Current()
	if err != nil {
		return taskUser{}, fmt.Errorf("user: look up the client's own user: %w", err)
	}
	name := taskUserName
	if name == "" {
		name = s.defaultUser
	}
	if os.Geteuid() != 0 {
		if taskUserName != "" && taskUserName != self.Username && taskUserName != self.Uid {
			return taskUser{}, fmt.Errorf("user %q: the Nomad client runs as %q (uid %s), not root, so it cannot run tasks as another user; remove the task's user or run the client as root", taskUserName, self.Username, self.Uid)
		}
		name = ""
	}
	if name == "" {
		uid, err1 := strconv.Atoi(self.Uid)
		gid, err2 := strconv.Atoi(self.Gid)
		if err := errors.Join(err1, err2); err != nil {
			return taskUser{}, fmt.Errorf("user: the client's uid/gid: %w", err)
		}
		u := taskUser{uid: uid, gid: gid}
		return u, checkRoot(s, u, self.Username+" (the Nomad client's user)")
	}
	uid, gid, home, err := users.LookupUnix(name)
	if err != nil {
		return taskUser{}, fmt.Errorf("user %q: %w; set the task's user (or the plugin's default_user) to an existing user", name, err)
	}
	u := taskUser{name: name, home: home, uid: uid, gid: gid}
	return u, checkRoot(s, u, strconv.Quote(name))
}

func checkRoot(s *settings, u taskUser, who string) error {
	if u.uid == 0 && !s.allowRoot {
		return fmt.Errorf("user: the task would run as root (%s); set the task's user to an unprivileged user, or allow root tasks with allow_root = true in the %s plugin block", who, PluginName)
	}
	return nil
}

// own makes dir belong to the task's user, so a task that runs as
// another user than the client can write the directories the driver
// creates for it. A client that is not root leaves them as they are
// (its tasks run as itself).
func (u taskUser) own(dir string) error {
	if os.Geteuid() != 0 || (u.uid == os.Geteuid() && u.gid == os.Getegid()) {
		return nil
	}
	if err := os.Chown(dir, u.uid, u.gid); err != nil {
		return fmt.Errorf("give %s to uid %d: %w", dir, u.uid, err)
	}
	return nil
}
