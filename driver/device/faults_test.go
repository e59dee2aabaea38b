package device

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
)

// faulty replays a recording with faults the test switches on and off,
// as a driver reload, a GPU falling off the bus, or a late driver do.
type faulty struct {
	rec nvml.Recorded

	mu       sync.Mutex
	initErr  error         // Init fails
	countErr error         // the library as a whole fails
	lost     map[int]error // these devices cannot be reached
}

func newFaulty(t *testing.T, file string) *faulty {
	t.Helper()
	rec, err := nvml.LoadRecording(file)
	if err != nil {
		t.Fatal(err)
	}
	return &faulty{rec: nvml.Recorded{Rec: rec}, lost: map[int]error{}}
}

func (f *faulty) set(change func(f *faulty)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

func (f *faulty) device(i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost[i]
}

func (f *faulty) Init() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.initErr
}
func (f *faulty) Shutdown() error                { return nil }
func (f *faulty) DriverVersion() (string, error) { return f.rec.DriverVersion() }
func (f *faulty) DeviceCount() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.countErr != nil {
		return 0, f.countErr
	}
	return f.rec.DeviceCount()
}
func (f *faulty) DeviceInfo(i int) (nvml.DeviceInfo, error) {
	if err := f.device(i); err != nil {
		return nvml.DeviceInfo{}, err
	}
	return f.rec.DeviceInfo(i)
}
func (f *faulty) DeviceStatus(i int) (nvml.Status, error) {
	if err := f.device(i); err != nil {
		return nvml.Status{}, err
	}
	return f.rec.DeviceStatus(i)
}
func (f *faulty) NvLinkRemotes(i int) ([]string, error) {
	if err := f.device(i); err != nil {
		return nil, err
	}
	return f.rec.NvLinkRemotes(i)
}
func (f *faulty) CommonAncestor(a, b int) (nvml.Level, error) {
	if err := errors.Join(f.device(a), f.device(b)); err != nil {
		return 0, err
	}
	return f.rec.CommonAncestor(a, b)
}

// health renders a fingerprint as "id:healthy" or "id:reason" per GPU.
func health(r *plugin.DeviceFingerprint) map[string]string {
	out := map[string]string{}
	for _, g := range r.Groups {
		for _, d := range g.Devices {
			out[d.ID] = "healthy"
			if !d.Healthy {
				out[d.ID] = d.HealthDesc
			}
		}
	}
	return out
}

const (
	gpu0 = "GPU-00000000-0000-0000-0000-000000000000"
	gpu1 = "GPU-00000001-0000-0000-0000-000000000001"
	gpu2 = "GPU-00000002-0000-0000-0000-000000000002"
	gpu3 = "GPU-00000003-0000-0000-0000-000000000003"
	lost = "nvml status query failed: GPU is lost" // the recording's GPU3
)

// TestFingerprintSurvivesFaults drives the plugin over gRPC through NVML
// faults and an unreadable health_file. Nomad's client drops a node's
// devices for good on the first fingerprint error, so no fault may
// produce one: the GPUs concerned turn unhealthy, the set is kept, and
// everything recovers once the fault clears.
func TestFingerprintSurvivesFaults(t *testing.T) {
	lib := newFaulty(t, "nvml/testdata/v100x4.json")
	healthFile := filepath.Join(t.TempDir(), "health")
	p := NewWithLibrary(log.NewNullLogger(), func() nvml.Library { return lib })
	dp := grpcPlugin(t, p)
	configure(t, dp, fmt.Sprintf("fingerprint_period = \"50ms\"\nhealth_file = %q\n", healthFile))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := dp.DeviceFingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// nextFingerprint fails the test on an error response.
	expect := func(step string, want map[string]string) {
		t.Helper()
		got := health(nextFingerprint(t, ch, 2*time.Second))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s:\n got %v\nwant %v", step, got, want)
		}
	}
	good := map[string]string{gpu0: "healthy", gpu1: "healthy", gpu2: "healthy", gpu3: lost}
	expect("first fingerprint", good)

	countErr := errors.New("Driver Not Loaded")
	lib.set(func(f *faulty) { f.countErr = countErr })
	expect("NVML fails as a whole", map[string]string{
		gpu0: "nvml: device count: Driver Not Loaded", gpu1: "nvml: device count: Driver Not Loaded",
		gpu2: "nvml: device count: Driver Not Loaded", gpu3: "nvml: device count: Driver Not Loaded"})
	lib.set(func(f *faulty) { f.countErr = nil })
	expect("NVML back", good)

	lib.set(func(f *faulty) { f.lost[1] = errors.New("device 1 handle: GPU is lost") })
	expect("one device unreachable", map[string]string{gpu0: "healthy", gpu1: "nvml device 1: device 1 handle: GPU is lost", gpu2: "healthy", gpu3: lost})
	lib.set(func(f *faulty) { delete(f.lost, 1) })
	expect("device back", good)

	// An unreadable health file (a directory here: unreadable even for
	// root) marks every GPU unhealthy until it can be read again.
	if err := os.Mkdir(healthFile, 0o755); err != nil {
		t.Fatal(err)
	}
	got := health(nextFingerprint(t, ch, 2*time.Second))
	for id, h := range got {
		if h == "healthy" || len(got) != 4 {
			t.Fatalf("unreadable health_file: %v, want all 4 GPUs unhealthy", got)
		}
		t.Logf("%s: %s", id, h)
	}
	if err := os.Remove(healthFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(healthFile, []byte(gpu2+" XID 48\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("health file readable again", map[string]string{gpu0: "healthy", gpu1: "healthy", gpu2: "XID 48", gpu3: lost})
}

// TestFingerprintLateAndLostDevices: NVML that is not up when the plugin
// starts, and a device whose handle fails at the start, do not fail the
// node: the first fingerprint reports what can be read, and devices show
// up as they become readable.
func TestFingerprintLateAndLostDevices(t *testing.T) {
	lib := newFaulty(t, "nvml/testdata/v100x4.json")
	lib.set(func(f *faulty) {
		f.initErr = fmt.Errorf("%w: Driver Not Loaded", nvml.ErrUnavailable)
		f.lost[0] = errors.New("device 0 handle: Unknown Error")
	})
	p := NewWithLibrary(log.NewNullLogger(), func() nvml.Library { return lib })
	dp := grpcPlugin(t, p)
	configure(t, dp, `fingerprint_period = "50ms"`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := dp.DeviceFingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := health(nextFingerprint(t, ch, 2*time.Second)); len(got) != 0 {
		t.Fatalf("NVML not loaded: got %v, want no GPUs", got)
	}
	lib.set(func(f *faulty) { f.initErr = nil })
	got := health(nextFingerprint(t, ch, 2*time.Second))
	if want := map[string]string{gpu1: "healthy", gpu2: "healthy", gpu3: lost}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("NVML up, device 0 unreachable: got %v, want %v (a device never identified cannot be reported)", got, want)
	}
	lib.set(func(f *faulty) { delete(f.lost, 0) })
	got = health(nextFingerprint(t, ch, 2*time.Second))
	if want := map[string]string{gpu0: "healthy", gpu1: "healthy", gpu2: "healthy", gpu3: lost}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("device 0 reachable: got %v, want %v", got, want)
	}
}
