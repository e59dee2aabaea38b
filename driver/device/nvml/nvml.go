// Package nvml puts NVIDIA's management library behind two small
// interfaces so the device plugin can be tested on machines without a GPU:
// Library is the slice of raw NVML the plugin calls, and the functions in
// this package (Fingerprint, Stats) turn its answers into plain data.
// Tests replace Library with Recorded, which replays answers captured from
// real devices (see Record).
package nvml

import (
	"errors"
	"fmt"
	"sort"
)

// ErrUnavailable means NVML cannot be used here: no NVIDIA driver, or a
// build without cgo.
var ErrUnavailable = errors.New("nvml: library unavailable")

// Level is NVML's topology distance between two GPUs, smallest first.
type Level int

// Values as in nvml.h's nvmlGpuTopologyLevel_t.
const (
	LevelInternal   Level = 0  // same board (multi-GPU card)
	LevelSingle     Level = 10 // one PCIe switch between them
	LevelMultiple   Level = 20 // several PCIe switches, no host bridge
	LevelHostBridge Level = 30
	LevelNode       Level = 40 // same NUMA node
	LevelSystem     Level = 50 // across NUMA nodes (SMP interconnect)
)

// DeviceInfo is what does not change while a device is attached.
type DeviceInfo struct {
	UUID         string `json:"uuid"`
	Name         string `json:"name"`
	MemoryBytes  uint64 `json:"memory_bytes"`
	ComputeMajor int    `json:"compute_major"`
	ComputeMinor int    `json:"compute_minor"`
	PCIBusID     string `json:"pci_bus_id"`
}

// Status is a device's live figures.
type Status struct {
	GPUUtilPercent    uint32 `json:"gpu_util_percent"`
	MemoryUtilPercent uint32 `json:"memory_util_percent"`
	MemoryUsedBytes   uint64 `json:"memory_used_bytes"`
	PowerMilliWatts   uint32 `json:"power_milliwatts"`
	TemperatureC      uint32 `json:"temperature_c"`
}

// Library is the part of NVML the plugin uses. Devices are addressed by
// NVML index, which is stable between Init and Shutdown.
type Library interface {
	Init() error
	Shutdown() error
	DriverVersion() (string, error)
	DeviceCount() (int, error)
	DeviceInfo(index int) (DeviceInfo, error)
	DeviceStatus(index int) (Status, error)
	// NvLinkRemotes returns the PCI bus IDs at the far end of the
	// device's active NVLinks.
	NvLinkRemotes(index int) ([]string, error)
	CommonAncestor(a, b int) (Level, error)
}

// GPU is one device as the plugin reports it.
type GPU struct {
	ID                string
	Model             string
	MemoryMiB         int64
	ComputeCapability string // "major.minor"
	PCIBusID          string
	DriverVersion     string
	// NvLinkPeers and SwitchPeers list the IDs of GPUs reachable over
	// NVLink, and behind the same PCIe switch, respectively.
	NvLinkPeers []string
	SwitchPeers []string
	Healthy     bool
	HealthDesc  string
}

// GPUStats is one device's utilization and memory.
type GPUStats struct {
	ID                string
	GPUUtilPercent    float64
	MemoryUtilPercent float64
	MemoryUsedMiB     int64
	MemoryTotalMiB    int64
	PowerWatts        float64
	TemperatureC      float64
}

// Fingerprint lists the GPUs the library sees. A device whose live
// figures cannot be read is reported unhealthy rather than dropped, so the
// scheduler stops placing work on it while it stays visible to operators.
func Fingerprint(lib Library) ([]GPU, error) {
	version, err := lib.DriverVersion()
	if err != nil {
		return nil, fmt.Errorf("nvml: driver version: %w", err)
	}
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("nvml: device count: %w", err)
	}
	gpus := make([]GPU, 0, n)
	byBus := make(map[string]int, n)
	for i := 0; i < n; i++ {
		info, err := lib.DeviceInfo(i)
		if err != nil {
			return nil, fmt.Errorf("nvml: device %d: %w", i, err)
		}
		g := GPU{
			ID:                info.UUID,
			Model:             info.Name,
			MemoryMiB:         int64(info.MemoryBytes >> 20),
			ComputeCapability: fmt.Sprintf("%d.%d", info.ComputeMajor, info.ComputeMinor),
			PCIBusID:          info.PCIBusID,
			DriverVersion:     version,
			Healthy:           true,
		}
		if _, err := lib.DeviceStatus(i); err != nil {
			g.Healthy = false
			g.HealthDesc = fmt.Sprintf("nvml status query failed: %v", err)
		}
		byBus[normalizeBusID(info.PCIBusID)] = i
		gpus = append(gpus, g)
	}
	for i := range gpus {
		remotes, err := lib.NvLinkRemotes(i)
		if err != nil {
			// Not every GPU has NVLink; a failed query only means no peers.
			remotes = nil
		}
		peers := map[string]bool{}
		for _, r := range remotes {
			if j, ok := byBus[normalizeBusID(r)]; ok && j != i {
				peers[gpus[j].ID] = true
			}
		}
		gpus[i].NvLinkPeers = sortedKeys(peers)
		switchPeers := map[string]bool{}
		for j := range gpus {
			if j == i {
				continue
			}
			lvl, err := lib.CommonAncestor(i, j)
			if err == nil && lvl <= LevelMultiple {
				switchPeers[gpus[j].ID] = true
			}
		}
		gpus[i].SwitchPeers = sortedKeys(switchPeers)
	}
	return gpus, nil
}

// Stats reads every device's live figures. A device that fails is left
// out; the fingerprint reports it unhealthy.
func Stats(lib Library) ([]GPUStats, error) {
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("nvml: device count: %w", err)
	}
	out := make([]GPUStats, 0, n)
	for i := 0; i < n; i++ {
		info, err := lib.DeviceInfo(i)
		if err != nil {
			continue
		}
		st, err := lib.DeviceStatus(i)
		if err != nil {
			continue
		}
		out = append(out, GPUStats{
			ID:                info.UUID,
			GPUUtilPercent:    float64(st.GPUUtilPercent),
			MemoryUtilPercent: float64(st.MemoryUtilPercent),
			MemoryUsedMiB:     int64(st.MemoryUsedBytes >> 20),
			MemoryTotalMiB:    int64(info.MemoryBytes >> 20),
			PowerWatts:        float64(st.PowerMilliWatts) / 1000,
			TemperatureC:      float64(st.TemperatureC),
		})
	}
	return out, nil
}

// normalizeBusID makes NVML's two bus ID spellings comparable: the legacy
// "0000:04:00.0" and the long "00000000:04:00.0", in any letter case.
func normalizeBusID(id string) string {
	b := []byte(id)
	for i, c := range b {
		if c >= 'A' && c <= 'F' {
			b[i] = c + ('a' - 'A')
		}
	}
	s := string(b)
	for len(s) > 12 && s[0] == '0' {
		s = s[1:]
	}
	return s
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
