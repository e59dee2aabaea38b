package plugin

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/hadar-sched/hadar/driver/plugin/proto/devicepb"
	"github.com/hadar-sched/hadar/driver/plugin/proto/structspb"
)

// DeviceTypeGPU is the device type of GPUs, as jobspecs request them
// ("nvidia/gpu").
const DeviceTypeGPU = "gpu"

// ErrDeviceDisabled is what Fingerprint returns when the plugin block
// disabled the plugin; the client then reports no devices from it.
var ErrDeviceDisabled = errors.New("device is not enabled")

// DevicePlugin is a device plugin: it reports a node's devices and tells
// the client how a task uses the ones it was given.
type DevicePlugin interface {
	BasePlugin
	// Fingerprint sends the node's devices at once (the client waits for
	// the first fingerprint before it registers the node) and again
	// whenever they change, until ctx ends; then it closes the channel.
	// A fingerprint carrying Err ends the stream, and the client drops
	// the plugin's devices: report a failing device as unhealthy
	// instead.
	Fingerprint(ctx context.Context) (<-chan *DeviceFingerprint, error)
	// Reserve returns what a task needs to use deviceIDs, all of one
	// device group (the client calls it once per device request).
	Reserve(ctx context.Context, deviceIDs []string) (*Reservation, error)
	// Stats sends the devices' statistics every interval until ctx ends.
	Stats(ctx context.Context, interval time.Duration) (<-chan *DeviceStatsReport, error)
}

// DeviceFingerprint is the node's devices, or Err.
type DeviceFingerprint struct {
	Groups []*DeviceGroup
	Err    error
}

// DeviceGroup is interchangeable devices of one vendor, type and name
// (model): the client fills a device request from a single group.
type DeviceGroup struct {
	Vendor, Type, Name string
	Devices            []*Device
	// Attributes are the group's, for ${device.attr.<name>} constraints.
	Attributes map[string]Attribute
}

// Device is one device of a group.
type Device struct {
	// ID identifies the device across plugin restarts; Reserve gets it.
	ID         string
	Healthy    bool
	HealthDesc string
	// PCIBusID is the device's PCI address, "" when unknown.
	PCIBusID string
}

// Reservation is what a task gets for its devices.
type Reservation struct {
	// Env is set in the task's environment (TaskConfig.DeviceEnv).
	Env map[string]string
}

// DeviceStatsReport is the devices' statistics, or Err.
type DeviceStatsReport struct {
	Groups []*DeviceGroupStats
	Err    error
}

// DeviceGroupStats are the statistics of one group's devices.
type DeviceGroupStats struct {
	Vendor, Type, Name string
	// Instances are by device ID.
	Instances map[string]*DeviceStats
}

// DeviceStats are one device's statistics.
type DeviceStats struct {
	// Summary is the figure the client shows first.
	Summary *StatValue
	// Stats are all of them, by name.
	Stats     map[string]*StatValue
	Timestamp time.Time
}

func registerDevice(s *grpc.Server, p DevicePlugin) {
	devicepb.RegisterDevicePluginServer(s, &deviceServer{impl: p})
}

// deviceServer serves DevicePlugin.
type deviceServer struct {
	devicepb.UnimplementedDevicePluginServer
	impl DevicePlugin
}

func (s *deviceServer) Fingerprint(_ *devicepb.FingerprintRequest, stream devicepb.DevicePlugin_FingerprintServer) error {
	ctx := stream.Context()
	ch, err := s.impl.Fingerprint(ctx)
	if err != nil {
		return toStatus(err)
	}
	return pump(ctx, ch, func(f *DeviceFingerprint) (*devicepb.FingerprintResponse, error) {
		if f.Err != nil {
			return nil, toStatus(f.Err)
		}
		return &devicepb.FingerprintResponse{DeviceGroup: deviceGroupsProto(f.Groups)}, nil
	}, stream.Send)
}

func deviceGroupsProto(groups []*DeviceGroup) []*devicepb.DeviceGroup {
	out := make([]*devicepb.DeviceGroup, 0, len(groups))
	for _, g := range groups {
		pg := &devicepb.DeviceGroup{
			Vendor: g.Vendor, DeviceType: g.Type, DeviceName: g.Name,
			Attributes: attributesProto(g.Attributes),
		}
		for _, d := range g.Devices {
			pd := &devicepb.DetectedDevice{Id: d.ID, Healthy: d.Healthy, HealthDescription: d.HealthDesc}
			if d.PCIBusID != "" {
				pd.HwLocality = &devicepb.DeviceLocality{PciBusId: d.PCIBusID}
			}
			pg.Devices = append(pg.Devices, pd)
		}
		out = append(out, pg)
	}
	return out
}

func (s *deviceServer) Reserve(ctx context.Context, req *devicepb.ReserveRequest) (*devicepb.ReserveResponse, error) {
	r, err := s.impl.Reserve(ctx, req.GetDeviceIds())
	if err != nil {
		return nil, toStatus(err)
	}
	res := &devicepb.ContainerReservation{}
	if r != nil {
		res.Envs = r.Env
	}
	return &devicepb.ReserveResponse{ContainerRes: res}, nil
}

func (s *deviceServer) Stats(req *devicepb.StatsRequest, stream devicepb.DevicePlugin_StatsServer) error {
	ctx := stream.Context()
	interval := req.GetCollectionInterval().AsDuration()
	if interval <= 0 {
		// The client's default, should it send none.
		interval = time.Second
	}
	ch, err := s.impl.Stats(ctx, interval)
	if err != nil {
		return toStatus(err)
	}
	return pump(ctx, ch, func(r *DeviceStatsReport) (*devicepb.StatsResponse, error) {
		if r.Err != nil {
			return nil, toStatus(r.Err)
		}
		return &devicepb.StatsResponse{Groups: deviceStatsProto(r.Groups)}, nil
	}, stream.Send)
}

func deviceStatsProto(groups []*DeviceGroupStats) []*devicepb.DeviceGroupStats {
	out := make([]*devicepb.DeviceGroupStats, 0, len(groups))
	for _, g := range groups {
		pg := &devicepb.DeviceGroupStats{Vendor: g.Vendor, Type: g.Type, Name: g.Name, InstanceStats: map[string]*devicepb.DeviceStats{}}
		for id, st := range g.Instances {
			if st == nil {
				continue
			}
			ps := &devicepb.DeviceStats{Summary: st.Summary.proto(), Timestamp: timestamppb.New(st.Timestamp)}
			if st.Stats != nil {
				ps.Stats = &structspb.StatObject{Attributes: map[string]*structspb.StatValue{}}
				for k, v := range st.Stats {
					if v != nil {
						ps.Stats.Attributes[k] = v.proto()
					}
				}
			}
			pg.InstanceStats[id] = ps
		}
		out = append(out, pg)
	}
	return out
}
