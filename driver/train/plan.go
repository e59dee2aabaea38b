package train

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/confine"
	"github.com/hadar-sched/hadar/driver/plugin"
)

// launch is what StartTask works out before starting anything.
type launch struct {
	command string
	args    []string
	dir     string
	env     map[string]string
	user    taskUser
	job     ids
	// taskDir is the task directory, which the progress paths are in.
	taskDir string
	// progress is where the process writes its progress, relative to
	// taskDir; mirror tells that it is not progressRel, so the driver
	// copies it there.
	progress string
	mirror   bool
	// checkpoint is the checkpoint directory; ckptBase the directory it
	// was made in (the checkpoint root, or <state_dir>/checkpoints;
	// both root's), through which the driver looks at it.
	checkpoint, ckptBase string
	stateDir             string
	modelSource          string
}

// progressRel is the progress file in the task directory: the sidecar
// reads it with AllocFS().Cat(alloc, "<task>/local/hadar-progress.json").
const progressRel = "local/" + contract.ProgressFileName

// ids are a job's uid and gid (the same number from the driver's range;
// the client's own when it is not root).
type ids struct{ uid, gid int }

func (d *Driver) plan(cfg *plugin.TaskConfig, tc *TaskConfig) (*launch, error) {
	s := d.config()
	taskDir := cfg.TaskDir()
	stateRoot := s.stateDir
	if stateRoot == "" {
		stateRoot = defaultStateDir(cfg.AllocDir)
	}
	d.mu.Lock()
	d.stateRoot = stateRoot
	d.mu.Unlock()
	job, err := jobIDs(s, cfg, stateRoot)
	if err != nil {
		return nil, err
	}
	u, err := resolveUser(s, cfg.User, job)
	if err != nil {
		return nil, err
	}
	// The task's env (with the device plugin's) passes through unchanged;
	// the driver adds the contract's variables (docs/training-contract.md).
	env := map[string]string{}
	for k, v := range cfg.Env {
		env[k] = v
	}
	for k, v := range cfg.DeviceEnv {
		env[k] = v
	}
	if _, ok := env["PATH"]; !ok {
		// Without a PATH the process could not find "python3".
		env["PATH"] = os.Getenv("PATH")
	}
	if upgradeTorchrunEnv(env, cfg.JobID) {
		d.logger.Info("torchrun environment of an older sidecar brought to the contract's: one process per GPU, LOCAL_RANK 0",
			"task", cfg.Name, "rank", env[contract.EnvRank])
	}
	set := map[string]string{}

	l := &launch{user: u, job: job, args: tc.Args, taskDir: taskDir.Dir, progress: progressRel}
	l.stateDir = filepath.Join(stateRoot, element(cfg.ID))
	// The task directory is Nomad's; it and all in it are writable by
	// every task, so it is reached from the allocation directory
	// (root's) without following a link.
	td, err := openTaskDir(taskDir.Dir)
	if err != nil {
		return nil, err
	}
	defer td.Close()
	if tc.ProgressFile != "" {
		if l.progress, err = td.Resolve("progress_file", tc.ProgressFile); err != nil {
			return nil, err
		}
		l.mirror = l.progress != progressRel
	}
	set[contract.EnvProgressFile] = filepath.Join(taskDir.Dir, l.progress)
	set[contract.EnvJobID] = cfg.JobID

	copySuffix := ""
	h := tc.HadarE
	if h == nil && sidecarCopy(env) {
		// A forkable job the hadar sidecar placed: its units are HadarE
		// copies that come and go, so it merges even without a hadare
		// block (copies dynamic, merge_every the trainer's default).
		h = &HadarEConfig{CopyIndex: -1}
	}
	if h != nil {
		idx, err := copyIndex(h, env)
		if err != nil {
			return nil, err
		}
		if s.mergeRoot == "" {
			return nil, fmt.Errorf("hadare: no merge directory; set merge_root in the %s plugin block (a directory all copies can reach: each job gets <merge_root>/<namespace>/<job>)", PluginName)
		}
		mergeDir, err := jobPath(s.mergeRoot, "merge_root", "hadare.merge_dir", h.MergeDir, cfg, job)
		if err != nil {
			return nil, fmt.Errorf("hadare: merge directory: %w", err)
		}
		set[contract.EnvCopyIndex] = strconv.Itoa(idx)
		if h.Copies > 0 {
			// Declared copies; without, the copies are whoever is in the
			// merge directory (the sidecar forks and unforks at will).
			set[contract.EnvCopies] = strconv.Itoa(h.Copies)
		}
		set[contract.EnvMergeDir] = mergeDir
		if h.MergeEvery > 0 {
			set[contract.EnvMergeEvery] = strconv.Itoa(h.MergeEvery)
		}
		copySuffix = "copy-" + strconv.Itoa(idx)
	}

	switch {
	case s.checkpointRoot != "":
		// Keyed by job, group and task, not allocation, so a job that is
		// stopped and run again (or rescheduled onto a node sharing the
		// root) finds its checkpoints. A worker the hadar sidecar placed
		// runs in a generated group whose name changes with every
		// placement (<template>-hadar-u<unit>-w<rank>, unit numbers only
		// grow): keyed by its template group instead, a moved or
		// restarted job finds the checkpoint its last unit wrote, and all
		// ranks of a unit share one directory.
		group := cfg.TaskGroupName
		if t := strings.TrimSpace(env[contract.EnvTemplate]); t != "" {
			group = t
		}
		elems := []string{group, cfg.Name}
		if copySuffix != "" {
			elems = append(elems, copySuffix)
		}
		l.ckptBase = s.checkpointRoot
		l.checkpoint, err = jobPath(s.checkpointRoot, "checkpoint_root", "checkpoint_dir", tc.CheckpointDir, cfg, job, elems...)
		if err != nil {
			return nil, fmt.Errorf("checkpoint directory: %w", err)
		}
	case tc.CheckpointDir != "":
		return nil, fmt.Errorf("checkpoint_dir %q: the %s plugin block sets no checkpoint_root; a job's checkpoint_dir is a path in its directory there, so set checkpoint_root (or leave checkpoint_dir out: checkpoints then live in the allocation)", tc.CheckpointDir, PluginName)
	default:
		l.ckptBase = filepath.Join(stateRoot, checkpointsDir)
		if l.checkpoint, err = allocCheckpointDir(l.ckptBase, cfg, job); err != nil {
			return nil, fmt.Errorf("checkpoint directory: %w", err)
		}
	}
	set[contract.EnvCheckpointDir] = l.checkpoint
	if tc.TotalSteps > 0 {
		set[contract.EnvTotalSteps] = strconv.FormatInt(int64(tc.TotalSteps), 10)
	}

	models, source, modelErr := gpuModels(cfg.Env, cfg.DeviceEnv, d.openNVML)
	if modelErr != nil {
		d.logger.Warn("GPU model unknown", "task", cfg.Name, "error", modelErr)
	}
	l.modelSource = source
	if len(models) > 0 && source != modelFromTaskEnv {
		set[contract.EnvGPUModel] = strings.Join(models, ",")
	}
	if tc.Emulate != nil {
		if len(models) == 0 && modelErr != nil {
			return nil, fmt.Errorf("emulate: %w; set HADAR_GPU_MODEL in the task's env", modelErr)
		}
		rate, err := tc.Emulate.stepsPerSec(models)
		if err != nil {
			return nil, err
		}
		set[contract.EnvStepsPerSec] = strconv.FormatFloat(rate, 'g', -1, 64)
		if spread, ok := tc.Emulate.spreadStepsPerSec(models); ok {
			set[contract.EnvSpreadStepsPerSec] = strconv.FormatFloat(spread, 'g', -1, 64)
		}
	}

	// A variable the driver derives from the task's config must not be
	// set otherwise by the task: the process and the driver would
	// disagree on where things are.
	for k, v := range set {
		if old, ok := env[k]; ok && old != v {
			return nil, fmt.Errorf("env %s = %q: %s sets it to %q from the task's config; remove it from the task's env (see docs/training-contract.md)", k, old, PluginName, v)
		}
		env[k] = v
	}
	l.env = env

	if l.command, err = resolveCommand(tc.Command, taskDir.Dir, env["PATH"]); err != nil {
		return nil, err
	}
	l.dir = tc.WorkDir
	if l.dir == "" {
		l.dir = taskDir.Dir
	}
	return l, nil
}

// upgradeTorchrunEnv rewrites the torchrun variables a sidecar of
// contract version 1 wrote (no GROUP_WORLD_SIZE; LOCAL_RANK counting the
// unit's workers on the node although each sees one GPU, so
// torch.cuda.set_device(LOCAL_RANK) failed on co-located workers) as the
// contract now has them (contract.WorkerEnv); NODE_RANK, the node's index,
// meant the same then. Tasks of a current sidecar, and tasks not placed
// by one, are left as they are. It reports whether it rewrote.
func upgradeTorchrunEnv(env map[string]string, jobID string) bool {
	if env[contract.EnvManagedBy] != contract.ManagedBySidecar || env[contract.EnvRank] == "" || env[contract.EnvGroupWorldSize] != "" {
		return false
	}
	rank, err1 := strconv.Atoi(env[contract.EnvRank])
	world, err2 := strconv.Atoi(env[contract.EnvWorldSize])
	node, err3 := strconv.Atoi(env[contract.EnvNodeRank])
	port, err4 := strconv.Atoi(env[contract.EnvMasterPort])
	unit, err5 := strconv.Atoi(env[contract.EnvUnit])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil {
		return false
	}
	set, defaults := contract.WorkerEnv{Rank: rank, WorldSize: world, NodeRank: node, MasterAddr: env[contract.EnvMasterAddr],
		MasterPort: port, RunID: contract.RunID(jobID, unit)}.Env()
	for k, v := range defaults {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	for k, v := range set {
		env[k] = v
	}
	return true
}

// jobIDs are the job's uid and gid: from the driver's range, recorded in
// merge_root when set, else checkpoint_root, else the state directory,
// so that every node sharing any of the job's directories gives the job
// the same ids. merge_root comes first: HadarE copies on every node must
// share it, while checkpoint_root may be node-local (a shared
// checkpoint_root with a node-local merge_root is refused at load, see
// checkIDRoot). Ids an earlier release recorded in checkpoint_root are
// kept. A client that is not root uses its own.
func jobIDs(s *settings, cfg *plugin.TaskConfig, stateRoot string) (ids, error) {
	if os.Geteuid() != 0 {
		return ids{os.Geteuid(), os.Getegid()}, nil
	}
	field, path := idRoot(s, stateRoot)
	if err := checkSubordinateIDs(s.idRange, "/etc/subuid", "/etc/subgid"); err != nil {
		return ids{}, err
	}
	root, err := confine.OpenRoot(field, path)
	if err != nil {
		return ids{}, err
	}
	defer root.Close()
	a, err := confine.NewAllocator(root, s.idRange)
	if err != nil {
		return ids{}, fmt.Errorf("job ids: %w", err)
	}
	defer a.Close()
	if field == "merge_root" && s.checkpointRoot != "" {
		old, err := confine.OpenRoot("checkpoint_root", s.checkpointRoot)
		if err != nil {
			return ids{}, err
		}
		defer old.Close()
		if err := a.Previous(old); err != nil {
			return ids{}, fmt.Errorf("job ids: %w", err)
		}
	}
	if reclaimable(s, field) {
		a.Reclaim(idReclaimGrace, func(ns, job string) (bool, error) {
			return jobGone(s, stateRoot, filepath.Dir(filepath.Clean(cfg.AllocDir)), ns, job)
		})
	}
	uid, gid, err := a.IDs(namespace(cfg), cfg.JobID)
	if err != nil {
		return ids{}, fmt.Errorf("job ids: %w", err)
	}
	return ids{uid, gid}, nil
}

// idReclaimGrace is how long a job's id claim stays its own after its
// last use (a task of it starting on any node) even with nothing of it
// left: more than the moment between the claim and its directories.
const idReclaimGrace = time.Hour

// reclaimable tells whether, recording ids in field, this node sees every
// place a job's directories can be on any node sharing the records: the
// state directory (node-local records) or checkpoint_root (every job's
// checkpoints there, shared with the records); with merge_root, only if
// checkpoint_root is set and shared too (else other nodes hold default
// or node-local checkpoints this one cannot see, and ids are never
// reclaimed).
func reclaimable(s *settings, field string) bool {
	switch field {
	case "state_dir", "checkpoint_root":
		return true
	}
	if s.checkpointRoot == "" {
		return false
	}
	_, shared := filesystemOf(s.checkpointRoot)
	return shared
}

// jobGone tells whether nothing of job is left under any root: no
// directory <root>/<ns>/<job> in checkpoint_root or merge_root, and none
// of default checkpoints once those of allocations Nomad collected from
// this node (not in allocsDir) are reaped.
func jobGone(s *settings, stateRoot, allocsDir, ns, job string) (bool, error) {
	nsE, err1 := confine.Element(ns)
	jobE, err2 := confine.Element(job)
	if err := errors.Join(err1, err2); err != nil {
		return false, nil
	}
	for _, root := range []string{s.checkpointRoot, s.mergeRoot} {
		if root == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, nsE, jobE)); !errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
	}
	jobDir := filepath.Join(stateRoot, checkpointsDir, nsE, jobE)
	if _, err := os.Lstat(jobDir); errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	reapAllocCheckpoints(jobDir, allocsDir, "")
	// Only if empty: an allocation of the job on this node keeps it.
	if err := unix.Rmdir(jobDir); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return true, nil
}

// idsInUse is the metric of the id range filling up: the ids claimed in
// the records this node uses, and the range's size; -1 when the records
// cannot be read (a client not root, a root not made yet).
func idsInUse(s *settings, stateRoot string) (inUse, total int) {
	field, path := idRoot(s, stateRoot)
	if os.Geteuid() != 0 || path == "" {
		return -1, s.idRange.Count
	}
	if _, err := os.Stat(filepath.Join(path, ".hadar-ids")); err != nil {
		return -1, s.idRange.Count
	}
	root, err := confine.OpenRoot(field, path)
	if err != nil {
		return -1, s.idRange.Count
	}
	defer root.Close()
	a, err := confine.NewAllocator(root, s.idRange)
	if err != nil {
		return -1, s.idRange.Count
	}
	defer a.Close()
	n, err := a.InUse()
	if err != nil {
		return -1, s.idRange.Count
	}
	return n, s.idRange.Count
}

// idRoot is the root job ids are recorded in (see jobIDs).
func idRoot(s *settings, stateRoot string) (field, path string) {
	switch {
	case s.mergeRoot != "":
		return "merge_root", s.mergeRoot
	case s.checkpointRoot != "":
		return "checkpoint_root", s.checkpointRoot
	}
	return "state_dir", stateRoot
}

// checkIDRoot refuses a checkpoint_root that nodes share beside a
// node-local merge_root, where the ids are recorded: each node would
// give one job its own ids, and two jobs one, in the shared
// checkpoint_root. The other way round (node-local checkpoint_root,
// shared merge_root) is what HadarE across nodes asks for, and holds.
func checkIDRoot(s *settings) error {
	if s.checkpointRoot == "" || s.mergeRoot == "" {
		return nil
	}
	ckFS, ckShared := filesystemOf(s.checkpointRoot)
	mFS, mShared := filesystemOf(s.mergeRoot)
	if ckShared && !mShared {
		return fmt.Errorf("checkpoint_root %q is on a filesystem nodes share (%s), but merge_root %q, where job ids are recorded, is node-local (%s): nodes sharing checkpoint_root would give one job different ids and two jobs one; put merge_root on a filesystem every node shares too (HadarE copies on several nodes need that anyway), or unset merge_root", s.checkpointRoot, ckFS, s.mergeRoot, mFS)
	}
	return nil
}

// filesystemOf names the filesystem path (or the nearest existing
// directory above it) is on, and whether nodes can share it (a network
// or cluster filesystem). A variable: tests stand in for NFS.
var filesystemOf = func(path string) (string, bool) {
	var st unix.Statfs_t
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if err := unix.Statfs(p, &st); err == nil {
			break
		}
		if p == "/" {
			return "unknown", false
		}
	}
	if name, ok := sharedFilesystems[int64(st.Type)]; ok {
		return name, true
	}
	return fmt.Sprintf("filesystem type %#x", st.Type), false
}

// sharedFilesystems are the statfs magic numbers of filesystems that
// several nodes mount (include/uapi/linux/magic.h and the vendors').
var sharedFilesystems = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0xFE534D42: "smb2",
	0x517B:     "smb",
	0x00C36400: "ceph",
	0x0BD00BD0: "lustre",
	0x47504653: "gpfs",
	0x01161970: "gfs2",
	0x7461636F: "ocfs2",
	0x01021997: "9p",
	0x65735546: "fuse (glusterfs, sshfs, s3fs...)",
	0x013111A8: "ibrix",
	0xAAD7AAEA: "panfs",
	0x19830326: "fhgfs/beegfs",
}

func namespace(cfg *plugin.TaskConfig) string {
	if cfg.Namespace == "" {
		return "default"
	}
	return cfg.Namespace
}

// jobPath makes a directory in the job's directory of root
// (<root>/<namespace>/<job>, owned by the job): value, a path the job
// gave in field (relative to the job's directory, or absolute under it),
// or else the path of the driver's elems (none: the job's directory).
// Nothing is followed through a link, created or chowned outside it.
func jobPath(rootPath, rootField, field, value string, cfg *plugin.TaskConfig, job ids, elems ...string) (string, error) {
	root, err := confine.OpenRoot(rootField, rootPath)
	if err != nil {
		return "", err
	}
	defer root.Close()
	jd, err := root.JobDir(namespace(cfg), cfg.JobID, job.uid, job.gid)
	if err != nil {
		return "", err
	}
	defer jd.Close()
	if value != "" {
		return jd.MkdirAll(field, value)
	}
	return jd.Mkdir(elems...)
}

// checkpointsDir holds, in the state directory, the checkpoints of tasks
// whose plugin block sets no checkpoint_root.
const checkpointsDir = "checkpoints"

// allocCheckpointDir makes <root>/<namespace>/<job>/<alloc id>/<task>,
// owned by the job, in root (<state_dir>/checkpoints, root's): the
// default checkpoint directory without a checkpoint_root, which lasts as
// long as the allocation. Not in the allocation's data directory: Nomad
// makes it and alloc/ mode 0777 without the sticky bit, so any task of
// any job could rename it away and put its own (or a link) in its place,
// then read the job's weights and feed it its own. It also removes what
// the job's allocations that Nomad has since collected left here.
func allocCheckpointDir(root string, cfg *plugin.TaskConfig, job ids) (string, error) {
	r, err := confine.OpenRoot("state_dir", root)
	if err != nil {
		return "", err
	}
	defer r.Close()
	jd, err := r.JobDir(namespace(cfg), cfg.JobID, job.uid, job.gid)
	if err != nil {
		return "", err
	}
	defer jd.Close()
	reapAllocCheckpoints(jd.Path(), filepath.Dir(filepath.Clean(cfg.AllocDir)), cfg.AllocID)
	return jd.Mkdir(cfg.AllocID, cfg.Name)
}

// reapAllocCheckpoints removes, from a job's directory of default
// checkpoints, those of allocations whose directory (in allocsDir, the
// client's) is gone: Nomad collected the allocation, and its checkpoints
// would have gone with it. The job directory's parents are root's, so
// the path is the driver's up to it; os.RemoveAll does not follow links
// below it.
func reapAllocCheckpoints(jobDir, allocsDir, current string) {
	ents, err := os.ReadDir(jobDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.Name() == current || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if _, err := os.Lstat(filepath.Join(allocsDir, e.Name())); errors.Is(err, fs.ErrNotExist) {
			_ = os.RemoveAll(filepath.Join(jobDir, e.Name()))
		}
	}
}

// openTaskDir opens the task directory <alloc>/<task> from the
// allocation directory, which is root's, without following a link.
func openTaskDir(dir string) (*confine.Dir, error) {
	return confine.OpenBelow("task directory", filepath.Dir(filepath.Clean(dir)), dir)
}

// defaultStateDir is where supervisor state lives when the plugin block
// sets no state_dir: "hadar-train" in the Nomad client's data directory,
// the parent of its alloc directory (<data_dir>/alloc/<alloc id>), which
// only root can write.
func defaultStateDir(allocDir string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(filepath.Clean(allocDir))), PluginName)
}

// element makes a name one path element (see confine.Element); the task
// IDs Nomad makes (<alloc>/<task>/<random>) always can be one.
func element(name string) string {
	e, err := confine.Element(name)
	if err != nil {
		return "_"
	}
	return e
}

// sidecarCopy tells whether the task is a worker of a forkable job the
// hadar sidecar placed (its env has HADAR_UNIT and the job's meta says
// hadar.forkable = true).
func sidecarCopy(env map[string]string) bool {
	if strings.TrimSpace(env[contract.EnvUnit]) == "" {
		return false
	}
	v, ok := env[envForkable]
	if !ok {
		v = env[strings.ToUpper(envForkable)]
	}
	f, err := strconv.ParseBool(strings.TrimSpace(v))
	return err == nil && f
}

// copyIndex is the HadarE copy a task is: hadare.copy_index, else the
// task env's HADAR_COPY_INDEX, else its HADAR_UNIT (the sidecar's unit
// number: HadarE copies are units), else the allocation's index in its
// group; config and env must agree when both are set. With declared
// copies the index is in 0..copies-1; with dynamic copies (copies unset)
// any number >= 0 is one.
func copyIndex(h *HadarEConfig, env map[string]string) (int, error) {
	parse := func(name, v string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		switch {
		case h.Copies > 0 && (err != nil || n < 0 || n >= h.Copies):
			return 0, fmt.Errorf("hadare: %s %q is not a copy index in 0..%d; set hadare.copy_index", name, v, h.Copies-1)
		case err != nil || n < 0:
			return 0, fmt.Errorf("hadare: %s %q is not a copy index (a number >= 0); set hadare.copy_index", name, v)
		}
		return n, nil
	}
	v, fromEnv := env[contract.EnvCopyIndex]
	set := h.CopyIndex >= 0
	switch {
	case set && fromEnv:
		n, err := parse(contract.EnvCopyIndex, v)
		if err != nil {
			return 0, err
		}
		if n != h.CopyIndex {
			return 0, fmt.Errorf("hadare: copy_index %d disagrees with the task env's %s=%s; set one of them", h.CopyIndex, contract.EnvCopyIndex, v)
		}
		return n, nil
	case set:
		return h.CopyIndex, nil
	case fromEnv:
		return parse(contract.EnvCopyIndex, v)
	}
	if v, ok := env[contract.EnvUnit]; ok && strings.TrimSpace(v) != "" {
		if h.Copies > 0 {
			return 0, fmt.Errorf("hadare: copies = %d, but the hadar sidecar placed this task as unit %s: under the sidecar, copies are its units and come and go; remove hadare.copies", h.Copies, v)
		}
		return parse(contract.EnvUnit, v)
	}
	if v, ok := env["NOMAD_ALLOC_INDEX"]; ok {
		return parse("NOMAD_ALLOC_INDEX", v)
	}
	return 0, nil
}

// resolveCommand finds the program: absolute as is, a relative path
// against the task directory (like raw_exec), a bare name on the task's
// PATH.
func resolveCommand(command, taskDir, path string) (string, error) {
	switch {
	case filepath.IsAbs(command):
		return command, nil
	case strings.Contains(command, "/"):
		return filepath.Join(taskDir, command), nil
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue // a relative PATH entry would be the driver's, not the task's
		}
		p := filepath.Join(dir, command)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q: not found on PATH %q; give an absolute path or a path relative to the task directory", command, path)
}

// envList renders env as KEY=value lines, sorted.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
