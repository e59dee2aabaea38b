package trace

import (
	"bytes"
	"io"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

// Seeds beyond these live in testdata/fuzz/<target>/.

func FuzzParseGavel(f *testing.F) {
	f.Add([]byte("ResNet-18 (batch size 16)\tpython3 main.py\tdir\t--num_steps\t1\t100\t2\t1\t-1.000000\t0\n"))
	f.Add([]byte("a\tc\td\t-n\t0\t20\t2\t2\t-1\t7.5\r\n\nb\tc\td\t-n\t1\t1e3\t1\t1\t-1\t0\n"))
	f.Add([]byte("A3C\tcd %s/rl && python3 main.py\t--max-steps\t0\t5000\t12.000000\t16\n\nLM (batch size 5)\tcmd\t--steps\t1\t7\t0.5\t1\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) { checkParsed(t, ParseGavel, data) })
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("id,model,scale_factor,total_steps,weight,arrival_s,slo_s\njob-0,\"m, x\",2,100,1,0,0\n# c\njob-1,m,1,5.5,2,3,60\n"))
	f.Add([]byte("id,model,scale_factor,total_steps,weight,arrival_s,slo_s\r\nj,m,1,1,1,1e8,0\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) { checkParsed(t, Parse, data) })
}

// checkParsed checks what every accepted trace keeps: valid jobs with unique
// IDs, sorted by arrival, and an own-format round trip that changes nothing.
func checkParsed(t *testing.T, parse func(io.Reader) ([]planner.Job, error), data []byte) {
	jobs, err := parse(bytes.NewReader(data))
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for i, j := range jobs {
		if err := j.Validate(); err != nil {
			t.Fatalf("accepted an invalid job: %v", err)
		}
		if seen[j.ID] {
			t.Fatalf("duplicate ID %q", j.ID)
		}
		seen[j.ID] = true
		if i > 0 && j.Arrival < jobs[i-1].Arrival {
			t.Fatalf("not sorted by arrival at %d", i)
		}
	}
	var buf bytes.Buffer
	if err := Write(&buf, jobs); err != nil {
		t.Fatalf("Write of parsed jobs: %v", err)
	}
	again, err := Parse(&buf)
	if err != nil {
		t.Fatalf("Parse of Write output: %v", err)
	}
	if !reflect.DeepEqual(again, jobs) {
		t.Fatalf("round trip changed the jobs")
	}
}

func FuzzParseSizeMix(f *testing.F) {
	f.Add("philly")
	f.Add("1=70,2=10,4=15,8=5")
	f.Add("16=1, 32=0.5")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseSizeMix(s)
		if err != nil {
			return
		}
		if len(m.ScaleFactors) == 0 || len(m.ScaleFactors) != len(m.Weights) {
			t.Fatalf("%q: %v: want one weight per scale factor, at least one", s, m)
		}
		for i, sf := range m.ScaleFactors {
			if sf <= 0 || slices.Contains(m.ScaleFactors[:i], sf) {
				t.Fatalf("%q: scale factors %v: want distinct positive integers", s, m.ScaleFactors)
			}
			if w := m.Weights[i]; math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
				t.Fatalf("%q: weight %v", s, w)
			}
		}
	})
}
