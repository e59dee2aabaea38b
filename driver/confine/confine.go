// Package confine keeps every path a job gives (checkpoint_dir,
// hadare.merge_dir, progress_file) inside the directory the operator
// configured for it, and gives each job directories no other job can
// reach. The driver runs as root; a job author writes the paths, and the
// job's tasks write the directories they point into, so both are
// untrusted.
//
// # Resolving without following links out
//
// A job-given path is first checked lexically: relative to its base
// directory, or absolute under it, and with no ".." element at all. It is
// then opened from a descriptor of the base directory without following
// any symbolic link below the base: with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) where the kernel has it
// (5.6+), else one element at a time with openat(O_NOFOLLOW). Not even
// links that stay inside the base are followed: a job's task owns its
// job's directory and could plant, between two of the driver's steps, a
// link to another job's directory next door. The base itself may be
// reached through links (the operator's configuration is trusted).
//
// Directories are created the same way: mkdirat in the parent's
// descriptor, then opened with O_NOFOLLOW, and only then given to the
// job with fchown and fchmod on that descriptor, never by a path string a
// task could swap for a link in between. Ownership is changed only for
// directories the driver just created below a root, never for one that
// was there. Files the driver reads as root (a progress file) are opened
// the same way, non-blocking (a FIFO cannot stall it), and must be
// regular files with a single link (a hard link to a root-only file is
// refused).
//
// Why not github.com/cyphar/filepath-securejoin or os.Root: the first is
// not in the project's package list, and both follow links that stay
// inside the root, which is exactly what one job could use against
// another here.
//
// # Per-job ownership
//
// Each job gets a uid, and a gid with the same number, from a range the
// operator reserves (id_range): see Allocator for how they are recorded
// so they are stable across restarts and across nodes that share the
// checkpoint root. A job's directory <root>/<namespace>/<job> is owned by
// its uid and gid with mode 2770: only the job's uid and members of its
// group get in, and the setgid bit gives everything created inside the
// job's group. The namespace level is root's, mode 0711: it can be
// crossed but not listed, so jobs cannot enumerate each other.
//
// Why a uid per job and not only a gid: tasks that share a uid (every
// task as "nobody") can ptrace each other and read each other's
// /proc/<pid>/{environ,mem,cwd,root}, so a group alone keeps their files
// apart only from honest processes. With a uid per job, another job's
// tasks are a different, unprivileged user.
//
// A task that runs as a user the job author named (user = "alice") gets
// the job's gid as a supplementary group and so reaches the job's
// directories. Consequences, for the docs: every task running as alice,
// in any job, can ptrace that task and so reach through it what it
// reaches; files alice creates are hers (group: the job's, by the setgid
// bit) with her umask, so the job's own uid may only read them unless the
// task sets umask 002. Per-job isolation holds only among tasks that run
// as the job's own uid.
package confine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is a directory that paths are confined to, held open by a
// descriptor: a root the operator configured, a job's directory in one,
// or a directory the driver trusts (a task directory Nomad made). Close
// it when done.
type Dir struct {
	fd   int
	path string
	// field and base name the root this directory is in, for errors:
	// checkpoint_root "/srv/hadar/checkpoints".
	field, base string
	// job is true for a job's directory (errors say so); root for one
	// the operator configured (OpenRoot), and what is below.
	job, root bool
	// uid and gid own what is created here; -1 leaves it to root.
	uid, gid int
	// walk forces the element-by-element walk (tests of the fallback).
	walk bool
}

// Path is the directory's absolute path.
func (d *Dir) Path() string { return d.path }

// IDs are the uid and gid that own what is created in d (-1: root).
func (d *Dir) IDs() (uid, gid int) { return d.uid, d.gid }

// Close releases the descriptor.
func (d *Dir) Close() error {
	if d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// OpenRoot opens (creating it, 0711, if missing) the directory the
// operator configured in field (e.g. "checkpoint_root"). It must be a
// directory owned by this process's user (root) and writable by nobody
// else: anyone who can write it could make another job's directory
// first.
func OpenRoot(field, path string) (*Dir, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%s %q: want an absolute path", field, path)
	}
	path = filepath.Clean(path)
	if err := os.MkdirAll(path, 0o711); err != nil {
		return nil, fmt.Errorf("%s %q: %w", field, path, err)
	}
	d, err := OpenDir(field, path)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		d.Close()
		return nil, fmt.Errorf("%s %q: %w", field, path, err)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		d.Close()
		return nil, fmt.Errorf("%s %q: owned by uid %d with mode %#o; it must be owned by uid %d and writable by no one else (chown %d %s; chmod go-w %s), or jobs could take each other's directories",
			field, path, st.Uid, st.Mode&0o7777, os.Geteuid(), os.Geteuid(), path, path)
	}
	d.root = true
	return d, nil
}

// OpenDir opens a trusted directory (a task directory Nomad made) to
// confine paths to; field names it in errors.
func OpenDir(field, path string) (*Dir, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%s %q: want an absolute path", field, path)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", field, path, err)
	}
	p := filepath.Clean(path)
	return &Dir{fd: fd, path: p, field: field, base: p, uid: -1, gid: -1}, nil
}

// OpenBelow opens the directory path below trusted: trusted is reached
// as given, links and all (Nomad's allocation directory, root's), and
// nothing below it through a link. Everything below an allocation
// directory is writable by every task (Nomad makes alloc/, its logs,
// data and tmp, and the task directory mode 0777 without the sticky
// bit), so a link there is a task's.
func OpenBelow(field, trusted, path string) (*Dir, error) {
	t, err := OpenDir(field, trusted)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	rel, err := filepath.Rel(t.path, filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%s %q: not below %q", field, path, trusted)
	}
	fd, err := t.openBeneath(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, t.fileError(field, path, err)
	}
	p := filepath.Clean(path)
	return &Dir{fd: fd, path: p, field: field, base: p, uid: -1, gid: -1}, nil
}

// Resolve checks value, a path a job gave in field, against d: relative
// to d, or absolute under it, without "..". It returns the path relative
// to d ("." for d itself).
func (d *Dir) Resolve(field, value string) (string, error) {
	if value == "" {
		return "", fmt.Errorf("%s: empty; give a path relative to %s", field, d.where())
	}
	if strings.ContainsRune(value, 0) {
		return "", fmt.Errorf("%s %q: contains a NUL byte", field, value)
	}
	for _, e := range strings.Split(value, "/") {
		if e == ".." {
			return "", fmt.Errorf("%s %q: \"..\" is not allowed; give a path relative to %s, or an absolute one under it, without \"..\"", field, value, d.where())
		}
	}
	rel := filepath.Clean(value)
	if filepath.IsAbs(value) {
		r, err := filepath.Rel(d.path, rel)
		if err != nil || r == ".." || strings.HasPrefix(r, "../") {
			return "", fmt.Errorf("%s %q: not under %s; use a relative path or one under it", field, value, d.where())
		}
		rel = r
	}
	return rel, nil
}

// where describes d for an error: the plugin's checkpoint_root "/x", or
// this job's directory "/x/ns/job" in it.
func (d *Dir) where() string {
	if d.job {
		return fmt.Sprintf("this job's directory %q (in the plugin's %s %q)", d.path, d.field, d.base)
	}
	whose := "the plugin's "
	if !d.root {
		whose = "the " // a directory the driver trusts, not one configured
	}
	if d.path == d.base {
		return fmt.Sprintf("%s%s %q", whose, d.field, d.base)
	}
	return fmt.Sprintf("%q (in %s%s %q)", d.path, whose, d.field, d.base)
}

// MkdirAll creates the directory value (a path a job gave in field, see
// Resolve) and its missing parents below d, each owned by d's ids with
// mode 2770, without following any link, and returns its absolute path.
// Directories that exist are used as they are.
func (d *Dir) MkdirAll(field, value string) (string, error) {
	rel, err := d.Resolve(field, value)
	if err != nil {
		return "", err
	}
	fd, err := d.mkdirAll(field, value, rel)
	if err != nil {
		return "", err
	}
	unix.Close(fd)
	return filepath.Join(d.path, rel), nil
}

// Mkdir creates d/<elems...> like MkdirAll, for names the driver chose
// (a task group, a task, copy-3): each is one path element, escaped if
// it holds a "/" or starts with a dot.
func (d *Dir) Mkdir(elems ...string) (string, error) {
	var parts []string
	for _, e := range elems {
		p, err := Element(e)
		if err != nil {
			return "", err
		}
		parts = append(parts, p)
	}
	rel := filepath.Join(parts...)
	if rel == "" {
		rel = "."
	}
	fd, err := d.mkdirAll("directory", rel, rel)
	if err != nil {
		return "", err
	}
	unix.Close(fd)
	return filepath.Join(d.path, rel), nil
}

// sub is the directory rel below d, open as fd.
func (d *Dir) sub(rel string, fd int, job bool) *Dir {
	return &Dir{fd: fd, path: filepath.Join(d.path, rel), field: d.field, base: d.base, job: job || d.job, root: d.root, uid: d.uid, gid: d.gid, walk: d.walk}
}

// mkdirAll walks rel from d, creating what is missing, and returns the
// last directory's descriptor.
func (d *Dir) mkdirAll(field, value, rel string) (int, error) {
	fd, err := unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return fd, nil
	}
	for _, e := range strings.Split(rel, "/") {
		next, err := d.mkdirOne(fd, e, d.uid, d.gid, 0o2770)
		unix.Close(fd)
		if err != nil {
			return -1, d.pathError(field, value, e, err)
		}
		fd = next
	}
	return fd, nil
}

// mkdirOne creates name in the directory parent (unless it exists),
// opens it without following a link, and gives a new one to uid:gid with
// mode, through its descriptor.
func (d *Dir) mkdirOne(parent int, name string, uid, gid int, mode uint32) (int, error) {
	// 0700 until it is the job's: nobody else gets in meanwhile.
	err := unix.Mkdirat(parent, name, 0o700)
	created := err == nil
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if created {
		if uid >= 0 {
			err = unix.Fchown(fd, uid, gid)
		}
		if err == nil {
			err = unix.Fchmod(fd, mode)
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
	} else if uid >= 0 {
		if err := settled(fd, uid, gid, mode); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// settled waits, briefly, while the existing directory fd is still ours
// with mode 0700 rather than uid:gid's: another task of the same job,
// starting on this node at the same moment, made it and is giving it to
// the job (mkdirOne makes it 0700, then chowns it). Without the wait that
// task's sibling would find it root's and refuse it. Below a setgid
// directory (a job's) mkdirat makes it 02700, so the setgid bit is not
// looked at.
//
// One still ours after the wait is a leftover of a plugin killed between
// mkdirat and fchown: it is given to the job as mkdirOne would have, if
// empty (mkdirOne gives a directory away before anything is made in it,
// so an empty one is all a crash leaves), else refused, naming the fix.
// Handing it on as root's would leave the task a directory it cannot
// enter.
func settled(fd, uid, gid int, mode uint32) error {
	var st unix.Stat_t
	for i := 0; ; i++ {
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		ours := int(st.Uid) == os.Geteuid() && st.Mode&0o5777 == 0o700
		if !ours || (int(st.Uid) == uid && int(st.Gid) == gid) {
			return nil
		}
		if i == 200 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	empty, err := emptyDir(fd)
	if err != nil {
		return err
	}
	if !empty {
		return fmt.Errorf("a directory of uid %d, mode %#o, that is not empty: the driver never fills one before giving it to the job; chown -R %d:%d it (and chmod 2770) to give it to the job, or remove it", st.Uid, st.Mode&0o7777, uid, gid)
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	return unix.Fchmod(fd, mode)
}

// emptyDir reports whether the directory fd has no entries, read through
// a description of its own (fd's offset is left alone).
func emptyDir(fd int) (bool, error) {
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	f := os.NewFile(uintptr(dfd), ".")
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0, err
}

// pathError explains err on element e of value.
func (d *Dir) pathError(field, value, e string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s %q: %q is a symbolic link or not a directory; no link is followed below %s: make it a real directory", field, value, e, d.where())
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%s %q: %q does not exist below %s", field, value, e, d.where())
	}
	return fmt.Errorf("%s %q: %q below %s: %w", field, value, e, d.where(), err)
}

// ReadFile reads value (a file a job gave in field, see Resolve) below d
// as the driver: never through a link, only a regular file with one
// link, at most max bytes.
func (d *Dir) ReadFile(field, value string, max int64) ([]byte, error) {
	rel, err := d.Resolve(field, value)
	if err != nil {
		return nil, err
	}
	fd, err := d.openBeneath(rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, d.fileError(field, value, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.path, rel))
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s %q: not a regular file", field, value)
	case st.Nlink != 1:
		return nil, fmt.Errorf("%s %q: has %d hard links; write it with a rename, not a link", field, value, st.Nlink)
	case st.Size > max:
		return nil, fmt.Errorf("%s %q: %d bytes, more than the %d read", field, value, st.Size, max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", field, value, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s %q: more than the %d bytes read", field, value, max)
	}
	return b, nil
}

func (d *Dir) fileError(field, value string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s %q: goes through a symbolic link (or a file where a directory should be); no link is followed below %s", field, value, d.where())
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%s %q: %w", field, value, fs.ErrNotExist)
	}
	return fmt.Errorf("%s %q: %w", field, value, err)
}

// WriteFile writes data to value (see Resolve) below d atomically (a
// temporary file in the same directory, then a rename), never through a
// link: a task cannot turn the driver's write into one elsewhere.
func (d *Dir) WriteFile(field, value string, data []byte, perm os.FileMode) error {
	rel, err := d.Resolve(field, value)
	if err != nil {
		return err
	}
	dir, name := filepath.Split(rel)
	if name == "" || name == "." {
		return fmt.Errorf("%s %q: not a file name", field, value)
	}
	pfd := -1
	if dir == "" {
		pfd, err = unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	} else {
		pfd, err = d.openBeneath(filepath.Clean(dir), unix.O_RDONLY|unix.O_DIRECTORY)
	}
	if err != nil {
		return d.fileError(field, value, err)
	}
	defer unix.Close(pfd)
	var tmp string
	var fd int
	for i := 0; ; i++ {
		tmp = fmt.Sprintf(".%s.tmp-%d-%d", name, os.Getpid(), i)
		fd, err = unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if !errors.Is(err, unix.EEXIST) || i > 100 {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("%s %q: %w", field, value, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = unix.Fchmod(fd, uint32(perm.Perm()))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(pfd, tmp, pfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return fmt.Errorf("%s %q: %w", field, value, err)
	}
	return nil
}

// OpenFIFO opens the FIFO value (a path given in field, see Resolve)
// below d for writing, never through a link and never creating it, and
// nothing but a FIFO: a task that can write the directory (Nomad's
// alloc/logs is everyone's) could have put a link to a root-only file,
// a hard link to one, or a device there. It blocks until the FIFO has a
// reader. The check and the open are on one inode: it is found as an
// O_PATH descriptor, checked, then reopened through /proc/self/fd.
func (d *Dir) OpenFIFO(field, value string) (*os.File, error) {
	rel, err := d.Resolve(field, value)
	if err != nil {
		return nil, err
	}
	pfd, err := d.openBeneath(rel, unix.O_PATH)
	if errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("%s %q: not there; Nomad's logmon makes this FIFO before the task starts, and it is never created here (a task may have removed it): %w", field, value, fs.ErrNotExist)
	}
	if err != nil {
		return nil, d.fileError(field, value, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, fmt.Errorf("%s %q: %w", field, value, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil, fmt.Errorf("%s %q: a %s owned by %d:%d, not a FIFO (what Nomad's logmon makes there); refusing to write into it: a task may have replaced the FIFO",
			field, value, fileType(st.Mode), st.Uid, st.Gid)
	}
	// Opening the magic link reopens the inode pfd holds; no name is
	// resolved again.
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_WRONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s %q: reopening the FIFO through /proc/self/fd (is /proc mounted?): %w", field, value, err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.path, rel)), nil
}

// fileType names the type in mode, for errors.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symbolic link"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFIFO:
		return "FIFO"
	}
	return fmt.Sprintf("file of type %#o", mode&unix.S_IFMT)
}

// openBeneath opens rel below d without following any link.
func (d *Dir) openBeneath(rel string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC | unix.O_NOFOLLOW
	if !d.walk {
		fd, err := unix.Openat2(d.fd, rel, &unix.OpenHow{
			Flags:   uint64(flags),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			// EPERM: a seccomp filter that denies openat2; walk instead.
			return fd, err
		}
	}
	fd, err := unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	elems := strings.Split(rel, "/")
	for i, e := range elems {
		f := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(elems)-1 {
			f = flags
		}
		next, err := unix.Openat(fd, e, f, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// Element makes a Nomad name (namespace, job, group, task) one path
// element: "/" and "%" are escaped, and a leading dot too (no name can
// be ".", "..", or one of the root's hidden entries). Plain names (
// letters, digits, "-", "_", ".") are unchanged.
func Element(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty name: cannot be a directory")
	}
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("name %q: contains a NUL byte", name)
	}
	s := strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
	if strings.HasPrefix(s, ".") {
		s = "%2E" + s[1:]
	}
	if len(s) > 255 {
		return "", fmt.Errorf("name %q: longer than a file name can be", name)
	}
	return s, nil
}

// WithIDs returns a second handle on d (close it too) whose MkdirAll and
// Mkdir give what they create to uid:gid with mode 2770, as in a job's
// directory: for a directory the driver trusts that holds one job's files
// but is not in a root (an allocation's shared data directory).
func (d *Dir) WithIDs(uid, gid int) (*Dir, error) {
	if uid <= 0 || gid <= 0 {
		return nil, fmt.Errorf("%s: uid %d gid %d: directories made for a job are never root's", d.where(), uid, gid)
	}
	fd, err := unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	o := *d
	o.fd, o.uid, o.gid = fd, uid, gid
	return &o, nil
}

// Remove removes the file value (a path a job gave in field, see
// Resolve) below d, never through a link: a symbolic link is removed
// itself, not what it points to. A missing file is not an error; a
// directory is not removed.
func (d *Dir) Remove(field, value string) error {
	rel, err := d.Resolve(field, value)
	if err != nil {
		return err
	}
	dir, name := filepath.Split(rel)
	if name == "" || name == "." {
		return fmt.Errorf("%s %q: not a file name", field, value)
	}
	var pfd int
	if dir == "" {
		pfd, err = unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	} else {
		pfd, err = d.openBeneath(filepath.Clean(dir), unix.O_RDONLY|unix.O_DIRECTORY)
	}
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return d.fileError(field, value, err)
	}
	defer unix.Close(pfd)
	if err := unix.Unlinkat(pfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s %q: %w", field, value, err)
	}
	return nil
}

// Lstat is the status of value (a path a job gave in field, see Resolve)
// below d, found without following any link (a final link's own status).
func (d *Dir) Lstat(field, value string) (unix.Stat_t, error) {
	var st unix.Stat_t
	rel, err := d.Resolve(field, value)
	if err != nil {
		return st, err
	}
	fd, err := d.openBeneath(rel, unix.O_PATH)
	if err != nil {
		return st, d.fileError(field, value, err)
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return st, fmt.Errorf("%s %q: %w", field, value, err)
	}
	return st, nil
}

// Names lists the entries of d itself (not below it).
func (d *Dir) Names() ([]string, error) {
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.where(), err)
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.where(), err)
	}
	return names, nil
}

// Rename renames the entry from of d itself to to, both single names:
// whatever from is (a link included) is renamed, never followed, and
// to, if it exists, is replaced (a directory only by an empty one).
func (d *Dir) Rename(from, to string) error {
	for _, n := range []string{from, to} {
		if n == "" || n == "." || n == ".." || strings.ContainsRune(n, '/') || strings.ContainsRune(n, 0) {
			return fmt.Errorf("%s: %q is not a name in it", d.where(), n)
		}
	}
	if err := unix.Renameat(d.fd, from, d.fd, to); err != nil {
		return fmt.Errorf("%s: rename %q to %q: %w", d.where(), from, to, err)
	}
	return nil
}
