package nvml

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Recording holds a machine's NVML answers so tests can replay them on
// machines without a GPU. Record captures one from a real Library; the
// files in testdata/ are recordings.
type Recording struct {
	// Source says where the answers came from (machine, or "hand-built
	// from <reference>"), so a reader knows how far to trust them.
	Source        string           `json:"source"`
	DriverVersion string           `json:"driver_version"`
	Devices       []RecordedDevice `json:"devices"`
	// Ancestors[a][b] is CommonAncestor(a, b).
	Ancestors [][]Level `json:"ancestors"`
}

// RecordedDevice is one device's answers. StatusError, when set, is the
// error the status query returned (an unhealthy device). HandleError,
// when set, is the error getting the device failed with: every query
// about it fails so (a device NVML counts but cannot reach).
type RecordedDevice struct {
	Info          DeviceInfo `json:"info"`
	Status        Status     `json:"status"`
	StatusError   string     `json:"status_error,omitempty"`
	HandleError   string     `json:"handle_error,omitempty"`
	NvLinkRemotes []string   `json:"nvlink_remotes,omitempty"`
}

// Record asks lib every question the plugin asks and keeps the answers.
func Record(lib Library, source string) (*Recording, error) {
	rec := &Recording{Source: source}
	var err error
	if rec.DriverVersion, err = lib.DriverVersion(); err != nil {
		return nil, fmt.Errorf("record driver version: %w", err)
	}
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("record device count: %w", err)
	}
	for i := 0; i < n; i++ {
		var d RecordedDevice
		if d.Info, err = lib.DeviceInfo(i); err != nil {
			d.HandleError = err.Error()
			rec.Devices = append(rec.Devices, d)
			continue
		}
		if d.Status, err = lib.DeviceStatus(i); err != nil {
			d.StatusError = err.Error()
		}
		d.NvLinkRemotes, _ = lib.NvLinkRemotes(i)
		rec.Devices = append(rec.Devices, d)
	}
	rec.Ancestors = make([][]Level, n)
	for a := 0; a < n; a++ {
		rec.Ancestors[a] = make([]Level, n)
		for b := 0; b < n; b++ {
			if a == b {
				continue
			}
			lvl, err := lib.CommonAncestor(a, b)
			if err != nil {
				lvl = LevelSystem
			}
			rec.Ancestors[a][b] = lvl
		}
	}
	return rec, nil
}

// LoadRecording reads a recording written as JSON.
func LoadRecording(path string) (*Recording, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load nvml recording: %w", err)
	}
	var rec Recording
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("load nvml recording %s: %w", path, err)
	}
	if len(rec.Ancestors) != 0 && len(rec.Ancestors) != len(rec.Devices) {
		return nil, fmt.Errorf("load nvml recording %s: ancestors has %d rows for %d devices", path, len(rec.Ancestors), len(rec.Devices))
	}
	return &rec, nil
}

// Recorded replays a Recording as a Library.
type Recorded struct {
	Rec *Recording
}

var _ Library = Recorded{}

func (r Recorded) Init() error                    { return nil }
func (r Recorded) Shutdown() error                { return nil }
func (r Recorded) DriverVersion() (string, error) { return r.Rec.DriverVersion, nil }
func (r Recorded) DeviceCount() (int, error)      { return len(r.Rec.Devices), nil }

func (r Recorded) device(i int) (*RecordedDevice, error) {
	if i < 0 || i >= len(r.Rec.Devices) {
		return nil, fmt.Errorf("device index %d out of range [0,%d)", i, len(r.Rec.Devices))
	}
	d := &r.Rec.Devices[i]
	if d.HandleError != "" {
		return nil, errors.New(d.HandleError)
	}
	return d, nil
}

func (r Recorded) DeviceInfo(i int) (DeviceInfo, error) {
	d, err := r.device(i)
	if err != nil {
		return DeviceInfo{}, err
	}
	return d.Info, nil
}

func (r Recorded) DeviceStatus(i int) (Status, error) {
	d, err := r.device(i)
	if err != nil {
		return Status{}, err
	}
	if d.StatusError != "" {
		return Status{}, errors.New(d.StatusError)
	}
	return d.Status, nil
}

func (r Recorded) NvLinkRemotes(i int) ([]string, error) {
	d, err := r.device(i)
	if err != nil {
		return nil, err
	}
	return d.NvLinkRemotes, nil
}

func (r Recorded) CommonAncestor(a, b int) (Level, error) {
	if _, err := r.device(a); err != nil {
		return 0, err
	}
	if _, err := r.device(b); err != nil {
		return 0, err
	}
	if len(r.Rec.Ancestors) == 0 {
		return LevelSystem, nil
	}
	return r.Rec.Ancestors[a][b], nil
}

// NewLibraryUnavailable returns a Library whose Init fails with
// ErrUnavailable, as on a node without NVIDIA's driver.
func NewLibraryUnavailable() Library { return unavailableLib{} }

type unavailableLib struct{}

func (unavailableLib) Init() error                            { return ErrUnavailable }
func (unavailableLib) Shutdown() error                        { return nil }
func (unavailableLib) DriverVersion() (string, error)         { return "", ErrUnavailable }
func (unavailableLib) DeviceCount() (int, error)              { return 0, ErrUnavailable }
func (unavailableLib) DeviceInfo(int) (DeviceInfo, error)     { return DeviceInfo{}, ErrUnavailable }
func (unavailableLib) DeviceStatus(int) (Status, error)       { return Status{}, ErrUnavailable }
func (unavailableLib) NvLinkRemotes(int) ([]string, error)    { return nil, ErrUnavailable }
func (unavailableLib) CommonAncestor(int, int) (Level, error) { return 0, ErrUnavailable }
