package train

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/supervise/cgroup"
)

// TaskStats reports the task's CPU (MHz and percent of a core, as Nomad
// shows them for exec tasks: MHz from the agent's CPU topology) and
// memory, read from its cgroup every interval until ctx ends or the task
// does.
func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *plugin.TaskResourceUsage, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, plugin.ErrTaskNotFound
	}
	if _, err := h.sup.Stats(); err != nil {
		return nil, fmt.Errorf("task %s stats: %w", h.name, err)
	}
	perCore := d.mhzPerCore()
	ch := make(chan *plugin.TaskResourceUsage)
	go func() {
		defer close(ch)
		t := time.NewTicker(interval)
		defer t.Stop()
		var last cgroup.Stats
		var lastAt time.Time
		for {
			now := time.Now()
			st, err := h.sup.Stats()
			if err != nil {
				// The cgroup went with the task.
				return
			}
			u := usage(st, last, now.Sub(lastAt), perCore, !lastAt.IsZero())
			u.Timestamp = now
			last, lastAt = st, now
			select {
			case ch <- u:
			case <-ctx.Done():
				return
			case <-d.ctx.Done():
				return
			case <-h.doneCh:
				return
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			case <-d.ctx.Done():
				return
			case <-h.doneCh:
				return
			}
		}
	}()
	return ch, nil
}

// usage turns two readings of a cgroup, elapsed apart, into Nomad's
// figures: percents of one core over the interval (0 for the first
// reading, which has no interval), MHz as that share of a core's speed.
func usage(now, last cgroup.Stats, elapsed time.Duration, mhzPerCore float64, rate bool) *plugin.TaskResourceUsage {
	u := &plugin.TaskResourceUsage{}
	pct := func(cur, prev time.Duration) float64 {
		if !rate || elapsed <= 0 || cur < prev {
			return 0
		}
		return float64(cur-prev) / float64(elapsed) * 100
	}
	u.CPU = plugin.CPUUsage{
		UserMode:         pct(now.CPUUser, last.CPUUser),
		SystemMode:       pct(now.CPUSystem, last.CPUSystem),
		Percent:          pct(now.CPUTotal, last.CPUTotal),
		ThrottledPeriods: now.CPUThrottledPeriods,
		ThrottledTime:    uint64(now.CPUThrottled),
		Measured: []plugin.CPUField{plugin.CPUSystemMode, plugin.CPUUserMode, plugin.CPUTotalTicks,
			plugin.CPUThrottledPeriods, plugin.CPUThrottledTime, plugin.CPUPercent},
	}
	u.CPU.TotalTicks = u.CPU.Percent / 100 * mhzPerCore
	u.Memory = plugin.MemoryUsage{
		RSS: now.MemoryRSS, Usage: now.MemoryCurrent, MaxUsage: now.MemoryMaxUsage, Swap: now.MemorySwap,
		Measured: []plugin.MemoryField{plugin.MemoryRSS, plugin.MemoryUsageBytes, plugin.MemoryMaxUsage, plugin.MemorySwap},
	}
	return u
}

// mhzPerCore is a core's speed as the Nomad client counts the node's
// compute (its topology, sent in SetConfig); without an agent, the
// machine's from /proc/cpuinfo.
func (d *Driver) mhzPerCore() float64 {
	d.mu.RLock()
	a := d.agent
	d.mu.RUnlock()
	if a != nil && a.Topology != nil && len(a.Topology.Cores) > 0 {
		if total := a.Topology.TotalCompute(); total > 0 {
			return float64(total) / float64(len(a.Topology.Cores))
		}
	}
	return cpuinfoMHz()
}

// cpuinfoMHz is the mean "cpu MHz" of /proc/cpuinfo; 1000 if unknown.
func cpuinfoMHz() float64 {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 1000
	}
	defer f.Close()
	var sum float64
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 0 {
			sum += mhz
			n++
		}
	}
	if n == 0 || n > runtime.NumCPU()*4 {
		return 1000
	}
	return sum / float64(n)
}
