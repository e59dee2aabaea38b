package config

import (
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// knownFamilies are NVIDIA datacenter GPU families as they appear in NVML
// device names ("Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-40GB",
// "Tesla K80"), longest first so "a100" wins over "a10" and "p100" over
// "p10". The planner's type is the family in lowercase: the name Gavel's
// profile and hadar's traces use.
var knownFamilies = []string{
	"gh200", "h200", "h100", "h800", "a100", "a800", "a40", "a30", "a16", "a10g", "a10", "a2",
	"l40s", "l40", "l4", "v100s", "v100", "p100", "p40", "p4", "t4", "k80", "k40", "m60", "m40",
}

// GPUTypes maps device models to the planner's GPU types.
type GPUTypes struct {
	overrides map[string]string
}

// NewGPUTypes returns a mapper with the configured overrides (model ->
// type), which win over the built-in rules.
func NewGPUTypes(overrides map[string]string) GPUTypes {
	m := map[string]string{}
	for k, v := range overrides {
		m[strings.TrimSpace(k)] = v
	}
	return GPUTypes{overrides: m}
}

// Type returns the planner type of a device model, or "" when neither an
// override nor a built-in rule knows it (the model's GPUs are then left out
// of planning, with a warning naming the gpu_types entry to add).
func (g GPUTypes) Type(model string) planner.GPUType {
	if t, ok := g.overrides[strings.TrimSpace(model)]; ok {
		return planner.GPUType(t)
	}
	lower := strings.ToLower(model)
	// Tokens split at anything that is not a letter or digit: "Tesla
	// V100-SXM2-16GB" gives tesla, v100, sxm2, 16gb.
	tokens := strings.FieldsFunc(lower, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') })
	for _, f := range knownFamilies {
		for _, tok := range tokens {
			if tok == f {
				return planner.GPUType(f)
			}
		}
	}
	return ""
}
