package train

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/plugins/drivers"
)

// launch is what StartTask works out before starting anything.
type launch struct {
	command  string
	args     []string
	dir      string
	env      map[string]string
	user     taskUser
	progress string // where the process writes its progress
	// mirror is the alloc-fs path the progress is copied to when the
	// process writes it elsewhere (progress_file outside the task dir);
	// "" when progress already is there.
	mirror      string
	modelSource string
}

// progressFileName is the progress file in the task's local/ directory:
// the sidecar reads it with AllocFS().Cat(alloc, "<task>/local/hadar-progress.json").
const progressFileName = "hadar-progress.json"

func (d *Driver) plan(cfg *drivers.TaskConfig, tc *TaskConfig) (*launch, error) {
	s := d.config()
	taskDir := cfg.TaskDir()
	u, err := resolveUser(s, cfg.User)
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
	set := map[string]string{}

	l := &launch{user: u, args: tc.Args}
	l.progress = tc.ProgressFile
	alloced := filepath.Join(taskDir.LocalDir, progressFileName)
	if l.progress == "" {
		l.progress = alloced
	} else if l.progress != alloced {
		l.mirror = alloced
	}
	set[EnvProgressFile] = l.progress
	set[EnvJobID] = cfg.JobID

	copySuffix := ""
	h := tc.HadarE
	if h == nil && sidecarCopy(env) {
		// A forkable job the hadar sidecar placed: its units are HadarE
		// copies that come and go, so it merges even without a hadare
		// block (copies dynamic, merge_every the trainer's default).
		h = &HadarEConfig{}
	}
	if h != nil {
		idx, err := copyIndex(h, env)
		if err != nil {
			return nil, err
		}
		mergeDir := h.MergeDir
		if mergeDir == "" {
			if s.mergeRoot == "" {
				return nil, fmt.Errorf("hadare: no merge directory; set hadare.merge_dir in the task or merge_root in the %s plugin block (a directory all copies can reach)", PluginName)
			}
			mergeDir = filepath.Join(s.mergeRoot, safe(cfg.Namespace), safe(cfg.JobID))
		}
		if err := mkdirOwned(mergeDir, u); err != nil {
			return nil, fmt.Errorf("hadare: merge directory: %w", err)
		}
		set[EnvCopyIndex] = strconv.Itoa(idx)
		if h.Copies > 0 {
			// Declared copies; without, the copies are whoever is in the
			// merge directory (the sidecar forks and unforks at will).
			set[EnvCopies] = strconv.Itoa(h.Copies)
		}
		set[EnvMergeDir] = mergeDir
		if h.MergeEvery > 0 {
			set[EnvMergeEvery] = strconv.Itoa(h.MergeEvery)
		}
		copySuffix = "copy-" + strconv.Itoa(idx)
	}

	ckpt := tc.CheckpointDir
	switch {
	case ckpt != "":
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
		if t := strings.TrimSpace(env[EnvTemplate]); t != "" {
			group = t
		}
		ckpt = filepath.Join(s.checkpointRoot, safe(cfg.Namespace), safe(cfg.JobID), safe(group), safe(cfg.Name), copySuffix)
	default:
		ckpt = filepath.Join(taskDir.SharedAllocDir, "data", "checkpoints", safe(cfg.Name))
	}
	if err := mkdirOwned(ckpt, u); err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	set[EnvCheckpointDir] = ckpt
	if tc.TotalSteps > 0 {
		set[EnvTotalSteps] = strconv.FormatInt(tc.TotalSteps, 10)
	}

	models, source, modelErr := gpuModels(cfg.Env, cfg.DeviceEnv, d.openNVML)
	if modelErr != nil {
		d.logger.Warn("GPU model unknown", "task", cfg.Name, "error", modelErr)
	}
	l.modelSource = source
	if len(models) > 0 && source != modelFromTaskEnv {
		set[EnvGPUModel] = strings.Join(models, ",")
	}
	if tc.Emulate != nil {
		if len(models) == 0 && modelErr != nil {
			return nil, fmt.Errorf("emulate: %w; set HADAR_GPU_MODEL in the task's env", modelErr)
		}
		rate, err := tc.Emulate.stepsPerSec(models)
		if err != nil {
			return nil, err
		}
		set[EnvStepsPerSec] = strconv.FormatFloat(rate, 'g', -1, 64)
		if spread, ok := tc.Emulate.spreadStepsPerSec(models); ok {
			set[EnvSpreadStepsPerSec] = strconv.FormatFloat(spread, 'g', -1, 64)
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
	if u.switches() {
		// As a login would; the task's own values win.
		for k, v := range map[string]string{"USER": u.name, "LOGNAME": u.name, "HOME": u.home} {
			if _, ok := env[k]; !ok {
				env[k] = v
			}
		}
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

// execCommand is what the executor starts: the program itself, or, for a
// task that runs as another user, the shim that becomes that user and
// execs the program (see privileges.go). The shim's check runs first, so
// a program the user cannot start fails StartTask.
func (d *Driver) execCommand(l *launch) (cmd string, args []string, err error) {
	if !l.user.switches() {
		return l.command, l.args, nil
	}
	if d.self == "" {
		return "", nil, fmt.Errorf("cannot find the %s binary to run the task as %s", PluginName, l.user.name)
	}
	c, err := userCredentials(l.user.uid, l.user.gid)
	if err != nil {
		return "", nil, err
	}
	if err := checkAsUser(d.self, c, l.dir, l.command); err != nil {
		return "", nil, err
	}
	args = append(append(append([]string{DropArg}, c.args()...), l.command), l.args...)
	return d.self, args, nil
}

// sidecarCopy tells whether the task is a worker of a forkable job the
// hadar sidecar placed (its env has HADAR_UNIT and the job's meta says
// hadar.forkable = true).
func sidecarCopy(env map[string]string) bool {
	if strings.TrimSpace(env[EnvUnit]) == "" {
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
	v, fromEnv := env[EnvCopyIndex]
	switch {
	case h.CopyIndex != nil && fromEnv:
		n, err := parse(EnvCopyIndex, v)
		if err != nil {
			return 0, err
		}
		if n != *h.CopyIndex {
			return 0, fmt.Errorf("hadare: copy_index %d disagrees with the task env's %s=%s; set one of them", *h.CopyIndex, EnvCopyIndex, v)
		}
		return n, nil
	case h.CopyIndex != nil:
		return *h.CopyIndex, nil
	case fromEnv:
		return parse(EnvCopyIndex, v)
	}
	if v, ok := env[EnvUnit]; ok && strings.TrimSpace(v) != "" {
		if h.Copies > 0 {
			return 0, fmt.Errorf("hadare: copies = %d, but the hadar sidecar placed this task as unit %s: under the sidecar, copies are its units and come and go; remove hadare.copies", h.Copies, v)
		}
		return parse(EnvUnit, v)
	}
	if v, ok := env["NOMAD_ALLOC_INDEX"]; ok {
		return parse("NOMAD_ALLOC_INDEX", v)
	}
	return 0, nil
}

// mkdirOwned creates dir (and its parents) and gives dir itself to the
// task's user.
func mkdirOwned(dir string, u taskUser) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return u.own(dir)
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
		p := filepath.Join(dir, command)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q: not found on PATH %q; give an absolute path or a path relative to the task directory", command, path)
}

// safe makes a Nomad name usable as one path element.
func safe(s string) string {
	if s == "" {
		return "_"
	}
	return strings.NewReplacer("/", "_", "..", "_").Replace(s)
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
