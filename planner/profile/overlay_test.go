package profile

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

// An overlay replaces the figures it names, keeps the rest, adds new
// entries and relative speeds; neither input changes.
func TestOverlay(t *testing.T) {
	base := mustNew(t, customEntries())
	over, err := Build("ops", []Entry{
		// Replaces h100 at 4 without a spread figure: the old spread one goes.
		{Model: "llama-tiny", ScaleFactor: 4, Consolidated: map[planner.GPUType]float64{"h100": 40, "b200": 80}},
		{Model: "new-model", ScaleFactor: 2, Consolidated: map[planner.GPUType]float64{"a100": 7}},
	}, map[planner.GPUType]RelativeSpeed{"b200": {Reference: "h100", Speed: 2}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := base.Overlay(over)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model  string
		sf     int
		t      planner.GPUType
		spread bool
		want   float64
	}{
		{"llama-tiny", 4, "h100", false, 40},
		{"llama-tiny", 4, "h100", true, 40}, // no spread figure left: the consolidated one
		{"llama-tiny", 4, "b200", false, 80},
		{"llama-tiny", 4, "a100", false, 12.5},
		{"llama-tiny", 1, "l4", false, 1.5},
		{"new-model", 2, "a100", false, 7},
	} {
		v, err := got.Throughput(tc.model, tc.sf, tc.t, tc.spread)
		if err != nil || v != tc.want {
			t.Errorf("%s x%d on %s (spread %v): %v, %v; want %v", tc.model, tc.sf, tc.t, tc.spread, v, err, tc.want)
		}
	}
	if r := got.RelativeSpeeds()["b200"]; r.Reference != "h100" || r.Speed != 2 {
		t.Errorf("relative speed %+v", r)
	}
	if !strings.Contains(got.Source(), "overlay: ops") {
		t.Errorf("source %q does not name the overlay", got.Source())
	}
	if v, _ := base.Throughput("llama-tiny", 4, "h100", true); v != 21.25 {
		t.Errorf("the base changed: spread h100 %v", v)
	}
	if same, _ := base.Overlay(nil); same != base {
		t.Error("a nil overlay is not the base itself")
	}
	// Its relative speeds survive a write and a read.
	var buf bytes.Buffer
	if err := got.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(&buf)
	if err != nil || !back.Equal(got) {
		t.Fatalf("round trip: %v (equal %v)", err, err == nil && back.Equal(got))
	}
}

// Missing figures wrap ErrNoFigure; a measured 0 is a figure.
func TestNoFigureIsDistinctFromZero(t *testing.T) {
	p := mustNew(t, customEntries())
	for _, tc := range []struct {
		model string
		sf    int
		t     planner.GPUType
	}{{"nobody", 1, "a100"}, {"llama-tiny", 3, "a100"}, {"llama-tiny", 1, "h100"}} {
		if _, err := p.Throughput(tc.model, tc.sf, tc.t, false); !errors.Is(err, ErrNoFigure) {
			t.Errorf("%s x%d on %s: %v, want ErrNoFigure", tc.model, tc.sf, tc.t, err)
		}
	}
	if v, err := p.Throughput("llama-tiny", 4, "l4", false); err != nil || v != 0 {
		t.Errorf("a measured 0: %v, %v", v, err)
	}
}

func TestRelativeSpeedErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		speeds map[planner.GPUType]RelativeSpeed
		want   string
	}{
		{"self", map[planner.GPUType]RelativeSpeed{"h100": {"h100", 2}}, "the type itself"},
		{"zero", map[planner.GPUType]RelativeSpeed{"h100": {"v100", 0}}, "want a positive number"},
		{"bad name", map[planner.GPUType]RelativeSpeed{"H 100": {"v100", 2}}, "lowercase name"},
		{"bad reference", map[planner.GPUType]RelativeSpeed{"h100": {"", 2}}, "reference"},
		{"loop", map[planner.GPUType]RelativeSpeed{"h100": {"b200", 2}, "b200": {"h100", 0.5}}, "loop back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build("x", nil, tc.speeds)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := Build("x", nil, nil); err == nil {
		t.Error("a profile with nothing at all is accepted")
	}
	if p, err := Parse([]byte(`{"format":"hadar-profile/v1","unit":"steps/s","relative_speeds":{"h100":{"reference":"v100","speed":3}},"entries":[]}`)); err != nil || p.RelativeSpeeds()["h100"].Speed != 3 {
		t.Errorf("a file of relative speeds only: %v", err)
	}
}
