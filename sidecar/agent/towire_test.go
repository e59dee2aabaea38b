package agent

import (
	"reflect"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Each engine enum maps to the wire constant of the same meaning and
// value: the API keeps its values whatever the engine renames.
func TestWireEnums(t *testing.T) {
	actions := map[engine.Action]wire.Action{engine.Start: wire.ActionStart, engine.Keep: wire.ActionKeep, engine.Stop: wire.ActionStop,
		engine.Move: wire.ActionMove, engine.Fork: wire.ActionFork, engine.Unfork: wire.ActionUnfork, engine.Wait: wire.ActionWait}
	for e, w := range actions {
		if got := wireAction(e); got != w || string(e) != string(w) {
			t.Errorf("engine action %q is %q on the wire, want %q", e, got, w)
		}
	}
	kinds := map[engine.Kind]wire.Kind{engine.Boundary: wire.KindRound, engine.Fill: wire.KindFill, engine.None: wire.KindNone}
	for e, w := range kinds {
		if got := wireKind(e); got != w || string(e) != string(w) {
			t.Errorf("engine kind %q is %q on the wire, want %q", e, got, w)
		}
	}
	if got := wireAction("later"); got != "later" {
		t.Errorf("an action the wire does not know is %q, want it as it is", got)
	}
}

// The conversions carry every field: each planner value below has every
// field set, so a wire field left zero is one the conversion forgot (or
// a field the planner gained that the wire does not show yet: then
// decide whether the API shows it).
func TestWireConversionsCarryEveryField(t *testing.T) {
	reason := round.Reason{Share: []float64{0.5}, Priority: 1, Price: 2, Utility: 3, Timer: 4, Waited: 5, Why: "why"}
	units := []planner.Unit{{Slots: []planner.Slot{{Node: "n1", Type: "v100", Count: 2}}}}
	learned := []engine.Learned{{Model: "m", SF: 2, Type: "v100", Profile: 1, Factor: 2, Rate: 3, Applied: true, Seconds: 4, Jobs: 5}}
	gaps := []engine.Gap{{Model: "m", Type: "b200", Why: "why"}}
	for _, c := range []struct {
		name     string
		from, to any
	}{
		{"reason", reason, wireReason(reason)},
		{"units", units[0].Slots[0], wireUnits(units)[0].Slots[0]},
		{"learned", learned[0], wireFigures(learned)[0]},
		{"gap", gaps[0], wireGaps(gaps)[0]},
	} {
		if n, m := reflect.TypeOf(c.from).NumField(), reflect.TypeOf(c.to).NumField(); n != m {
			t.Errorf("%s: %T has %d fields, %T %d", c.name, c.from, n, c.to, m)
		}
		for _, f := range reflect.VisibleFields(reflect.TypeOf(c.from)) {
			if reflect.ValueOf(c.from).FieldByIndex(f.Index).IsZero() {
				t.Fatalf("%s: the test's %T leaves %s zero", c.name, c.from, f.Name)
			}
		}
		for _, f := range reflect.VisibleFields(reflect.TypeOf(c.to)) {
			if reflect.ValueOf(c.to).FieldByIndex(f.Index).IsZero() {
				t.Errorf("%s: %T.%s is not carried over", c.name, c.to, f.Name)
			}
		}
	}
	if wireUnits(nil) != nil || wireGaps(nil) != nil || wireTypeSpeeds(nil) != nil {
		t.Error("nil became empty: the API writes null for it")
	}
	if got := wireTypeSpeeds(map[planner.GPUType]float64{"v100": 1}); got["v100"] != 1 {
		t.Errorf("type speeds %v", got)
	}
}
