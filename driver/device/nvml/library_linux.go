//go:build linux && cgo

package nvml

import (
	"fmt"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// realLibrary calls NVML through go-nvml, which dlopens libnvidia-ml.so.1
// at Init; building it needs cgo but not the NVIDIA driver.
type realLibrary struct {
	lib gonvml.Interface
	// mu guards devices: the plugin's fingerprint and stats loops query
	// concurrently.
	mu sync.Mutex
	// devices[i] is nil while device i's handle cannot be had; dev
	// asks again, so a device that recovers comes back.
	devices []gonvml.Device
}

// NewLibrary returns the system's NVML. Init fails with ErrUnavailable
// where the NVIDIA driver is not installed.
func NewLibrary() Library {
	return &realLibrary{lib: gonvml.New()}
}

func nvmlErr(what string, r gonvml.Return) error {
	if r == gonvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("%s: %s", what, gonvml.ErrorString(r))
}

// Init opens NVML and counts the devices. A device whose handle cannot be
// had (e.g. GPU_IS_LOST) does not fail it: that device's queries fail
// instead, and the plugin reports it unhealthy.
func (l *realLibrary) Init() (err error) {
	// go-nvml panics when libnvidia-ml.so cannot be loaded on some
	// versions; turn that into ErrUnavailable.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrUnavailable, r)
		}
	}()
	if r := l.lib.Init(); r != gonvml.SUCCESS {
		return fmt.Errorf("%w: %s", ErrUnavailable, gonvml.ErrorString(r))
	}
	n, r := l.lib.DeviceGetCount()
	if err := nvmlErr("device count", r); err != nil {
		_ = l.lib.Shutdown()
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.devices = make([]gonvml.Device, n)
	for i := 0; i < n; i++ {
		if d, r := l.lib.DeviceGetHandleByIndex(i); r == gonvml.SUCCESS {
			l.devices[i] = d
		}
	}
	return nil
}

func (l *realLibrary) Shutdown() error { return nvmlErr("shutdown", l.lib.Shutdown()) }

func (l *realLibrary) DriverVersion() (string, error) {
	v, r := l.lib.SystemGetDriverVersion()
	return v, nvmlErr("driver version", r)
}

func (l *realLibrary) DeviceCount() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.devices), nil
}

func (l *realLibrary) dev(i int) (gonvml.Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < 0 || i >= len(l.devices) {
		return nil, fmt.Errorf("device index %d out of range [0,%d)", i, len(l.devices))
	}
	if l.devices[i] == nil {
		d, r := l.lib.DeviceGetHandleByIndex(i)
		if err := nvmlErr(fmt.Sprintf("device %d handle", i), r); err != nil {
			return nil, err
		}
		l.devices[i] = d
	}
	return l.devices[i], nil
}

func busID(p gonvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func (l *realLibrary) DeviceInfo(i int) (DeviceInfo, error) {
	d, err := l.dev(i)
	if err != nil {
		return DeviceInfo{}, err
	}
	var info DeviceInfo
	var r gonvml.Return
	if info.UUID, r = d.GetUUID(); r != gonvml.SUCCESS {
		return info, nvmlErr("uuid", r)
	}
	if info.Name, r = d.GetName(); r != gonvml.SUCCESS {
		return info, nvmlErr("name", r)
	}
	mem, r := d.GetMemoryInfo()
	if r != gonvml.SUCCESS {
		return info, nvmlErr("memory info", r)
	}
	info.MemoryBytes = mem.Total
	if info.ComputeMajor, info.ComputeMinor, r = d.GetCudaComputeCapability(); r != gonvml.SUCCESS {
		return info, nvmlErr("compute capability", r)
	}
	pci, r := d.GetPciInfo()
	if r != gonvml.SUCCESS {
		return info, nvmlErr("pci info", r)
	}
	info.PCIBusID = busID(pci)
	return info, nil
}

func (l *realLibrary) DeviceStatus(i int) (Status, error) {
	d, err := l.dev(i)
	if err != nil {
		return Status{}, err
	}
	var st Status
	util, r := d.GetUtilizationRates()
	if r != gonvml.SUCCESS {
		return st, nvmlErr("utilization", r)
	}
	st.GPUUtilPercent, st.MemoryUtilPercent = util.Gpu, util.Memory
	mem, r := d.GetMemoryInfo()
	if r != gonvml.SUCCESS {
		return st, nvmlErr("memory info", r)
	}
	st.MemoryUsedBytes = mem.Used
	// Power and temperature are not supported on every board; zero
	// means "not reported".
	if p, r := d.GetPowerUsage(); r == gonvml.SUCCESS {
		st.PowerMilliWatts = p
	}
	if t, r := d.GetTemperature(gonvml.TEMPERATURE_GPU); r == gonvml.SUCCESS {
		st.TemperatureC = t
	}
	return st, nil
}

func (l *realLibrary) NvLinkRemotes(i int) ([]string, error) {
	d, err := l.dev(i)
	if err != nil {
		return nil, err
	}
	var out []string
	for link := 0; link < gonvml.NVLINK_MAX_LINKS; link++ {
		state, r := d.GetNvLinkState(link)
		if r != gonvml.SUCCESS || state != gonvml.FEATURE_ENABLED {
			continue
		}
		pci, r := d.GetNvLinkRemotePciInfo(link)
		if r != gonvml.SUCCESS {
			continue
		}
		out = append(out, busID(pci))
	}
	return out, nil
}

func (l *realLibrary) CommonAncestor(a, b int) (Level, error) {
	da, err := l.dev(a)
	if err != nil {
		return 0, err
	}
	db, err := l.dev(b)
	if err != nil {
		return 0, err
	}
	lvl, r := da.GetTopologyCommonAncestor(db)
	return Level(lvl), nvmlErr("topology", r)
}
