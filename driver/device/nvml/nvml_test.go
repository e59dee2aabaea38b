package nvml

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func load(t *testing.T, name string) Recorded {
	t.Helper()
	rec, err := LoadRecording(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return Recorded{Rec: rec}
}

func TestFingerprintRecorded(t *testing.T) {
	tests := []struct {
		file        string
		wantIDs     []string
		wantModel   string
		wantMemMiB  int64
		wantCC      string
		wantNvLink  map[string][]string
		wantSwitch  map[string][]string
		wantHealthy map[string]bool
	}{
		{
			file:       "v100x4.json",
			wantIDs:    []string{"GPU-00000000-0000-0000-0000-000000000000", "GPU-00000001-0000-0000-0000-000000000001", "GPU-00000002-0000-0000-0000-000000000002", "GPU-00000003-0000-0000-0000-000000000003"},
			wantModel:  "Tesla V100-SXM2-16GB",
			wantMemMiB: 16384,
			wantCC:     "7.0",
			wantNvLink: map[string][]string{
				"GPU-00000000-0000-0000-0000-000000000000": {"GPU-00000001-0000-0000-0000-000000000001", "GPU-00000002-0000-0000-0000-000000000002"},
				"GPU-00000003-0000-0000-0000-000000000003": {"GPU-00000001-0000-0000-0000-000000000001", "GPU-00000002-0000-0000-0000-000000000002"},
			},
			wantSwitch: map[string][]string{
				"GPU-00000000-0000-0000-0000-000000000000": {"GPU-00000001-0000-0000-0000-000000000001"},
				"GPU-00000002-0000-0000-0000-000000000002": {"GPU-00000003-0000-0000-0000-000000000003"},
			},
			wantHealthy: map[string]bool{
				"GPU-00000000-0000-0000-0000-000000000000": true,
				"GPU-00000003-0000-0000-0000-000000000003": false,
			},
		},
		{
			file:        "k80x2.json",
			wantIDs:     []string{"GPU-k80-a", "GPU-k80-b"},
			wantModel:   "Tesla K80",
			wantMemMiB:  11519,
			wantCC:      "3.7",
			wantNvLink:  map[string][]string{"GPU-k80-a": {}},
			wantSwitch:  map[string][]string{"GPU-k80-a": {"GPU-k80-b"}},
			wantHealthy: map[string]bool{"GPU-k80-a": true, "GPU-k80-b": true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			scan, err := Fingerprint(load(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(scan.Failed) != 0 {
				t.Errorf("failed devices %v, want none", scan.Failed)
			}
			byID := map[string]GPU{}
			var ids []string
			for _, g := range scan.GPUs {
				byID[g.ID] = g
				ids = append(ids, g.ID)
				if g.Model != tc.wantModel || g.MemoryMiB != tc.wantMemMiB || g.ComputeCapability != tc.wantCC {
					t.Errorf("%s: got model %q mem %d cc %q, want %q %d %q", g.ID, g.Model, g.MemoryMiB, g.ComputeCapability, tc.wantModel, tc.wantMemMiB, tc.wantCC)
				}
			}
			if !reflect.DeepEqual(ids, tc.wantIDs) {
				t.Errorf("ids = %v, want %v", ids, tc.wantIDs)
			}
			for id, want := range tc.wantNvLink {
				if got := byID[id].NvLinkPeers; !reflect.DeepEqual(got, want) {
					t.Errorf("%s nvlink peers = %v, want %v", id, got, want)
				}
			}
			for id, want := range tc.wantSwitch {
				if got := byID[id].SwitchPeers; !reflect.DeepEqual(got, want) {
					t.Errorf("%s switch peers = %v, want %v", id, got, want)
				}
			}
			for id, want := range tc.wantHealthy {
				if got := byID[id]; got.Healthy != want || (!want && got.HealthDesc == "") {
					t.Errorf("%s healthy = %v (%q), want %v", id, got.Healthy, got.HealthDesc, want)
				}
			}
		})
	}
}

// TestFingerprintLostHandle: a device NVML counts but cannot reach (its
// handle fails, as GPU_IS_LOST does) does not fail the scan: it is listed
// as failed by index and left out of the others' topology.
func TestFingerprintLostHandle(t *testing.T) {
	lib := load(t, "v100x4.json")
	lib.Rec.Devices[2].HandleError = "device 2 handle: GPU is lost"
	scan, err := Fingerprint(lib)
	if err != nil {
		t.Fatalf("one lost device failed the whole scan: %v", err)
	}
	if len(scan.Failed) != 1 || scan.Failed[0].Index != 2 || scan.Failed[0].Err.Error() != "device 2 handle: GPU is lost" {
		t.Fatalf("failed = %v, want device 2 with its error", scan.Failed)
	}
	var ids []string
	for _, g := range scan.GPUs {
		ids = append(ids, g.ID)
		for _, p := range append(append([]string{}, g.NvLinkPeers...), g.SwitchPeers...) {
			if p == "GPU-00000002-0000-0000-0000-000000000002" {
				t.Errorf("%s lists the lost GPU as a peer", g.ID)
			}
		}
	}
	want := []string{"GPU-00000000-0000-0000-0000-000000000000", "GPU-00000001-0000-0000-0000-000000000001", "GPU-00000003-0000-0000-0000-000000000003"}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("ids %v, want %v", ids, want)
	}
	if got := scan.GPUs[0].NvLinkPeers; !reflect.DeepEqual(got, []string{"GPU-00000001-0000-0000-0000-000000000001"}) {
		t.Errorf("GPU0 NVLink peers %v", got)
	}
	// Stats leave it out too; Models names the others and refuses it.
	if st, err := Stats(lib); err != nil || len(st) != 2 {
		t.Errorf("stats %v, %v: want the two readable healthy GPUs", st, err)
	}
	m, err := Models(lib, []string{"GPU-00000003-0000-0000-0000-000000000003"})
	if err != nil || m["GPU-00000003-0000-0000-0000-000000000003"] != "Tesla V100-SXM2-16GB" {
		t.Errorf("Models = %v, %v", m, err)
	}
	if _, err := Models(lib, []string{"GPU-00000002-0000-0000-0000-000000000002"}); err == nil || !strings.Contains(err.Error(), "GPU is lost") {
		t.Errorf("Models of the lost GPU: err %v, want one naming the unreadable device", err)
	}
	// A recording keeps the failure, and replays it.
	rec, err := Record(lib, "lost")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Devices[2].HandleError != "device 2 handle: GPU is lost" {
		t.Errorf("recorded handle error %q", rec.Devices[2].HandleError)
	}
}

func TestModels(t *testing.T) {
	lib := load(t, "k80x2.json")
	m, err := Models(lib, []string{"GPU-k80-b", "GPU-k80-a"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, map[string]string{"GPU-k80-a": "Tesla K80", "GPU-k80-b": "Tesla K80"}) {
		t.Fatalf("models %v", m)
	}
	if _, err := Models(lib, []string{"GPU-k80-a", "GPU-nope"}); err == nil || !strings.Contains(err.Error(), `"GPU-nope"`) {
		t.Fatalf("unknown UUID: err %v", err)
	}
}

func TestStatsRecorded(t *testing.T) {
	stats, err := Stats(load(t, "v100x4.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The lost GPU has no figures and is left out.
	if len(stats) != 3 {
		t.Fatalf("got %d stats, want 3: %+v", len(stats), stats)
	}
	want := GPUStats{ID: "GPU-00000000-0000-0000-0000-000000000000", GPUUtilPercent: 87, MemoryUtilPercent: 40, MemoryUsedMiB: 9216, MemoryTotalMiB: 16384, PowerWatts: 243, TemperatureC: 71}
	if stats[0] != want {
		t.Errorf("stats[0] = %+v, want %+v", stats[0], want)
	}
}

func TestNormalizeBusID(t *testing.T) {
	tests := []struct{ a, b string }{
		{"00000000:06:00.0", "0000:06:00.0"},
		{"0000:0A:00.0", "0000:0a:00.0"},
	}
	for _, tc := range tests {
		if normalizeBusID(tc.a) != normalizeBusID(tc.b) {
			t.Errorf("%q and %q should compare equal: %q vs %q", tc.a, tc.b, normalizeBusID(tc.a), normalizeBusID(tc.b))
		}
	}
	if normalizeBusID("0000:06:00.0") == normalizeBusID("0000:07:00.0") {
		t.Error("different buses compare equal")
	}
}

func TestRecordRoundTrip(t *testing.T) {
	orig := load(t, "v100x4.json")
	rec, err := Record(orig, orig.Rec.Source)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(orig.Rec)
	b, _ := json.Marshal(rec)
	if string(a) != string(b) {
		t.Errorf("record of a replay differs from the recording:\n%s\n%s", a, b)
	}
}

// TestRealNVML runs the same code against the machine's GPUs when it has
// them. With HADAR_NVML_RECORD=<file> it also writes a recording that can
// be checked into testdata/.
func TestRealNVML(t *testing.T) {
	lib := NewLibrary()
	if err := lib.Init(); err != nil {
		if errors.Is(err, ErrUnavailable) {
			t.Skipf("no NVML on this machine: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	scan, err := Fingerprint(lib)
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.GPUs) == 0 {
		t.Skipf("NVML loaded but reports no GPUs (unreadable: %v)", scan.Failed)
	}
	for _, f := range scan.Failed {
		t.Errorf("device %d cannot be read: %v", f.Index, f.Err)
	}
	ids := make([]string, 0, len(scan.GPUs))
	for _, g := range scan.GPUs {
		ids = append(ids, g.ID)
		if g.ID == "" || g.Model == "" || g.MemoryMiB <= 0 || g.PCIBusID == "" {
			t.Errorf("incomplete fingerprint: %+v", g)
		}
		t.Logf("gpu %+v", g)
	}
	models, err := Models(lib, ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range scan.GPUs {
		if models[g.ID] != g.Model {
			t.Errorf("Models(%s) = %q, want %q", g.ID, models[g.ID], g.Model)
		}
	}
	stats, err := Stats(lib)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.MemoryTotalMiB <= 0 {
			t.Errorf("stats without memory total: %+v", s)
		}
	}
	if out := os.Getenv("HADAR_NVML_RECORD"); out != "" {
		host, _ := os.Hostname()
		rec, err := Record(lib, "recorded on "+host)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.MarshalIndent(rec, "", " ")
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
