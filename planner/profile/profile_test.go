package profile

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

var (
	// The shared data sits beside the clone (../shared) on the project's
	// machines and in CI; the test that reads it skips where it is absent,
	// and the spot checks below carry the figures in any case.
	gavelDir = flag.String("gavel-dir", "../../../shared/data/gavel", "directory holding Gavel's throughput JSON files")
	update   = flag.Bool("update", false, "rewrite data/*.json from the files in -gavel-dir")
)

// TestEmbeddedMatchesGavel checks the embedded copies against Gavel's files
// and, with -update, regenerates them:
//
//	go test ./planner/profile -run TestEmbeddedMatchesGavel -update
func TestEmbeddedMatchesGavel(t *testing.T) {
	for _, c := range []struct{ gavel, embedded, source string }{
		{"simulation_throughputs.json", "data/gavel-simulation.json", "Gavel simulation_throughputs.json (github.com/stanford-futuredata/gavel, scheduler/; MIT, see LICENSE.gavel)"},
		{"physical_cluster_throughputs.json", "data/gavel-physical.json", "Gavel physical_cluster_throughputs.json (github.com/stanford-futuredata/gavel, scheduler/; MIT, see LICENSE.gavel)"},
	} {
		t.Run(c.gavel, func(t *testing.T) {
			src := filepath.Join(*gavelDir, c.gavel)
			if _, err := os.Stat(src); err != nil {
				if *update {
					t.Fatalf("-update needs %s: %v", src, err)
				}
				t.Skipf("Gavel's file is not here (%v); the spot checks cover the embedded data", err)
			}
			fromGavel, err := Load(src)
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				var buf bytes.Buffer
				withSource := &Profile{source: c.source, entries: fromGavel.entries, types: fromGavel.types, models: fromGavel.models, sfs: fromGavel.sfs}
				if err := withSource.WriteJSON(&buf); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(c.embedded, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			embedded, err := Load(c.embedded)
			if err != nil {
				t.Fatal(err)
			}
			if !embedded.Equal(fromGavel) {
				t.Fatalf("%s differs from %s: regenerate with -update", c.embedded, src)
			}
		})
	}
}

func TestDefaultSpotChecks(t *testing.T) {
	// Figures copied by hand from Gavel's simulation_throughputs.json.
	cases := []struct {
		model  string
		sf     int
		typ    planner.GPUType
		spread bool
		want   float64
	}{
		{"ResNet-18 (batch size 16)", 1, "v100", false, 32.353384328946916},
		{"ResNet-18 (batch size 16)", 1, "p100", false, 35.869203207990005},
		{"ResNet-18 (batch size 16)", 1, "k80", false, 4.795294551566172},
		{"ResNet-18 (batch size 16)", 1, "v100", true, 32.353384328946916}, // sf 1 is never spread
		{"ResNet-18 (batch size 16)", 2, "v100", false, 100.14206200421837},
		{"ResNet-18 (batch size 16)", 2, "v100", true, 35.33651986363828},
		{"Transformer (batch size 64)", 2, "v100", true, 7.005137811237574},
		{"Transformer (batch size 64)", 2, "k80", true, 2.726588607798238},
		{"ResNet-50 (batch size 128)", 2, "k80", false, 0},
		{"ResNet-50 (batch size 128)", 2, "k80", true, 0},                         // no spread figure: consolidated
		{"ResNet-50 (batch size 64)", 4, "k80", true, 2.4122290974193286},         // no spread figure: consolidated
		{"Recommendation (batch size 8192)", 1, "p100", false, 5.548440840558535}, // faster than on v100
	}
	p := Default()
	for _, c := range cases {
		got, err := p.Throughput(c.model, c.sf, c.typ, c.spread)
		if err != nil {
			t.Errorf("Throughput(%q, %d, %s, %v): %v", c.model, c.sf, c.typ, c.spread, err)
			continue
		}
		if got != c.want {
			t.Errorf("Throughput(%q, %d, %s, %v) = %v, want %v", c.model, c.sf, c.typ, c.spread, got, c.want)
		}
	}
	if got, want := p.Types(), []planner.GPUType{"k80", "p100", "v100"}; !slices.Equal(got, want) {
		t.Errorf("Types() = %v, want %v", got, want)
	}
	if got := len(p.Models()); got != 26 {
		t.Errorf("len(Models()) = %d, want 26", got)
	}
	if got, want := p.ScaleFactors("ResNet-18 (batch size 16)"), []int{1, 2, 4, 8}; !slices.Equal(got, want) {
		t.Errorf("ScaleFactors = %v, want %v", got, want)
	}
	if got := len(p.Entries()); got != 83 {
		t.Errorf("len(Entries()) = %d, want 83 (Gavel's keys)", got)
	}
	// The physical profile differs where Gavel measured: ResNet-50 bs128
	// cannot run on a K80 even alone.
	phys := GavelPhysical()
	if got, _ := phys.Throughput("ResNet-50 (batch size 128)", 1, "k80", false); got != 0 {
		t.Errorf("physical ResNet-50 bs128 sf1 k80 = %v, want 0", got)
	}
	if got, _ := phys.Throughput("ResNet-18 (batch size 16)", 1, "p100", false); got != 37.277478637785975 {
		t.Errorf("physical ResNet-18 bs16 sf1 p100 = %v, want 37.277478637785975", got)
	}
	if Default() != p {
		t.Error("Default() parsed twice: want one shared immutable value")
	}
}

func TestGavelExcerpt(t *testing.T) {
	p, err := Load("testdata/gavel-excerpt.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Models(), []string{"ResNet-18 (batch size 16)", "ResNet-50 (batch size 128)"}; !slices.Equal(got, want) {
		t.Fatalf("Models() = %q, want %q", got, want)
	}
	if got, _ := p.Throughput("ResNet-18 (batch size 16)", 2, "p100", true); got != 34.889140006633475 {
		t.Errorf("spread p100 = %v", got)
	}
	for _, e := range p.Entries() {
		if e.ScaleFactor == 1 && len(e.Spread) > 0 {
			t.Errorf("%q sf 1 kept spread figures %v: want them dropped", e.Model, e.Spread)
		}
	}
	if !p.Equal(Default().subset(p)) {
		t.Error("excerpt differs from the embedded default on the same keys")
	}
}

// subset returns the entries of p whose (model, sf) are in q, for comparing
// excerpts.
func (p *Profile) subset(q *Profile) *Profile {
	var es []Entry
	for _, e := range p.Entries() {
		if _, ok := q.entries[key{e.Model, e.ScaleFactor}]; ok {
			es = append(es, e)
		}
	}
	out, err := New(p.source, es)
	if err != nil {
		panic(err)
	}
	return out
}

func TestOwnRoundTrip(t *testing.T) {
	for name, p := range map[string]*Profile{"default": Default(), "physical": GavelPhysical(), "custom": mustNew(t, customEntries())} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := p.WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			q, err := ReadJSON(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatalf("re-reading own output: %v\n%s", err, buf.String())
			}
			if !q.Equal(p) || q.Source() != p.Source() {
				t.Fatal("round trip changed the profile")
			}
			var again bytes.Buffer
			if err := q.WriteJSON(&again); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), again.Bytes()) {
				t.Fatal("WriteJSON is not deterministic")
			}
		})
	}
}

func customEntries() []Entry {
	return []Entry{
		{Model: "llama-tiny", ScaleFactor: 4, Consolidated: map[planner.GPUType]float64{"a100": 12.5, "h100": 30, "l4": 0}, Spread: map[planner.GPUType]float64{"h100": 21.25}},
		{Model: "llama-tiny", ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"a100": 4, "l4": 1.5}},
	}
}

func mustNew(t *testing.T, es []Entry) *Profile {
	t.Helper()
	p, err := New("test", es)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCustomTypes(t *testing.T) {
	p := mustNew(t, customEntries())
	if got, want := p.Types(), []planner.GPUType{"a100", "h100", "l4"}; !slices.Equal(got, want) {
		t.Errorf("Types() = %v, want %v", got, want)
	}
	if got, want := p.ScaleFactors("llama-tiny"), []int{1, 4}; !slices.Equal(got, want) {
		t.Errorf("ScaleFactors = %v, want %v", got, want)
	}
	if got, err := p.Throughput("llama-tiny", 4, "h100", true); err != nil || got != 21.25 {
		t.Errorf("spread h100 = %v, %v", got, err)
	}
	if got, err := p.Throughput("llama-tiny", 4, "a100", true); err != nil || got != 12.5 {
		t.Errorf("spread a100 (fallback) = %v, %v", got, err)
	}
	if got, err := p.Throughput("llama-tiny", 4, "l4", false); err != nil || got != 0 {
		t.Errorf("measured zero = %v, %v; want 0, nil", got, err)
	}
	// Returned slices are copies: changing them leaves the profile alone.
	ts := p.Types()
	ts[0] = "zzz"
	if p.Types()[0] != "a100" {
		t.Error("Types() exposes internal state")
	}
}

func TestThroughputErrors(t *testing.T) {
	p := Default()
	cases := []struct {
		model string
		sf    int
		typ   planner.GPUType
		want  []string
	}{
		{"GPT-5", 1, "v100", []string{`unknown model "GPT-5"`, `"A3C"`, "add entries"}},
		{"ResNet-18 (batch size 16)", 3, "v100", []string{"no scale factor 3", "1, 2, 4, 8", "add a"}},
		{"A3C", 2, "v100", []string{"no scale factor 2", "profiled: 1"}},
		{"ResNet-18 (batch size 16)", 2, "a100", []string{`GPU type "a100"`, "k80, p100, v100", `add a consolidated "a100"`}},
	}
	for _, c := range cases {
		_, err := p.Throughput(c.model, c.sf, c.typ, false)
		if err == nil {
			t.Errorf("Throughput(%q, %d, %s): no error", c.model, c.sf, c.typ)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Throughput(%q, %d, %s) error %q: want it to contain %q", c.model, c.sf, c.typ, err, w)
			}
		}
	}
}

func TestReadJSONErrors(t *testing.T) {
	const ok = `{"model":"m","scale_factor":2,"consolidated":{"v100":1}}`
	cases := []struct{ name, in, want string }{
		{"format", `{"format":"hadar-profile/v2","unit":"steps/s","entries":[` + ok + `]}`, `format "hadar-profile/v2": want "hadar-profile/v1"`},
		{"no format", `{"unit":"steps/s","entries":[` + ok + `]}`, `format "": want "hadar-profile/v1"`},
		{"unit", `{"format":"hadar-profile/v1","unit":"samples/s","entries":[` + ok + `]}`, `unit "samples/s": want "steps/s"`},
		{"empty", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[]}`, "no entries"},
		{"negative", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":2,"consolidated":{"v100":-1}}]}`, `(model "m", scale_factor 2): consolidated.v100 = -1: want steps/s >= 0`},
		{"negative spread", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":2,"consolidated":{"v100":1},"spread":{"v100":-2}}]}`, `spread.v100 = -2`},
		{"duplicate", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[` + ok + `,` + ok + `]}`, "duplicate (model, scale_factor)"},
		{"unknown field", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":2,"consolidatd":{"v100":1}}]}`, `unknown field "consolidatd"`},
		{"uppercase type", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":2,"consolidated":{"V100":1}}]}`, `GPU type "V100": want a lowercase name`},
		{"spread sf1", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":1,"consolidated":{"v100":1},"spread":{"v100":1}}]}`, "spread given at scale_factor 1"},
		{"spread only", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":2,"consolidated":{"v100":1},"spread":{"p100":1}}]}`, "spread.p100 has no consolidated.p100"},
		{"sf zero", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":0,"consolidated":{"v100":1}}]}`, "scale_factor: want a positive"},
		{"empty model", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"","scale_factor":1,"consolidated":{"v100":1}}]}`, "model is empty"},
		{"no consolidated", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":1}]}`, "consolidated is empty"},
		{"trailing", `{"format":"hadar-profile/v1","unit":"steps/s","entries":[` + ok + `]} {}`, "data after the top-level object"},
		{"syntax", `{"format":`, "unexpected EOF"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadJSON(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v: want it to contain %q", err, c.want)
			}
		})
	}
}

func TestNewRejectsNonFinite(t *testing.T) {
	// JSON cannot carry NaN or Inf, but New is also an API.
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		_, err := New("", []Entry{{Model: "m", ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"v100": v}}})
		if err == nil || !strings.Contains(err.Error(), "consolidated.v100") || !strings.Contains(err.Error(), "finite") {
			t.Errorf("New with %v: error %v, want one naming consolidated.v100 and asking for a finite number", v, err)
		}
	}
}

func TestLoadGavelJSONErrors(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"not object", `[1]`, "want {\"<gpu type>\""},
		{"bad key", `{"v100": {"ResNet, 1": {"null": 1}}}`, `job key "ResNet, 1": no opening parenthesis`},
		{"bad sf", `{"v100": {"('ResNet', x)": {"null": 1}}}`, `scale factor "x" is not a positive integer`},
		{"zero sf", `{"v100": {"('ResNet', 0)": {"null": 1}}}`, `scale factor "0" is not a positive integer`},
		{"unquoted", `{"v100": {"(ResNet, 1)": {"null": 1}}}`, "model is not a quoted string"},
		{"no null", `{"v100": {"('ResNet', 1)": {"('x', 1)": [1, 2]}}}`, `has no "null" (isolated) throughput`},
		{"null null", `{"v100": {"('ResNet', 1)": {"null": null}}}`, `"null" = null: want a number`},
		{"string null", `{"v100": {"('ResNet', 1)": {"null": "fast"}}}`, `"null" = "fast": want a number`},
		{"negative", `{"v100": {"('ResNet', 2)": {"null": -3}}}`, "consolidated.v100 = -3"},
		{"dup type", `{"v100": {"('ResNet', 1)": {"null": 1}}, "V100": {"('ResNet', 1)": {"null": 1}}}`, "same type once lowercased"},
		{"spread only", `{"v100_unconsolidated": {"('ResNet', 2)": {"null": 1}}}`, "consolidated is empty"},
		{"empty type", `{"_unconsolidated": {"('ResNet', 2)": {"null": 1}}}`, `GPU type key "_unconsolidated"`},
		{"empty", `{}`, "no entries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadGavelJSON(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v: want it to contain %q", err, c.want)
			}
		})
	}
}

func TestParseGavelJobKey(t *testing.T) {
	for _, c := range []struct {
		in    string
		model string
		sf    int
	}{
		{"('ResNet-18 (batch size 16)', 1)", "ResNet-18 (batch size 16)", 1},
		{`("Bob's model, v2", 8)`, "Bob's model, v2", 8},
		{"('A3C',4)", "A3C", 4},
	} {
		m, sf, err := parseGavelJobKey(c.in)
		if err != nil || m != c.model || sf != c.sf {
			t.Errorf("parseGavelJobKey(%q) = %q, %d, %v; want %q, %d", c.in, m, sf, err, c.model, c.sf)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(dir, "own.json")
	var buf bytes.Buffer
	if err := mustNew(t, customEntries()).WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(own, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(own)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Equal(mustNew(t, customEntries())) {
		t.Error("Load of own format differs")
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"v100": 3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(dir, "missing.json")} {
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("Load(%s) error %v: want one naming the path", path, err)
		}
	}
}

func TestCheck(t *testing.T) {
	p := Default()
	job := func(id, model string, sf int) planner.Job {
		return planner.Job{ID: id, Model: model, ScaleFactor: sf, TotalSteps: 1, Weight: 1}
	}
	good := []planner.Job{job("job-0", "ResNet-18 (batch size 16)", 2), job("job-1", "ResNet-50 (batch size 128)", 4)}
	if err := p.Check(good, []planner.GPUType{"v100", "k80"}); err != nil {
		t.Fatalf("Check(good): %v", err)
	}
	cases := []struct {
		name  string
		jobs  []planner.Job
		types []planner.GPUType
		want  []string
	}{
		{"no types", good, nil, []string{"no GPU types given"}},
		{"unknown type", good, []planner.GPUType{"v100", "a100"}, []string{`GPU type "a100" is not in the profile`, "k80, p100, v100"}},
		{"unknown model", []planner.Job{job("job-7", "GPT", 1)}, []planner.GPUType{"v100"}, []string{"job job-7", `unknown model "GPT"`}},
		{"unknown sf", []planner.Job{job("job-8", "A3C", 4)}, []planner.GPUType{"v100"}, []string{"job job-8", "no scale factor 4"}},
		{"cannot run", []planner.Job{job("job-9", "ResNet-50 (batch size 128)", 2)}, []planner.GPUType{"k80"}, []string{"job job-9", `("ResNet-50 (batch size 128)", 2)`, "zero or no throughput", "k80"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := p.Check(c.jobs, c.types)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q: want it to contain %q", err, w)
				}
			}
		})
	}
	var many []planner.Job
	for i := range 25 {
		many = append(many, job("job-x", "GPT", i+1))
	}
	err := p.Check(many, []planner.GPUType{"v100"})
	if err == nil || !strings.Contains(err.Error(), "and 15 more problems") {
		t.Errorf("Check of 25 bad jobs: %v; want 10 listed and 15 counted", err)
	}
}
