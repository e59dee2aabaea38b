package planner

import (
	"math"
	"testing"
)

func TestJobWidths(t *testing.T) {
	base := Job{ID: "a", Model: "m", ScaleFactor: 2, TotalSteps: 1, Weight: 1}
	for _, c := range []struct {
		widths []int
		ok     bool
	}{
		{nil, true},
		{[]int{2}, true},
		{[]int{1, 2, 4}, true},
		{[]int{1, 4}, false},    // lacks the scale factor
		{[]int{2, 1, 4}, false}, // not sorted
		{[]int{0, 2}, false},    // not positive
		{[]int{2, 2}, false},    // repeated
	} {
		j := base
		j.Widths = c.widths
		if err := j.Validate(); (err == nil) != c.ok {
			t.Errorf("widths %v: Validate = %v, want ok=%v", c.widths, err, c.ok)
		}
	}
	j := base
	j.Widths = []int{1, 2, 4}
	if !j.Elastic() || !j.AllowsWidth(4) || j.AllowsWidth(8) || !base.AllowsWidth(2) || base.AllowsWidth(1) || base.Elastic() {
		t.Errorf("Elastic/AllowsWidth wrong")
	}
}

func TestWeightOr1(t *testing.T) {
	for _, c := range []struct{ w, want float64 }{{2.5, 2.5}, {1, 1}, {0, 1}, {-3, 1}, {math.NaN(), 1}} {
		if got := (Job{Weight: c.w}).WeightOr1(); got != c.want {
			t.Errorf("Job{Weight: %v}.WeightOr1() = %v, want %v", c.w, got, c.want)
		}
	}
}
