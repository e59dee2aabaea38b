package confine

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// JobDir makes (or opens) the job's directory <d>/<namespace>/<job> in a
// root d: the namespace level root's with mode 0711, the job's level
// owned by uid:gid with mode 2770 (see the package doc). The returned
// Dir creates what it is asked to with the job's ids, and confines the
// job's paths to it. A job directory owned by someone else is refused:
// it predates per-job ownership, or another job made it.
func (d *Dir) JobDir(ns, job string, uid, gid int) (*Dir, error) {
	if uid <= 0 || gid <= 0 {
		return nil, fmt.Errorf("job %q: uid %d gid %d: a job's directory is never root's", job, uid, gid)
	}
	nsE, err := Element(ns)
	if err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	jobE, err := Element(job)
	if err != nil {
		return nil, fmt.Errorf("job: %w", err)
	}
	nsPath := filepath.Join(d.path, nsE)
	nfd, err := d.mkdirOne(d.fd, nsE, -1, -1, 0o711)
	if err != nil {
		return nil, d.pathError("namespace", ns, nsE, err)
	}
	defer unix.Close(nfd)
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil {
		return nil, err
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("namespace directory %q: owned by uid %d with mode %#o; it must be uid %d's and writable by no one else (chown %d %s; chmod 0711 %s)",
			nsPath, st.Uid, st.Mode&0o7777, os.Geteuid(), os.Geteuid(), nsPath, nsPath)
	}
	jobPath := filepath.Join(nsPath, jobE)
	jfd, err := d.mkdirOne(nfd, jobE, uid, gid, 0o2770)
	if err != nil {
		return nil, d.pathError("job", job, jobE, err)
	}
	if err := unix.Fstat(jfd, &st); err != nil {
		unix.Close(jfd)
		return nil, err
	}
	if int(st.Uid) != uid || int(st.Gid) != gid {
		unix.Close(jfd)
		return nil, fmt.Errorf("job directory %q: owned by %d:%d, not this job's %d:%d: it predates per-job ownership, or another job made it; to keep what it holds, chown -R %d:%d %s and chmod 2770 %s, else remove it",
			jobPath, st.Uid, st.Gid, uid, gid, uid, gid, jobPath, jobPath)
	}
	jd := d.sub(filepath.Join(nsE, jobE), jfd, true)
	jd.uid, jd.gid = uid, gid
	return jd, nil
}
