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

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
	"github.com/hadar-sched/hadar/version"
)

const (
	// PluginName is the plugin file name operators reference in the
	// agent's plugin block.
	PluginName = "hadar-gpu"

	vendor     = "nvidia"
	deviceType = plugin.DeviceTypeGPU

	// Environment the task gets from Reserve, with the reserved model
	// (contract.EnvGPUReservedModel).
	envNvidiaVisible = "NVIDIA_VISIBLE_DEVICES"
	envCudaVisible   = "CUDA_VISIBLE_DEVICES"
)

// Plugin is the device plugin. Create it with New.
type Plugin struct {
	logger log.Logger
	// newLibrary opens NVML; tests hand in a recorded one.
	newLibrary func() nvml.Library

	mu       sync.Mutex
	settings *settings
	lib      nvml.Library // open NVML; nil when declared or not (yet) available
	// libErr is why NVML could not be opened, logged once per change.
	libErr string
	// devices is the set last reported to Nomad, by ID. NVML GPUs stay in
	// it once seen: a GPU that cannot be read or vanishes is reported
	// unhealthy rather than dropped, because Nomad drops a node's devices
	// for good on a fingerprint error and a smaller set strands the
	// allocations using the missing GPUs.
	devices map[string]nvml.GPU
	// byIndex maps an NVML index to the ID last seen there, to name a
	// device that can no longer be identified.
	byIndex map[int]string
}

var _ plugin.DevicePlugin = (*Plugin)(nil)

// New returns the plugin using the system's NVML.
func New(logger log.Logger) *Plugin {
	return NewWithLibrary(logger, nvml.NewLibrary)
}

// NewWithLibrary returns the plugin with its NVML supplied by open.
func NewWithLibrary(logger log.Logger, open func() nvml.Library) *Plugin {
	return &Plugin{logger: logger.Named(PluginName), newLibrary: open, devices: map[string]nvml.GPU{}, byIndex: map[int]string{}}
}

// PluginInfo identifies the plugin to Nomad.
func (p *Plugin) PluginInfo() plugin.Info {
	return plugin.Info{Type: plugin.TypeDevice, Name: PluginName, Version: version.Plugin()}
}

// ConfigSchema returns the plugin block's schema.
func (p *Plugin) ConfigSchema() *hclspec.Spec { return configSpec }

// SetConfig validates the plugin block. NVML is opened at the first
// fingerprint (and again at later ones while it is unavailable), so a
// node without NVML reports no GPUs rather than failing, and one whose
// driver comes up late starts reporting them.
func (p *Plugin) SetConfig(_ context.Context, c *plugin.Config) error {
	var cfg Config
	if len(c.PluginConfig) != 0 {
		if err := configSpec.Decode(c.PluginConfig, &cfg); err != nil {
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
	p.closeLibrary()
	p.settings = s
	p.devices, p.byIndex = map[string]nvml.GPU{}, map[int]string{}
	return nil
}

// library returns open NVML, opening it if needed; nil when the GPUs are
// declared or NVML is unavailable. Called with p.mu held.
func (p *Plugin) library() nvml.Library {
	if p.lib != nil || p.settings == nil || !p.settings.enabled || p.settings.declared != nil {
		return p.lib
	}
	lib := p.newLibrary()
	if err := lib.Init(); err != nil {
		if msg := err.Error(); msg != p.libErr {
			p.libErr = msg
			p.logger.Warn("NVML unavailable; reporting no NVML GPUs (declare an inventory with gpu blocks to emulate some)", "error", err)
		}
		return nil
	}
	p.lib, p.libErr = lib, ""
	return lib
}

func (p *Plugin) closeLibrary() {
	if p.lib != nil {
		_ = p.lib.Shutdown()
		p.lib = nil
	}
}

// gpus lists the node's GPUs now, health applied, ignored ones dropped.
// Faults never make it fail: they mark GPUs unhealthy.
func (p *Plugin) gpus() ([]nvml.GPU, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.settings
	if s == nil {
		return nil, fmt.Errorf("%s: SetConfig was not called", PluginName)
	}
	var all []nvml.GPU
	if s.declared != nil {
		for _, d := range s.declared {
			all = append(all, d.gpu)
		}
	} else {
		all = p.nvmlGPUs()
	}
	marked, err := readHealthFile(s.healthFile)
	if err != nil {
		// The operator's health signal cannot be read: fail safe, every
		// GPU unhealthy until the file is readable again.
		p.logger.Error("health_file unreadable; reporting every GPU unhealthy until it is readable", "error", err)
		marked = map[string]string{}
		for _, g := range all {
			marked[g.ID] = err.Error()
		}
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
	for _, g := range out {
		p.devices[g.ID] = g
	}
	return out, nil
}

// nvmlGPUs scans NVML and merges the scan into the GPUs seen before:
// a device that cannot be identified, or is no longer counted, keeps its
// last description and is marked unhealthy. Called with p.mu held.
func (p *Plugin) nvmlGPUs() []nvml.GPU {
	seen := map[string]nvml.GPU{}
	lib := p.library()
	if lib != nil {
		scan, err := nvml.Fingerprint(lib)
		if err != nil {
			p.logger.Error("NVML scan failed; reporting the GPUs seen before as unhealthy", "error", err)
			// Reopen at the next fingerprint: the driver may have been
			// reloaded under us.
			p.closeLibrary()
			for id, g := range p.devices {
				seen[id] = unhealthy(g, err.Error())
			}
		}
		for _, g := range scan.GPUs {
			seen[g.ID] = g
			p.byIndex[g.Index] = g.ID
		}
		for _, f := range scan.Failed {
			id, known := p.byIndex[f.Index]
			if !known {
				p.logger.Warn("NVML device cannot be identified and was never seen; not reported", "index", f.Index, "error", f.Err)
				continue
			}
			if _, ok := seen[id]; !ok {
				seen[id] = unhealthy(p.devices[id], fmt.Sprintf("nvml device %d: %v", f.Index, f.Err))
			}
		}
	}
	gone := "no longer reported by NVML"
	if lib == nil {
		gone = "NVML unavailable: " + p.libErr
	}
	for id, g := range p.devices {
		if _, ok := seen[id]; !ok && g.Index >= 0 {
			seen[id] = unhealthy(g, gone)
		}
	}
	out := make([]nvml.GPU, 0, len(seen))
	for _, g := range seen {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func unhealthy(g nvml.GPU, why string) nvml.GPU {
	g.Healthy, g.HealthDesc = false, why
	return g
}

// Reserve returns the environment a task needs to use deviceIDs. Nomad
// calls it once per device request, so all IDs belong to one group.
func (p *Plugin) Reserve(_ context.Context, deviceIDs []string) (*plugin.Reservation, error) {
	if len(deviceIDs) == 0 {
		return &plugin.Reservation{}, nil
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
	return &plugin.Reservation{
		Env: map[string]string{
			envNvidiaVisible:             ids,
			envCudaVisible:               ids,
			contract.EnvGPUReservedModel: strings.Join(names, ","),
		},
	}, nil
}

// Fingerprint sends the node's GPUs at once, then again every
// fingerprint_period when anything (set, attributes, health) changed.
func (p *Plugin) Fingerprint(ctx context.Context) (<-chan *plugin.DeviceFingerprint, error) {
	p.mu.Lock()
	s := p.settings
	p.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("%s: SetConfig was not called", PluginName)
	}
	if !s.enabled {
		return nil, plugin.ErrDeviceDisabled
	}
	out := make(chan *plugin.DeviceFingerprint)
	go p.fingerprintLoop(ctx, s.period, out)
	return out, nil
}

func (p *Plugin) fingerprintLoop(ctx context.Context, period time.Duration, out chan<- *plugin.DeviceFingerprint) {
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
		gpus, err := p.gpus()
		if err != nil {
			// Only "SetConfig was not called"; Nomad always calls it first.
			p.logger.Error("fingerprint skipped", "error", err)
			continue
		}
		groups := buildGroups(gpus)
		key := groupsKey(groups)
		if !first && key == last {
			continue
		}
		if !first {
			p.logger.Info("GPU set or health changed; sending a new fingerprint")
		}
		first, last = false, key
		select {
		case out <- &plugin.DeviceFingerprint{Groups: groups}:
		case <-ctx.Done():
			return
		}
	}
}

// Shutdown releases NVML. Nomad does not call it; tests and embedders do.
func (p *Plugin) Shutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLibrary()
}
