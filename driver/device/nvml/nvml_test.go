package nvml

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
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
			gpus, err := Fingerprint(load(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			byID := map[string]GPU{}
			var ids []string
			for _, g := range gpus {
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
	gpus, err := Fingerprint(lib)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) == 0 {
		t.Skip("NVML loaded but reports no GPUs")
	}
	for _, g := range gpus {
		if g.ID == "" || g.Model == "" || g.MemoryMiB <= 0 || g.PCIBusID == "" {
			t.Errorf("incomplete fingerprint: %+v", g)
		}
		t.Logf("gpu %+v", g)
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
