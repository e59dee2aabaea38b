package plugin

import (
	"context"
	"path/filepath"
	"time"

	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
)

// DriverPlugin is a task driver: it starts, watches and stops tasks on
// behalf of the Nomad client. A task ID that the driver does not know is
// answered with ErrTaskNotFound.
type DriverPlugin interface {
	BasePlugin
	// TaskConfigSchema is the schema of a task's config block.
	TaskConfigSchema() *hclspec.Spec
	// Capabilities tells the client what the driver supports.
	Capabilities() Capabilities
	// Fingerprint sends the driver's health and node attributes at once
	// and again whenever they change, until ctx ends; then it closes the
	// channel.
	Fingerprint(ctx context.Context) (<-chan *DriverFingerprint, error)
	// StartTask starts a task and returns the handle the client keeps
	// for it (and hands back to RecoverTask). An error wrapped with
	// Recoverable lets the client retry; any other fails the task.
	StartTask(ctx context.Context, cfg *TaskConfig) (*TaskHandle, error)
	// RecoverTask takes a task back after the plugin restarted, from the
	// handle StartTask returned.
	RecoverTask(ctx context.Context, h *TaskHandle) error
	// WaitTask blocks until the task exits and returns how; at once if
	// it has. It returns ctx's error when ctx ends first. The client
	// calls it any number of times.
	WaitTask(ctx context.Context, taskID string) (*ExitResult, error)
	// StopTask sends signal ("" for the driver's default) and kills the
	// task if it has not exited after timeout (its kill_timeout).
	StopTask(ctx context.Context, taskID string, timeout time.Duration, signal string) error
	// DestroyTask forgets a task, killing it first if force is set; a
	// running task without force is an error.
	DestroyTask(ctx context.Context, taskID string, force bool) error
	// InspectTask reports the task's state.
	InspectTask(ctx context.Context, taskID string) (*TaskStatus, error)
	// TaskStats sends the task's resource usage every interval until ctx
	// ends or the task is gone; then it closes the channel.
	TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *TaskResourceUsage, error)
	// TaskEvents sends events about any of the driver's tasks, which the
	// client records in the task's event list, until ctx ends.
	TaskEvents(ctx context.Context) (<-chan *TaskEvent, error)
	// SignalTask sends a signal (a name such as "SIGUSR1") to the task.
	SignalTask(ctx context.Context, taskID string, signal string) error
}

// Capabilities is what a driver supports.
type Capabilities struct {
	// SendSignals: SignalTask works.
	SendSignals bool
	// Exec: the driver runs commands in a task (nomad alloc exec);
	// this package serves no exec RPCs, so leave it false.
	Exec              bool
	FSIsolation       FSIsolation
	NetIsolationModes []NetIsolationMode
	MountConfigs      MountConfigs
}

// FSIsolation is how a task's filesystem is isolated.
type FSIsolation int

// The isolations Nomad knows (the values are the wire numbers).
const (
	FSIsolationNone FSIsolation = iota
	FSIsolationChroot
	FSIsolationImage
	FSIsolationUnveil
)

// NetIsolationMode is a network isolation a driver supports.
type NetIsolationMode int

// The modes Nomad knows (the values are the wire numbers).
const (
	NetIsolationHost NetIsolationMode = iota
	NetIsolationGroup
	NetIsolationTask
	NetIsolationNone
)

// MountConfigs is whether a driver supports a task's volume mounts.
type MountConfigs int

// The values Nomad knows (the wire numbers).
const (
	MountsAny MountConfigs = iota
	MountsNone
)

// HealthState is a driver's health on a node.
type HealthState int

// The states Nomad knows (the values are the wire numbers).
const (
	HealthUndetected HealthState = iota
	HealthUnhealthy
	HealthHealthy
)

// DriverHealthy is the health description Nomad's own drivers give when
// healthy.
const DriverHealthy = "Healthy"

// DriverFingerprint is a driver's health and the node attributes it
// contributes ("driver.<name>" and the like).
type DriverFingerprint struct {
	Attributes        map[string]Attribute
	Health            HealthState
	HealthDescription string
	// Err is reported to the client in the fingerprint, which goes on.
	Err error
}

// TaskConfig is a task as the client asks the driver to run it.
type TaskConfig struct {
	// ID identifies the task (alloc and task name); every later call
	// names the task by it.
	ID            string
	AllocID       string
	Name          string
	TaskGroupName string
	JobName       string
	JobID         string
	Namespace     string
	NodeName      string
	NodeID        string
	// Env is the task's environment as the client built it (the job's
	// env, NOMAD_* variables); DeviceEnv is what device plugins' Reserve
	// returned for its devices.
	Env, DeviceEnv map[string]string
	// User is the task's user, "" when the job names none.
	User string
	// AllocDir is the allocation directory; TaskDir derives the task's.
	AllocDir string
	// StdoutPath and StderrPath are the FIFOs the client's log collector
	// reads.
	StdoutPath, StderrPath string
	Resources              *Resources
	// DriverConfig is the task's config block, msgpack-encoded for
	// TaskConfigSchema: decode it with DecodeDriverConfig.
	DriverConfig []byte
}

// Resources are what the client allotted a task.
type Resources struct {
	// CPUShares is the task's cpu (MHz), its cgroup weight.
	CPUShares int64
	// MemoryMB is the task's memory; MemoryMaxMB its memory_max (0 when
	// not oversubscribed).
	MemoryMB, MemoryMaxMB int64
	// Linux is the cgroup settings the client computed; nil when it sent
	// none.
	Linux *LinuxResources
}

// LinuxResources are the cgroup settings of a task.
type LinuxResources struct {
	CPUPeriod, CPUQuota, CPUShares int64
	MemoryLimitBytes               int64
	OOMScoreAdj                    int64
	CpusetCpus                     string
	PercentTicks                   float64
	// CgroupPath is the cgroup the client made for the task (on
	// cgroups v2 its directory under /sys/fs/cgroup); "" when none.
	CgroupPath string
}

// Where the client lays out an allocation (facts of Nomad's alloc dir).
const (
	sharedAllocName = "alloc"
	logDirName      = "logs"
	taskLocal       = "local"
	taskSecrets     = "secrets"
	taskPrivate     = "private"
)

// TaskDir is a task's directories in the allocation directory.
type TaskDir struct {
	// Dir is <alloc dir>/<task>, the task's working directory.
	Dir string
	// LocalDir is <task dir>/local, the task's own scratch space (the
	// alloc filesystem shows it as <task>/local).
	LocalDir   string
	SecretsDir string
	PrivateDir string
	// SharedAllocDir is <alloc dir>/alloc, shared by the alloc's tasks.
	SharedAllocDir string
	// SharedTaskDir is <task dir>/alloc, where isolating drivers mount
	// the shared dir.
	SharedTaskDir string
	// LogDir is <alloc dir>/alloc/logs.
	LogDir string
}

// TaskDir is the task's directories.
func (c *TaskConfig) TaskDir() TaskDir {
	dir := filepath.Join(c.AllocDir, c.Name)
	return TaskDir{
		Dir:            dir,
		LocalDir:       filepath.Join(dir, taskLocal),
		SecretsDir:     filepath.Join(dir, taskSecrets),
		PrivateDir:     filepath.Join(dir, taskPrivate),
		SharedAllocDir: filepath.Join(c.AllocDir, sharedAllocName),
		SharedTaskDir:  filepath.Join(dir, sharedAllocName),
		LogDir:         filepath.Join(c.AllocDir, sharedAllocName, logDirName),
	}
}

// DecodeDriverConfig decodes DriverConfig with spec (the driver's
// TaskConfigSchema) into out; see hclspec.Spec.Decode.
func (c *TaskConfig) DecodeDriverConfig(spec *hclspec.Spec, out any) error {
	return spec.Decode(c.DriverConfig, out)
}

// TaskState is a task's state as the client sees it.
type TaskState int

// The states Nomad knows.
const (
	TaskStateUnknown TaskState = iota
	TaskStateRunning
	TaskStateExited
)

// TaskHandle is what the client keeps for a task to recover it.
type TaskHandle struct {
	// Version is the driver's format of DriverState.
	Version int
	Config  *TaskConfig
	State   TaskState
	// DriverState is opaque to the client: the driver's own record of
	// the task (how to reattach to it).
	DriverState []byte
}

// ExitResult is how a task ended.
type ExitResult struct {
	ExitCode int
	// Signal is the signal that killed it, 0 if none.
	Signal    int
	OOMKilled bool
	// Err is why the driver could not tell (the client shows it).
	Err error
}

// Successful tells whether the task exited 0 on its own.
func (r *ExitResult) Successful() bool {
	return r.ExitCode == 0 && r.Signal == 0 && r.Err == nil
}

// TaskStatus is a task's state for InspectTask.
type TaskStatus struct {
	ID, Name               string
	State                  TaskState
	StartedAt, CompletedAt time.Time
	ExitResult             *ExitResult
	// DriverAttributes are the driver's own details about the task.
	DriverAttributes map[string]string
}

// TaskEvent is something the operator should see in a task's events.
type TaskEvent struct {
	TaskID, AllocID, TaskName string
	Timestamp                 time.Time
	Message                   string
	// Annotations are details shown with the event.
	Annotations map[string]string
}

// TaskResourceUsage is a task's resource usage at Timestamp.
type TaskResourceUsage struct {
	Timestamp time.Time
	CPU       CPUUsage
	Memory    MemoryUsage
}

// CPUUsage is a task's CPU usage; Measured says which figures are real.
type CPUUsage struct {
	SystemMode, UserMode float64
	// TotalTicks is the task's CPU use in MHz.
	TotalTicks                      float64
	ThrottledPeriods, ThrottledTime uint64
	Percent                         float64
	Measured                        []CPUField
}

// CPUField names a figure of CPUUsage.
type CPUField int

// The figures, as Nomad numbers them on the wire.
const (
	CPUSystemMode CPUField = iota
	CPUUserMode
	CPUTotalTicks
	CPUThrottledPeriods
	CPUThrottledTime
	CPUPercent
)

// MemoryUsage is a task's memory usage in bytes; Measured says which
// figures are real.
type MemoryUsage struct {
	RSS, Cache, Swap, Usage, MaxUsage, KernelUsage, KernelMaxUsage uint64
	Measured                                                       []MemoryField
}

// MemoryField names a figure of MemoryUsage.
type MemoryField int

// The figures, as Nomad numbers them on the wire.
const (
	MemoryRSS MemoryField = iota
	MemoryCache
	MemoryMaxUsage
	MemoryKernelUsage
	MemoryKernelMaxUsage
	MemoryUsageBytes
	MemorySwap
)
