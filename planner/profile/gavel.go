package profile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// gavelSpreadSuffix marks Gavel's figures for a job spread across servers.
const gavelSpreadSuffix = "_unconsolidated"

// LoadGavelJSON reads Gavel's throughput file (simulation_throughputs.json or
// physical_cluster_throughputs.json): {"<type>[_unconsolidated]": {"('<model>',
// sf)": {"null": steps/s, "<other job key>": [own, other], ...}}}. Only the
// isolated ("null") figure is kept; co-location figures are ignored. Type
// names are lowercased. Spread figures at scale factor 1 are dropped (a
// one-GPU job cannot be split, and Gavel repeats the consolidated value).
func LoadGavelJSON(r io.Reader) (*Profile, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("gavel profile: read: %w", err)
	}
	return parseGavel(data)
}

func parseGavel(data []byte) (*Profile, error) {
	var raw map[string]map[string]map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("gavel profile: %w: want {\"<gpu type>\": {\"('<model>', <scale factor>)\": {\"null\": <steps/s>, ...}}}", err)
	}
	byKey := map[key]*Entry{}
	var order []key
	seenType := map[string]string{} // lowercased type key -> original spelling
	topKeys := make([]string, 0, len(raw))
	for k := range raw {
		topKeys = append(topKeys, k)
	}
	slices.Sort(topKeys) // deterministic error reporting
	for _, top := range topKeys {
		lower := strings.ToLower(strings.TrimSpace(top))
		if prev, dup := seenType[lower]; dup {
			return nil, fmt.Errorf("gavel profile: GPU type keys %q and %q are the same type once lowercased: keep one", prev, top)
		}
		seenType[lower] = top
		name, spread := strings.CutSuffix(lower, gavelSpreadSuffix)
		if name == "" || strings.ContainsAny(name, " \t\n") {
			return nil, fmt.Errorf("gavel profile: GPU type key %q: want a name such as \"v100\" or \"v100%s\"", top, gavelSpreadSuffix)
		}
		t := planner.GPUType(name)
		jobKeys := make([]string, 0, len(raw[top]))
		for k := range raw[top] {
			jobKeys = append(jobKeys, k)
		}
		slices.Sort(jobKeys)
		for _, jobKey := range jobKeys {
			figures := raw[top][jobKey]
			model, sf, err := parseGavelJobKey(jobKey)
			if err != nil {
				return nil, fmt.Errorf("gavel profile: %s: %w", top, err)
			}
			null, ok := figures["null"]
			if !ok {
				return nil, fmt.Errorf("gavel profile: %s: %s has no \"null\" (isolated) throughput: add it", top, jobKey)
			}
			var v *float64
			if err := json.Unmarshal(null, &v); err != nil || v == nil {
				return nil, fmt.Errorf("gavel profile: %s: %s: \"null\" = %s: want a number of steps/s", top, jobKey, bytes.TrimSpace(null))
			}
			if spread && sf == 1 {
				continue
			}
			k := key{model, sf}
			e := byKey[k]
			if e == nil {
				e = &Entry{Model: model, ScaleFactor: sf, Consolidated: map[planner.GPUType]float64{}}
				byKey[k] = e
				order = append(order, k)
			}
			if spread {
				if e.Spread == nil {
					e.Spread = map[planner.GPUType]float64{}
				}
				e.Spread[t] = *v
			} else {
				e.Consolidated[t] = *v
			}
		}
	}
	slices.SortFunc(order, func(a, b key) int {
		if c := strings.Compare(a.model, b.model); c != 0 {
			return c
		}
		return a.sf - b.sf
	})
	entries := make([]Entry, len(order))
	for i, k := range order {
		e := byKey[k]
		// A spread figure with no consolidated one for the same type cannot
		// be checked against anything; New rejects it with the fix.
		entries[i] = *e
	}
	p, err := New("gavel", entries)
	if err != nil {
		return nil, fmt.Errorf("gavel profile: %w", err)
	}
	return p, nil
}

// parseGavelJobKey parses the string form of Gavel's Python tuple key,
// "('ResNet-18 (batch size 16)', 1)". Python quotes with " when the name holds
// a '; backslash escapes are not produced for hadar's model names and are
// rejected rather than guessed at.
func parseGavelJobKey(s string) (string, int, error) {
	bad := func(why string) (string, int, error) {
		return "", 0, fmt.Errorf("job key %q: %s: want \"('<model>', <scale factor>)\"", s, why)
	}
	inner, ok := strings.CutPrefix(s, "(")
	if !ok {
		return bad("no opening parenthesis")
	}
	inner, ok = strings.CutSuffix(inner, ")")
	if !ok {
		return bad("no closing parenthesis")
	}
	i := strings.LastIndex(inner, ",")
	if i < 0 {
		return bad("no comma")
	}
	quoted, sfText := strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:])
	if len(quoted) < 2 || (quoted[0] != '\'' && quoted[0] != '"') || quoted[len(quoted)-1] != quoted[0] {
		return bad("model is not a quoted string")
	}
	model := quoted[1 : len(quoted)-1]
	if strings.ContainsRune(model, '\\') || strings.ContainsRune(model, rune(quoted[0])) {
		return bad("escaped characters in the model name are not supported")
	}
	if strings.TrimSpace(model) == "" {
		return bad("empty model")
	}
	sf, err := strconv.Atoi(sfText)
	if err != nil || sf <= 0 {
		return bad(fmt.Sprintf("scale factor %q is not a positive integer", sfText))
	}
	return model, sf, nil
}
