package plugin

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hadar-sched/hadar/driver/plugin/proto/basepb"
	"github.com/hadar-sched/hadar/driver/plugin/proto/structspb"
)

// ErrTaskNotFound is what a driver returns for a task ID it does not
// know; it is sent with code NotFound and Nomad's message for it.
var ErrTaskNotFound = errors.New("task not found for given id")

// RecoverableError marks an error the client may retry; build it with
// Recoverable.
type RecoverableError struct{ Err error }

func (e *RecoverableError) Error() string { return e.Err.Error() }
func (e *RecoverableError) Unwrap() error { return e.Err }

// Recoverable marks err as worth retrying: a StartTask failing with it is
// restarted under the task's restart policy rather than failed for good.
func Recoverable(err error) error {
	if err == nil {
		return nil
	}
	return &RecoverableError{Err: err}
}

// toStatus turns a plugin's error into the gRPC status the client reads.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	var rec *RecoverableError
	if errors.As(err, &rec) {
		st, derr := status.New(codes.FailedPrecondition, err.Error()).WithDetails(&structspb.RecoverableError{Recoverable: true})
		if derr == nil {
			return st.Err()
		}
	}
	if errors.Is(err, ErrTaskNotFound) {
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// baseServer serves BasePlugin.
type baseServer struct {
	basepb.UnimplementedBasePluginServer
	impl BasePlugin
}

func (s *baseServer) PluginInfo(context.Context, *basepb.PluginInfoRequest) (*basepb.PluginInfoResponse, error) {
	info := s.impl.PluginInfo()
	var t basepb.PluginType
	switch info.Type {
	case TypeDriver:
		t = basepb.PluginType_PLUGIN_TYPE_DRIVER
	case TypeDevice:
		t = basepb.PluginType_PLUGIN_TYPE_DEVICE
	default:
		return nil, status.Errorf(codes.Internal, "plugin %q: unknown plugin type %v", info.Name, info.Type)
	}
	versions := info.APIVersions
	if versions == nil {
		versions = []string{APIVersion}
	}
	return &basepb.PluginInfoResponse{Type: t, PluginApiVersions: versions, PluginVersion: info.Version, Name: info.Name}, nil
}

func (s *baseServer) ConfigSchema(context.Context, *basepb.ConfigSchemaRequest) (*basepb.ConfigSchemaResponse, error) {
	spec := s.impl.ConfigSchema()
	if spec == nil {
		// The client then allows no config block at all.
		return &basepb.ConfigSchemaResponse{}, nil
	}
	return &basepb.ConfigSchemaResponse{Spec: spec.Proto()}, nil
}

func (s *baseServer) SetConfig(ctx context.Context, req *basepb.SetConfigRequest) (*basepb.SetConfigResponse, error) {
	c := &Config{APIVersion: req.GetPluginApiVersion(), PluginConfig: req.GetMsgpackConfig()}
	if d := req.GetNomadConfig().GetDriver(); d != nil && s.impl.PluginInfo().Type == TypeDriver {
		c.Agent = agentConfigFromProto(d)
	}
	if err := s.impl.SetConfig(ctx, c); err != nil {
		// Nomad's SDK prefixes this too; operators see it in the agent's
		// start error.
		return nil, toStatus(fmt.Errorf("SetConfig failed: %w", err))
	}
	return &basepb.SetConfigResponse{}, nil
}

func agentConfigFromProto(d *basepb.NomadDriverConfig) *AgentConfig {
	a := &AgentConfig{ClientMinPort: int(d.GetClientMinPort()), ClientMaxPort: int(d.GetClientMaxPort())}
	if t := d.GetTopology(); t != nil {
		a.Topology = &Topology{
			OverrideTotalCompute:    t.GetOverrideTotalCompute(),
			OverrideWithheldCompute: t.GetOverrideWitholdCompute(),
		}
		for _, c := range t.GetCores() {
			a.Topology.Cores = append(a.Topology.Cores, Core{
				Disabled: c.GetDisable(), BaseMHz: c.GetBaseSpeed(), MaxMHz: c.GetMaxSpeed(), GuessMHz: c.GetGuessSpeed(),
			})
		}
	}
	return a
}
