package device

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/plugintest"
)

// grpcPlugin serves p over a real go-plugin gRPC connection and returns
// a client that calls it as the Nomad client would.
func grpcPlugin(t *testing.T, p *Plugin) *plugintest.Client {
	t.Helper()
	t.Cleanup(p.Shutdown)
	return plugintest.Connect(t, p)
}

func configure(t *testing.T, dp *plugintest.Client, body string) {
	t.Helper()
	cfg, err := pluginConfig(body)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.SetConfig(context.Background(), cfg.PluginConfig, nil); err != nil {
		t.Fatal(err)
	}
}

func nextFingerprint(t *testing.T, ch <-chan *plugin.DeviceFingerprint, within time.Duration) *plugin.DeviceFingerprint {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatal("fingerprint channel closed")
		}
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r
	case <-time.After(within):
		t.Fatalf("no fingerprint within %v", within)
	}
	return nil
}

// describe renders groups compactly for table comparisons.
func describe(groups []*plugin.DeviceGroup) map[string]string {
	out := map[string]string{}
	for _, g := range groups {
		var parts []string
		parts = append(parts, g.Vendor+"/"+g.Type)
		for _, k := range []string{attrMemory, attrComputeCapability, attrSource, attrNvLinkDomainSize, attrNvLinkDomains, attrSwitchDomains} {
			if a, ok := g.Attributes[k]; ok {
				parts = append(parts, k+"="+a.String())
			}
		}
		for _, d := range g.Devices {
			s := d.ID
			if !d.Healthy {
				s += "(unhealthy)"
			}
			if d.PCIBusID != "" {
				s += "@" + d.PCIBusID
			}
			parts = append(parts, s)
		}
		out[g.Name] = strings.Join(parts, " ")
	}
	return out
}

func TestFingerprint(t *testing.T) {
	v100x4, err := nvml.LoadRecording("nvml/testdata/v100x4.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		lib  nvml.Library
		body string
		want map[string]string
	}{
		{
			name: "declared mixed",
			body: mixedInventory,
			want: map[string]string{
				"Tesla V100-SXM2-16GB": "nvidia/gpu memory=16384MiB compute_capability=7.0 source=declared nvlink_domain_size=2 nvlink_domains=v100-0,v100-1 v100-0@0000:06:00.0 v100-1",
				"Tesla K80":            "nvidia/gpu memory=11444MiB compute_capability=3.7 source=declared nvlink_domain_size=0 k80-0(unhealthy)",
			},
		},
		{
			name: "declared with ignored id",
			body: mixedInventory + `ignored_gpu_ids = ["k80-0"]`,
			want: map[string]string{
				"Tesla V100-SXM2-16GB": "nvidia/gpu memory=16384MiB compute_capability=7.0 source=declared nvlink_domain_size=2 nvlink_domains=v100-0,v100-1 v100-0@0000:06:00.0 v100-1",
			},
		},
		{
			name: "recorded NVML, DGX-1 quad",
			lib:  nvml.Recorded{Rec: v100x4},
			want: map[string]string{
				"Tesla V100-SXM2-16GB": "nvidia/gpu memory=16384MiB compute_capability=7.0 source=nvml nvlink_domain_size=4 " +
					"nvlink_domains=GPU-00000000-0000-0000-0000-000000000000,GPU-00000001-0000-0000-0000-000000000001,GPU-00000002-0000-0000-0000-000000000002,GPU-00000003-0000-0000-0000-000000000003 " +
					"pcie_switch_domains=GPU-00000000-0000-0000-0000-000000000000,GPU-00000001-0000-0000-0000-000000000001;GPU-00000002-0000-0000-0000-000000000002,GPU-00000003-0000-0000-0000-000000000003 " +
					"GPU-00000000-0000-0000-0000-000000000000@00000000:06:00.0 GPU-00000001-0000-0000-0000-000000000001@00000000:07:00.0 GPU-00000002-0000-0000-0000-000000000002@00000000:85:00.0 GPU-00000003-0000-0000-0000-000000000003(unhealthy)@00000000:86:00.0",
			},
		},
		{
			name: "no NVML, no inventory",
			lib:  nvml.NewLibraryUnavailable(),
			want: map[string]string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := tc.lib
			p := NewWithLibrary(log.NewNullLogger(), func() nvml.Library { return lib })
			dp := grpcPlugin(t, p)
			configure(t, dp, tc.body)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, err := dp.DeviceFingerprint(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The first fingerprint must come at once: the client waits
			// for it before registering the node.
			got := describe(nextFingerprint(t, ch, time.Second).Groups)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("groups:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestFingerprintHealthChange(t *testing.T) {
	health := filepath.Join(t.TempDir(), "health")
	p := NewWithLibrary(log.NewNullLogger(), nvml.NewLibraryUnavailable)
	dp := grpcPlugin(t, p)
	configure(t, dp, mixedInventory+"\nhealth_file = \""+health+"\"\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := dp.DeviceFingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(nextFingerprint(t, ch, time.Second).Groups)["Tesla V100-SXM2-16GB"]; strings.Contains(got, "unhealthy") {
		t.Fatalf("healthy at first, got %s", got)
	}
	// Nothing changed: no new fingerprint for a few periods.
	select {
	case r := <-ch:
		t.Fatalf("unchanged inventory re-sent: %v", describe(r.Groups))
	case <-time.After(500 * time.Millisecond):
	}
	if err := os.WriteFile(health, []byte("v100-1 XID 79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := nextFingerprint(t, ch, 2*time.Second)
	for _, g := range r.Groups {
		for _, d := range g.Devices {
			want := d.ID != "v100-1" && d.ID != "k80-0"
			if d.Healthy != want {
				t.Errorf("%s healthy=%v, want %v", d.ID, d.Healthy, want)
			}
			if d.ID == "v100-1" && d.HealthDesc != "XID 79" {
				t.Errorf("v100-1 health desc %q", d.HealthDesc)
			}
		}
	}
	cancel()
	for range ch {
	}
}

func TestReserve(t *testing.T) {
	p := NewWithLibrary(log.NewNullLogger(), nvml.NewLibraryUnavailable)
	dp := grpcPlugin(t, p)
	configure(t, dp, mixedInventory)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := dp.DeviceFingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nextFingerprint(t, ch, time.Second)
	tests := []struct {
		name    string
		ids     []string
		wantEnv map[string]string
		wantErr string
	}{
		{"two", []string{"v100-1", "v100-0"}, map[string]string{
			"NVIDIA_VISIBLE_DEVICES": "v100-1,v100-0", "CUDA_VISIBLE_DEVICES": "v100-1,v100-0", "HADAR_GPU_RESERVED_MODEL": "Tesla V100-SXM2-16GB"}, ""},
		{"none", nil, nil, ""},
		{"unknown", []string{"v100-0", "GPU-nope"}, nil, `unknown GPU id "GPU-nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := dp.Reserve(ctx, tc.ids)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Env) != len(tc.wantEnv) || (len(tc.wantEnv) > 0 && !reflect.DeepEqual(res.Env, tc.wantEnv)) {
				t.Fatalf("env = %v, want %v", res.Env, tc.wantEnv)
			}
		})
	}
}

func TestStats(t *testing.T) {
	v100x4, err := nvml.LoadRecording("nvml/testdata/v100x4.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		lib      nvml.Library
		body     string
		id       string
		wantUtil float64
		wantUsed int64
		wantN    int
	}{
		{"declared", nvml.NewLibraryUnavailable(), mixedInventory, "v100-0", 85, 9216, 3},
		{"recorded NVML", nvml.Recorded{Rec: v100x4}, "", "GPU-00000001-0000-0000-0000-000000000001", 91, 9728, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := tc.lib
			p := NewWithLibrary(log.NewNullLogger(), func() nvml.Library { return lib })
			dp := grpcPlugin(t, p)
			configure(t, dp, tc.body)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fp, err := dp.DeviceFingerprint(ctx)
			if err != nil {
				t.Fatal(err)
			}
			nextFingerprint(t, fp, time.Second)
			ch, err := dp.DeviceStats(ctx, 50*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			var r *plugin.DeviceStatsReport
			select {
			case r = <-ch:
			case <-time.After(time.Second):
				t.Fatal("no stats")
			}
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			n := 0
			var found bool
			for _, g := range r.Groups {
				for id, st := range g.Instances {
					n++
					if id != tc.id {
						continue
					}
					found = true
					if u := *st.Stats["gpu_utilization"].FloatNumerator; u != tc.wantUtil {
						t.Errorf("utilization %v, want %v", u, tc.wantUtil)
					}
					if m := *st.Summary.IntNumerator; m != tc.wantUsed {
						t.Errorf("memory used %v, want %v", m, tc.wantUsed)
					}
				}
			}
			if !found || n != tc.wantN {
				t.Errorf("found %v, %d instances, want %d", found, n, tc.wantN)
			}
		})
	}
}

func TestDisabled(t *testing.T) {
	p := NewWithLibrary(log.NewNullLogger(), nvml.NewLibraryUnavailable)
	dp := grpcPlugin(t, p)
	configure(t, dp, `enabled = false`)
	ch, err := dp.DeviceFingerprint(context.Background())
	if err == nil {
		// Over gRPC the error arrives on the stream.
		select {
		case r := <-ch:
			if r != nil {
				err = r.Err
			}
		case <-time.After(time.Second):
			t.Fatal("no answer from a disabled plugin")
		}
	}
	if err == nil || !strings.Contains(err.Error(), "not enabled") {
		t.Fatalf("err = %v, want plugin disabled", err)
	}
}
