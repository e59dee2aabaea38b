package engine

import (
	"fmt"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
)

// Learned keys are bounded in number and expire by their last observation
// (issue 31, item 11: every key ever seen was kept, saved and refitted).
func TestLearnedKeysAreBoundedAndExpire(t *testing.T) {
	est, err := NewEstimates(profile.Default(), LearnConfig{On: true, Warmup: 30, MinEvidence: 300})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < MaxKeys+10; i++ {
		k := estKey{fmt.Sprintf("m%d", i), 1, planner.GPUType("h100")}
		est.observe(k, "j", 100, 10, 100, float64(i))
	}
	est.prune(MaxKeys + 10)
	if len(est.corr) != MaxKeys {
		t.Fatalf("%d keys kept, want %d", len(est.corr), MaxKeys)
	}
	if _, ok := est.corr[estKey{"m0", 1, "h100"}]; ok {
		t.Fatal("the least recently observed key was kept")
	}
	if _, ok := est.rate[estKey{"m0", 1, "h100"}]; ok {
		t.Fatal("a forgotten key's rate was kept")
	}
	recent := estKey{fmt.Sprintf("m%d", MaxKeys+9), 1, "h100"}
	if _, ok := est.corr[recent]; !ok {
		t.Fatal("the most recent key was dropped")
	}
	est.prune(MaxKeys + 9 + LedgerTTL + 1)
	if len(est.corr) != 0 || len(est.rate) != 0 {
		t.Fatalf("%d keys, %d rates kept past LedgerTTL", len(est.corr), len(est.rate))
	}
}
