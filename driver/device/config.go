package device

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
)

// configSpec is the plugin block's schema (see docs/driver.md).
var configSpec = hclspec.Object(map[string]*hclspec.Spec{
	"enabled": hclspec.Default(
		hclspec.Attr("enabled", "bool", false),
		hclspec.Literal("true"),
	),
	"fingerprint_period": hclspec.Default(
		hclspec.Attr("fingerprint_period", "string", false),
		hclspec.Literal(`"1m"`),
	),
	"ignored_gpu_ids": hclspec.Default(
		hclspec.Attr("ignored_gpu_ids", "list(string)", false),
		hclspec.Literal("[]"),
	),
	"health_file": hclspec.Attr("health_file", "string", false),
	"gpu": hclspec.BlockList("gpu", hclspec.Object(map[string]*hclspec.Spec{
		"id":                 hclspec.Attr("id", "string", true),
		"model":              hclspec.Attr("model", "string", true),
		"memory":             hclspec.Attr("memory", "string", true),
		"compute_capability": hclspec.Attr("compute_capability", "string", false),
		"pci_bus_id":         hclspec.Attr("pci_bus_id", "string", false),
		"nvlink_group":       hclspec.Attr("nvlink_group", "string", false),
		"pcie_switch":        hclspec.Attr("pcie_switch", "string", false),
		"healthy": hclspec.Default(
			hclspec.Attr("healthy", "bool", false),
			hclspec.Literal("true"),
		),
		"utilization": hclspec.Attr("utilization", "number", false),
		"memory_used": hclspec.Attr("memory_used", "string", false),
	})),
})

// Config is the plugin block as Nomad hands it over (msgpack, decoded
// with configSpec).
type Config struct {
	Enabled           bool        `cty:"enabled"`
	FingerprintPeriod string      `cty:"fingerprint_period"`
	IgnoredGPUIDs     []string    `cty:"ignored_gpu_ids"`
	HealthFile        string      `cty:"health_file"`
	GPUs              []GPUConfig `cty:"gpu"`
}

// GPUConfig declares one GPU of the inventory.
type GPUConfig struct {
	ID                string  `cty:"id"`
	Model             string  `cty:"model"`
	Memory            string  `cty:"memory"`
	ComputeCapability string  `cty:"compute_capability"`
	PCIBusID          string  `cty:"pci_bus_id"`
	NvLinkGroup       string  `cty:"nvlink_group"`
	PCIeSwitch        string  `cty:"pcie_switch"`
	Healthy           bool    `cty:"healthy"`
	Utilization       float64 `cty:"utilization"`
	MemoryUsed        string  `cty:"memory_used"`
}

// settings is a validated Config.
type settings struct {
	enabled    bool
	period     time.Duration
	ignored    map[string]bool
	healthFile string
	// declared is nil when the GPUs come from NVML.
	declared []declaredGPU
}

type declaredGPU struct {
	gpu   nvml.GPU
	stats nvml.GPUStats
}

// parseConfig validates c; its errors name the offending field.
func parseConfig(c Config) (*settings, error) {
	s := &settings{enabled: c.Enabled, ignored: map[string]bool{}, healthFile: c.HealthFile}
	period := c.FingerprintPeriod
	if period == "" {
		period = "1m"
	}
	d, err := time.ParseDuration(period)
	if err != nil || d <= 0 {
		return nil, fmt.Errorf("fingerprint_period %q: want a positive duration such as \"30s\" or \"1m\"", c.FingerprintPeriod)
	}
	s.period = d
	for _, id := range c.IgnoredGPUIDs {
		s.ignored[id] = true
	}
	if len(c.GPUs) == 0 {
		return s, nil
	}
	s.declared = []declaredGPU{}
	seen := map[string]int{}
	memByModel := map[string]int64{}
	ccByModel := map[string]string{}
	nvlink := map[string][]string{}
	switches := map[string][]string{}
	for i, g := range c.GPUs {
		where := fmt.Sprintf("gpu[%d]", i)
		if g.ID != "" {
			where = fmt.Sprintf("gpu[%d] (id %q)", i, g.ID)
		}
		if strings.TrimSpace(g.ID) == "" {
			return nil, fmt.Errorf("%s.id: empty; give every declared GPU a unique id", where)
		}
		if j, dup := seen[g.ID]; dup {
			return nil, fmt.Errorf("%s.id: duplicate of gpu[%d]; ids must be unique on a node", where, j)
		}
		seen[g.ID] = i
		if strings.TrimSpace(g.Model) == "" {
			return nil, fmt.Errorf("%s.model: empty; give the GPU model as jobspecs name it, e.g. \"Tesla V100-SXM2-16GB\"", where)
		}
		mem, err := ParseSizeMiB(g.Memory)
		if err != nil {
			return nil, fmt.Errorf("%s.memory: %w", where, err)
		}
		if mem <= 0 {
			return nil, fmt.Errorf("%s.memory %q: want a positive size", where, g.Memory)
		}
		if prev, ok := memByModel[g.Model]; ok && prev != mem {
			return nil, fmt.Errorf("%s.memory: %d MiB differs from an earlier %q GPU's %d MiB; GPUs of one model form one device group with one memory attribute, so give them different model names", where, mem, g.Model, prev)
		}
		memByModel[g.Model] = mem
		cc := g.ComputeCapability
		if cc != "" {
			if err := checkComputeCapability(cc); err != nil {
				return nil, fmt.Errorf("%s.compute_capability: %w", where, err)
			}
		}
		if prev, ok := ccByModel[g.Model]; ok && prev != cc {
			return nil, fmt.Errorf("%s.compute_capability: %q differs from an earlier %q GPU's %q; give them different model names", where, cc, g.Model, prev)
		}
		ccByModel[g.Model] = cc
		var used int64
		if g.MemoryUsed != "" {
			if used, err = ParseSizeMiB(g.MemoryUsed); err != nil {
				return nil, fmt.Errorf("%s.memory_used: %w", where, err)
			}
			if used > mem {
				return nil, fmt.Errorf("%s.memory_used %q: exceeds memory %q", where, g.MemoryUsed, g.Memory)
			}
		}
		if g.Utilization < 0 || g.Utilization > 100 {
			return nil, fmt.Errorf("%s.utilization %v: want a percentage in [0,100]", where, g.Utilization)
		}
		dg := declaredGPU{
			gpu: nvml.GPU{
				Index: -1, ID: g.ID, Model: g.Model, MemoryMiB: mem, ComputeCapability: cc,
				PCIBusID: g.PCIBusID, DriverVersion: "declared", Healthy: g.Healthy,
			},
			stats: nvml.GPUStats{
				ID: g.ID, GPUUtilPercent: g.Utilization, MemoryUsedMiB: used, MemoryTotalMiB: mem,
				MemoryUtilPercent: 100 * float64(used) / float64(mem),
			},
		}
		if !g.Healthy {
			dg.gpu.HealthDesc = "declared unhealthy in the plugin config"
		}
		if g.NvLinkGroup != "" {
			nvlink[g.NvLinkGroup] = append(nvlink[g.NvLinkGroup], g.ID)
		}
		if g.PCIeSwitch != "" {
			switches[g.PCIeSwitch] = append(switches[g.PCIeSwitch], g.ID)
		}
		s.declared = append(s.declared, dg)
	}
	for i := range s.declared {
		g := &s.declared[i].gpu
		src := c.GPUs[i]
		g.NvLinkPeers = peersOf(g.ID, nvlink[src.NvLinkGroup], src.NvLinkGroup != "")
		g.SwitchPeers = peersOf(g.ID, switches[src.PCIeSwitch], src.PCIeSwitch != "")
	}
	return s, nil
}

func peersOf(id string, members []string, ok bool) []string {
	out := []string{}
	if !ok {
		return out
	}
	for _, m := range members {
		if m != id {
			out = append(out, m)
		}
	}
	return out
}

func checkComputeCapability(cc string) error {
	major, minor, ok := strings.Cut(cc, ".")
	if !ok {
		return fmt.Errorf("%q: want \"major.minor\", e.g. \"7.0\"", cc)
	}
	for _, p := range []string{major, minor} {
		if _, err := strconv.ParseUint(p, 10, 16); err != nil {
			return fmt.Errorf("%q: want \"major.minor\" with decimal numbers, e.g. \"8.6\"", cc)
		}
	}
	return nil
}

// sizeUnits maps a size unit to MiB per unit, as a fraction num/den so
// that decimal units convert exactly where they can.
var sizeUnits = map[string][2]int64{
	"MiB": {1, 1},
	"GiB": {1024, 1},
	"TiB": {1024 * 1024, 1},
	"MB":  {1000 * 1000, 1024 * 1024},
	"GB":  {1000 * 1000 * 1000, 1024 * 1024},
	"TB":  {1000 * 1000 * 1000 * 1000, 1024 * 1024},
}

// ParseSizeMiB reads a size such as "16GiB", "16384 MiB" or "40GB" and
// returns whole MiB.
func ParseSizeMiB(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return !unicode.IsDigit(r) && r != '.' })
	if i <= 0 {
		return 0, fmt.Errorf("%q: want a number and a unit, e.g. \"16GiB\" (units: MiB, GiB, TiB, MB, GB, TB)", s)
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("%q: %q is not a non-negative number", s, num)
	}
	u, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("%q: unknown unit %q; want one of MiB, GiB, TiB, MB, GB, TB", s, unit)
	}
	mib := f * float64(u[0]) / float64(u[1])
	if mib > 1<<50 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return int64(mib), nil
}

// readHealthFile returns the GPUs an operator marked unhealthy: one line
// per GPU, "<id> <reason...>"; blank lines and lines starting with # are
// skipped. A missing file marks nothing.
func readHealthFile(path string) (map[string]string, error) {
	out := map[string]string{}
	if path == "" {
		return out, nil
	}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("health_file %s: %w", path, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, _ := strings.Cut(line, " ")
		reason = strings.TrimSpace(reason)
		if reason == "" {
			reason = "marked unhealthy in " + path
		}
		out[id] = reason
	}
	return out, nil
}
