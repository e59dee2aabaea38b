package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const congested = "../../netmodel/examples/congested-core.json"

func TestNetmodelCalibratePrintsFit(t *testing.T) {
	out, errs, code := runCLI(t, "netmodel", "calibrate")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"Fitted: effective inter-server bandwidth", "| **all** |", "no network model"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, _, code := runCLI(t, "netmodel", "fit"); code != 2 {
		t.Errorf("unknown netmodel subcommand: exit %d, want 2", code)
	}
}

func TestSimPlacementWithTopology(t *testing.T) {
	dir := t.TempDir()
	out, errs, code := runCLI(t, "sim", "--trace", gavelTrace, "--policies", "gavel-maxmin,hadar", "--topology", congested,
		"--placement", "pack,consolidate,delay-autotune", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"gavel-maxmin+pack", "gavel-maxmin+consolidate", "hadar+delay-autotune", "auto-tuner timer scale", "topology " + congested} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "autotune-gavel-maxmin_delay-autotune.csv")); err != nil {
		t.Errorf("no tuner trajectory CSV: %v", err)
	}
}

func TestSimPlacementRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown placement", []string{"--placement", "tight"}, []string{"--placement", "consolidate", "spread", "delay-autotune"}},
		{"missing topology", []string{"--topology", "nope.json"}, []string{"--topology", "nope.json"}},
		{"node not in topology", []string{"--topology", congested, "--cluster", "v100=40"}, []string{`"v100-9"`}},
		{"gavel fidelity", []string{"--topology", congested, "--fidelity", "gavel"}, []string{"--fidelity improved"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errs, code := runCLI(t, append([]string{"sim", "--trace", gavelTrace}, tc.args...)...)
			if code == 0 {
				t.Fatal("want a failure")
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr %q does not mention %q", errs, w)
				}
			}
		})
	}
}
