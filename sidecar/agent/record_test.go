package agent

import (
	"fmt"
	"testing"

	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// The record counts cycles, rounds and repairs, keeps the last decision,
// and keeps the newest maxHistory events, each job's in order; a restore
// takes the saved history and rounds only.
func TestRecord(t *testing.T) {
	var r record
	if r.repairCounts() != nil || r.events() != nil || r.eventsOf("j") != nil {
		t.Fatal("an empty record holds something")
	}
	r.cycle()
	r.cycle()
	r.round()
	r.decided(engine.Decision{Time: 3, Kind: engine.Boundary})
	r.repaired(wire.RepairPlacement)
	r.repaired(wire.RepairPlacement)
	r.repaired(wire.RepairFallback)
	if r.cycles != 2 || r.rounds != 1 || r.last.Time != 3 || r.last.Kind != engine.Boundary {
		t.Fatalf("cycles %d, rounds %d, last %+v", r.cycles, r.rounds, r.last)
	}
	rc := r.repairCounts()
	if rc[wire.RepairPlacement] != 2 || rc[wire.RepairFallback] != 1 {
		t.Fatalf("repairs %v", rc)
	}
	rc[wire.RepairFallback] = 9 // a copy: the record keeps its count
	if r.repairCounts()[wire.RepairFallback] != 1 {
		t.Fatal("repairCounts is not a copy")
	}

	for i := range maxHistory + 10 {
		r.note(wire.Event{Job: fmt.Sprintf("j%d", i%2), Result: fmt.Sprint(i)})
	}
	evs := r.events()
	if len(evs) != maxHistory || evs[0].Result != "10" || evs[len(evs)-1].Result != fmt.Sprint(maxHistory+9) {
		t.Fatalf("%d events from %s to %s", len(evs), evs[0].Result, evs[len(evs)-1].Result)
	}
	evs[0].Result = "changed" // a copy
	if r.history[0].Result != "10" {
		t.Fatal("events is not a copy")
	}
	odd := r.eventsOf("j1")
	if len(odd) != maxHistory/2 || odd[0].Result != "11" {
		t.Fatalf("%d events of j1, first %s", len(odd), odd[0].Result)
	}

	r.restore([]wire.Event{{Job: "k"}}, 7)
	if len(r.history) != 1 || r.rounds != 7 || r.cycles != 2 || r.repairs[wire.RepairPlacement] != 2 {
		t.Fatalf("restored: %d events, %d rounds, %d cycles, repairs %v", len(r.history), r.rounds, r.cycles, r.repairs)
	}
}
