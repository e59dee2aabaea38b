package netmodel

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// GavelKey identifies one row of Gavel's throughput tables.
type GavelKey struct {
	// Model is Gavel's job type, e.g. "ResNet-18 (batch size 16)".
	Model string
	// SF is the scale factor: the number of GPUs (workers).
	SF int
}

// GavelThroughputs holds the isolated throughputs (the "null" entries) of
// a Gavel throughput file: steps/s aggregated over the job's workers, per
// table ("v100", "v100_unconsolidated", ...) and key. Co-location entries
// are dropped: this model does not price GPU sharing.
type GavelThroughputs struct {
	Tables map[string]map[GavelKey]float64
}

// UnconsolidatedSuffix marks Gavel's tables of multi-GPU jobs spread over
// servers.
const UnconsolidatedSuffix = "_unconsolidated"

var gavelKeyRE = regexp.MustCompile(`^\('(.+)', ([0-9]+)\)$`)

// ParseGavelKey parses "('<model>', <sf>)".
func ParseGavelKey(s string) (GavelKey, error) {
	m := gavelKeyRE.FindStringSubmatch(s)
	if m == nil {
		return GavelKey{}, fmt.Errorf("key %q: want \"('<model> (batch size N)', <scale factor>)\"", s)
	}
	sf, err := strconv.Atoi(m[2])
	if err != nil || sf <= 0 {
		return GavelKey{}, fmt.Errorf("key %q: scale factor %q: want a positive integer", s, m[2])
	}
	return GavelKey{Model: m[1], SF: sf}, nil
}

// ModelFamily strips the batch size: "ResNet-18 (batch size 16)" ->
// "ResNet-18". Bytes per iteration depend on the model, not the batch.
func ModelFamily(model string) string {
	if i := strings.Index(model, " (batch size"); i >= 0 {
		return model[:i]
	}
	return model
}

// LoadGavelThroughputs reads a Gavel simulation_throughputs.json (or
// physical_cluster_throughputs.json) and keeps the isolated throughputs.
func LoadGavelThroughputs(r io.Reader) (*GavelThroughputs, error) {
	var raw map[string]map[string]map[string]json.RawMessage
	if err := json.NewDecoder(r).Decode(&raw); err != nil {
		return nil, fmt.Errorf("gavel throughputs: want {\"<gpu type>\": {\"('<model>', sf)\": {\"null\": steps/s}}}: %w", err)
	}
	out := &GavelThroughputs{Tables: make(map[string]map[GavelKey]float64, len(raw))}
	for table, rows := range raw {
		t := make(map[GavelKey]float64, len(rows))
		for ks, entry := range rows {
			k, err := ParseGavelKey(ks)
			if err != nil {
				return nil, fmt.Errorf("gavel throughputs: %s: %w", table, err)
			}
			v, ok := entry["null"]
			if !ok {
				return nil, fmt.Errorf("gavel throughputs: %s[%s]: no \"null\" (isolated) entry", table, ks)
			}
			var thr float64
			if err := json.Unmarshal(v, &thr); err != nil || math.IsNaN(thr) || thr < 0 {
				return nil, fmt.Errorf("gavel throughputs: %s[%s].null: want steps/s >= 0, got %s", table, ks, v)
			}
			t[k] = thr
		}
		out.Tables[table] = t
	}
	return out, nil
}

// GPUTypes lists the consolidated tables that have an unconsolidated twin,
// sorted.
func (g *GavelThroughputs) GPUTypes() []string {
	var out []string
	for t := range g.Tables {
		if strings.HasSuffix(t, UnconsolidatedSuffix) {
			continue
		}
		if _, ok := g.Tables[t+UnconsolidatedSuffix]; ok {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

// ModelSize is a model family's parameter count and where it comes from.
type ModelSize struct {
	Family string
	Params float64
	// Basis says how the count was obtained; every count here is inferred
	// from the public model definition Gavel's workload is based on.
	Basis string
}

// DefaultModelSizes returns the inferred parameter counts of Gavel's model
// families (a fresh slice each call; callers may edit it).
func DefaultModelSizes() []ModelSize {
	return []ModelSize{
		{"ResNet-18", 11.2e6, "CIFAR-10 ResNet-18 (kuangliu/pytorch-cifar), 11.17M"},
		{"ResNet-50", 25.6e6, "ImageNet ResNet-50 (torchvision), 25.56M"},
		{"Transformer", 48e6, "attention-is-all-you-need-pytorch base (d_model 512, 6+6 layers) on Multi30k, ~44M + ~4M embeddings"},
		{"LM", 13.9e6, "pytorch/examples word_language_model, 2-layer LSTM 200/200, Wikitext-2 vocab 33,278"},
		{"Recommendation", 28e6, "NVIDIA DeepRecommender autoencoder on ML-20M, ~27k items x 512 x 2 + hidden layers"},
		{"A3C", 0.9e6, "A3C conv + LSTM Atari agent"},
		{"CycleGAN", 28.3e6, "CycleGAN 2 ResNet-9 generators (11.4M) + 2 PatchGAN discriminators (2.8M)"},
	}
}
