// Package plugin is hadar's implementation of the plugin protocol Nomad's
// client speaks to external device and task driver plugins: go-plugin's
// handshake over gRPC, the "base", "device" and "driver" services of
// driver/plugin/proto, and small Go interfaces for a plugin to implement.
// It replaces Nomad's plugin SDK, which hadar does not use (it is under
// the BUSL; the wire format is a fact of the protocol).
//
// A plugin implements BasePlugin and one of DevicePlugin or DriverPlugin,
// and its main serves it:
//
//	func main() {
//		logger := plugin.NewLogger()
//		plugin.Serve(device.New(logger), logger)
//	}
//
// Configuration schemas are built with driver/plugin/hclspec; the config
// Nomad sends (Config.PluginConfig, TaskConfig.DriverConfig) is decoded
// with the same spec.
//
// How the Nomad client (1.11) treats what a plugin returns, which this
// package follows:
//   - An RPC error reaches the client as a gRPC status carrying the
//     error's message. ErrTaskNotFound is sent with code NotFound; the
//     client tells it from other errors by nothing else.
//   - An error wrapped with Recoverable makes StartTask (and TaskStats)
//     retryable: the client restarts the task under its restart policy.
//     Any other StartTask error fails the task for good.
//   - A streaming RPC (fingerprints, stats, events) ends when its channel
//     closes or the client goes away. A response carrying Err ends it with
//     that error: for a device plugin the client then drops the node's
//     devices until the plugin restarts, so report faults as unhealthy
//     devices instead.
package plugin

import (
	"context"
	"fmt"
	"os"

	log "github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
	"github.com/hadar-sched/hadar/driver/plugin/proto/basepb"
)

// The handshake the Nomad client expects from every plugin it launches
// (go-plugin's magic cookie and protocol version).
const (
	MagicCookieKey   = "NOMAD_PLUGIN_MAGIC_COOKIE"
	MagicCookieValue = "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255"
	ProtocolVersion  = 2
)

// APIVersion is the Nomad plugin API version of devices and drivers that
// this package speaks.
const APIVersion = "v0.1.0"

// The names of the plugin sets the client dispenses.
const (
	SetBase   = "base"
	SetDevice = "device"
	SetDriver = "driver"
)

// Handshake is the go-plugin handshake of Nomad's plugins.
func Handshake() goplugin.HandshakeConfig {
	return goplugin.HandshakeConfig{
		ProtocolVersion:  ProtocolVersion,
		MagicCookieKey:   MagicCookieKey,
		MagicCookieValue: MagicCookieValue,
	}
}

// Type is the kind of plugin.
type Type int

const (
	// TypeDriver is a task driver.
	TypeDriver Type = iota + 1
	// TypeDevice is a device plugin.
	TypeDevice
)

func (t Type) String() string {
	switch t {
	case TypeDriver:
		return "driver"
	case TypeDevice:
		return "device"
	}
	return fmt.Sprintf("Type(%d)", int(t))
}

// Info identifies a plugin to the client.
type Info struct {
	Type Type
	// Name is the plugin's name: a task driver's name in jobspecs, and
	// what the agent's plugin block names.
	Name string
	// Version is the plugin's own version, e.g. "v0.1.0".
	Version string
	// APIVersions are the plugin API versions it speaks; nil means
	// {APIVersion}.
	APIVersions []string
}

// Config is what SetConfig receives.
type Config struct {
	// APIVersion is the plugin API version the client chose.
	APIVersion string
	// PluginConfig is the agent's plugin block config, msgpack-encoded
	// for the plugin's ConfigSchema: decode it with that spec's Decode.
	// Nomad always sends it (defaults applied); it is empty only when
	// the plugin is driven without an agent.
	PluginConfig []byte
	// Agent is what the client tells a task driver about itself; nil
	// for device plugins, and when the agent checks the config at load
	// time.
	Agent *AgentConfig
}

// AgentConfig is the Nomad client's configuration a task driver gets.
type AgentConfig struct {
	// ClientMinPort and ClientMaxPort are the loopback port range the
	// client uses for its plugin subsystems (executors included).
	ClientMinPort, ClientMaxPort int
	// Topology is the node's CPUs; nil when the client sent none.
	Topology *Topology
}

// Topology is the node's CPUs, as the client detected and overrode them.
type Topology struct {
	Cores []Core
	// OverrideTotalCompute is the agent's cpu_total_compute, in MHz; 0
	// when not set.
	OverrideTotalCompute uint64
	// OverrideWithheldCompute is compute (MHz) the agent reserves.
	OverrideWithheldCompute uint64
}

// Core is one logical CPU.
type Core struct {
	// Disabled: the agent may not run tasks on it (reserved cores).
	Disabled bool
	// Speeds in MHz; zero when unknown.
	BaseMHz, MaxMHz, GuessMHz uint64
}

// MHz is the core's speed as Nomad counts it: base, else max, else the
// guess.
func (c Core) MHz() uint64 {
	switch {
	case c.BaseMHz > 0:
		return c.BaseMHz
	case c.MaxMHz > 0:
		return c.MaxMHz
	}
	return c.GuessMHz
}

// TotalCompute is the node's compute in MHz, as Nomad's client counts it
// for task CPU statistics: the override if set, else every core's MHz.
func (t *Topology) TotalCompute() uint64 {
	if t.OverrideTotalCompute > 0 {
		return t.OverrideTotalCompute
	}
	var total uint64
	for _, c := range t.Cores {
		total += c.MHz()
	}
	return total
}

// UsableCompute is the compute (MHz) tasks may use: enabled cores less
// what the agent withholds (or the override).
func (t *Topology) UsableCompute() uint64 {
	if t.OverrideTotalCompute > 0 {
		return t.OverrideTotalCompute
	}
	var total uint64
	for _, c := range t.Cores {
		if !c.Disabled {
			total += c.MHz()
		}
	}
	if t.OverrideWithheldCompute >= total {
		return 0
	}
	return total - t.OverrideWithheldCompute
}

// BasePlugin is what every plugin serves.
type BasePlugin interface {
	// PluginInfo identifies the plugin.
	PluginInfo() Info
	// ConfigSchema is the schema of the agent's plugin block config.
	ConfigSchema() *hclspec.Spec
	// SetConfig validates and applies the plugin block config. The
	// client calls it before anything else, once to check the config
	// when the agent loads the plugin, and again on every instance it
	// launches. Its error fails the agent's start, so it should name the
	// offending field and how to fix it.
	SetConfig(ctx context.Context, c *Config) error
}

// NewLogger is the logger a plugin process logs with: JSON on stderr,
// which the Nomad client reads into its own log, at every level (the
// agent filters by its log_level).
func NewLogger() log.Logger {
	return log.New(&log.LoggerOptions{Level: log.Trace, JSONFormat: true, Output: os.Stderr})
}

// Serve serves p, a DevicePlugin or a DriverPlugin, to the Nomad client
// that launched this process, until the client goes away. Run outside a
// client it prints that it is a plugin and exits.
func Serve(p BasePlugin, logger log.Logger) {
	set, err := PluginSet(p)
	if err != nil {
		logger.Error("cannot serve plugin", "error", err)
		os.Exit(1)
	}
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake(),
		Plugins:         set,
		GRPCServer:      goplugin.DefaultGRPCServer,
		Logger:          logger,
	})
}

// PluginSet is the go-plugin set Serve serves for p: SetBase, and
// SetDevice or SetDriver by p's kind. Their GRPCClient sides return an
// error: hadar has no client of its own (tests wrap GRPCServer).
func PluginSet(p BasePlugin) (goplugin.PluginSet, error) {
	info := p.PluginInfo()
	set := goplugin.PluginSet{SetBase: &grpcPlugin{register: func(s *grpc.Server) {
		basepb.RegisterBasePluginServer(s, &baseServer{impl: p})
	}}}
	switch impl := p.(type) {
	case DevicePlugin:
		if info.Type != TypeDevice {
			return nil, fmt.Errorf("plugin %q implements DevicePlugin but PluginInfo says %v", info.Name, info.Type)
		}
		set[SetDevice] = &grpcPlugin{register: func(s *grpc.Server) { registerDevice(s, impl) }}
	case DriverPlugin:
		if info.Type != TypeDriver {
			return nil, fmt.Errorf("plugin %q implements DriverPlugin but PluginInfo says %v", info.Name, info.Type)
		}
		set[SetDriver] = &grpcPlugin{register: func(s *grpc.Server) { registerDriver(s, impl) }}
	default:
		return nil, fmt.Errorf("plugin %q (%T) is neither a DevicePlugin nor a DriverPlugin", info.Name, p)
	}
	return set, nil
}

// grpcPlugin is one entry of a plugin set: it registers a service on the
// server go-plugin gives it.
type grpcPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	register func(*grpc.Server)
}

func (g *grpcPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	g.register(s)
	return nil
}

func (g *grpcPlugin) GRPCClient(context.Context, *goplugin.GRPCBroker, *grpc.ClientConn) (interface{}, error) {
	return nil, fmt.Errorf("hadar's plugin package serves plugins; it has no client")
}

// pump relays a plugin's channel onto a gRPC server stream: each value,
// converted, is sent until the client goes (ctx) or the plugin closes the
// channel; a nil value is skipped. A conversion error ends the stream with
// that error (a plugin reporting it failed). The five streaming methods
// share it so that they end alike.
func pump[T, P any](ctx context.Context, ch <-chan *T, conv func(*T) (P, error), send func(P) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case v, ok := <-ch:
			if !ok {
				return nil
			}
			if v == nil {
				continue
			}
			m, err := conv(v)
			if err != nil {
				return err
			}
			if err := send(m); err != nil {
				return err
			}
		}
	}
}
