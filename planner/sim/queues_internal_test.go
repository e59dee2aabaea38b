package sim

import (
	"math"
	"testing"
)

func TestWaterFill(t *testing.T) {
	for _, c := range []struct {
		want, weight []float64
		total        float64
		out          []float64
	}{
		{[]float64{10, 10}, []float64{1, 1}, 8, []float64{4, 4}},
		{[]float64{10, 2}, []float64{1, 1}, 8, []float64{6, 2}},         // b wants less than half: a gets the rest
		{[]float64{10, 10}, []float64{3, 1}, 8, []float64{6, 2}},        // by weight
		{[]float64{1, 0, 1}, []float64{1, 1, 1}, 8, []float64{1, 0, 1}}, // no one gets more than it wants
		{[]float64{0, 0}, []float64{1, 1}, 8, []float64{0, 0}},
	} {
		got := waterFill(c.want, c.weight, c.total)
		for q := range got {
			if math.Abs(got[q]-c.out[q]) > 1e-9 {
				t.Fatalf("waterFill(%v, %v, %v) = %v, want %v", c.want, c.weight, c.total, got, c.out)
			}
		}
	}
}

func TestJain(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{1, 1, 1}, 1},
		{[]float64{1, 0, 0, 0}, 0.25},
		{[]float64{2, 1}, 0.9},
		{nil, 0},
	} {
		if got := Jain(c.xs); math.Abs(got-c.want) > 1e-12 {
			t.Fatalf("Jain(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}
