package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The warnings remembered are bounded and expire (issue 31, item 11: the
// map grew with every key ever warned of).
func TestWarnedIsBoundedAndExpires(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	a := &Agent{log: hclog.NewNullLogger(), clock: func() time.Time { return now }}
	for i := 0; i < 3*maxWarned; i++ {
		a.warnOnce(fmt.Sprintf("k%d", i), "w")
	}
	if len(a.warned) > maxWarned {
		t.Fatalf("%d warnings remembered, want at most %d", len(a.warned), maxWarned)
	}
	a.warned = nil
	a.warnOnce("gap", "w")
	first := a.warned["gap"]
	now = now.Add(warnTTL / 2)
	a.warnOnce("gap", "w")
	if a.warned["gap"] != first {
		t.Fatal("warned again within warnTTL")
	}
	now = now.Add(warnTTL)
	a.warnOnce("other", "w")
	a.warnOnce("gap", "w")
	if !a.warned["gap"].Equal(now) {
		t.Fatal("not warned again once warnTTL passed")
	}
}
