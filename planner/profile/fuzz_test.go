package profile

import (
	"bytes"
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
	}
}
