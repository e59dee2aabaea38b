package registry

import (
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/speed"
)

func TestHadarAblationSwitches(t *testing.T) {
	o := Options{Speed: speed.Model{Profile: profile.Default()}}
	for name, want := range map[string]string{
		"hadar":                       "hadar",
		"hadar:flat":                  "hadar:flat",
		"hadar-jct:nobackfill:flat":   "hadar-jct:flat:nobackfill",
		"hadare:noguide":              "hadare:noguide",
		"HADAR:nodeprices:nobackfill": "hadar:nodeprices:nobackfill",
		"hadar:h8:flat":               "hadar:flat:h8",
		"hadar:crit0.7":               "hadar:crit0.7",
	} {
		s, err := New(name, o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Name() != want {
			t.Fatalf("%s built %q, want %q", name, s.Name(), want)
		}
	}
	for _, bad := range []string{"hadar:fast", "hadar:h0", "hadar:h-2", "hadar:crit0", "hadar:crit1.5"} {
		if _, err := New(bad, o); err == nil || !strings.Contains(err.Error(), "flat") {
			t.Fatalf("%s gave %v, want an error listing the known switches", bad, err)
		}
	}
	if _, err := New("gavel-maxmin:flat", o); err == nil {
		t.Fatal("a Gavel policy took a Hadar switch")
	}
}

// Check, the configuration's test of a name, accepts exactly what New
// builds: every listed name, and the switches of each family.
func TestCheckAgreesWithNew(t *testing.T) {
	o := Options{Speed: speed.Model{Profile: profile.Default()}}
	names := append(Names(), "sia:rigid", "sia:p1", "SIA:rigid:p-0.5", "hadar:h8:flat", "hadare-jct:crit0.7",
		"sia:fast", "sia:p0", "hadar:fast", "gavel-maxmin:flat", "gavel-maxmin:rigid", "nope", "")
	for _, name := range names {
		_, errNew := New(name, o)
		errCheck := Check(name)
		if (errNew == nil) != (errCheck == nil) {
			t.Errorf("%q: New says %v, Check says %v", name, errNew, errCheck)
		}
	}
}
