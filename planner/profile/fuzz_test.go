package profile

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// Seeds beyond these live in testdata/fuzz/<target>/.

func FuzzLoadGavelJSON(f *testing.F) {
	f.Add([]byte(`{"v100": {"('ResNet-18 (batch size 16)', 2)": {"null": 100.1, "('A3C', 1)": [1, 2]}}, "v100_unconsolidated": {"('ResNet-18 (batch size 16)', 2)": {"null": 35.3}}}`))
	f.Add([]byte(`{"k80": {"('ResNet-50 (batch size 128)', 2)": {"null": 0.0}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := LoadGavelJSON(bytes.NewReader(data))
		if err != nil {
			return
		}
		roundTrip(t, p)
	})
}

func FuzzReadJSON(f *testing.F) {
	f.Add([]byte(`{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":2,"consolidated":{"v100":1,"k80":0},"spread":{"v100":0.5}}]}`))
	f.Add([]byte(`{"format":"hadar-profile/v1","unit":"steps/s","entries":[{"model":"m","scale_factor":1,"consolidated":{"v100":-1}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ReadJSON(bytes.NewReader(data))
		if err != nil {
			return
		}
		roundTrip(t, p)
	})
}

// roundTrip checks the invariants every accepted profile keeps: own-format
// output reads back Equal, and every listed key answers Throughput.
func roundTrip(t *testing.T, p *Profile) {
	t.Helper()
	var buf bytes.Buffer
	if err := p.WriteJSON(&buf); err != nil {
		t.Fatalf("WriteJSON: %v", err)
	}
	q, err := ReadJSON(&buf)
	if err != nil {
		t.Fatalf("re-reading own output: %v", err)
	}
	if !q.Equal(p) {
		t.Fatal("round trip changed the profile")
	}
	for _, m := range p.Models() {
		if strings.TrimSpace(m) == "" {
			t.Fatalf("accepted an empty model")
		}
		for _, sf := range p.ScaleFactors(m) {
			for _, typ := range p.Types() {
				v, err := p.Throughput(m, sf, typ, true)
				if err == nil && v < 0 {
					t.Fatalf("negative throughput %v", v)
				}
			}
		}
		extendChecks(t, p, m)
	}
}

// extendChecks extrapolates model above, between and below its profiled
// scale factors: an accepted profile extends without error (unless a figure
// overflows), and every extrapolated figure is finite and >= 0, zero where
// the anchor's is.
func extendChecks(t *testing.T, p *Profile, model string) {
	t.Helper()
	sfs := p.ScaleFactors(model)
	pairs := []Pair{{model, 2*sfs[len(sfs)-1] + 1}}
	if sfs[0] > 1 {
		pairs = append(pairs, Pair{model, sfs[0] - 1})
	}
	for i := 1; i < len(sfs); i++ {
		if sfs[i]-sfs[i-1] > 1 {
			pairs = append(pairs, Pair{model, sfs[i-1] + 1})
		}
	}
	q, xs, err := p.Extend(pairs)
	if err != nil {
		if !strings.Contains(err.Error(), "want a finite number") {
			t.Fatalf("Extend(%v): %v", pairs, err)
		}
		return
	}
	for _, x := range xs {
		for _, typ := range p.Types() {
			anchor, aerr := p.Throughput(model, x.Anchor, typ, false)
			v, err := q.Throughput(model, x.Pair.ScaleFactor, typ, false)
			if (aerr == nil) != (err == nil) || err == nil && (v < 0 || math.IsInf(v, 0) || anchor == 0 && v != 0) {
				t.Fatalf("%s on %s: %v (%v), anchor %d gives %v (%v)", x.Pair, typ, v, err, x.Anchor, anchor, aerr)
			}
		}
	}
}
