package plugintest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/proto/driverpb"
	"github.com/hadar-sched/hadar/driver/plugin/proto/hclspecpb"
)

// TaskConfigSchema returns the task config's schema in its wire form
// (turn a task's config into msgpack with DriverConfig).
func (c *Client) TaskConfigSchema(ctx context.Context) (*hclspecpb.Spec, error) {
	r, err := c.driver.TaskConfigSchema(ctx, &driverpb.TaskConfigSchemaRequest{})
	return r.GetSpec(), err
}

// Capabilities asks what the driver supports.
func (c *Client) Capabilities(ctx context.Context) (plugin.Capabilities, error) {
	r, err := c.driver.Capabilities(ctx, &driverpb.CapabilitiesRequest{})
	if err != nil {
		return plugin.Capabilities{}, err
	}
	pc := r.GetCapabilities()
	caps := plugin.Capabilities{
		SendSignals: pc.GetSendSignals(),
		Exec:        pc.GetExec(),
	}
	switch pc.GetFsIsolation() {
	case driverpb.DriverCapabilities_FS_ISOLATION_CHROOT:
		caps.FSIsolation = plugin.FSIsolationChroot
	case driverpb.DriverCapabilities_FS_ISOLATION_IMAGE:
		caps.FSIsolation = plugin.FSIsolationImage
	case driverpb.DriverCapabilities_FS_ISOLATION_UNVEIL:
		caps.FSIsolation = plugin.FSIsolationUnveil
	}
	if pc.GetMountConfigs() == driverpb.DriverCapabilities_MOUNT_CONFIGS_NONE {
		caps.MountConfigs = plugin.MountsNone
	}
	for _, m := range pc.GetNetworkIsolationModes() {
		switch m {
		case driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_HOST:
			caps.NetIsolationModes = append(caps.NetIsolationModes, plugin.NetIsolationHost)
		case driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_GROUP:
			caps.NetIsolationModes = append(caps.NetIsolationModes, plugin.NetIsolationGroup)
		case driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_TASK:
			caps.NetIsolationModes = append(caps.NetIsolationModes, plugin.NetIsolationTask)
		case driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_NONE:
			caps.NetIsolationModes = append(caps.NetIsolationModes, plugin.NetIsolationNone)
		}
	}
	return caps, nil
}

// DriverFingerprint streams a driver's fingerprints.
func (c *Client) DriverFingerprint(ctx context.Context) (<-chan *plugin.DriverFingerprint, error) {
	s, err := c.driver.Fingerprint(ctx, &driverpb.FingerprintRequest{})
	if err != nil {
		return nil, err
	}
	return stream(ctx, s.Recv, func(r *driverpb.FingerprintResponse) (*plugin.DriverFingerprint, error) {
		f := &plugin.DriverFingerprint{Attributes: attributes(r.GetAttributes()), HealthDescription: r.GetHealthDescription()}
		switch r.GetHealth() {
		case driverpb.FingerprintResponse_HEALTH_STATE_HEALTHY:
			f.Health = plugin.HealthHealthy
		case driverpb.FingerprintResponse_HEALTH_STATE_UNHEALTHY:
			f.Health = plugin.HealthUnhealthy
		}
		if r.GetErr() != "" {
			f.Err = errors.New(r.GetErr())
		}
		return f, nil
	}, func(err error) *plugin.DriverFingerprint { return &plugin.DriverFingerprint{Err: err} }), nil
}

// StartTask starts cfg (its DriverConfig from DriverConfig).
func (c *Client) StartTask(ctx context.Context, cfg *plugin.TaskConfig) (*plugin.TaskHandle, error) {
	r, err := c.driver.StartTask(ctx, &driverpb.StartTaskRequest{Task: taskConfigProto(cfg)})
	if err != nil {
		return nil, err
	}
	if r.GetHandle() == nil {
		return nil, fmt.Errorf("StartTask answered no handle")
	}
	return taskHandle(r.GetHandle()), nil
}

// RecoverTask hands a stored handle back.
func (c *Client) RecoverTask(ctx context.Context, h *plugin.TaskHandle) error {
	_, err := c.driver.RecoverTask(ctx, &driverpb.RecoverTaskRequest{TaskId: h.Config.ID, Handle: &driverpb.TaskHandle{
		Version: int32(h.Version), Config: taskConfigProto(h.Config), State: taskStateProto(h.State), DriverState: h.DriverState,
	}})
	return err
}

// WaitTask waits for the task's exit; the RPC's error comes back as the
// result's Err, as the client has it.
func (c *Client) WaitTask(ctx context.Context, taskID string) *plugin.ExitResult {
	r, err := c.driver.WaitTask(ctx, &driverpb.WaitTaskRequest{TaskId: taskID})
	if err != nil {
		return &plugin.ExitResult{Err: err}
	}
	res := &plugin.ExitResult{}
	if x := r.GetResult(); x != nil {
		res.ExitCode, res.Signal, res.OOMKilled = int(x.GetExitCode()), int(x.GetSignal()), x.GetOomKilled()
	}
	if r.GetErr() != "" {
		res.Err = errors.New(r.GetErr())
	}
	return res
}

// StopTask stops the task with signal, killing it after timeout.
func (c *Client) StopTask(ctx context.Context, taskID string, timeout time.Duration, signal string) error {
	_, err := c.driver.StopTask(ctx, &driverpb.StopTaskRequest{TaskId: taskID, Timeout: durationpb.New(timeout), Signal: signal})
	return err
}

// DestroyTask forgets the task.
func (c *Client) DestroyTask(ctx context.Context, taskID string, force bool) error {
	_, err := c.driver.DestroyTask(ctx, &driverpb.DestroyTaskRequest{TaskId: taskID, Force: force})
	return err
}

// InspectTask reports the task's status. It fails where the client would
// (the client reads the timestamps and result without checking them).
func (c *Client) InspectTask(ctx context.Context, taskID string) (*plugin.TaskStatus, error) {
	r, err := c.driver.InspectTask(ctx, &driverpb.InspectTaskRequest{TaskId: taskID})
	if err != nil {
		return nil, err
	}
	t := r.GetTask()
	if t == nil || t.GetResult() == nil {
		return nil, fmt.Errorf("InspectTask answered no task or no result: the client would crash on it")
	}
	for _, ts := range []*timestamppb.Timestamp{t.GetStartedAt(), t.GetCompletedAt()} {
		if err := ts.CheckValid(); err != nil {
			return nil, fmt.Errorf("InspectTask timestamp: %w (the client fails on it)", err)
		}
	}
	return &plugin.TaskStatus{
		ID: t.GetId(), Name: t.GetName(), State: taskState(t.GetState()),
		StartedAt: t.GetStartedAt().AsTime(), CompletedAt: t.GetCompletedAt().AsTime(),
		ExitResult: &plugin.ExitResult{
			ExitCode: int(t.GetResult().GetExitCode()), Signal: int(t.GetResult().GetSignal()), OOMKilled: t.GetResult().GetOomKilled(),
		},
		DriverAttributes: r.GetDriver().GetAttributes(),
	}, nil
}

// TaskStats streams the task's resource usage every interval.
func (c *Client) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *TaskStats, error) {
	s, err := c.driver.TaskStats(ctx, &driverpb.TaskStatsRequest{TaskId: taskID, CollectionInterval: durationpb.New(interval)})
	if err != nil {
		return nil, err
	}
	return stream(ctx, s.Recv, func(r *driverpb.TaskStatsResponse) (*TaskStats, error) {
		st := r.GetStats()
		if err := st.GetTimestamp().CheckValid(); err != nil {
			return nil, fmt.Errorf("task stats timestamp: %w (the client drops the report)", err)
		}
		agg := st.GetAggResourceUsage()
		if agg == nil {
			return nil, fmt.Errorf("task stats without agg_resource_usage: the client would crash on it")
		}
		u := &plugin.TaskResourceUsage{Timestamp: st.GetTimestamp().AsTime()}
		if cpu := agg.GetCpu(); cpu != nil {
			u.CPU = plugin.CPUUsage{
				SystemMode: cpu.GetSystemMode(), UserMode: cpu.GetUserMode(), TotalTicks: cpu.GetTotalTicks(),
				ThrottledPeriods: cpu.GetThrottledPeriods(), ThrottledTime: cpu.GetThrottledTime(), Percent: cpu.GetPercent(),
			}
			for _, f := range cpu.GetMeasuredFields() {
				u.CPU.Measured = append(u.CPU.Measured, plugin.CPUField(f))
			}
		}
		if m := agg.GetMemory(); m != nil {
			u.Memory = plugin.MemoryUsage{
				RSS: m.GetRss(), Cache: m.GetCache(), Swap: m.GetSwap(), Usage: m.GetUsage(), MaxUsage: m.GetMaxUsage(),
				KernelUsage: m.GetKernelUsage(), KernelMaxUsage: m.GetKernelMaxUsage(),
			}
			for _, f := range m.GetMeasuredFields() {
				u.Memory.Measured = append(u.Memory.Measured, plugin.MemoryField(f))
			}
		}
		return &TaskStats{Usage: u}, nil
	}, func(err error) *TaskStats { return &TaskStats{Err: err} }), nil
}

// TaskStats is one report of TaskStats, or the error that ended them.
type TaskStats struct {
	Usage *plugin.TaskResourceUsage
	Err   error
}

// TaskEvents streams the driver's task events.
func (c *Client) TaskEvents(ctx context.Context) (<-chan *TaskEvent, error) {
	s, err := c.driver.TaskEvents(ctx, &driverpb.TaskEventsRequest{})
	if err != nil {
		return nil, err
	}
	return stream(ctx, s.Recv, func(r *driverpb.DriverTaskEvent) (*TaskEvent, error) {
		return &TaskEvent{Event: &plugin.TaskEvent{
			TaskID: r.GetTaskId(), AllocID: r.GetAllocId(), TaskName: r.GetTaskName(),
			Timestamp: r.GetTimestamp().AsTime(), Message: r.GetMessage(), Annotations: r.GetAnnotations(),
		}}, nil
	}, func(err error) *TaskEvent { return &TaskEvent{Err: err} }), nil
}

// TaskEvent is one event of TaskEvents, or the error that ended them.
type TaskEvent struct {
	Event *plugin.TaskEvent
	Err   error
}

// SignalTask sends signal to the task.
func (c *Client) SignalTask(ctx context.Context, taskID, signal string) error {
	_, err := c.driver.SignalTask(ctx, &driverpb.SignalTaskRequest{TaskId: taskID, Signal: signal})
	return err
}

// taskConfigProto encodes a task as the client does: every section
// present, as the client always fills them.
func taskConfigProto(c *plugin.TaskConfig) *driverpb.TaskConfig {
	pb := &driverpb.TaskConfig{
		Id: c.ID, AllocId: c.AllocID, Name: c.Name, TaskGroupName: c.TaskGroupName,
		JobName: c.JobName, JobId: c.JobID, Namespace: c.Namespace, NodeName: c.NodeName, NodeId: c.NodeID,
		Env: c.Env, DeviceEnv: c.DeviceEnv, User: c.User, AllocDir: c.AllocDir,
		StdoutPath: c.StdoutPath, StderrPath: c.StderrPath, MsgpackDriverConfig: c.DriverConfig,
	}
	if r := c.Resources; r != nil {
		pb.Resources = &driverpb.Resources{
			AllocatedResources: &driverpb.AllocatedTaskResources{
				Cpu:    &driverpb.AllocatedCpuResources{CpuShares: r.CPUShares},
				Memory: &driverpb.AllocatedMemoryResources{MemoryMb: r.MemoryMB, MemoryMaxMb: r.MemoryMaxMB},
			},
		}
		if l := r.Linux; l != nil {
			pb.Resources.LinuxResources = &driverpb.LinuxResources{
				CpuPeriod: l.CPUPeriod, CpuQuota: l.CPUQuota, CpuShares: l.CPUShares, MemoryLimitBytes: l.MemoryLimitBytes,
				OomScoreAdj: l.OOMScoreAdj, CpusetCpus: l.CpusetCpus, PercentTicks: l.PercentTicks, CpusetCgroup: l.CgroupPath,
			}
		}
	}
	return pb
}

func taskConfig(pb *driverpb.TaskConfig) *plugin.TaskConfig {
	if pb == nil {
		return nil
	}
	c := &plugin.TaskConfig{
		ID: pb.GetId(), AllocID: pb.GetAllocId(), Name: pb.GetName(), TaskGroupName: pb.GetTaskGroupName(),
		JobName: pb.GetJobName(), JobID: pb.GetJobId(), Namespace: pb.GetNamespace(), NodeName: pb.GetNodeName(), NodeID: pb.GetNodeId(),
		Env: pb.GetEnv(), DeviceEnv: pb.GetDeviceEnv(), User: pb.GetUser(), AllocDir: pb.GetAllocDir(),
		StdoutPath: pb.GetStdoutPath(), StderrPath: pb.GetStderrPath(), DriverConfig: pb.GetMsgpackDriverConfig(),
	}
	if r := pb.GetResources(); r != nil {
		a := r.GetAllocatedResources()
		c.Resources = &plugin.Resources{
			CPUShares: a.GetCpu().GetCpuShares(), MemoryMB: a.GetMemory().GetMemoryMb(), MemoryMaxMB: a.GetMemory().GetMemoryMaxMb(),
		}
		if l := r.GetLinuxResources(); l != nil {
			c.Resources.Linux = &plugin.LinuxResources{
				CPUPeriod: l.GetCpuPeriod(), CPUQuota: l.GetCpuQuota(), CPUShares: l.GetCpuShares(), MemoryLimitBytes: l.GetMemoryLimitBytes(),
				OOMScoreAdj: l.GetOomScoreAdj(), CpusetCpus: l.GetCpusetCpus(), PercentTicks: l.GetPercentTicks(), CgroupPath: l.GetCpusetCgroup(),
			}
		}
	}
	return c
}

func taskHandle(pb *driverpb.TaskHandle) *plugin.TaskHandle {
	return &plugin.TaskHandle{Version: int(pb.GetVersion()), Config: taskConfig(pb.GetConfig()), State: taskState(pb.GetState()), DriverState: pb.GetDriverState()}
}

func taskState(s driverpb.TaskState) plugin.TaskState {
	switch s {
	case driverpb.TaskState_TASK_STATE_RUNNING:
		return plugin.TaskStateRunning
	case driverpb.TaskState_TASK_STATE_EXITED:
		return plugin.TaskStateExited
	}
	return plugin.TaskStateUnknown
}

func taskStateProto(s plugin.TaskState) driverpb.TaskState {
	switch s {
	case plugin.TaskStateRunning:
		return driverpb.TaskState_TASK_STATE_RUNNING
	case plugin.TaskStateExited:
		return driverpb.TaskState_TASK_STATE_EXITED
	}
	return driverpb.TaskState_TASK_STATE_UNKNOWN
}
