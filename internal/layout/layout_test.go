package layout

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const root = "../.."

func TestLayout(t *testing.T) {
	pkgs, err := Packages(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 40 || !slices.ContainsFunc(pkgs, func(p Package) bool { return p.Dir == "planner/engine" }) {
		t.Fatalf("read %d packages, planner/engine not among them: the walk is broken", len(pkgs))
	}
	for _, v := range Violations(pkgs, Rules) {
		t.Error(v)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Unlisted(pkgs, string(doc)) {
		t.Errorf("package %s is not in docs/architecture.md: add a line for it", p)
	}
}

// The checks catch what they are for.
func TestViolationsCatch(t *testing.T) {
	pkgs := []Package{
		{Dir: "planner/hadar", Imports: []string{"fmt", "planner", "sidecar/watch", "github.com/hashicorp/nomad/api"}},
		{Dir: "contract", Imports: []string{"encoding/json", "planner"}},
		{Dir: "cmd/hadar", Imports: []string{"sidecar", "sidecar/agent", "github.com/hashicorp/nomad/api"}},
		{Dir: "sidecar", Imports: []string{"sidecar/agent", "sidecar/wire"}},
		{Dir: "e2e/scale", Imports: []string{"sidecar/agent"}},
		{Dir: "sidecar/wire", Imports: []string{"planner/engine", "sidecar/config"}},
		{Dir: "driver/train", Imports: []string{"contract", "github.com/hashicorp/nomad/plugins/drivers"}},
		{Dir: "driver/device", Imports: []string{"version", "internal/demo"}},
		{Dir: "version", Imports: []string{"fmt", "contract"}},
		{Dir: "sidecar/telemetry", Imports: []string{"internal/observability", "internal/release"}},
		{Dir: "driver/mountinfo", Imports: []string{"strconv", "contract"}},
		{Dir: "internal/hostpath", Imports: []string{"driver/mountinfo"}},
	}
	got := Violations(pkgs, Rules)
	want := []string{
		"planner/hadar imports sidecar/watch",
		"planner/hadar imports github.com/hashicorp/nomad/api",
		"contract imports planner",
		"cmd/hadar imports sidecar/agent",
		"sidecar/wire imports sidecar/config",
		"sidecar/wire imports planner/engine",
		"driver/train imports github.com/hashicorp/nomad/plugins/drivers",
		"driver/device imports internal/demo",
		"version imports contract",
		"sidecar/telemetry imports internal/release",
		"driver/mountinfo imports contract",
	}
	if len(got) != len(want) {
		t.Errorf("%d violations, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w+":") }) {
			t.Errorf("missed %q in:\n%s", w, strings.Join(got, "\n"))
		}
	}
	if u := Unlisted(pkgs, "`planner/hadar` `contract`"); len(u) != 10 {
		t.Errorf("unlisted: %v", u)
	}
}
