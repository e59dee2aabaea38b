package plugin

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/hadar-sched/hadar/driver/plugin/proto/driverpb"
)

func registerDriver(s *grpc.Server, p DriverPlugin) {
	driverpb.RegisterDriverServer(s, &driverServer{impl: p})
}

// driverServer serves DriverPlugin. The client dereferences some
// optional fields without checking them (a task status's result and
// timestamps, a stats report's usage), so those are always sent.
type driverServer struct {
	driverpb.UnimplementedDriverServer
	impl DriverPlugin
}

func (s *driverServer) TaskConfigSchema(context.Context, *driverpb.TaskConfigSchemaRequest) (*driverpb.TaskConfigSchemaResponse, error) {
	spec := s.impl.TaskConfigSchema()
	if spec == nil {
		return &driverpb.TaskConfigSchemaResponse{}, nil
	}
	return &driverpb.TaskConfigSchemaResponse{Spec: spec.Proto()}, nil
}

func (s *driverServer) Capabilities(context.Context, *driverpb.CapabilitiesRequest) (*driverpb.CapabilitiesResponse, error) {
	c := s.impl.Capabilities()
	pb := &driverpb.DriverCapabilities{
		SendSignals:           c.SendSignals,
		Exec:                  c.Exec,
		FsIsolation:           driverpb.DriverCapabilities_FSIsolation(c.FSIsolation),
		NetworkIsolationModes: []driverpb.NetworkIsolationMode{},
		MountConfigs:          driverpb.DriverCapabilities_MountConfigs(c.MountConfigs),
	}
	for _, m := range c.NetIsolationModes {
		pb.NetworkIsolationModes = append(pb.NetworkIsolationModes, driverpb.NetworkIsolationMode(m))
	}
	return &driverpb.CapabilitiesResponse{Capabilities: pb}, nil
}

func (s *driverServer) Fingerprint(_ *driverpb.FingerprintRequest, stream driverpb.Driver_FingerprintServer) error {
	ctx := stream.Context()
	ch, err := s.impl.Fingerprint(ctx)
	if err != nil {
		return toStatus(err)
	}
	return pump(ctx, ch, func(f *DriverFingerprint) (*driverpb.FingerprintResponse, error) {
		pb := &driverpb.FingerprintResponse{
			Attributes:        attributesProto(f.Attributes),
			Health:            driverpb.FingerprintResponse_HealthState(f.Health),
			HealthDescription: f.HealthDescription,
		}
		if f.Err != nil {
			// A driver's fingerprint error is news for the client, not the
			// end of the stream.
			pb.Err = f.Err.Error()
		}
		return pb, nil
	}, stream.Send)
}

func (s *driverServer) StartTask(ctx context.Context, req *driverpb.StartTaskRequest) (*driverpb.StartTaskResponse, error) {
	h, err := s.impl.StartTask(ctx, taskConfigFromProto(req.GetTask()))
	if err != nil {
		return nil, toStatus(err)
	}
	if h == nil {
		return nil, status.Error(codes.Internal, "driver returned no task handle and no error")
	}
	return &driverpb.StartTaskResponse{Handle: taskHandleProto(h)}, nil
}

func (s *driverServer) RecoverTask(ctx context.Context, req *driverpb.RecoverTaskRequest) (*driverpb.RecoverTaskResponse, error) {
	if req.GetHandle() == nil {
		return nil, status.Error(codes.InvalidArgument, "RecoverTask without a task handle")
	}
	if err := s.impl.RecoverTask(ctx, taskHandleFromProto(req.GetHandle())); err != nil {
		return nil, toStatus(err)
	}
	return &driverpb.RecoverTaskResponse{}, nil
}

func (s *driverServer) WaitTask(ctx context.Context, req *driverpb.WaitTaskRequest) (*driverpb.WaitTaskResponse, error) {
	res, err := s.impl.WaitTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &driverpb.WaitTaskResponse{Result: exitResultProto(res)}
	if res != nil && res.Err != nil {
		resp.Err = res.Err.Error()
	}
	return resp, nil
}

func (s *driverServer) StopTask(ctx context.Context, req *driverpb.StopTaskRequest) (*driverpb.StopTaskResponse, error) {
	if d := req.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "StopTask timeout: %v", err)
		}
	}
	if err := s.impl.StopTask(ctx, req.GetTaskId(), req.GetTimeout().AsDuration(), req.GetSignal()); err != nil {
		return nil, toStatus(err)
	}
	return &driverpb.StopTaskResponse{}, nil
}

func (s *driverServer) DestroyTask(ctx context.Context, req *driverpb.DestroyTaskRequest) (*driverpb.DestroyTaskResponse, error) {
	if err := s.impl.DestroyTask(ctx, req.GetTaskId(), req.GetForce()); err != nil {
		return nil, toStatus(err)
	}
	return &driverpb.DestroyTaskResponse{}, nil
}

func (s *driverServer) InspectTask(ctx context.Context, req *driverpb.InspectTaskRequest) (*driverpb.InspectTaskResponse, error) {
	st, err := s.impl.InspectTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, toStatus(err)
	}
	if st == nil {
		return nil, status.Error(codes.Internal, "driver returned no task status and no error")
	}
	return &driverpb.InspectTaskResponse{
		Task: &driverpb.TaskStatus{
			Id:          st.ID,
			Name:        st.Name,
			State:       taskStateProto(st.State),
			StartedAt:   timestamppb.New(st.StartedAt),
			CompletedAt: timestamppb.New(st.CompletedAt),
			Result:      exitResultProto(st.ExitResult),
		},
		Driver: &driverpb.TaskDriverStatus{Attributes: st.DriverAttributes},
	}, nil
}

func (s *driverServer) TaskStats(req *driverpb.TaskStatsRequest, stream driverpb.Driver_TaskStatsServer) error {
	ctx := stream.Context()
	interval := req.GetCollectionInterval().AsDuration()
	if interval <= 0 {
		return status.Errorf(codes.InvalidArgument, "TaskStats collection interval %v: want a positive duration", interval)
	}
	ch, err := s.impl.TaskStats(ctx, req.GetTaskId(), interval)
	if err != nil {
		return toStatus(err)
	}
	return pump(ctx, ch, func(u *TaskResourceUsage) (*driverpb.TaskStatsResponse, error) {
		return &driverpb.TaskStatsResponse{Stats: taskStatsProto(req.GetTaskId(), u)}, nil
	}, stream.Send)
}

func (s *driverServer) TaskEvents(_ *driverpb.TaskEventsRequest, stream driverpb.Driver_TaskEventsServer) error {
	ctx := stream.Context()
	ch, err := s.impl.TaskEvents(ctx)
	if err != nil {
		return toStatus(err)
	}
	return pump(ctx, ch, func(ev *TaskEvent) (*driverpb.DriverTaskEvent, error) {
		return &driverpb.DriverTaskEvent{
			TaskId:      ev.TaskID,
			AllocId:     ev.AllocID,
			TaskName:    ev.TaskName,
			Timestamp:   timestamppb.New(ev.Timestamp),
			Message:     ev.Message,
			Annotations: ev.Annotations,
		}, nil
	}, stream.Send)
}

func (s *driverServer) SignalTask(ctx context.Context, req *driverpb.SignalTaskRequest) (*driverpb.SignalTaskResponse, error) {
	if err := s.impl.SignalTask(ctx, req.GetTaskId(), req.GetSignal()); err != nil {
		return nil, toStatus(err)
	}
	return &driverpb.SignalTaskResponse{}, nil
}

func taskConfigFromProto(pb *driverpb.TaskConfig) *TaskConfig {
	c := &TaskConfig{
		ID:            pb.GetId(),
		AllocID:       pb.GetAllocId(),
		Name:          pb.GetName(),
		TaskGroupName: pb.GetTaskGroupName(),
		JobName:       pb.GetJobName(),
		JobID:         pb.GetJobId(),
		Namespace:     pb.GetNamespace(),
		NodeName:      pb.GetNodeName(),
		NodeID:        pb.GetNodeId(),
		Env:           pb.GetEnv(),
		DeviceEnv:     pb.GetDeviceEnv(),
		User:          pb.GetUser(),
		AllocDir:      pb.GetAllocDir(),
		StdoutPath:    pb.GetStdoutPath(),
		StderrPath:    pb.GetStderrPath(),
		DriverConfig:  pb.GetMsgpackDriverConfig(),
	}
	if r := pb.GetResources(); r != nil {
		c.Resources = &Resources{
			CPUShares:   r.GetAllocatedResources().GetCpu().GetCpuShares(),
			MemoryMB:    r.GetAllocatedResources().GetMemory().GetMemoryMb(),
			MemoryMaxMB: r.GetAllocatedResources().GetMemory().GetMemoryMaxMb(),
		}
		if l := r.GetLinuxResources(); l != nil {
			c.Resources.Linux = &LinuxResources{
				CPUPeriod:        l.GetCpuPeriod(),
				CPUQuota:         l.GetCpuQuota(),
				CPUShares:        l.GetCpuShares(),
				MemoryLimitBytes: l.GetMemoryLimitBytes(),
				OOMScoreAdj:      l.GetOomScoreAdj(),
				CpusetCpus:       l.GetCpusetCpus(),
				PercentTicks:     l.GetPercentTicks(),
				CgroupPath:       l.GetCpusetCgroup(),
			}
		}
	}
	return c
}

func taskConfigProto(c *TaskConfig) *driverpb.TaskConfig {
	if c == nil {
		return nil
	}
	pb := &driverpb.TaskConfig{
		Id:                  c.ID,
		AllocId:             c.AllocID,
		Name:                c.Name,
		TaskGroupName:       c.TaskGroupName,
		JobName:             c.JobName,
		JobId:               c.JobID,
		Namespace:           c.Namespace,
		NodeName:            c.NodeName,
		NodeId:              c.NodeID,
		Env:                 c.Env,
		DeviceEnv:           c.DeviceEnv,
		User:                c.User,
		AllocDir:            c.AllocDir,
		StdoutPath:          c.StdoutPath,
		StderrPath:          c.StderrPath,
		MsgpackDriverConfig: c.DriverConfig,
	}
	if r := c.Resources; r != nil {
		pb.Resources = &driverpb.Resources{AllocatedResources: &driverpb.AllocatedTaskResources{
			Cpu:    &driverpb.AllocatedCpuResources{CpuShares: r.CPUShares},
			Memory: &driverpb.AllocatedMemoryResources{MemoryMb: r.MemoryMB, MemoryMaxMb: r.MemoryMaxMB},
		}}
		if l := r.Linux; l != nil {
			pb.Resources.LinuxResources = &driverpb.LinuxResources{
				CpuPeriod:        l.CPUPeriod,
				CpuQuota:         l.CPUQuota,
				CpuShares:        l.CPUShares,
				MemoryLimitBytes: l.MemoryLimitBytes,
				OomScoreAdj:      l.OOMScoreAdj,
				CpusetCpus:       l.CpusetCpus,
				PercentTicks:     l.PercentTicks,
				CpusetCgroup:     l.CgroupPath,
			}
		}
	}
	return pb
}

func taskHandleProto(h *TaskHandle) *driverpb.TaskHandle {
	return &driverpb.TaskHandle{
		Version:     clampInt32(h.Version),
		Config:      taskConfigProto(h.Config),
		State:       taskStateProto(h.State),
		DriverState: h.DriverState,
	}
}

func taskHandleFromProto(pb *driverpb.TaskHandle) *TaskHandle {
	h := &TaskHandle{Version: int(pb.GetVersion()), DriverState: pb.GetDriverState()}
	if pb.GetConfig() != nil {
		h.Config = taskConfigFromProto(pb.GetConfig())
	}
	switch pb.GetState() {
	case driverpb.TaskState_TASK_STATE_RUNNING:
		h.State = TaskStateRunning
	case driverpb.TaskState_TASK_STATE_EXITED:
		h.State = TaskStateExited
	}
	return h
}

func taskStateProto(s TaskState) driverpb.TaskState {
	switch s {
	case TaskStateRunning:
		return driverpb.TaskState_TASK_STATE_RUNNING
	case TaskStateExited:
		return driverpb.TaskState_TASK_STATE_EXITED
	}
	return driverpb.TaskState_TASK_STATE_UNKNOWN
}

func exitResultProto(r *ExitResult) *driverpb.ExitResult {
	if r == nil {
		return &driverpb.ExitResult{}
	}
	return &driverpb.ExitResult{ExitCode: clampInt32(r.ExitCode), Signal: clampInt32(r.Signal), OomKilled: r.OOMKilled}
}

func clampInt32(i int) int32 {
	switch {
	case i > math.MaxInt32:
		return math.MaxInt32
	case i < math.MinInt32:
		return math.MinInt32
	}
	return int32(i)
}

func taskStatsProto(taskID string, u *TaskResourceUsage) *driverpb.TaskStats {
	ts := u.Timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	cpu := &driverpb.CPUUsage{
		SystemMode:       u.CPU.SystemMode,
		UserMode:         u.CPU.UserMode,
		TotalTicks:       u.CPU.TotalTicks,
		ThrottledPeriods: u.CPU.ThrottledPeriods,
		ThrottledTime:    u.CPU.ThrottledTime,
		Percent:          u.CPU.Percent,
		MeasuredFields:   []driverpb.CPUUsage_Fields{},
	}
	for _, f := range u.CPU.Measured {
		cpu.MeasuredFields = append(cpu.MeasuredFields, driverpb.CPUUsage_Fields(f))
	}
	mem := &driverpb.MemoryUsage{
		Rss:            u.Memory.RSS,
		Cache:          u.Memory.Cache,
		Swap:           u.Memory.Swap,
		Usage:          u.Memory.Usage,
		MaxUsage:       u.Memory.MaxUsage,
		KernelUsage:    u.Memory.KernelUsage,
		KernelMaxUsage: u.Memory.KernelMaxUsage,
		MeasuredFields: []driverpb.MemoryUsage_Fields{},
	}
	for _, f := range u.Memory.Measured {
		mem.MeasuredFields = append(mem.MeasuredFields, driverpb.MemoryUsage_Fields(f))
	}
	return &driverpb.TaskStats{
		Id:               taskID,
		Timestamp:        timestamppb.New(ts),
		AggResourceUsage: &driverpb.TaskResourceUsage{Cpu: cpu, Memory: mem},
	}
}

// String makes a TaskState readable in logs and test failures.
func (s TaskState) String() string {
	switch s {
	case TaskStateRunning:
		return "running"
	case TaskStateExited:
		return "exited"
	case TaskStateUnknown:
		return "unknown"
	}
	return fmt.Sprintf("TaskState(%d)", int(s))
}
