package device

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	log "github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/plugintest"
)

// pluginConfig turns the body of a plugin "hadar-gpu" { config { ... } }
// block into what the Nomad agent sends to SetConfig, the way the agent's
// plugin loader does (HCL v1 -> map -> hcldec with our schema -> msgpack).
func pluginConfig(body string) (*plugin.Config, error) {
	b, err := plugintest.PluginConfig(configSpec.Proto(), body)
	if err != nil {
		return nil, err
	}
	return &plugin.Config{PluginConfig: b, APIVersion: plugin.APIVersion}, nil
}

const mixedInventory = `
fingerprint_period = "200ms"
gpu {
  id = "v100-0"
  model = "Tesla V100-SXM2-16GB"
  memory = "16GiB"
  compute_capability = "7.0"
  pci_bus_id = "0000:06:00.0"
  nvlink_group = "a"
  pcie_switch = "s0"
  utilization = 85
  memory_used = "9GiB"
}
gpu {
  id = "v100-1"
  model = "Tesla V100-SXM2-16GB"
  memory = "16384MiB"
  compute_capability = "7.0"
  nvlink_group = "a"
  pcie_switch = "s1"
}
gpu {
  id = "k80-0"
  model = "Tesla K80"
  memory = "12GB"
  compute_capability = "3.7"
  healthy = false
}
`

func TestSetConfigErrors(t *testing.T) {
	gpu := func(attrs string) string { return "gpu {\n" + attrs + "\n}\n" }
	tests := []struct {
		name string
		body string
		want string // substring of the error; "" = accepted
	}{
		{"empty config", ``, ""},
		{"mixed inventory", mixedInventory, ""},
		{"unknown unit", gpu(`id = "a"
model = "X"
memory = "16GX"`), `gpu[0] (id "a").memory: "16GX": unknown unit "GX"`},
		{"no unit", gpu(`id = "a"
model = "X"
memory = "16"`), `gpu[0] (id "a").memory: "16": want a number and a unit`},
		{"no number", gpu(`id = "a"
model = "X"
memory = "GiB"`), `want a number and a unit`},
		{"duplicate id", gpu(`id = "a"
model = "X"
memory = "1GiB"`) + gpu(`id = "a"
model = "X"
memory = "1GiB"`), `gpu[1] (id "a").id: duplicate of gpu[0]`},
		{"empty model", gpu(`id = "a"
model = ""
memory = "1GiB"`), `gpu[0] (id "a").model: empty`},
		{"empty id", gpu(`id = " "
model = "X"
memory = "1GiB"`), `.id: empty`},
		{"missing memory", gpu(`id = "a"
model = "X"`), `memory`},
		{"zero memory", gpu(`id = "a"
model = "X"
memory = "0GiB"`), `want a positive size`},
		{"bad compute capability", gpu(`id = "a"
model = "X"
memory = "1GiB"
compute_capability = "seven"`), `gpu[0] (id "a").compute_capability: "seven"`},
		{"model memory mismatch", gpu(`id = "a"
model = "X"
memory = "1GiB"`) + gpu(`id = "b"
model = "X"
memory = "2GiB"`), `gpu[1] (id "b").memory: 2048 MiB differs`},
		{"used over memory", gpu(`id = "a"
model = "X"
memory = "1GiB"
memory_used = "2GiB"`), `memory_used "2GiB": exceeds memory`},
		{"utilization range", gpu(`id = "a"
model = "X"
memory = "1GiB"
utilization = 140`), `utilization 140`},
		{"bad period", `fingerprint_period = "soon"`, `fingerprint_period "soon"`},
		{"negative period", `fingerprint_period = "-1s"`, `fingerprint_period "-1s"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewWithLibrary(log.NewNullLogger(), func() nvml.Library { return nvml.Recorded{Rec: &nvml.Recording{}} })
			cfg, err := pluginConfig(tc.body)
			if err == nil {
				err = p.SetConfig(context.Background(), cfg)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted, want error containing %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestParseSizeMiB(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"16GiB", 16384, true},
		{"16 GiB", 16384, true},
		{"16384MiB", 16384, true},
		{"1.5GiB", 1536, true},
		{"12GB", 11444, true},
		{"80GB", 76293, true},
		{"1TiB", 1 << 20, true},
		{"16gib", 0, false},
		{"", 0, false},
		{"-1GiB", 0, false},
		{"1e3GiB", 0, false},
		{"1..2GiB", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSizeMiB(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("ParseSizeMiB(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
}

// FuzzSetConfig feeds arbitrary plugin-block bodies through the agent's
// decoding path into SetConfig. Whatever it accepts must be a usable
// inventory: unique, non-empty IDs and models, positive memory.
func FuzzSetConfig(f *testing.F) {
	f.Add(mixedInventory)
	f.Add(`gpu { id = "a" model = "X" memory = "1GiB" }`)
	f.Add(`ignored_gpu_ids = ["GPU-1"] health_file = "/nonexistent"`)
	f.Fuzz(func(t *testing.T, body string) {
		cfg, err := pluginConfig(body)
		if err != nil {
			return
		}
		p := NewWithLibrary(log.NewNullLogger(), func() nvml.Library { return nvml.Recorded{Rec: &nvml.Recording{}} })
		if err := p.SetConfig(context.Background(), cfg); err != nil {
			return
		}
		seen := map[string]bool{}
		for _, d := range p.settings.declared {
			g := d.gpu
			if strings.TrimSpace(g.ID) == "" || strings.TrimSpace(g.Model) == "" || g.MemoryMiB <= 0 || seen[g.ID] {
				t.Fatalf("accepted a bad GPU %+v from %q", g, body)
			}
			seen[g.ID] = true
		}
		if p.settings.period <= 0 {
			t.Fatalf("accepted period %v", p.settings.period)
		}
	})
}

func TestHealthFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "health")
	if err := os.WriteFile(path, []byte("# drained by ops\nv100-1 XID 79 fell off the bus\n\nk80-0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readHealthFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"v100-1": "XID 79 fell off the bus", "k80-0": "marked unhealthy in " + path}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got, err := readHealthFile(filepath.Join(t.TempDir(), "missing")); err != nil || len(got) != 0 {
		t.Fatalf("missing file: %v, %v", got, err)
	}
}
