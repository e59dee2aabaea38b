// Package layout holds the rules of hadar's package layout
// (docs/architecture.md) as data, and checks a checkout against them: every
// package is listed in the architecture document, and no package imports
// across a line the design draws (the planner knows nothing of Nomad, the
// training contract imports nothing of hadar, only the sidecar's assembly
// and the end-to-end tests reach into its lifecycle).
package layout

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Module is hadar's module path.
const Module = "github.com/hadar-sched/hadar"

// Rule forbids packages under From (a module-relative folder; "" is every
// package) to import a package under To (an import path: the module's
// folders module-relative, others in full), except the packages under
// the Except folders and the imports under Allow.
type Rule struct {
	From   string
	To     string
	Except []string
	Allow  []string
	Why    string
}

// Rules are the lines docs/architecture.md draws.
var Rules = []Rule{
	{From: "planner", To: "sidecar", Why: "the planner is a pure library: the sidecar drives it, not the reverse"},
	{From: "planner", To: "driver", Why: "the planner is a pure library"},
	{From: "planner", To: "github.com/hashicorp/nomad", Why: "the planner knows nothing of Nomad"},
	{From: "netmodel", To: "github.com/hashicorp/nomad", Why: "the network model knows nothing of Nomad"},
	{From: "netmodel", To: "sidecar", Why: "the network model is a pure library"},
	{From: "contract", To: "", Why: "the training contract is a leaf: every side imports it, it imports nothing of hadar"},
	{From: "version", To: "", Why: "the release every binary reports is a leaf: the plugins, the sidecar and every command import it, it imports nothing of hadar"},
	{From: "driver/mountinfo", To: "", Why: "mountinfo's unescaping is a leaf: the task driver's cgroup code and internal/hostpath (the demo, the harness) both import it, it imports nothing of hadar"},
	{From: "driver", To: "internal", Why: "internal holds the demo and the release tooling: a plugin on every client pulls none of it in (the release number is package version)"},
	{From: "sidecar", To: "internal", Allow: []string{"internal/observability"}, Why: "internal holds the demo and the release tooling: the daemon pulls none of it in (only telemetry's test reads the shipped dashboard through internal/observability)"},
	{From: "driver", To: "sidecar", Why: "the driver runs on every client and talks to the sidecar only through the contract and Nomad"},
	{From: "driver", To: "planner", Why: "the driver does not plan"},
	{From: "", To: "sidecar/agent", Except: []string{"sidecar", "e2e"}, Why: "the sidecar's lifecycle is assembled by package sidecar; tools read sidecar/wire"},
	{From: "sidecar/wire", To: "sidecar", Why: "the wire types are what clients import: they must not pull the daemon in"},
	{From: "sidecar/wire", To: "planner", Why: "the status API is wire's own types: a planner type in it would let a planner rename change the API (the agent and sidecar/queues convert)"},
	{From: "", To: "github.com/hashicorp/nomad", Allow: []string{"github.com/hashicorp/nomad/api"}, Why: "only github.com/hashicorp/nomad/api (MPL) may be imported: the rest of Nomad's module is BUSL"},
}

// Package is one Go package of the checkout.
type Package struct {
	// Dir is its folder, module-relative with slashes.
	Dir string
	// Imports are its imports, tests included: module packages
	// module-relative, others in full.
	Imports []string
}

// skip are folders that hold no package of the main module: other
// modules (e2e/tools), data, the Python library, build outputs.
func skip(rel string) bool {
	base := path.Base(rel)
	switch {
	case rel == "e2e/tools", rel == "bin", rel == "out", rel == "python", rel == "deploy", rel == "jobspecs", rel == "docs":
		return true
	case base == "testdata", strings.HasPrefix(base, "."), strings.HasPrefix(base, "_"):
		return true
	}
	return false
}

// Packages reads every package under root (the module's folder).
func Packages(root string) ([]Package, error) {
	var out []Package
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel != "." && skip(rel) {
			return filepath.SkipDir
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return err
		}
		imports := map[string]bool{}
		found := false
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(p, e.Name()), nil, parser.ImportsOnly)
			if err != nil {
				return fmt.Errorf("reading %s: %w", filepath.Join(rel, e.Name()), err)
			}
			found = true
			for _, im := range f.Imports {
				ip, err := strconv.Unquote(im.Path.Value)
				if err != nil {
					return fmt.Errorf("%s: import %s: %w", filepath.Join(rel, e.Name()), im.Path.Value, err)
				}
				if ip == Module {
					ip = ""
				} else if r, ok := strings.CutPrefix(ip, Module+"/"); ok {
					ip = r
				}
				imports[ip] = true
			}
		}
		if found {
			pkg := Package{Dir: rel}
			for ip := range imports {
				pkg.Imports = append(pkg.Imports, ip)
			}
			sort.Strings(pkg.Imports)
			out = append(out, pkg)
		}
		return nil
	})
	return out, err
}

// under says whether p is folder dir or inside it ("" holds everything).
func under(p, dir string) bool {
	return dir == "" || p == dir || strings.HasPrefix(p, dir+"/")
}

// local says whether an import (as Package.Imports has it) is one of the
// module's packages: those have no dot in their first element.
func local(ip string) bool {
	first, _, _ := strings.Cut(ip, "/")
	return !strings.Contains(first, ".") && !isStd(ip)
}

// isStd tells the standard library from the module's folders: the
// module's top folders are known.
func isStd(ip string) bool {
	first, _, _ := strings.Cut(ip, "/")
	switch first {
	case "cmd", "contract", "driver", "e2e", "internal", "netmodel", "planner", "sidecar", "trainer", "version", "":
		return false
	}
	return true
}

// Violations are the imports of pkgs that break rules, one line each.
func Violations(pkgs []Package, rules []Rule) []string {
	var out []string
	for _, p := range pkgs {
		for _, r := range rules {
			if !under(p.Dir, r.From) || excepted(p.Dir, r.Except) {
				continue
			}
			for _, ip := range p.Imports {
				// A package's external tests import the package itself.
				if ip == p.Dir || excepted(ip, r.Allow) {
					continue
				}
				if r.To == "" && local(ip) || r.To != "" && under(ip, r.To) {
					out = append(out, fmt.Sprintf("%s imports %s: %s", p.Dir, ip, r.Why))
				}
			}
		}
	}
	return out
}

func excepted(dir string, except []string) bool {
	for _, e := range except {
		if under(dir, e) {
			return true
		}
	}
	return false
}

// Unlisted are the packages doc does not name: each must appear as
// `folder` (in backquotes) in the architecture document.
func Unlisted(pkgs []Package, doc string) []string {
	var out []string
	for _, p := range pkgs {
		if !strings.Contains(doc, "`"+p.Dir+"`") {
			out = append(out, p.Dir)
		}
	}
	return out
}
