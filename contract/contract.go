// Package contract is the training-process contract declared once: the
// environment a training process gets, the progress file it writes, its
// checkpoints, and the files HadarE copies share. docs/training-contract.md
// is the spec for people; this package is what every Go implementation —
// the task driver (driver/train), the device plugin (driver/device), the
// sidecar (sidecar/watch, sidecar/jobform), the trainer (trainer/run), the
// demo — imports, and what the Python library (python/hadar_train)
// mirrors, both held to the shared fixtures in testdata/.
//
// It is a leaf: it imports nothing of hadar's.
package contract

import (
	"strconv"
	"strings"
)

// Version is the contract's version: bumped when a field changes meaning.
// A progress file carries it; readers accept files without it (0) and of
// every version so far, whose progress fields all mean the same.
//
// Version 2: one process per GPU with LOCAL_RANK 0 (it indexes the devices
// the process sees, and hadar-gpu shows it one), every variable torchrun
// sets (WorkerEnv), the stop protocol across ranks, checkpoint names, and
// the HadarE merge directory's files (MergeVersion 3: model state as named
// tensors, shared by the Go trainer and the Python library).
const Version = 2

// The environment the task driver sets for a training process (and the
// sidecar, for tasks on Nomad's own drivers).
const (
	// EnvProgressFile is where the process writes its progress.
	EnvProgressFile = "HADAR_PROGRESS_FILE"
	// EnvCheckpointDir is where checkpoints live; it survives a restart.
	EnvCheckpointDir = "HADAR_CHECKPOINT_DIR"
	// EnvTotalSteps is the steps the job must reach.
	EnvTotalSteps = "HADAR_TOTAL_STEPS"
	// EnvStepsPerSec is emulation only: the pace to keep.
	EnvStepsPerSec = "HADAR_STEPS_PER_SEC"
	// EnvSpreadStepsPerSec is the emulated pace when the unit spans
	// several nodes.
	EnvSpreadStepsPerSec = "HADAR_SPREAD_STEPS_PER_SEC"
	// EnvJobID is the job's ID, shared by all its copies.
	EnvJobID = "HADAR_JOB_ID"
	// EnvCopyIndex and EnvCopies: HadarE, this copy's index and the
	// number of copies (when fixed).
	EnvCopyIndex = "HADAR_COPY_INDEX"
	EnvCopies    = "HADAR_COPIES"
	// EnvMergeDir is the directory HadarE copies merge through;
	// EnvMergeEvery the steps between merges; EnvMergeInterval, a
	// duration ("2s"), makes a copy's steps per round its pace times it.
	EnvMergeDir      = "HADAR_MERGE_DIR"
	EnvMergeEvery    = "HADAR_MERGE_EVERY"
	EnvMergeInterval = "HADAR_MERGE_INTERVAL"
	// EnvGPUModel names the GPU model(s) the task got.
	EnvGPUModel = "HADAR_GPU_MODEL"
)

// EnvGPUReservedModel is what hadar-gpu (driver/device) sets when it
// reserves GPUs for a task: their model(s), comma-separated, which the
// task driver reads to pick the emulated pace (Nomad does not pass
// allocated devices to drivers). It is not EnvGPUModel because Nomad lets a
// device plugin's variables override the task's own, and a task's
// HADAR_GPU_MODEL (set by the sidecar) must win (docs/driver.md).
const EnvGPUReservedModel = "HADAR_GPU_RESERVED_MODEL"

// The environment the sidecar writes into each worker group it generates
// (the task driver passes it through).
const (
	// EnvUnit is the placement unit's number, stable while the unit runs;
	// HadarE copies are units.
	EnvUnit = "HADAR_UNIT"
	// EnvTemplate is the template group's name: checkpoints are keyed by
	// it, not by the generated group's, which changes with each placement.
	EnvTemplate = "HADAR_TEMPLATE"
	// EnvGPUType is the planner's GPU type the worker was placed on.
	EnvGPUType = "HADAR_GPU_TYPE"
	// EnvManagedBy is "hadar-sidecar" on the workers it placed.
	EnvManagedBy = "HADAR_MANAGED_BY"
	// EnvPlacementID is the placement's ID: the workers of one start share
	// it.
	EnvPlacementID = "HADAR_PLACEMENT_ID"
	// EnvJobRun identifies the run of the job: the Nomad job's create
	// index, new when a purged job is registered again. A task whose
	// checkpoint directory was written by another run, or by a run that
	// finished, starts fresh unless the job asks to resume (MetaResume).
	EnvJobRun = "HADAR_JOB_RUN"
	// EnvWidths is the widths an elastic job may run at (hadar.workers),
	// ascending and comma-separated ("1,2,4"), so that the process can
	// check its global batch divides among each; set only on elastic
	// jobs' workers.
	EnvWidths = "HADAR_WIDTHS"
)

// Job meta keys the task driver reads as well as the sidecar (Nomad puts
// job meta in a task's env as NOMAD_META_<key>).
const (
	// MetaResume is the job meta key with which a job's author asks a new
	// run to resume from the checkpoints of the job's previous run
	// ("true").
	MetaResume = "hadar.resume"
	// MetaForkable is the job meta key with which a job's author lets
	// HadarE fork the job into copies ("true"): the driver tells a copy by
	// it.
	MetaForkable = "hadar.forkable"
)

// ManagedBySidecar is EnvManagedBy's value on the workers the sidecar
// placed.
const ManagedBySidecar = "hadar-sidecar"

// torchrun's names (torch.distributed.run), set for the workers of a unit.
const (
	EnvRank           = "RANK"
	EnvWorldSize      = "WORLD_SIZE"
	EnvLocalRank      = "LOCAL_RANK"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	EnvGroupRank      = "GROUP_RANK"
	EnvGroupWorldSize = "GROUP_WORLD_SIZE"
	EnvRoleRank       = "ROLE_RANK"
	EnvRoleWorldSize  = "ROLE_WORLD_SIZE"
	EnvRoleName       = "ROLE_NAME"
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
	// torchelastic's: hadar runs no agent, restarts nothing itself (a
	// unit that breaks is planned anew), and rank 0 hosts the store.
	EnvRestartCount  = "TORCHELASTIC_RESTART_COUNT"
	EnvMaxRestarts   = "TORCHELASTIC_MAX_RESTARTS"
	EnvRunID         = "TORCHELASTIC_RUN_ID"
	EnvUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE"
	// NCCL collectives fail on a lost peer instead of hanging (the stop
	// protocol relies on it); torchrun defaults both, keeping the task's.
	EnvNCCLAsyncErrors      = "NCCL_ASYNC_ERROR_HANDLING"
	EnvTorchNCCLAsyncErrors = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
	// EnvNodeRank is not torchrun's: hadar sets it to the index of the
	// worker's node among its unit's nodes (what torch.distributed.launch
	// and Lightning call the node rank).
	EnvNodeRank = "NODE_RANK"
)

// RoleName is ROLE_NAME: torchrun's default role.
const RoleName = "default"

// WorkerEnv is one worker of a unit as torchrun would have started it:
// one process per GPU, each its own torchrun "node" (agent) with one local
// worker, so LOCAL_RANK is 0 and indexes the one GPU the process sees
// (hadar-gpu narrows CUDA_VISIBLE_DEVICES to the worker's GPU).
type WorkerEnv struct {
	Rank, WorldSize int
	// NodeRank is the index of the worker's node among the unit's nodes,
	// in rank order.
	NodeRank   int
	MasterAddr string
	MasterPort int
	// RunID is TORCHELASTIC_RUN_ID: the same for the unit's workers.
	RunID string
}

// Env returns the variables the worker's task gets. Defaults are the
// variables torchrun leaves to the task when it sets them itself (the
// NCCL switches): a writer sets them only where the task has none.
func (w WorkerEnv) Env() (set, defaults map[string]string) {
	r, n := strconv.Itoa(w.Rank), strconv.Itoa(w.WorldSize)
	set = map[string]string{
		EnvRank: r, EnvWorldSize: n,
		EnvLocalRank: "0", EnvLocalWorldSize: "1",
		EnvGroupRank: r, EnvGroupWorldSize: n,
		EnvRoleRank: r, EnvRoleWorldSize: n, EnvRoleName: RoleName,
		EnvNodeRank:   strconv.Itoa(w.NodeRank),
		EnvMasterAddr: w.MasterAddr, EnvMasterPort: strconv.Itoa(w.MasterPort),
		EnvRestartCount: "0", EnvMaxRestarts: "0", EnvRunID: w.RunID, EnvUseAgentStore: "False",
	}
	defaults = map[string]string{EnvNCCLAsyncErrors: "1", EnvTorchNCCLAsyncErrors: "1"}
	return set, defaults
}

// RunID is the TORCHELASTIC_RUN_ID of unit of job.
func RunID(job string, unit int) string { return job + "-u" + strconv.Itoa(unit) }

// ProgressFileName is the progress file's name in the task's local/
// directory, where the sidecar reads it through Nomad's alloc filesystem;
// ProgressAllocPath is that path in the allocation, {task} the task's name.
const (
	ProgressFileName  = "hadar-progress.json"
	ProgressAllocPath = "{task}/local/" + ProgressFileName
)

// PathElement makes a Nomad name (namespace, job, group, task) one path
// element of the storage layout (<root>/<namespace>/<job>/...): "/" and
// "%" are escaped, and a leading dot (no name can be ".", ".." or
// hidden). Plain names (letters, digits, "-", "_", ".") are unchanged.
// driver/confine.Element is the same rule.
func PathElement(name string) string {
	s := strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
	if strings.HasPrefix(s, ".") {
		s = "%2E" + s[1:]
	}
	return s
}
