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
	} {
		s, err := New(name, o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Name() != want {
			t.Fatalf("%s built %q, want %q", name, s.Name(), want)
		}
	}
	if _, err := New("hadar:fast", o); err == nil || !strings.Contains(err.Error(), "flat") {
		t.Fatalf("an unknown switch gave %v, want an error listing the known ones", err)
	}
	if _, err := New("gavel-maxmin:flat", o); err == nil {
		t.Fatal("a Gavel policy took a Hadar switch")
	}
}
