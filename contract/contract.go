// Package contract is the training-process contract declared once: the
// environment a training process gets, the progress file it writes and the
// files it shares with hadar. docs/training-contract.md is the spec for
// people; this package is what every Go implementation — the task driver
// (driver/train), the sidecar (sidecar/watch, sidecar/jobform), the
// trainer (trainer/run), the demo — imports, and what the Python library
// (python/) mirrors, checked by shared fixtures (testdata/).
//
// It is a leaf: it imports nothing of hadar's.
package contract

// Version is the contract's version: bumped when a field changes meaning.
// A progress file may carry it; readers accept files without it.
const Version = 1

// The environment the task driver sets for a training process.
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
	// EnvMergeEvery the steps between merges.
	EnvMergeDir   = "HADAR_MERGE_DIR"
	EnvMergeEvery = "HADAR_MERGE_EVERY"
	// EnvGPUModel names the GPU model(s) the task got.
	EnvGPUModel = "HADAR_GPU_MODEL"
)

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
)

// torchrun's names (torch.distributed.run), set for the workers of a unit.
const (
	EnvRank           = "RANK"
	EnvWorldSize      = "WORLD_SIZE"
	EnvLocalRank      = "LOCAL_RANK"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	EnvGroupRank      = "GROUP_RANK"
	EnvNodeRank       = "NODE_RANK"
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
)

// ProgressFileName is the progress file's name in the task's local/
// directory, where the sidecar reads it through Nomad's alloc filesystem;
// ProgressAllocPath is that path in the allocation, {task} the task's name.
const (
	ProgressFileName  = "hadar-progress.json"
	ProgressAllocPath = "{task}/local/" + ProgressFileName
)
