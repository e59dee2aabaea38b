package profile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/hadar-sched/hadar/planner"
)

// Format and Unit are the values hadar's own profile format carries in its
// "format" and "unit" fields.
const (
	Format = "hadar-profile/v1"
	Unit   = "steps/s"
)

// fileV1 is hadar's own profile format (docs/formats.md).
type fileV1 struct {
	Format  string    `json:"format"`
	Unit    string    `json:"unit"`
	Source  string    `json:"source,omitempty"`
	Entries []entryV1 `json:"entries"`
	// RelativeSpeeds is optional (RelativeSpeed): how fast a GPU type no
	// figure covers runs against a reference type.
	RelativeSpeeds map[planner.GPUType]RelativeSpeed `json:"relative_speeds,omitempty"`
}

type entryV1 struct {
	Model        string                      `json:"model"`
	ScaleFactor  int                         `json:"scale_factor"`
	Consolidated map[planner.GPUType]float64 `json:"consolidated"`
	Spread       map[planner.GPUType]float64 `json:"spread,omitempty"`
}

// ReadJSON reads hadar's own profile format. Unknown fields are rejected so
// that a misspelt field is an error rather than a silently missing figure.
func ReadJSON(r io.Reader) (*Profile, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("profile: read: %w", err)
	}
	return parseOwn(data)
}

func parseOwn(data []byte) (*Profile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f fileV1
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("profile: %w: want {\"format\": %q, \"unit\": %q, \"entries\": [...]}", err, Format, Unit)
	}
	if dec.More() {
		return nil, fmt.Errorf("profile: data after the top-level object: want one JSON object")
	}
	if f.Format != Format {
		return nil, fmt.Errorf("profile: format %q: want %q", f.Format, Format)
	}
	if f.Unit != Unit {
		return nil, fmt.Errorf("profile: unit %q: want %q", f.Unit, Unit)
	}
	entries := make([]Entry, len(f.Entries))
	for i, e := range f.Entries {
		entries[i] = Entry(e)
	}
	p, err := Build(f.Source, entries, f.RelativeSpeeds)
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	return p, nil
}

// WriteJSON writes p in hadar's own format: entries sorted by model then
// scale factor, one per line, so that diffs of profiles stay readable.
// Figures are written in Go's shortest round-trip form; reading the output
// gives an Equal profile.
func (p *Profile) WriteJSON(w io.Writer) error {
	bw := bufio.NewWriter(w)
	head, err := json.Marshal(struct {
		Format         string                            `json:"format"`
		Unit           string                            `json:"unit"`
		Source         string                            `json:"source,omitempty"`
		RelativeSpeeds map[planner.GPUType]RelativeSpeed `json:"relative_speeds,omitempty"`
	}{Format, Unit, p.source, p.speeds})
	if err != nil {
		return fmt.Errorf("profile: write: %w", err)
	}
	// Drop the closing brace to append the entries array to the object.
	bw.Write(head[:len(head)-1])
	bw.WriteString(",\n\"entries\": [\n")
	for i, e := range p.Entries() {
		line, err := json.Marshal(entryV1(e))
		if err != nil {
			return fmt.Errorf("profile: write %q sf %d: %w", e.Model, e.ScaleFactor, err)
		}
		bw.WriteString("  ")
		bw.Write(line)
		if i < len(p.entries)-1 {
			bw.WriteByte(',')
		}
		bw.WriteByte('\n')
	}
	bw.WriteString("]}\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("profile: write: %w", err)
	}
	return nil
}

// Parse reads either format from data: an object with a top-level "format"
// field is hadar's own, anything else is taken as Gavel's.
func Parse(data []byte) (*Profile, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("profile: not a JSON object: %w: want hadar's format (%q) or Gavel's throughput JSON", err, Format)
	}
	if _, own := probe["format"]; own {
		return parseOwn(data)
	}
	return parseGavel(data)
}

// Load reads a profile file in either format (see Parse).
func Load(path string) (*Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load profile: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load profile %s: %w", path, err)
	}
	return p, nil
}
