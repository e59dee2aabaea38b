package trace

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
)

func TestSiaPhillyWorkloads(t *testing.T) {
	tests := []struct {
		name        string
		draw        func(int64) ([]planner.Job, error)
		jobs        int
		lastMinH    float64 // bounds on the last arrival, hours: 20/h for jobs-1 gaps
		lastMaxH    float64
		oneGPUShare [2]float64
	}{
		// 159 exponential gaps of mean 3 min: 7.95 h, sd 0.63 h.
		{"philly-8h", SiaPhilly, 160, 6, 10, [2]float64{0.55, 0.82}},
		// 959 gaps: 47.95 h, sd 1.5 h.
		{"philly-48h", SiaPhillyLong, 960, 43, 53, [2]float64{0.63, 0.75}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for seed := int64(1); seed <= 5; seed++ {
				jobs, err := tc.draw(seed)
				if err != nil {
					t.Fatal(err)
				}
				if len(jobs) != tc.jobs {
					t.Fatalf("seed %d: %d jobs, want %d", seed, len(jobs), tc.jobs)
				}
				if last := jobs[len(jobs)-1].Arrival / 3600; jobs[0].Arrival != 0 || last < tc.lastMinH || last > tc.lastMaxH {
					t.Errorf("seed %d: arrivals from %v s to %.2f h, want 0 to %v-%v h", seed, jobs[0].Arrival, last, tc.lastMinH, tc.lastMaxH)
				}
				one := 0
				for _, j := range jobs {
					// 32-GPU jobs are capped to 16: no type of the cluster has 32.
					if !map[int]bool{1: true, 2: true, 4: true, 8: true, 16: true}[j.ScaleFactor] {
						t.Fatalf("seed %d: %s on %d GPUs, want a Philly size capped at 16", seed, j.ID, j.ScaleFactor)
					}
					if j.ScaleFactor == 1 {
						one++
					}
				}
				if share := float64(one) / float64(len(jobs)); share < tc.oneGPUShare[0] || share > tc.oneGPUShare[1] {
					t.Errorf("seed %d: %.3f of jobs on one GPU, want about 0.687 (PhillySizes)", seed, share)
				}
				// The jobs resolve against Gavel's profile on the cluster's
				// types, the 16-GPU ones extrapolated, as hadar sim runs them.
				if _, err := profile.Default().Resolve(jobs, []planner.GPUType{"k80", "p100", "v100"}, profile.Extrapolate, nil); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
			}
			a, errA := tc.draw(7)
			b, errB := tc.draw(7)
			c, errC := tc.draw(8)
			if errA != nil || errB != nil || errC != nil {
				t.Fatal(errA, errB, errC)
			}
			if !reflect.DeepEqual(a, b) {
				t.Error("same seed, different jobs")
			}
			if reflect.DeepEqual(a, c) {
				t.Error("seeds 7 and 8 drew the same jobs")
			}
		})
	}
}

// For a seed, the 8-hour workload is the first 160 jobs of the 48-hour
// one: each quantity has its own stream, drawn job by job.
func TestSiaPhillyPrefix(t *testing.T) {
	short, err := SiaPhilly(3)
	if err != nil {
		t.Fatal(err)
	}
	long, err := SiaPhillyLong(3)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(short, long[:len(short)]) {
		t.Error("philly-8h is not the start of philly-48h for seed 3")
	}
}

// The large jobs the cap folds in keep the trace's share: 16 and 32 GPUs
// were 2.3 % of PhillySizes' jobs, so about 2.3 % are on 16 GPUs now.
func TestSiaPhillyLargeShare(t *testing.T) {
	jobs, err := SiaPhillyLong(1)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, j := range jobs {
		if j.ScaleFactor == 16 {
			n++
		}
	}
	if share := float64(n) / float64(len(jobs)); share < 0.01 || share > 0.04 {
		t.Errorf("%.3f of jobs on 16 GPUs, want about 0.023", share)
	}
}

func TestCapSizes(t *testing.T) {
	cluster := func(spec string) planner.Cluster {
		c, err := planner.ParseClusterSpec(spec, 4)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	got, err := CapSizes(PhillySizes(), cluster(SiaCluster))
	if err != nil {
		t.Fatal(err)
	}
	want := SizeMix{ScaleFactors: []int{1, 2, 4, 8, 16}, Weights: []float64{10480, 463, 2044, 1916, 255 + 91}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Philly sizes on %s: %v, want %v", SiaCluster, got, want)
	}
	// 32 GPUs of one type: nothing to cap.
	if got, err := CapSizes(PhillySizes(), cluster("v100=32,k80=8")); err != nil || !reflect.DeepEqual(got, PhillySizes()) {
		t.Errorf("on 32 V100s: %v, %v; want the mix unchanged", got, err)
	}
	// 6 GPUs at most: 8, 16 and 32 fold into 4.
	got, err = CapSizes(PhillySizes(), cluster("v100=6,k80=6"))
	if err != nil || !reflect.DeepEqual(got.ScaleFactors, []int{1, 2, 4}) || got.Weights[2] != 2044+1916+255+91 {
		t.Errorf("on 6 GPUs a type: %v, %v", got, err)
	}
	if _, err := CapSizes(SizeMix{ScaleFactors: []int{8}, Weights: []float64{1}}, cluster("v100=4")); err == nil || !strings.Contains(err.Error(), "at least 8 GPUs of one type") {
		t.Errorf("no size fits: error %v", err)
	}
	if _, err := CapSizes(SizeMix{}, cluster("v100=4")); err == nil {
		t.Error("empty mix: want an error")
	}
}

func TestLookupWorkload(t *testing.T) {
	w, err := LookupWorkload(" Philly-8H ")
	if err != nil || w.Name != "philly-8h" || w.Jobs != 160 || w.RatePerHour != 20 || w.Cluster != SiaCluster {
		t.Errorf("philly-8h: %+v, %v", w, err)
	}
	if _, err := LookupWorkload("sia"); err == nil || !strings.Contains(err.Error(), "philly-8h, philly-48h") {
		t.Errorf("unknown workload: error %v, want one listing the names", err)
	}
	// Workloads hands out copies: changing one leaves the table alone.
	ws := Workloads()
	ws[0].Sizes.Weights[0] = 0
	if again := Workloads(); again[0].Sizes.Weights[0] != 10480 {
		t.Error("Workloads shares its size mix with callers")
	}
}
