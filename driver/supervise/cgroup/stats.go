package cgroup

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Stats is a group's resource usage.
type Stats struct {
	// CPU time of the group's processes, living and dead.
	CPUUser, CPUSystem, CPUTotal time.Duration
	// CPU quota enforcement: periods elapsed, periods throttled, and
	// time throttled.
	CPUPeriods, CPUThrottledPeriods uint64
	CPUThrottled                    time.Duration
	// Memory in bytes: charged now, anonymous (RSS), swapped out, and
	// the most ever charged (0 where the kernel does not say: v2 before
	// Linux 5.19).
	MemoryCurrent, MemoryRSS, MemorySwap, MemoryMaxUsage uint64
}

// Stats reads the group's usage from its files.
func (g *Group) Stats() (Stats, error) {
	if g.st.Version == V2 {
		return g.statsV2()
	}
	return g.statsV1()
}

func (g *Group) statsV2() (Stats, error) {
	var s Stats
	cpu, err := g.read("", "cpu.stat")
	if err != nil {
		return s, fmt.Errorf("cgroup stats: %w", err)
	}
	us := func(k string) time.Duration { return time.Duration(kv(cpu, k)) * time.Microsecond }
	s.CPUTotal, s.CPUUser, s.CPUSystem = us("usage_usec"), us("user_usec"), us("system_usec")
	s.CPUPeriods, s.CPUThrottledPeriods, s.CPUThrottled = kv(cpu, "nr_periods"), kv(cpu, "nr_throttled"), us("throttled_usec")
	// The memory files exist only where the memory controller is on.
	if cur, err := g.read("", "memory.current"); err == nil {
		s.MemoryCurrent, _ = strconv.ParseUint(cur, 10, 64)
		st, err := g.read("", "memory.stat")
		if err != nil {
			return s, fmt.Errorf("cgroup stats: %w", err)
		}
		s.MemoryRSS = kv(st, "anon")
		s.MemorySwap = readUint(g, "", "memory.swap.current")
		s.MemoryMaxUsage = readUint(g, "", "memory.peak")
	}
	return s, nil
}

func (g *Group) statsV1() (Stats, error) {
	var s Stats
	var errs []error
	total, err := g.read("cpuacct", "cpuacct.usage")
	errs = append(errs, err)
	n, _ := strconv.ParseUint(total, 10, 64)
	s.CPUTotal = time.Duration(n)
	if u, err := g.read("cpuacct", "cpuacct.usage_user"); err == nil {
		// Nanoseconds, Linux 4.7+.
		n, _ := strconv.ParseUint(u, 10, 64)
		s.CPUUser = time.Duration(n)
		sys, _ := g.read("cpuacct", "cpuacct.usage_sys")
		n, _ = strconv.ParseUint(sys, 10, 64)
		s.CPUSystem = time.Duration(n)
	} else {
		// Older kernels: USER_HZ ticks, 100 a second on Linux.
		st, err := g.read("cpuacct", "cpuacct.stat")
		errs = append(errs, err)
		s.CPUUser = time.Duration(kv(st, "user")) * 10 * time.Millisecond
		s.CPUSystem = time.Duration(kv(st, "system")) * 10 * time.Millisecond
	}
	cpu, err := g.read("cpu", "cpu.stat")
	errs = append(errs, err)
	s.CPUPeriods, s.CPUThrottledPeriods = kv(cpu, "nr_periods"), kv(cpu, "nr_throttled")
	s.CPUThrottled = time.Duration(kv(cpu, "throttled_time"))

	s.MemoryCurrent = readUint(g, "memory", "memory.usage_in_bytes")
	s.MemoryMaxUsage = readUint(g, "memory", "memory.max_usage_in_bytes")
	st, err := g.read("memory", "memory.stat")
	errs = append(errs, err)
	s.MemoryRSS = kv(st, "total_rss")
	if sw := readUint(g, "memory", "memory.memsw.usage_in_bytes"); sw > s.MemoryCurrent {
		s.MemorySwap = sw - s.MemoryCurrent
	}
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("cgroup stats: %w", err)
	}
	return s, nil
}

func readUint(g *Group, controller, file string) uint64 {
	v, err := g.read(controller, file)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(v, 10, 64)
	return n
}
