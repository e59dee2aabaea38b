package train

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The executor can switch a task to its user itself, but Nomad 1.11.3's
// executor gives that user the supplementary group 0 (root) besides its
// own (setCmdUser appends the groups to a slice made with zeros) and loses
// USER and HOME. So the driver has the executor start the hadar-train
// binary as a shim that sets the user's real groups, gid and uid and then
// execs the training program in place: same pid, same process group, the
// cgroup the executor put it in.
const (
	// DropArg makes the hadar-train binary the shim:
	// hadar-train drop-privileges <uid> <gid> <groups> <command> [args...]
	DropArg = "drop-privileges"
	// CheckArg makes it check, as the task's user, that the program can
	// be started, so StartTask can fail with the reason:
	// hadar-train check-access <uid> <gid> <groups> <dir> <command>
	CheckArg = "check-access"
)

// credentials are what the shim switches to.
type credentials struct {
	uid, gid int
	groups   []int
}

func (c credentials) args() []string {
	gs := make([]string, len(c.groups))
	for i, g := range c.groups {
		gs[i] = strconv.Itoa(g)
	}
	return []string{strconv.Itoa(c.uid), strconv.Itoa(c.gid), strings.Join(gs, ",")}
}

// userCredentials looks up uid's groups (its primary one included).
func userCredentials(uid, gid int) (credentials, error) {
	c := credentials{uid: uid, gid: gid}
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return c, fmt.Errorf("user %d: %w", uid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return c, fmt.Errorf("groups of user %s: %w", u.Username, err)
	}
	for _, id := range ids {
		g, err := strconv.Atoi(id)
		if err != nil {
			return c, fmt.Errorf("groups of user %s: %q: %w", u.Username, id, err)
		}
		c.groups = append(c.groups, g)
	}
	return c, nil
}

func parseCredentials(uid, gid, groups string) (credentials, error) {
	var c credentials
	var err1, err2 error
	c.uid, err1 = strconv.Atoi(uid)
	c.gid, err2 = strconv.Atoi(gid)
	if err := errors.Join(err1, err2); err != nil {
		return c, err
	}
	for _, g := range splitList(groups) {
		n, err := strconv.Atoi(g)
		if err != nil {
			return c, err
		}
		c.groups = append(c.groups, n)
	}
	return c, nil
}

// become switches this process (all its threads) to c for good.
func (c credentials) become() error {
	if err := syscall.Setgroups(c.groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", c.groups, err)
	}
	if err := syscall.Setgid(c.gid); err != nil {
		return fmt.Errorf("setgid %d: %w", c.gid, err)
	}
	if err := syscall.Setuid(c.uid); err != nil {
		return fmt.Errorf("setuid %d: %w", c.uid, err)
	}
	return nil
}

// DropPrivileges is the shim's main (argv after DropArg): it becomes the
// task's user and execs the program. It returns only on failure, with
// the exit code to end with.
func DropPrivileges(argv []string) int {
	if len(argv) < 4 {
		fmt.Fprintln(os.Stderr, "hadar-train drop-privileges: want <uid> <gid> <groups> <command> [args...]")
		return 2
	}
	c, err := parseCredentials(argv[0], argv[1], argv[2])
	if err != nil {
		fmt.Fprintf(os.Stderr, "hadar-train drop-privileges: %v\n", err)
		return 2
	}
	if err := c.become(); err != nil {
		fmt.Fprintf(os.Stderr, "hadar-train: %v\n", err)
		return 126
	}
	err = syscall.Exec(argv[3], argv[3:], os.Environ())
	fmt.Fprintf(os.Stderr, "hadar-train: cannot start %s: %v\n", argv[3], err)
	return 126
}

// CheckAccess is the check's main (argv after CheckArg): as the task's
// user it enters the working directory and tests the program is an
// executable file. It prints the problem and returns 1 if not.
func CheckAccess(argv []string) int {
	if len(argv) != 5 {
		fmt.Fprintln(os.Stderr, "hadar-train check-access: want <uid> <gid> <groups> <dir> <command>")
		return 2
	}
	c, err := parseCredentials(argv[0], argv[1], argv[2])
	if err == nil {
		err = c.become()
	}
	if err == nil {
		err = checkStartable(argv[3], argv[4])
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

func checkStartable(dir, command string) error {
	if err := os.Chdir(dir); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	fi, err := os.Stat(command)
	switch {
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("%s: is a directory, not a program", command)
	}
	if err := unix.Access(command, unix.X_OK); err != nil {
		return fmt.Errorf("%s: %w", command, err)
	}
	return nil
}

// checkAsUser runs the check as c through the binary self, so StartTask
// reports what would stop the program from starting.
func checkAsUser(self string, c credentials, dir, command string) error {
	out, err := exec.Command(self, append(append([]string{CheckArg}, c.args()...), dir, command)...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("cannot start %s as uid %d: %s (every directory above it and the working directory must be reachable by that user; Nomad creates its data_dir private to root: chmod 0711 it)", command, c.uid, msg)
	}
	return nil
}
