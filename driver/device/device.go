// Package device is hadar's Nomad device plugin ("hadar-gpu"). It reports
// NVIDIA GPUs as vendor "nvidia", type "gpu", one device group per model,
// so jobspecs written for Nomad's nvidia plugin keep working. GPUs come
// from NVML, or from an inventory declared in the plugin config on nodes
// without NVIDIA's driver (CI, demos, emulated heterogeneous clusters).
package device

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"

	"github.com/hadar-sched/hadar/driver/device/nvml"
)

const (
	// PluginName is the plugin file name operators reference in the
	// agent's plugin block.
	PluginName = "hadar-gpu"
	// PluginVersion is reported to Nomad.
	PluginVersion = "v0.1.0"

	vendor     = "nvidia"
	deviceType = device.DeviceTypeGPU

	// Environment the task gets from Reserve. HADAR_GPU_MODEL lets the
	// hadar-train driver pick the emulated pace without asking Nomad.
	envNvidiaVisible = "NVIDIA_VISIBLE_DEVICES"
	envCudaVisible   = "CUDA_VISIBLE_DEVICES"
	envModel         = "HADAR_GPU_MODEL"
)

var pluginInfo = &base.PluginInfoResponse{
	Type:              base.PluginTypeDevice,
	PluginApiVersions: []string{device.ApiVersion010},
	PluginVersion:     PluginVersion,
	Name:              PluginName,
}

// Plugin is the device plugin. Create it with New.
type Plugin struct {
	logger log.Logger
	// newLibrary opens NVML; tests hand in a recorded one.
	newLibrary func() nvml.Library

	mu       sync.Mutex
	settings *settings
	lib      nvml.Library // open NVML, nil when declared or unavailable
	devices  map[string]nvml.GPU
}

var _ device.DevicePlugin = (*Plugin)(nil)

// New returns the plugin using the system's NVML.
func New(logger log.Logger) *Plugin {
	return NewWithLibrary(logger, nvml.NewLibrary)
}

// NewWithLibrary returns the plugin with its NVML supplied by open.
func NewWithLibrary(logger log.Logger, open func() nvml.Library) *Plugin {
	return &Plugin{logger: logger.Named(PluginName), newLibrary: open, devices: map[string]nvml.GPU{}}
}

// PluginInfo identifies the plugin to Nomad.
func (p *Plugin) PluginInfo() (*base.PluginInfoResponse, error) { return pluginInfo, nil }

// ConfigSchema returns the plugin block's schema.
func (p *Plugin) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

// SetConfig validates the plugin block and, without a declared inventory,
// opens NVML. A node without NVML reports no GPUs rather than failing,
// so one agent config serves GPU and CPU nodes alike.
func (p *Plugin) SetConfig(c *base.Config) error {
	var cfg Config
	if len(c.PluginConfig) != 0 {
		if err := base.MsgPackDecode(c.PluginConfig, &cfg); err != nil {
			return fmt.Errorf("%s plugin config: %w", PluginName, err)
		}
	} else {
		cfg = Config{Enabled: true}
	}
	s, err := parseConfig(cfg)
	if err != nil {
		return fmt.Errorf("%s plugin config: %w", PluginName, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lib != nil {
		_ = p.lib.Shutdown()
		p.lib = nil
	}
	p.settings = s
	if s.enabled && s.declared == nil {
		lib := p.newLibrary()
		if err := lib.Init(); err != nil {
			p.logger.Warn("NVML unavailable; reporting no GPUs (declare an inventory with gpu blocks to emulate some)", "error", err)
		} else {
			p.lib = lib
		}
	}
	return nil
}

// gpus lists the node's GPUs now, health applied, ignored ones dropped.
func (p *Plugin) gpus() ([]nvml.GPU, error) {
	p.mu.Lock()
	s, lib := p.settings, p.lib
	p.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("%s: SetConfig was not called", PluginName)
	}
	var all []nvml.GPU
	switch {
	case s.declared != nil:
		for _, d := range s.declared {
			all = append(all, d.gpu)
		}
	case lib != nil:
		var err error
		if all, err = nvml.Fingerprint(lib); err != nil {
			return nil, err
		}
	}
	marked, err := readHealthFile(s.healthFile)
	if err != nil {
		return nil, err
	}
	out := make([]nvml.GPU, 0, len(all))
	for _, g := range all {
		if s.ignored[g.ID] {
			continue
		}
		if reason, ok := marked[g.ID]; ok {
			g.Healthy, g.HealthDesc = false, reason
		}
		out = append(out, g)
	}
	p.mu.Lock()
	p.devices = make(map[string]nvml.GPU, len(out))
	for _, g := range out {
		p.devices[g.ID] = g
	}
	p.mu.Unlock()
	return out, nil
}

// Reserve returns the environment a task needs to use deviceIDs. Nomad
// calls it once per device request, so all IDs belong to one group.
func (p *Plugin) Reserve(deviceIDs []string) (*device.ContainerReservation, error) {
	if len(deviceIDs) == 0 {
		return &device.ContainerReservation{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	models := map[string]bool{}
	for _, id := range deviceIDs {
		g, ok := p.devices[id]
		if !ok {
			return nil, fmt.Errorf("%s: unknown GPU id %q: not in the node's last fingerprint", PluginName, id)
		}
		models[g.Model] = true
	}
	ids := strings.Join(deviceIDs, ",")
	names := make([]string, 0, len(models))
	for m := range models {
		names = append(names, m)
	}
	sort.Strings(names)
	return &device.ContainerReservation{
		Envs: map[string]string{
			envNvidiaVisible: ids,
			envCudaVisible:   ids,
			envModel:         strings.Join(names, ","),
		},
	}, nil
}

// Fingerprint sends the node's GPUs at once, then again every
// fingerprint_period when anything (set, attributes, health) changed.
func (p *Plugin) Fingerprint(ctx context.Context) (<-chan *device.FingerprintResponse, error) {
	p.mu.Lock()
	s := p.settings
	p.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("%s: SetConfig was not called", PluginName)
	}
	if !s.enabled {
		return nil, device.ErrPluginDisabled
	}
	out := make(chan *device.FingerprintResponse)
	go p.fingerprintLoop(ctx, s.period, out)
	return out, nil
}

func (p *Plugin) fingerprintLoop(ctx context.Context, period time.Duration, out chan<- *device.FingerprintResponse) {
	defer close(out)
	var last string
	first := true
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			timer.Reset(period)
		}
		var resp *device.FingerprintResponse
		gpus, err := p.gpus()
		if err != nil {
			p.logger.Error("fingerprint failed", "error", err)
			resp = device.NewFingerprintError(err)
			last = "" // send the next good fingerprint even if unchanged
		} else {
			groups := buildGroups(gpus)
			key := groupsKey(groups)
			if !first && key == last {
				continue
			}
			if !first {
				p.logger.Info("GPU set or health changed; sending a new fingerprint")
			}
			last = key
			resp = device.NewFingerprint(groups...)
		}
		first = false
		select {
		case out <- resp:
		case <-ctx.Done():
			return
		}
	}
}

// Shutdown releases NVML. Nomad does not call it; tests and embedders do.
func (p *Plugin) Shutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lib != nil {
		_ = p.lib.Shutdown()
		p.lib = nil
	}
}
