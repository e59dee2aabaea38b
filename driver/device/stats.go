package device

import (
	"context"
	"fmt"
	"time"

	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
)

// Stats sends every GPU's utilization and memory each interval: NVML's
// figures, or the declared inventory's emulated ones.
func (p *Plugin) Stats(ctx context.Context, interval time.Duration) (<-chan *plugin.DeviceStatsReport, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("%s: stats interval %v: want a positive duration", PluginName, interval)
	}
	out := make(chan *plugin.DeviceStatsReport)
	go func() {
		defer close(out)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			resp := p.statsOnce()
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
			select {
			case <-ticker.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func (p *Plugin) statsOnce() *plugin.DeviceStatsReport {
	p.mu.Lock()
	s, lib := p.settings, p.lib
	known := make(map[string]nvml.GPU, len(p.devices))
	for id, g := range p.devices {
		known[id] = g
	}
	p.mu.Unlock()
	if s == nil {
		return &plugin.DeviceStatsReport{Err: fmt.Errorf("%s: SetConfig was not called", PluginName)}
	}
	var all []nvml.GPUStats
	switch {
	case s.declared != nil:
		for _, d := range s.declared {
			all = append(all, d.stats)
		}
	case lib != nil:
		var err error
		if all, err = nvml.Stats(lib); err != nil {
			return &plugin.DeviceStatsReport{Err: err}
		}
	}
	now := time.Now()
	groups := map[string]*plugin.DeviceGroupStats{}
	var order []string
	for _, st := range all {
		g, ok := known[st.ID]
		if !ok {
			continue // ignored, or not fingerprinted yet
		}
		grp, ok := groups[g.Model]
		if !ok {
			grp = &plugin.DeviceGroupStats{Vendor: vendor, Type: deviceType, Name: g.Model, Instances: map[string]*plugin.DeviceStats{}}
			groups[g.Model] = grp
			order = append(order, g.Model)
		}
		grp.Instances[st.ID] = instanceStats(st, now)
	}
	resp := &plugin.DeviceStatsReport{}
	for _, m := range order {
		resp.Groups = append(resp.Groups, groups[m])
	}
	return resp
}

func instanceStats(st nvml.GPUStats, now time.Time) *plugin.DeviceStats {
	memUsed := plugin.IntRatioStat(st.MemoryUsedMiB, st.MemoryTotalMiB, unitMiB, "GPU memory used")
	return &plugin.DeviceStats{
		Summary: memUsed,
		Stats: map[string]*plugin.StatValue{
			"memory":             memUsed,
			"gpu_utilization":    plugin.FloatStat(st.GPUUtilPercent, "%", "GPU utilization"),
			"memory_utilization": plugin.FloatStat(st.MemoryUtilPercent, "%", "memory controller utilization"),
			"power":              plugin.FloatStat(st.PowerWatts, unitW, "power draw"),
			"temperature":        plugin.FloatStat(st.TemperatureC, "C", "GPU temperature"),
		},
		Timestamp: now,
	}
}
