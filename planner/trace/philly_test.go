package trace

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
)

// The embedded table is Gavel's list as data/README.md describes it: the
// counts by size, the range, and the correlation between size and run time
// that drawing the two together keeps.
func TestPhillyJobs(t *testing.T) {
	jobs := PhillyJobs()
	if len(jobs) != 33192 {
		t.Fatalf("%d jobs, want 33,192", len(jobs))
	}
	bySize := map[int][]float64{}
	for _, j := range jobs {
		bySize[j.GPUs] = append(bySize[j.GPUs], j.Seconds)
	}
	counts := map[int]int{}
	for g, s := range bySize {
		counts[g] = len(s)
	}
	if want := map[int]int{1: 25304, 2: 665, 4: 3076, 8: 4147}; !reflect.DeepEqual(counts, want) {
		t.Errorf("jobs by size %v, want %v", counts, want)
	}
	median := func(s []float64) float64 { s = slices.Sorted(slices.Values(s)); return s[(len(s)-1)/2] / 3600 }
	lo, hi := math.Inf(1), 0.0
	for _, j := range jobs {
		lo, hi = min(lo, j.Seconds), max(hi, j.Seconds)
	}
	if lo != 3600 || hi != 5196151 {
		t.Errorf("run times %v to %v s, want 3,600 (1 h) to 5,196,151 (60 days)", lo, hi)
	}
	if m1, m8 := median(bySize[1]), median(bySize[8]); math.Abs(m1-2.97) > 0.01 || math.Abs(m8-17.94) > 0.01 {
		t.Errorf("median run time %.2f h on 1 GPU, %.2f h on 8, want 2.97 and 17.94", m1, m8)
	}
	// Callers get a copy.
	jobs[0].GPUs = 99
	if PhillyJobs()[0].GPUs == 99 {
		t.Error("PhillyJobs shares its table with callers")
	}
}

func TestParseJobSamples(t *testing.T) {
	got, err := ParseJobSamples(strings.NewReader("seconds,gpus\n3600,1\n7200.5,8\n"))
	if err != nil || !reflect.DeepEqual(got, []JobSample{{3600, 1}, {7200.5, 8}}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "header"},
		{"gpus,seconds\n1,3600\n", `want "seconds,gpus"`},
		{"seconds,gpus\n", "no jobs"},
		{"seconds,gpus\n-1,1\n", "line 2: seconds"},
		{"seconds,gpus\nNaN,1\n", "line 2: seconds"},
		{"seconds,gpus\n+Inf,1\n", "line 2: seconds"},
		{"seconds,gpus\n60,1\n60,0\n", "line 3: gpus"},
		{"seconds,gpus\n60,1,2\n", "wrong number of fields"},
	} {
		if _, err := ParseJobSamples(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one with %q", tc.in, err, tc.want)
		}
	}
}

// With Samples each job takes one sample's run time and size together:
// here the 1-GPU jobs all run 100 s and the 2-GPU jobs 10,000 s, which no
// draw of the two apart gives.
func TestSynthesizeSamples(t *testing.T) {
	const model = "ResNet-50 (batch size 64)"
	samples := []JobSample{{100, 1}, {10000, 2}}
	jobs, err := Synthesize(SynthConfig{Jobs: 400, Seed: 3, Models: []string{model}, Samples: samples})
	if err != nil {
		t.Fatal(err)
	}
	n := map[int]int{}
	for _, j := range jobs {
		thr, err := profile.Default().Throughput(model, j.ScaleFactor, "v100", false)
		if err != nil {
			t.Fatal(err)
		}
		want := map[int]float64{1: 100, 2: 10000}[j.ScaleFactor]
		if d := j.TotalSteps / thr; math.Abs(d-want) > 1/thr {
			t.Fatalf("%s on %d GPUs runs %.1f s on the V100, want %v", j.ID, j.ScaleFactor, d, want)
		}
		n[j.ScaleFactor]++
	}
	if n[1] < 160 || n[2] < 160 {
		t.Errorf("sizes drawn %v of 400, want about half each", n)
	}
	for _, tc := range []struct {
		cfg  SynthConfig
		want string
	}{
		{SynthConfig{Jobs: 1, Samples: samples, ScaleFactors: []int{1}, ScaleFactorWeights: []float64{1}}, "leave Durations, ScaleFactors"},
		{SynthConfig{Jobs: 1, Samples: samples, Durations: &DurationDist{Unit: 1}}, "leave Durations"},
		{SynthConfig{Jobs: 1, Samples: []JobSample{}}, "Samples is empty"},
		{SynthConfig{Jobs: 1, Samples: []JobSample{{0, 1}}}, "Samples[0]"},
		{SynthConfig{Jobs: 1, Samples: []JobSample{{60, 1}, {60, -2}}}, "Samples[1]"},
	} {
		if _, err := Synthesize(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one with %q", tc.cfg, err, tc.want)
		}
	}
}

// With samples the offered work is the mean of run time times size, not
// the product of the means: (100*1 + 10000*2)/2 = 10,050 GPU-seconds a job
// (the product of the means, 5,050 * 1.5, is 7,575).
func TestRateForLoadSamples(t *testing.T) {
	c, err := planner.ParseClusterSpec("v100=8", 8)
	if err != nil {
		t.Fatal(err)
	}
	cfg := SynthConfig{Models: []string{"ResNet-50 (batch size 64)"}, Samples: []JobSample{{100, 1}, {10000, 2}}}
	rate, err := RateForLoad(cfg, c, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if want := 0.5 * 8 * 3600 / 10050.0; math.Abs(rate-want) > 1e-9*want {
		t.Errorf("rate %v jobs/h, want %v", rate, want)
	}
}

func TestPhillyTraceWorkloads(t *testing.T) {
	for _, tc := range []struct {
		name string
		jobs int
	}{{"philly-trace-8h", 160}, {"philly-trace-48h", 960}} {
		w, err := LookupWorkload(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		cluster, err := planner.ParseClusterSpec(w.Cluster, 4)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := w.Config(5, cluster, nil)
		if err != nil {
			t.Fatal(err)
		}
		jobs, err := Synthesize(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != tc.jobs {
			t.Fatalf("%s: %d jobs, want %d", tc.name, len(jobs), tc.jobs)
		}
		one := 0
		for _, j := range jobs {
			thr, err := profile.Default().Throughput(j.Model, j.ScaleFactor, "v100", false)
			if err != nil {
				t.Fatalf("%s: %s: %v", tc.name, j.ID, err)
			}
			// Every run time is one of the trace's: 1 h to 60 days.
			if d := j.TotalSteps / thr; d < 3600-1/thr || d > 5196151+1/thr {
				t.Fatalf("%s: %s runs %.0f s on the V100, want 1 h to 60 days", tc.name, j.ID, d)
			}
			if j.ScaleFactor == 1 {
				one++
			}
		}
		// 25,304 of 33,192 jobs (0.762) are on one GPU.
		if share := float64(one) / float64(len(jobs)); share < 0.62 || share > 0.9 {
			t.Errorf("%s: %.3f of jobs on one GPU, want about 0.762", tc.name, share)
		}
	}
	short, errS := synthesizeNamed("philly-trace-8h", 4)
	long, errL := synthesizeNamed("philly-trace-48h", 4)
	if errS != nil || errL != nil || !reflect.DeepEqual(short, long[:len(short)]) {
		t.Errorf("philly-trace-8h is not the start of philly-trace-48h for seed 4 (%v, %v)", errS, errL)
	}
}

func TestCapSamples(t *testing.T) {
	c, err := planner.ParseClusterSpec("v100=6,k80=6", 2)
	if err != nil {
		t.Fatal(err)
	}
	in := []JobSample{{10, 1}, {20, 4}, {30, 8}, {40, 2}}
	got, err := CapSamples(in, c)
	if want := []JobSample{{10, 1}, {20, 4}, {30, 4}, {40, 2}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("on 6 GPUs a type: %v, %v; want %v", got, err, want)
	}
	if in[2].GPUs != 8 {
		t.Error("CapSamples changed its input")
	}
	if _, err := CapSamples([]JobSample{{10, 8}}, c); err == nil || !strings.Contains(err.Error(), "at least 8 GPUs of one type") {
		t.Errorf("no size fits: error %v", err)
	}
}
