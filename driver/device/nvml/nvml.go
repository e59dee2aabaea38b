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
	// Index is the device's NVML index; -1 for a declared GPU.
	Index             int
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

// DeviceError is a device NVML counts but cannot identify: its handle or
// its static info could not be read.
type DeviceError struct {
	Index int
	Err   error
}

// Scan is what one pass over the library found.
type Scan struct {
	GPUs []GPU
	// Failed lists the devices that could not be identified; the plugin
	// reports the GPU it last saw at that index as unhealthy.
	Failed []DeviceError
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
// scheduler stops placing work on it while it stays visible to operators;
// a device that cannot even be identified is listed in Scan.Failed. Only a
// failure of the library as a whole is an error.
func Fingerprint(lib Library) (Scan, error) {
	version, err := lib.DriverVersion()
	if err != nil {
		return Scan{}, fmt.Errorf("nvml: driver version: %w", err)
	}
	n, err := lib.DeviceCount()
	if err != nil {
		return Scan{}, fmt.Errorf("nvml: device count: %w", err)
	}
	var scan Scan
	byBus := make(map[string]string, n)
	for i := 0; i < n; i++ {
		info, err := lib.DeviceInfo(i)
		if err != nil {
			scan.Failed = append(scan.Failed, DeviceError{Index: i, Err: err})
			continue
		}
		g := GPU{
			Index:             i,
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
		byBus[normalizeBusID(info.PCIBusID)] = info.UUID
		scan.GPUs = append(scan.GPUs, g)
	}
	for k := range scan.GPUs {
		g := &scan.GPUs[k]
		remotes, err := lib.NvLinkRemotes(g.Index)
		if err != nil {
			// Not every GPU has NVLink; a failed query only means no peers.
			remotes = nil
		}
		peers := map[string]bool{}
		for _, r := range remotes {
			if id, ok := byBus[normalizeBusID(r)]; ok && id != g.ID {
				peers[id] = true
			}
		}
		g.NvLinkPeers = sortedKeys(peers)
		switchPeers := map[string]bool{}
		for _, o := range scan.GPUs {
			if o.Index == g.Index {
				continue
			}
			lvl, err := lib.CommonAncestor(g.Index, o.Index)
			if err == nil && lvl <= LevelMultiple {
				switchPeers[o.ID] = true
			}
		}
		g.SwitchPeers = sortedKeys(switchPeers)
	}
	return scan, nil
}

// Models returns the model (NVML device name) of each GPU UUID in ids, as
// the library sees them now; an ID it does not know is an error.
func Models(lib Library, ids []string) (map[string]string, error) {
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("nvml: device count: %w", err)
	}
	byUUID := make(map[string]string, n)
	var unreadable []error
	for i := 0; i < n; i++ {
		info, err := lib.DeviceInfo(i)
		if err != nil {
			unreadable = append(unreadable, fmt.Errorf("device %d: %w", i, err))
			continue
		}
		byUUID[info.UUID] = info.Name
	}
	out := make(map[string]string, len(ids))
	for _, id := range ids {
		m, ok := byUUID[id]
		if !ok {
			if len(unreadable) > 0 {
				return nil, fmt.Errorf("nvml: GPU %q not among the %d readable devices (unreadable: %w)", id, len(byUUID), errors.Join(unreadable...))
			}
			return nil, fmt.Errorf("nvml: no GPU with UUID %q among the node's %d devices", id, n)
		}
		out[id] = m
	}
	return out, nil
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
