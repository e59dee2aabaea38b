package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/proto/basepb"
	"github.com/hadar-sched/hadar/driver/plugin/proto/devicepb"
	"github.com/hadar-sched/hadar/driver/plugin/proto/driverpb"
	"github.com/hadar-sched/hadar/driver/plugin/proto/hclspecpb"
	"github.com/hadar-sched/hadar/driver/plugin/proto/structspb"
)

// Client calls a plugin's RPCs as the Nomad client does. Its methods
// mirror the plugin's: unary RPCs return the gRPC status error as the
// client gets it; streams deliver a last response with Err when they end
// in an error, and close.
type Client struct {
	base   basepb.BasePluginClient
	device devicepb.DevicePluginClient
	driver driverpb.DriverClient
}

// connPlugin serves a plugin set entry and hands the test the raw
// connection on the client side.
type connPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	server goplugin.GRPCPlugin
}

func (c *connPlugin) GRPCServer(b *goplugin.GRPCBroker, s *grpc.Server) error {
	return c.server.GRPCServer(b, s)
}

func (c *connPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (interface{}, error) {
	return conn, nil
}

// clientSet is what the client side dispenses: connections.
func clientSet() goplugin.PluginSet {
	return goplugin.PluginSet{
		plugin.SetBase:   &connPlugin{},
		plugin.SetDevice: &connPlugin{},
		plugin.SetDriver: &connPlugin{},
	}
}

// Connect serves p in-process over go-plugin's gRPC transport, as
// plugin.Serve would, and returns a client of it; both are closed when
// the test ends.
func Connect(t testing.TB, p plugin.BasePlugin) *Client {
	t.Helper()
	set, err := plugin.PluginSet(p)
	if err != nil {
		t.Fatal(err)
	}
	ps := map[string]goplugin.Plugin{}
	for name, entry := range set {
		gp, ok := entry.(goplugin.GRPCPlugin)
		if !ok {
			t.Fatalf("plugin set entry %q is not a gRPC plugin", name)
		}
		ps[name] = &connPlugin{server: gp}
	}
	client, _ := goplugin.TestPluginGRPCConn(t, false, ps)
	// Closing the client shuts the server down too.
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(plugin.SetBase)
	if err != nil {
		t.Fatal(err)
	}
	return newClient(raw.(*grpc.ClientConn))
}

// Launch starts cmd as a plugin process, as the Nomad client launches
// one (handshake, magic cookie, gRPC), and returns a client of it. The
// process is killed when the test ends.
func Launch(t testing.TB, cmd *exec.Cmd) *Client {
	t.Helper()
	c := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugin.Handshake(),
		Plugins:          clientSet(),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           log.New(&log.LoggerOptions{Name: "plugintest", Output: io.Discard}),
		StartTimeout:     30 * time.Second,
	})
	t.Cleanup(c.Kill)
	rpc, err := c.Client()
	if err != nil {
		t.Fatalf("launch plugin %s: %v", cmd.Path, err)
	}
	raw, err := rpc.Dispense(plugin.SetBase)
	if err != nil {
		t.Fatal(err)
	}
	return newClient(raw.(*grpc.ClientConn))
}

func newClient(conn *grpc.ClientConn) *Client {
	return &Client{
		base:   basepb.NewBasePluginClient(conn),
		device: devicepb.NewDevicePluginClient(conn),
		driver: driverpb.NewDriverClient(conn),
	}
}

// PluginInfo asks the plugin what it is.
func (c *Client) PluginInfo(ctx context.Context) (plugin.Info, error) {
	r, err := c.base.PluginInfo(ctx, &basepb.PluginInfoRequest{})
	if err != nil {
		return plugin.Info{}, err
	}
	info := plugin.Info{Name: r.GetName(), Version: r.GetPluginVersion(), APIVersions: r.GetPluginApiVersions()}
	switch r.GetType() {
	case basepb.PluginType_PLUGIN_TYPE_DEVICE:
		info.Type = plugin.TypeDevice
	case basepb.PluginType_PLUGIN_TYPE_DRIVER:
		info.Type = plugin.TypeDriver
	default:
		return info, fmt.Errorf("plugin is of unknown type %v", r.GetType())
	}
	return info, nil
}

// ConfigSchema returns the plugin block's schema in its wire form (turn
// it into msgpack with PluginConfig).
func (c *Client) ConfigSchema(ctx context.Context) (*hclspecpb.Spec, error) {
	r, err := c.base.ConfigSchema(ctx, &basepb.ConfigSchemaRequest{})
	return r.GetSpec(), err
}

// SetConfig sends config (msgpack, from PluginConfig) and, for a task
// driver, the agent's settings (nil as when the agent checks a config at
// load time).
func (c *Client) SetConfig(ctx context.Context, config []byte, agent *plugin.AgentConfig) error {
	req := &basepb.SetConfigRequest{MsgpackConfig: config, PluginApiVersion: plugin.APIVersion}
	if agent != nil {
		d := &basepb.NomadDriverConfig{ClientMinPort: uint32(agent.ClientMinPort), ClientMaxPort: uint32(agent.ClientMaxPort)}
		if t := agent.Topology; t != nil {
			d.Topology = &basepb.ClientTopology{OverrideTotalCompute: t.OverrideTotalCompute, OverrideWitholdCompute: t.OverrideWithheldCompute}
			for _, core := range t.Cores {
				d.Topology.Cores = append(d.Topology.Cores, &basepb.ClientTopologyCore{
					Disable: core.Disabled, BaseSpeed: core.BaseMHz, MaxSpeed: core.MaxMHz, GuessSpeed: core.GuessMHz,
				})
			}
		}
		req.NomadConfig = &basepb.NomadConfig{Driver: d}
	}
	_, err := c.base.SetConfig(ctx, req)
	return err
}

// stream turns a server stream into a channel of converted responses;
// an error other than the stream's end arrives as a last value made by
// fail.
func stream[R any, T any](ctx context.Context, recv func() (R, error), conv func(R) (T, error), fail func(error) T) <-chan T {
	out := make(chan T, 1)
	go func() {
		defer close(out)
		for {
			r, err := recv()
			if err == nil {
				var v T
				if v, err = conv(r); err == nil {
					select {
					case out <- v:
						continue
					case <-ctx.Done():
						return
					}
				}
			}
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				select {
				case out <- fail(err):
				case <-ctx.Done():
				}
			}
			return
		}
	}()
	return out
}

// DeviceFingerprint streams a device plugin's fingerprints.
func (c *Client) DeviceFingerprint(ctx context.Context) (<-chan *plugin.DeviceFingerprint, error) {
	s, err := c.device.Fingerprint(ctx, &devicepb.FingerprintRequest{})
	if err != nil {
		return nil, err
	}
	return stream(ctx, s.Recv, func(r *devicepb.FingerprintResponse) (*plugin.DeviceFingerprint, error) {
		f := &plugin.DeviceFingerprint{}
		for _, g := range r.GetDeviceGroup() {
			group := &plugin.DeviceGroup{Vendor: g.GetVendor(), Type: g.GetDeviceType(), Name: g.GetDeviceName(), Attributes: attributes(g.GetAttributes())}
			for _, d := range g.GetDevices() {
				group.Devices = append(group.Devices, &plugin.Device{
					ID: d.GetId(), Healthy: d.GetHealthy(), HealthDesc: d.GetHealthDescription(), PCIBusID: d.GetHwLocality().GetPciBusId(),
				})
			}
			f.Groups = append(f.Groups, group)
		}
		return f, nil
	}, func(err error) *plugin.DeviceFingerprint { return &plugin.DeviceFingerprint{Err: err} }), nil
}

// Reserve asks for the environment of deviceIDs.
func (c *Client) Reserve(ctx context.Context, deviceIDs []string) (*plugin.Reservation, error) {
	r, err := c.device.Reserve(ctx, &devicepb.ReserveRequest{DeviceIds: deviceIDs})
	if err != nil {
		return nil, err
	}
	return &plugin.Reservation{Env: r.GetContainerRes().GetEnvs()}, nil
}

// DeviceStats streams a device plugin's statistics every interval.
func (c *Client) DeviceStats(ctx context.Context, interval time.Duration) (<-chan *plugin.DeviceStatsReport, error) {
	s, err := c.device.Stats(ctx, &devicepb.StatsRequest{CollectionInterval: durationpb.New(interval)})
	if err != nil {
		return nil, err
	}
	return stream(ctx, s.Recv, func(r *devicepb.StatsResponse) (*plugin.DeviceStatsReport, error) {
		rep := &plugin.DeviceStatsReport{}
		for _, g := range r.GetGroups() {
			gs := &plugin.DeviceGroupStats{Vendor: g.GetVendor(), Type: g.GetType(), Name: g.GetName(), Instances: map[string]*plugin.DeviceStats{}}
			for id, st := range g.GetInstanceStats() {
				if err := st.GetTimestamp().CheckValid(); err != nil {
					return nil, fmt.Errorf("device %s stats timestamp: %w", id, err)
				}
				ds := &plugin.DeviceStats{Summary: statValue(st.GetSummary()), Stats: map[string]*plugin.StatValue{}, Timestamp: st.GetTimestamp().AsTime()}
				for k, v := range st.GetStats().GetAttributes() {
					ds.Stats[k] = statValue(v)
				}
				gs.Instances[id] = ds
			}
			rep.Groups = append(rep.Groups, gs)
		}
		return rep, nil
	}, func(err error) *plugin.DeviceStatsReport { return &plugin.DeviceStatsReport{Err: err} }), nil
}

func attributes(m map[string]*structspb.Attribute) map[string]plugin.Attribute {
	out := make(map[string]plugin.Attribute, len(m))
	for k, a := range m {
		var v plugin.Attribute
		switch x := a.GetValue().(type) {
		case *structspb.Attribute_StringVal:
			v = plugin.StringAttr(x.StringVal)
		case *structspb.Attribute_IntVal:
			v = plugin.IntAttr(x.IntVal, "")
		case *structspb.Attribute_FloatVal:
			v = plugin.FloatAttr(x.FloatVal, "")
		case *structspb.Attribute_BoolVal:
			v = plugin.BoolAttr(x.BoolVal)
		}
		v.Unit = a.GetUnit()
		out[k] = v
	}
	return out
}

func statValue(pb *structspb.StatValue) *plugin.StatValue {
	if pb == nil {
		return nil
	}
	v := &plugin.StatValue{Unit: pb.GetUnit(), Desc: pb.GetDesc()}
	if w := pb.GetFloatNumeratorVal(); w != nil {
		v.FloatNumerator = ptr(w.GetValue())
	}
	if w := pb.GetFloatDenominatorVal(); w != nil {
		v.FloatDenominator = ptr(w.GetValue())
	}
	if w := pb.GetIntNumeratorVal(); w != nil {
		v.IntNumerator = ptr(w.GetValue())
	}
	if w := pb.GetIntDenominatorVal(); w != nil {
		v.IntDenominator = ptr(w.GetValue())
	}
	if w := pb.GetStringVal(); w != nil {
		v.String = ptr(w.GetValue())
	}
	if w := pb.GetBoolVal(); w != nil {
		v.Bool = ptr(w.GetValue())
	}
	return v
}

func ptr[T any](v T) *T { return &v }

// Recoverable tells whether err, from StartTask or TaskStats, is one the
// client would retry: a status whose first detail is Nomad's
// RecoverableError saying so.
func Recoverable(err error) bool {
	st, ok := status.FromError(err)
	if !ok || len(st.Details()) == 0 {
		return false
	}
	rec, ok := st.Details()[0].(*structspb.RecoverableError)
	return ok && rec.GetRecoverable()
}
