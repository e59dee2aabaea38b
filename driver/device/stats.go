package device

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/helper/pointer"
	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/hadar-sched/hadar/driver/device/nvml"
)

// Stats sends every GPU's utilization and memory each interval: NVML's
// figures, or the declared inventory's emulated ones.
func (p *Plugin) Stats(ctx context.Context, interval time.Duration) (<-chan *device.StatsResponse, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("%s: stats interval %v: want a positive duration", PluginName, interval)
	}
	out := make(chan *device.StatsResponse)
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

func (p *Plugin) statsOnce() *device.StatsResponse {
	p.mu.Lock()
	s, lib := p.settings, p.lib
	known := make(map[string]nvml.GPU, len(p.devices))
	for id, g := range p.devices {
		known[id] = g
	}
	p.mu.Unlock()
	if s == nil {
		return device.NewStatsError(fmt.Errorf("%s: SetConfig was not called", PluginName))
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
			return device.NewStatsError(err)
		}
	}
	now := time.Now()
	groups := map[string]*device.DeviceGroupStats{}
	var order []string
	for _, st := range all {
		g, ok := known[st.ID]
		if !ok {
			continue // ignored, or not fingerprinted yet
		}
		grp, ok := groups[g.Model]
		if !ok {
			grp = &device.DeviceGroupStats{Vendor: vendor, Type: deviceType, Name: g.Model, InstanceStats: map[string]*device.DeviceStats{}}
			groups[g.Model] = grp
			order = append(order, g.Model)
		}
		grp.InstanceStats[st.ID] = instanceStats(st, now)
	}
	resp := &device.StatsResponse{}
	for _, m := range order {
		resp.Groups = append(resp.Groups, groups[m])
	}
	return resp
}

func instanceStats(st nvml.GPUStats, now time.Time) *device.DeviceStats {
	memUsed := &structs.StatValue{
		IntNumeratorVal:   pointer.Of(st.MemoryUsedMiB),
		IntDenominatorVal: pointer.Of(st.MemoryTotalMiB),
		Unit:              structs.UnitMiB,
		Desc:              "GPU memory used",
	}
	return &device.DeviceStats{
		Summary: memUsed,
		Stats: &structs.StatObject{Attributes: map[string]*structs.StatValue{
			"memory":             memUsed,
			"gpu_utilization":    {FloatNumeratorVal: pointer.Of(st.GPUUtilPercent), Unit: "%", Desc: "GPU utilization"},
			"memory_utilization": {FloatNumeratorVal: pointer.Of(st.MemoryUtilPercent), Unit: "%", Desc: "memory controller utilization"},
			"power":              {FloatNumeratorVal: pointer.Of(st.PowerWatts), Unit: structs.UnitW, Desc: "power draw"},
			"temperature":        {FloatNumeratorVal: pointer.Of(st.TemperatureC), Unit: "C", Desc: "GPU temperature"},
		}},
		Timestamp: now,
	}
}
