package netmodel

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzParseTopology: the parser never panics, and whatever it accepts can
// be priced to a finite, positive time. Seeds: the example topologies and
// testdata/fuzz/FuzzParseTopology.
func FuzzParseTopology(f *testing.F) {
	examples, _ := filepath.Glob(filepath.Join("examples", "*.json"))
	for _, path := range examples {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(minimalTopology))
	f.Fuzz(func(t *testing.T, data []byte) {
		tp, err := ParseTopology("fuzz.json", data)
		if err != nil {
			return
		}
		// Price a two-worker job on the first and last nodes at a few times.
		nodes := tp.Nodes()
		p := Placement{{nodes[0].ID, 0}}
		if len(nodes) > 1 {
			p = append(p, Worker{nodes[len(nodes)-1].ID, 0})
		} else if nodes[0].GPUs > 1 {
			p = append(p, Worker{nodes[0].ID, 1})
		}
		job := &JobComm{Bytes: 1e8, Overlap: 0.3, Compute: map[string]float64{}}
		for _, n := range nodes {
			job.Compute[n.GPUType] = 0.1
		}
		for _, at := range []time.Duration{0, time.Hour, 1000 * time.Hour} {
			pr, err := tp.Price(job, p, at)
			if err != nil {
				t.Fatalf("accepted topology cannot price %v: %v", p, err)
			}
			if !(pr.Iteration > 0) || math.IsInf(pr.Iteration, 0) || !(pr.Slowdown >= 1) || math.IsInf(pr.Slowdown, 0) {
				t.Fatalf("accepted topology priced %v as %+v", p, pr)
			}
		}
	})
}
