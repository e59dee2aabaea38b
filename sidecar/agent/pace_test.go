package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/planner/engine"
)

// The warnings remembered are bounded and expire (issue 31, item 11: the
// map grew with every key ever warned of).
func TestWarnedIsBoundedAndExpires(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	var p pacer
	for i := 0; i < 3*maxWarned; i++ {
		if p.silenced(fmt.Sprintf("k%d", i), now) {
			t.Fatalf("k%d silenced before it was ever given", i)
		}
	}
	if len(p.warned) > maxWarned {
		t.Fatalf("%d warnings remembered, want at most %d", len(p.warned), maxWarned)
	}
	p = pacer{}
	p.silenced("gap", now)
	now = now.Add(warnTTL / 2)
	if !p.silenced("gap", now) {
		t.Fatal("warned again within warnTTL")
	}
	now = now.Add(warnTTL)
	p.silenced("other", now)
	if p.silenced("gap", now) || !p.warned["gap"].Equal(now) {
		t.Fatal("not warned again once warnTTL passed")
	}
}

// A boundary is due from the time it was set for, and each one planned
// sets the next one round on; the zero pacer plans at once.
func TestPacerRounds(t *testing.T) {
	var p pacer
	now := time.Unix(1_000_000, 0)
	if !p.due(now) {
		t.Fatal("the zero pacer does not plan a boundary at once")
	}
	p.planned(now, time.Minute)
	if p.due(now.Add(59*time.Second)) || !p.due(now.Add(time.Minute)) {
		t.Fatalf("next boundary %v: due too early or not at all", p.nextRound())
	}
	p.planAt(now)
	if !p.due(now) || !p.nextRound().Equal(now) {
		t.Fatal("planAt did not make a boundary due")
	}
}

// Cycles are reported to the function registered, and only then timed.
func TestPacerReportsCycles(t *testing.T) {
	var p pacer
	if p.reporting() {
		t.Fatal("the zero pacer reports")
	}
	p.cycled(engine.Fill, time.Second) // nobody to tell: no panic
	var got []time.Duration
	p.report(func(k engine.Kind, d time.Duration) {
		if k != engine.Boundary {
			t.Errorf("kind %v, want a boundary", k)
		}
		got = append(got, d)
	})
	p.cycled(engine.Boundary, 2*time.Second)
	if !p.reporting() || len(got) != 1 || got[0] != 2*time.Second {
		t.Fatalf("reported %v", got)
	}
}
