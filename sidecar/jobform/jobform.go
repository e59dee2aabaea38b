// Package jobform turns a managed job's template into the Nomad job that
// runs a placement, and reads a placement back from a job. A managed job
// has two forms in Nomad (docs/sidecar.md, "How a placement is written"):
//
//   - held: the job as its author submitted it, or as hadar returns it
//     when it evicts the job: the template task group with count 1 and the
//     gate constraint, so Nomad keeps its evaluation blocked and the job
//     pending (never garbage-collected), and `nomad job status` shows why;
//   - placed: the template group with count 0 (it keeps the gate), plus one
//     generated task group per worker, "<template>-hadar-u<unit>-w<rank>"
//     (package groupname holds the grammar), each pinned to its node with
//     a ${node.unique.id} constraint and to its GPU models with a
//     ${device.model} constraint on the GPU request, and
//     given the training contract's environment (torchrun's variables for
//     one process per GPU, and on Nomad's own task drivers the paths
//     hadar-train would set, with the storage they are on mounted), and a
//     kill signal and timeout that leave time for a checkpoint.
//
// A unit keeps its number across rewrites as long as it runs on the same
// GPUs, so a rewrite that forks, unforks or moves one unit leaves every
// other generated group byte for byte as it was: Nomad ignores them and
// their allocations go on. Nothing hadar needs to remember is written into
// meta (a meta change restarts a running job); the generated groups are the
// record a restarted sidecar rebuilds placements from.
package jobform

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// Attributes the placed form constrains.
const (
	NodeAttribute  = "${node.unique.id}"
	ModelAttribute = "${device.model}"
	// PortLabel is the rendezvous port of a unit's rank 0.
	PortLabel = "hadar_rdzv"
)

// Options are what the sidecar's configuration says about the tasks it
// generates. The zero value of a field is its default (DefaultOptions).
type Options struct {
	// CheckpointVolume and MergeVolume are the client host volumes (the
	// same shared storage on every node, like hadar-train's
	// checkpoint_root and merge_root) mounted into tasks on drivers that
	// mount volumes (exec, docker, ...), at MountDir/checkpoints and
	// MountDir/merge.
	CheckpointVolume, MergeVolume string
	MountDir                      string
	// CheckpointMeta and MergeMeta are the node meta keys holding the
	// host paths of that storage, for raw_exec tasks, which mount nothing
	// and see the host.
	CheckpointMeta, MergeMeta string
	// KillTimeout is the least kill_timeout a generated task gets: the
	// time a stopped worker has to checkpoint (Nomad caps it at the
	// client's max_kill_timeout, 30s by default).
	KillTimeout time.Duration
	// NoSharedStorage keeps tasks on Nomad's own drivers off shared
	// storage: their checkpoints go to their allocation's data directory
	// (lost when the worker moves) and no host volume is asked for, which
	// a node without one could not place. The sidecar sets it unless its
	// config has a storage block.
	NoSharedStorage bool
}

// The defaults of Options.
const (
	DefaultCheckpointVolume = "hadar-checkpoints"
	DefaultMergeVolume      = "hadar-merge"
	DefaultMountDir         = "/hadar"
	DefaultCheckpointMeta   = "hadar.checkpoint_root"
	DefaultMergeMeta        = "hadar.merge_root"
	DefaultKillTimeout      = 30 * time.Second
	// DefaultKillSignal is the kill_signal of a task that sets none
	// (Nomad's default is SIGINT; the contract takes both).
	DefaultKillSignal = "SIGTERM"
)

// DefaultOptions are the options of a sidecar configured with none.
func DefaultOptions() Options { return Options{}.withDefaults() }

func (o Options) withDefaults() Options {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&o.CheckpointVolume, DefaultCheckpointVolume)
	def(&o.MergeVolume, DefaultMergeVolume)
	def(&o.MountDir, DefaultMountDir)
	def(&o.CheckpointMeta, DefaultCheckpointMeta)
	def(&o.MergeMeta, DefaultMergeMeta)
	if o.KillTimeout <= 0 {
		o.KillTimeout = DefaultKillTimeout
	}
	return o
}

// TrainDriver is hadar's task driver: it sets the contract's paths
// itself (docs/driver.md); tasks on any other driver get them from the
// sidecar.
const TrainDriver = "hadar-train"

// RawExecDriver runs tasks on the host, mounting nothing.
const RawExecDriver = "raw_exec"

// Volume names the generated groups use for the storage.
const (
	checkpointVolumeName = "hadar-checkpoints"
	mergeVolumeName      = "hadar-merge"
)

// Unit is one placement unit of a job as written: a number stable while it
// runs on the same GPUs, and its workers in rank order.
type Unit struct {
	ID      int
	Workers []Worker
	// Port is the rendezvous port of rank 0 (MASTER_PORT).
	Port int
}

// Worker is one GPU of a unit.
type Worker struct {
	Node string
	Type planner.GPUType
	// Models are the device group names (${device.model}) of that type on
	// the node; the worker may use any of them.
	Models []string
	// Addr is the address of the unit's rank 0 node (MASTER_ADDR); it is
	// what the worker's environment carries.
	Addr string
}

// Planner returns the planner unit of u.
func (u Unit) Planner() planner.Unit {
	var out planner.Unit
	for _, w := range u.Workers {
		if n := len(out.Slots); n > 0 && out.Slots[n-1].Node == w.Node && out.Slots[n-1].Type == w.Type {
			out.Slots[n-1].Count++
			continue
		}
		out.Slots = append(out.Slots, planner.Slot{Node: w.Node, Type: w.Type, Count: 1})
	}
	return out
}

// clone deep-copies through JSON: api types carry pointers everywhere,
// and the template must never share memory with what is written.
func clone[T any](v T) (T, error) {
	var out T
	b, err := json.Marshal(v)
	if err != nil {
		return out, err
	}
	err = json.Unmarshal(b, &out)
	return out, err
}

// ErrorAttribute is the attribute of the constraint that carries hadar's
// error onto a job it refuses (the sidecar's refusal note): no node has
// it, so Nomad shows the error as the reason the job waits. Every form
// jobform writes drops it.
const ErrorAttribute = "${meta.hadar.error}"

// WithoutNotes returns cs without refusal notes (ErrorAttribute).
func WithoutNotes(cs []*api.Constraint) []*api.Constraint {
	var out []*api.Constraint
	for _, c := range cs {
		if c == nil || c.LTarget != ErrorAttribute {
			out = append(out, c)
		}
	}
	return out
}

func withoutGate(cs []*api.Constraint) []*api.Constraint {
	var out []*api.Constraint
	for _, c := range cs {
		if !jobspec.IsGate(c) {
			out = append(out, c)
		}
	}
	return out
}

func withGate(cs []*api.Constraint) []*api.Constraint {
	if slices.ContainsFunc(cs, jobspec.IsGate) {
		return cs
	}
	return append(cs, jobspec.GateConstraint())
}

// template returns the job's template group.
func template(job *api.Job, spec jobspec.Spec) (*api.TaskGroup, error) {
	for _, g := range job.TaskGroups {
		if g != nil && g.Name != nil && *g.Name == spec.Group {
			return g, nil
		}
	}
	return nil, fmt.Errorf("job %q: template group %q is missing", spec.JobID, spec.Group)
}

// Held returns the held form of job: generated groups removed, the
// template group with count 1 and the gate.
func Held(job *api.Job, spec jobspec.Spec) (*api.Job, error) {
	out, err := clone(job)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", spec.JobID, err)
	}
	var keep []*api.TaskGroup
	for _, g := range out.TaskGroups {
		if _, gen := groupname.Parse(deref(g.Name)); !gen {
			keep = append(keep, g)
		}
	}
	out.TaskGroups = keep
	out.Constraints = WithoutNotes(out.Constraints)
	t, err := template(out, spec)
	if err != nil {
		return nil, err
	}
	one := 1
	t.Count = &one
	if !jobspec.HasGate(out) {
		t.Constraints = withGate(t.Constraints)
	}
	return out, nil
}

// Placed is PlacedWith the default options.
func Placed(job *api.Job, spec jobspec.Spec, units []Unit) (*api.Job, error) {
	return PlacedWith(job, spec, units, DefaultOptions())
}

// PlacedWith returns the placed form of job running units (the whole
// placement: units not listed are removed). Generated groups of units that
// are already written with the same workers are kept as they are, so
// Nomad leaves their allocations alone.
func PlacedWith(job *api.Job, spec jobspec.Spec, units []Unit, o Options) (*api.Job, error) {
	o = o.withDefaults()
	out, err := clone(job)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", spec.JobID, err)
	}
	current, err := Units(job, spec)
	if err != nil {
		return nil, err
	}
	t, err := template(out, spec)
	if err != nil {
		return nil, err
	}
	existing := map[string]*api.TaskGroup{}
	var kept []*api.TaskGroup
	for _, g := range out.TaskGroups {
		if _, gen := groupname.Parse(deref(g.Name)); gen {
			existing[*g.Name] = g
		} else {
			kept = append(kept, g)
		}
	}
	// The gate moves from the job to the template group: job-level
	// constraints apply to the generated groups too.
	if slices.ContainsFunc(out.Constraints, jobspec.IsGate) {
		out.Constraints = withoutGate(out.Constraints)
	}
	out.Constraints = WithoutNotes(out.Constraints)
	t.Constraints = withGate(t.Constraints)
	zero := 0
	t.Count = &zero
	out.TaskGroups = kept
	seen := map[int]bool{}
	for _, u := range units {
		if seen[u.ID] || u.ID < 0 {
			return nil, fmt.Errorf("job %q: unit number %d given twice or negative", spec.JobID, u.ID)
		}
		seen[u.ID] = true
		if len(u.Workers) == 0 {
			return nil, fmt.Errorf("job %q: unit %d has no workers", spec.JobID, u.ID)
		}
		same := false
		for _, c := range current {
			same = same || (c.ID == u.ID && sameWorkers(c, u))
		}
		for rank := range u.Workers {
			name := groupname.Format(spec.Group, u.ID, rank)
			if g := existing[name]; same && g != nil {
				out.TaskGroups = append(out.TaskGroups, g)
				continue
			}
			g, err := worker(t, spec, u, rank, o, run(job))
			if err != nil {
				return nil, err
			}
			out.TaskGroups = append(out.TaskGroups, g)
		}
	}
	return out, nil
}

func sameWorkers(a, b Unit) bool {
	if len(a.Workers) != len(b.Workers) || a.Port != b.Port {
		return false
	}
	for i := range a.Workers {
		x, y := a.Workers[i], b.Workers[i]
		if x.Node != y.Node || x.Type != y.Type {
			return false
		}
	}
	return true
}

// run is contract.EnvJobRun of job: its create index, which a purged
// job registered again gets anew ("" when unknown).
func run(job *api.Job) string {
	if job.CreateIndex == nil || *job.CreateIndex == 0 {
		return ""
	}
	return strconv.FormatUint(*job.CreateIndex, 10)
}

// widths is contract.EnvWidths of an elastic job: its widths, ascending,
// comma-separated ("1,2,4"); "" for a rigid job.
func widths(spec jobspec.Spec) string {
	if len(spec.Widths) < 2 {
		return ""
	}
	ws := make([]string, len(spec.Widths))
	for i, w := range spec.Widths {
		ws[i] = strconv.Itoa(w)
	}
	return strings.Join(ws, ",")
}

// worker builds the generated group of one worker from the template.
func worker(t *api.TaskGroup, spec jobspec.Spec, u Unit, rank int, o Options, run string) (*api.TaskGroup, error) {
	g, err := clone(t)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", spec.JobID, err)
	}
	w := u.Workers[rank]
	name := groupname.Format(spec.Group, u.ID, rank)
	g.Name = &name
	one := 1
	g.Count = &one
	g.Scaling = nil // a policy for the template is not one per worker
	g.Constraints = append(withoutGate(g.Constraints), api.NewConstraint(NodeAttribute, "=", w.Node))
	// The unit's layout: which nodes, in order. Each worker is one
	// process on one GPU, torchrun's "node" of one local worker.
	var nodes []string
	for _, x := range u.Workers {
		if !slices.Contains(nodes, x.Node) {
			nodes = append(nodes, x.Node)
		}
	}
	env, defaults := contract.WorkerEnv{Rank: rank, WorldSize: len(u.Workers), NodeRank: slices.Index(nodes, w.Node),
		MasterAddr: u.Workers[0].Addr, MasterPort: u.Port, RunID: contract.RunID(spec.JobID, u.ID)}.Env()
	maps.Copy(env, map[string]string{
		contract.EnvUnit: strconv.Itoa(u.ID), contract.EnvTemplate: spec.Group,
		contract.EnvGPUType: string(w.Type), contract.EnvTotalSteps: strconv.FormatInt(spec.Steps, 10), contract.EnvManagedBy: contract.ManagedBySidecar,
	})
	if len(w.Models) == 1 {
		env[contract.EnvGPUModel] = w.Models[0]
	}
	if run != "" {
		env[contract.EnvJobRun] = run
	}
	if ws := widths(spec); ws != "" {
		env[contract.EnvWidths] = ws
	}
	found := false
	for _, task := range g.Tasks {
		if task == nil || task.Name != spec.Task {
			continue
		}
		found = true
		if task.Env == nil {
			task.Env = map[string]string{}
		}
		for k, v := range defaults {
			if _, ok := task.Env[k]; !ok {
				task.Env[k] = v
			}
		}
		maps.Copy(task.Env, env)
		if task.Driver != TrainDriver {
			storage(g, task, spec, u, o)
		}
		// Time to checkpoint when Nomad stops the worker.
		if task.KillSignal == "" {
			task.KillSignal = DefaultKillSignal
		}
		if task.KillTimeout == nil || *task.KillTimeout < o.KillTimeout {
			kt := o.KillTimeout
			task.KillTimeout = &kt
		}
		if task.Resources == nil {
			continue
		}
		for _, d := range task.Resources.Devices {
			if d == nil || d.Name != spec.Device {
				continue
			}
			var cs []*api.Constraint
			for _, c := range d.Constraints {
				if c != nil && c.LTarget != ModelAttribute {
					cs = append(cs, c)
				}
			}
			models := slices.Clone(w.Models)
			sort.Strings(models)
			if len(models) == 0 {
				return nil, fmt.Errorf("job %q: worker %d of unit %d on node %s: no GPU model of type %s there", spec.JobID, rank, u.ID, w.Node, w.Type)
			}
			d.Constraints = append(cs, api.NewConstraint(ModelAttribute, "set_contains_any", strings.Join(models, ",")))
		}
	}
	if !found {
		return nil, fmt.Errorf("job %q: template group %q has no task %q", spec.JobID, spec.Group, spec.Task)
	}
	if rank == 0 {
		// Rank 0 reserves the rendezvous port: Nomad refuses the placement
		// rather than start a unit whose port another task holds.
		net := &api.NetworkResource{ReservedPorts: []api.Port{{Label: PortLabel, Value: u.Port}}}
		if len(g.Networks) > 0 && g.Networks[0] != nil {
			net = g.Networks[0]
			net.ReservedPorts = append(net.ReservedPorts, api.Port{Label: PortLabel, Value: u.Port})
		} else {
			g.Networks = append(g.Networks, net)
		}
	}
	return g, nil
}

// storage gives a task on one of Nomad's own drivers what hadar-train
// would give it (docs/training-contract.md, "Environment"): its job's ID,
// the progress file where the sidecar reads it, and its checkpoint (and
// HadarE merge) directory on shared storage, keyed like hadar-train's:
// <root>/<namespace>/<job>/<template>/<task>[/copy-<unit>] and
// <root>/<namespace>/<job>. On raw_exec the roots are host paths from the
// node's meta; elsewhere host volumes mounted into the task.
func storage(g *api.TaskGroup, task *api.Task, spec jobspec.Spec, u Unit, o Options) {
	ns := spec.Namespace
	if ns == "" {
		ns = "default"
	}
	ckptRoot, mergeRoot := "${meta."+o.CheckpointMeta+"}", "${meta."+o.MergeMeta+"}"
	switch {
	case o.NoSharedStorage:
		ckptRoot, mergeRoot = "${NOMAD_ALLOC_DIR}/data/checkpoints", "${NOMAD_ALLOC_DIR}/data/merge"
	case task.Driver != RawExecDriver:
		ckptRoot, mergeRoot = path.Join(o.MountDir, "checkpoints"), path.Join(o.MountDir, "merge")
		mount(g, task, checkpointVolumeName, o.CheckpointVolume, ckptRoot)
		if spec.Forkable {
			mount(g, task, mergeVolumeName, o.MergeVolume, mergeRoot)
		}
	}
	jobDir := []string{element(ns), element(spec.JobID)}
	ckpt := append([]string{ckptRoot}, jobDir...)
	ckpt = append(ckpt, element(spec.Group), element(task.Name))
	if spec.Forkable {
		// A HadarE copy (a unit) checkpoints on its own: copies hold
		// different states between merges.
		ckpt = append(ckpt, "copy-"+strconv.Itoa(u.ID))
		task.Env[contract.EnvMergeDir] = path.Join(append([]string{mergeRoot}, jobDir...)...)
		task.Env[contract.EnvCopyIndex] = strconv.Itoa(u.ID)
	}
	task.Env[contract.EnvCheckpointDir] = path.Join(ckpt...)
	task.Env[contract.EnvProgressFile] = "${NOMAD_TASK_DIR}/" + contract.ProgressFileName
	task.Env[contract.EnvJobID] = spec.JobID
}

// element is a Nomad name as one element of a storage path
// (contract.PathElement), with "$" escaped too: Nomad interpolates
// ${...} in env values.
func element(name string) string {
	return strings.ReplaceAll(contract.PathElement(name), "$", "%24")
}

// mount mounts host volume source read-write at dest in the task, adding
// it to the group (unless the group has a volume of that name), unless
// the task mounts something there already.
func mount(g *api.TaskGroup, task *api.Task, name, source, dest string) {
	for _, m := range task.VolumeMounts {
		if m != nil && m.Destination != nil && *m.Destination == dest {
			return
		}
	}
	if g.Volumes == nil {
		g.Volumes = map[string]*api.VolumeRequest{}
	}
	if _, ok := g.Volumes[name]; !ok {
		g.Volumes[name] = &api.VolumeRequest{Name: name, Type: "host", Source: source}
	}
	vol, d, ro := name, dest, false
	task.VolumeMounts = append(task.VolumeMounts, &api.VolumeMount{Volume: &vol, Destination: &d, ReadOnly: &ro})
}

// Units reads the placement written in job: its generated groups, by unit
// and rank. A unit with a missing rank or a group not in the placed form's
// shape is an error: the job was edited by hand.
func Units(job *api.Job, spec jobspec.Spec) ([]Unit, error) {
	byUnit := map[int]map[int]Worker{}
	ports := map[int]int{}
	for _, g := range job.TaskGroups {
		gw, ok := groupname.Parse(deref(g.Name))
		if !ok || gw.Template != spec.Group {
			continue
		}
		id, rank := gw.Unit, gw.Rank
		w, port, err := readWorker(g, spec)
		if err != nil {
			return nil, fmt.Errorf("job %q group %q: %w", spec.JobID, *g.Name, err)
		}
		if byUnit[id] == nil {
			byUnit[id] = map[int]Worker{}
		}
		byUnit[id][rank] = w
		if rank == 0 {
			ports[id] = port
		}
	}
	var out []Unit
	for id, ranks := range byUnit {
		u := Unit{ID: id, Port: ports[id]}
		for r := range len(ranks) {
			w, ok := ranks[r]
			if !ok {
				return nil, fmt.Errorf("job %q unit %d: rank %d is missing (ranks must be 0..%d): the job was edited by hand", spec.JobID, id, r, len(ranks)-1)
			}
			u.Workers = append(u.Workers, w)
		}
		out = append(out, u)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out, nil
}

func readWorker(g *api.TaskGroup, spec jobspec.Spec) (Worker, int, error) {
	var w Worker
	for _, c := range g.Constraints {
		if c != nil && c.LTarget == NodeAttribute && (c.Operand == "=" || c.Operand == "") {
			w.Node = c.RTarget
		}
	}
	if w.Node == "" {
		return w, 0, fmt.Errorf("no %s constraint", NodeAttribute)
	}
	port := 0
	for _, t := range g.Tasks {
		if t == nil || t.Name != spec.Task {
			continue
		}
		w.Type = planner.GPUType(t.Env[contract.EnvGPUType])
		w.Addr = t.Env[contract.EnvMasterAddr]
		if p, err := strconv.Atoi(t.Env[contract.EnvMasterPort]); err == nil {
			port = p
		}
		if t.Resources != nil {
			for _, d := range t.Resources.Devices {
				for _, c := range d.Constraints {
					if c != nil && c.LTarget == ModelAttribute {
						w.Models = strings.Split(c.RTarget, ",")
					}
				}
			}
		}
	}
	if w.Type == "" {
		return w, 0, fmt.Errorf("no %s in task %q's env", contract.EnvGPUType, spec.Task)
	}
	return w, port, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
