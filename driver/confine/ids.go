package confine

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// IDRange is the block of ids the operator reserves for jobs: First to
// First+Count-1, used as both uids and gids. No account or group may use
// one (checked against /etc/passwd and /etc/group for the whole range,
// and each id given to a job against the system's user database, NSS:
// LDAP or SSSD accounts are not in those files), on any node that shares
// the root.
type IDRange struct {
	First, Count int
}

func (r IDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.First+r.Count-1) }

// idsDir is the root's hidden directory of id records; Element never
// makes a job or namespace name that starts with a dot, so none collides.
const idsDir = ".hadar-ids"

// Allocator gives each job (namespace and job id) a uid and gid of its
// own from an IDRange, recorded in <root>/.hadar-ids so that the answer
// is the same across calls, restarts and every node that shares the root
// (checkpoints move with a job to another node).
//
// The records are symbolic links, made with symlinkat, which creates a
// name and its content in one step and fails if the name exists, on
// local filesystems and NFS alike; they are read with readlinkat and
// never followed:
//
//   - by-id/<uid> -> <namespace>/<job> (escaped): the claim; the first
//     to make it owns the id;
//   - by-job/<sha256 of the key> -> <uid>: the index, for one lookup.
//
// A job's first candidate is First + hash(namespace, job) mod Count; on
// a claim by another job, the next id (linear probing), at most
// maxProbe of them. A claim is removed only to be given to another job
// at once (Reclaim), so every node probing for the same job walks the
// same sequence and finds the same claim, even if the index entry was
// lost (a crash between the two links).
//
// Claims and reclaims are made holding an OFD lock on <root>/.hadar-ids/
// lock (NFS passes it to the server), so that a job whose id is being
// reclaimed cannot be given it again by another node in between. Each
// use of a claim sets its time (the record's mtime): a job starting on
// any node keeps its claim recent.
type Allocator struct {
	root        *Dir
	rng         IDRange
	byID, byJob int
	// prevID and prevJob are the records of an earlier place (-1: none),
	// see Previous.
	prevID, prevJob int
	lock            int
	// gone and grace: see Reclaim.
	gone  func(ns, job string) (bool, error)
	grace time.Duration
}

// maxProbe bounds the ids one claim tries, and maxReclaimChecks the
// claims of other jobs it asks about (Reclaim's gone): a claim's cost
// stays bounded however full the range is.
const (
	maxProbe         = 4096
	maxReclaimChecks = 4
)

// lockMu serialises this process's holders of the OFD lock (each
// allocator opens the lock file on its own).
var lockMu sync.Mutex

// NewAllocator records ids in root (a Dir from OpenRoot). It refuses a
// range that overlaps an account or group of this machine, or that
// includes 0 or 65534 (nobody).
func NewAllocator(root *Dir, rng IDRange) (*Allocator, error) {
	if rng.First <= 0 || rng.Count <= 0 || rng.First+rng.Count > 1<<31-1 {
		return nil, fmt.Errorf("id_range %d+%d: want a first id > 0 and a count > 0 within 2^31-1", rng.First, rng.Count)
	}
	if rng.First <= 65534 && 65534 < rng.First+rng.Count {
		return nil, fmt.Errorf("id_range %s: includes 65534 (nobody); choose ids no account uses, e.g. 200000-299999", rng)
	}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		if err := checkUnused(f, rng); err != nil {
			return nil, err
		}
	}
	a := &Allocator{root: root, rng: rng, byID: -1, byJob: -1, prevID: -1, prevJob: -1, lock: -1}
	top, err := root.mkdirOne(root.fd, idsDir, -1, -1, 0o700)
	if err != nil {
		return nil, root.pathError("id records", idsDir, idsDir, err)
	}
	defer unix.Close(top)
	if a.byID, err = root.mkdirOne(top, "by-id", -1, -1, 0o700); err == nil {
		a.byJob, err = root.mkdirOne(top, "by-job", -1, -1, 0o700)
	}
	if err == nil {
		a.lock, err = unix.Openat(top, "lock", unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	}
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("id records in %s: %w", root.where(), err)
	}
	return a, nil
}

// checkUnused fails if an entry of file (passwd or group format) has an
// id in rng.
func checkUnused(file string, rng IDRange) error {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 3 {
			continue
		}
		id, err := strconv.Atoi(fields[2])
		if err == nil && id >= rng.First && id < rng.First+rng.Count {
			return fmt.Errorf("id_range %s: %s has %q with id %d in it; choose a range no account or group uses", rng, file, fields[0], id)
		}
	}
	return sc.Err()
}

// Close releases the record directories.
func (a *Allocator) Close() error {
	for _, fd := range []*int{&a.byID, &a.byJob, &a.prevID, &a.prevJob, &a.lock} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	return nil
}

// Previous makes IDs keep, for a job without a record here, the id that
// old's records (<old>/.hadar-ids, where an earlier release recorded
// them) give it, if no other job claimed it here: its directories are
// owned by that id. Nothing is created in old.
func (a *Allocator) Previous(old *Dir) error {
	top, err := old.openBeneath(idsDir, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return old.fileError("id records", idsDir, err)
	}
	defer unix.Close(top)
	for _, r := range []struct {
		name string
		fd   *int
	}{{"by-id", &a.prevID}, {"by-job", &a.prevJob}} {
		fd, err := unix.Openat(top, r.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("id records in %s: %s: %w", old.where(), r.name, err)
		}
		*r.fd = fd
	}
	return nil
}

// Reclaim lets IDs take, while probing, the id of another job whose
// claim has not been used for grace and for which gone says that
// nothing of it is left (no directory of its under any root): no new
// owner could read what it left. Only the caller knows where a job's
// directories can be; it must answer for every node sharing the
// records, or not call Reclaim. At most maxReclaimChecks are asked per
// claim.
func (a *Allocator) Reclaim(grace time.Duration, gone func(ns, job string) (bool, error)) {
	a.grace, a.gone = grace, gone
}

// InUse counts the ids claimed (the metric of a range filling up).
func (a *Allocator) InUse() (int, error) {
	fd, err := unix.Openat(a.byID, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), idsDir+"/by-id")
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(1024)
		for _, name := range names {
			if !strings.HasPrefix(name, ".") {
				n++
			}
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// locked runs f holding the records' lock.
func (a *Allocator) locked(f func() error) error {
	lockMu.Lock()
	defer lockMu.Unlock()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	for {
		err := unix.FcntlFlock(uintptr(a.lock), unix.F_OFD_SETLKW, &lk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("lock %s/%s/lock (the filesystem must support POSIX locks; on NFS, lockd or v4): %w", a.root.path, idsDir, err)
		}
		break
	}
	defer func() {
		lk.Type = unix.F_UNLCK
		_ = unix.FcntlFlock(uintptr(a.lock), unix.F_OFD_SETLK, &lk)
	}()
	return f()
}

// IDs returns the job's uid and gid (the same number), allocating them
// on first use.
func (a *Allocator) IDs(ns, job string) (uid, gid int, err error) {
	if ns == "" || job == "" || strings.ContainsRune(ns+job, 0) {
		return -1, -1, fmt.Errorf("ids for namespace %q job %q: want non-empty names without NUL", ns, job)
	}
	err = a.locked(func() error {
		uid, err = a.ids(ns, job)
		return err
	})
	if err != nil {
		return -1, -1, err
	}
	return uid, uid, nil
}

func (a *Allocator) ids(ns, job string) (int, error) {
	key := url.PathEscape(ns) + "/" + url.PathEscape(job)
	sum := sha256.Sum256([]byte(ns + "\x00" + job))
	index := hex.EncodeToString(sum[:])
	if v, err := readlink(a.byJob, index); err == nil {
		if id, err := strconv.Atoi(v); err == nil && a.owner(id) == key {
			if err := a.unknown(id, key); err != nil {
				return -1, err
			}
			return id, a.touch(id)
		}
	}
	if a.prevJob >= 0 {
		if v, err := readlink(a.prevJob, index); err == nil {
			id, err := strconv.Atoi(v)
			if o, _ := readlink(a.prevID, v); err == nil && o == key && id >= a.rng.First && id < a.rng.First+a.rng.Count {
				if ok, err := a.claim(id, key, index); err != nil {
					return -1, err
				} else if ok {
					return id, a.touch(id)
				}
			}
		}
	}
	start := int(binary.BigEndian.Uint64(sum[:8]) % uint64(a.rng.Count))
	probes, checks := min(a.rng.Count, maxProbe), 0
	for i := range probes {
		id := a.rng.First + (start+i)%a.rng.Count
		if ok, err := a.claim(id, key, index); err != nil {
			return -1, err
		} else if ok {
			return id, a.touch(id)
		}
		if a.gone == nil || checks == maxReclaimChecks {
			continue
		}
		if ok, err := a.reclaim(id, &checks); err != nil {
			return -1, err
		} else if ok {
			if ok, err := a.claim(id, key, index); err != nil {
				return -1, err
			} else if ok {
				return id, a.touch(id)
			}
		}
	}
	n, _ := a.InUse()
	return -1, fmt.Errorf("id_range %s is full: %d of %d ids claimed, none free among the %d this job may take and none of a job that is gone (see docs/driver.md, \"Per-job ids\"); widen it, or remove the directories of jobs that are over so their ids can be reclaimed (records in %s/%s)", a.rng, n, a.rng.Count, probes, a.root.path, idsDir)
}

// reclaim removes the claim of id, and its owner's index, if the claim
// was not used for the grace period and gone says nothing of its job is
// left; checks counts the jobs asked about.
func (a *Allocator) reclaim(id int, checks *int) (bool, error) {
	name := strconv.Itoa(id)
	var st unix.Stat_t
	if err := unix.Fstatat(a.byID, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, nil
	}
	if time.Since(time.Unix(st.Mtim.Unix())) < a.grace {
		return false, nil
	}
	owner := a.owner(id)
	nsE, jobE, ok := strings.Cut(owner, "/")
	ns, err1 := url.PathUnescape(nsE)
	job, err2 := url.PathUnescape(jobE)
	if !ok || err1 != nil || err2 != nil {
		return false, nil // not a record this code made: left alone
	}
	*checks++
	gone, err := a.gone(ns, job)
	if err != nil || !gone {
		return false, err
	}
	sum := sha256.Sum256([]byte(ns + "\x00" + job))
	if v, err := readlink(a.byJob, hex.EncodeToString(sum[:])); err == nil && v == name {
		if err := unix.Unlinkat(a.byJob, hex.EncodeToString(sum[:]), 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("reclaim id %d of job %s: index: %w", id, owner, err)
		}
	}
	if err := unix.Unlinkat(a.byID, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, fmt.Errorf("reclaim id %d of job %s: %w", id, owner, err)
	}
	return true, nil
}

// touch marks id's claim used now.
func (a *Allocator) touch(id int) error {
	now := unix.NsecToTimespec(time.Now().UnixNano())
	if err := unix.UtimesNanoAt(a.byID, strconv.Itoa(id), []unix.Timespec{now, now}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("ids: mark id %d used: %w", id, err)
	}
	return nil
}

// claim claims id for key (the job) and indexes it; false if another job
// holds it.
func (a *Allocator) claim(id int, key, index string) (bool, error) {
	err := unix.Symlinkat(key, a.byID, strconv.Itoa(id))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return false, fmt.Errorf("ids for %s: claim %d: %w", key, id, err)
	}
	if err != nil && a.owner(id) != key {
		return false, nil // another job's
	}
	// Not skipped: nodes whose NSS differ would then give the job
	// different ids. The claim stays; the operator fixes the range.
	if err := a.unknown(id, key); err != nil {
		return false, err
	}
	err = unix.Symlinkat(strconv.Itoa(id), a.byJob, index)
	if errors.Is(err, unix.EEXIST) {
		if v, _ := readlink(a.byJob, index); v != strconv.Itoa(id) {
			// A stale index (a crash between claim and index, an id
			// since reclaimed): replaced, under the lock.
			if err = unix.Unlinkat(a.byJob, index, 0); err == nil {
				err = unix.Symlinkat(strconv.Itoa(id), a.byJob, index)
			}
		} else {
			err = nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("ids for %s: index: %w", key, err)
	}
	return true, nil
}

// accountOf names the account or group id is in the system's user
// database (os/user: NSS through the C library where built with cgo),
// "" if none. A variable: tests stand in for an LDAP account.
var accountOf = func(id int) string {
	s := strconv.Itoa(id)
	if u, err := user.LookupId(s); err == nil {
		return fmt.Sprintf("user %q (uid %d)", u.Username, id)
	}
	if g, err := user.LookupGroupId(s); err == nil {
		return fmt.Sprintf("group %q (gid %d)", g.Name, id)
	}
	return ""
}

// unknown fails if id is an account's or group's in NSS.
func (a *Allocator) unknown(id int, key string) error {
	if who := accountOf(id); who != "" {
		return fmt.Errorf("id_range %s: id %d, for job %s, is %s in this node's user database (NSS: LDAP, SSSD...): the job would own that account's files; choose a range no account or group uses on any node", a.rng, id, key, who)
	}
	return nil
}

// owner is the key that claimed id, "" if none.
func (a *Allocator) owner(id int) string {
	v, _ := readlink(a.byID, strconv.Itoa(id))
	return v
}

func readlink(dirfd int, name string) (string, error) {
	b := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, name, b)
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}
