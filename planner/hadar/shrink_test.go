package hadar

import (
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

// Job a (elastic, widths 2, 4 and 8) runs on all 8 V100s, 10 h of work
// left at 8 (T(8) = 36); rigid job b (2 GPUs, 10 steps/s) arrives with
// 10 h of work, denser per GPU-round (R/(10 h * 2) against R/(10 h * 8)).
// The restart is 60 s. Waiting, b is done in 10 h + 60 s + 10 h; started
// now, in 10 h + 60 s: a gain of 10 h. Preempting a whole costs a its
// restart and 10 h of waiting, more than the gain: no preemption. But a
// may shrink to 4: with T(4) = 19 it is done in 60 s + 36/19 * 10 h =
// 19.0 h instead of 10 h, a loss of 9.0 h under b's 10 h gain, so a
// shrinks and b starts. With T(4) = 15 a loses 60 s + 14 h, more than b
// gains (at 2, T(2) = 8, it loses even more): a keeps its 8 and b waits.
func TestElasticShrinkForAWaitingJob(t *testing.T) {
	prev := map[string]planner.Placement{"a": {Units: []planner.Unit{{Slots: []planner.Slot{{Node: "v0", Type: "v100", Count: 8}}}}}}
	for _, tc := range []struct {
		name  string
		a     map[int]float64
		wantA int
		wantB int
	}{
		{"pays", map[int]float64{2: 10, 4: 19, 8: 36}, 4, 2},
		{"does not pay", map[int]float64{2: 8, 4: 15, 8: 36}, 8, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := widthRates{"a": tc.a, "b": {2: 10}}
			v := elasticView(prof, 360, prev, map[string]float64{"a": 36 * 36000, "b": 10 * 36000})
			b := v.Jobs[1]
			b.Widths, b.WidthThroughput = nil, nil
			got := planned(t, elasticSched(t, prof, Config{RestartCost: 60}), v)
			if got["a"] != tc.wantA || got["b"] != tc.wantB {
				t.Fatalf("a on %d GPUs, b on %d; want %d and %d: a: %s; b: %s", got["a"], got["b"], tc.wantA, tc.wantB, why(v, "a"), why(v, "b"))
			}
			if tc.wantA == 4 {
				want := "shrinks to 4 workers for b: done in about 19.0 h instead of 10.0 h at 8, a loss of 9.0 h (its 60 s restart included) against 10.0 h gained"
				if w := why(v, "a"); !strings.Contains(w, want) {
					t.Fatalf("a's reason %q lacks %q", w, want)
				}
				if w := why(v, "b"); !strings.Contains(w, "starts on GPUs a gives up") {
					t.Fatalf("b's reason %q", w)
				}
			} else if w := why(v, "a"); strings.Contains(w, "shrinks") {
				t.Fatalf("a's reason %q", w)
			}
		})
	}
}
