package trace

import (
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

func TestMakeElastic(t *testing.T) {
	var jobs []planner.Job
	for i := range 400 {
		jobs = append(jobs, planner.Job{ID: string(rune('a'+i%26)) + string(rune('0'+i/26)), Model: "m", ScaleFactor: []int{1, 2, 4, 8}[i%4], TotalSteps: 1, Weight: 1})
	}
	jobs = append(jobs, planner.Job{ID: "lone", Model: "only8", ScaleFactor: 8, TotalSteps: 1, Weight: 1})
	prof := func(m string) []int {
		if m == "only8" {
			return []int{8}
		}
		return []int{1, 2, 4, 8}
	}
	got, err := MakeElastic(jobs, 0.5, 1, prof)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := MakeElastic(jobs, 0.5, 1, prof)
	other, _ := MakeElastic(jobs, 0.5, 2, prof)
	n, differ := 0, 0
	for i, j := range got {
		if len(jobs[i].Widths) != 0 {
			t.Fatal("input changed")
		}
		if !slices.Equal(j.Widths, again[i].Widths) {
			t.Fatalf("job %s: not deterministic", j.ID)
		}
		if !slices.Equal(j.Widths, other[i].Widths) {
			differ++
		}
		if len(j.Widths) == 0 {
			continue
		}
		n++
		if err := j.Validate(); err != nil {
			t.Fatal(err)
		}
		want := map[int][]int{1: {1, 2}, 2: {1, 2, 4}, 4: {1, 2, 4, 8}, 8: {1, 2, 4, 8}}[j.ScaleFactor]
		if !slices.Equal(j.Widths, want) {
			t.Fatalf("job %s of scale factor %d: widths %v, want %v", j.ID, j.ScaleFactor, j.Widths, want)
		}
	}
	if n < 160 || n > 240 {
		t.Fatalf("%d of 401 jobs elastic at 0.5", n)
	}
	if differ == 0 {
		t.Fatal("another seed drew the same jobs")
	}
	if len(got[400].Widths) != 0 {
		t.Fatal("a job with no other profiled width became elastic")
	}
	if all, _ := MakeElastic(jobs, 1, 1, prof); len(all[0].Widths) == 0 {
		t.Fatal("fraction 1 left a job rigid")
	}
	if _, err := MakeElastic(jobs, 1.5, 1, prof); err == nil {
		t.Fatal("fraction 1.5 accepted")
	}
}
