// Package licence checks that the main module stays off code it may not
// use: HashiCorp moved Nomad (1.7.0 and later) and Consul (1.17.0 and
// later) to the Business Source License 1.1, and only some of their Go
// modules stayed under the MPL 2.0. Nomad and Consul are test tools here
// (e2e/tools, modules of their own); the main module, tests included,
// imports only the MPL parts (the API clients), and its go.mod and go.sum
// do not name the rest at all.
//
// It reads what `go list -deps -test -json ./...` prints (ListArgs), and
// go.mod and go.sum; `go run ./internal/licence/licencecheck` (make
// licence-check) runs it on the repository.
package licence

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ListArgs are the go list arguments whose output Check reads: every
// package the main module builds, its tests' included, with the fields
// Check uses.
func ListArgs() []string {
	return []string{"list", "-deps", "-test", "-json=ImportPath,Module,Imports,Deps,ForTest", "./..."}
}

// Module is the part of go list's module Check uses.
type Module struct {
	Path    string
	Version string
	Main    bool
	Dir     string
	Replace *Module
}

// Package is the part of go list's package Check uses.
type Package struct {
	ImportPath string
	Module     *Module
	Imports    []string
	Deps       []string
	ForTest    string
}

// ReadList decodes go list -json output (a stream of JSON objects).
func ReadList(r io.Reader) ([]Package, error) {
	dec := json.NewDecoder(r)
	var out []Package
	for {
		var p Package
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("go list output, after %d packages: %w", len(out), err)
		}
		out = append(out, p)
	}
}

const (
	nomad  = "github.com/hashicorp/nomad"
	consul = "github.com/hashicorp/consul"
)

// mpl are the Go modules of the Nomad and Consul repositories that are
// under the MPL 2.0 (their LICENSE files, checked on the versions this
// repository uses: nomad/api v0.0.0-20260907080526, consul/api v1.33,
// consul/sdk v0.17, consul/proto-public v0.7). Every other module of
// those two repositories is under the BUSL 1.1 (nomad itself from 1.7.0;
// consul, consul/envoyextensions and consul/troubleshoot from 1.17.0),
// or not known to be MPL.
func mpl() []string {
	return []string{nomad + "/api", consul + "/api", consul + "/proto-public", consul + "/sdk"}
}

// Forbidden says why the main module may not use the module at path, or
// "" when the named rules allow it (a module's own LICENSE file is
// checked besides, see Check).
func Forbidden(path string) string {
	for _, repo := range []struct {
		path, name, since string
		busl              []string // its other modules known to be BUSL
	}{
		{nomad, "Nomad", "1.7.0", nil},
		{consul, "Consul", "1.17.0", []string{consul + "/envoyextensions", consul + "/troubleshoot"}},
	} {
		if path != repo.path && !strings.HasPrefix(path, repo.path+"/") {
			continue
		}
		if slices.Contains(mpl(), path) {
			return ""
		}
		var allowed []string
		for _, m := range mpl() {
			if strings.HasPrefix(m, repo.path+"/") {
				allowed = append(allowed, m)
			}
		}
		only := fmt.Sprintf("of %s's modules only %s (MPL-2.0) may be used", repo.name, strings.Join(allowed, ", "))
		if path == repo.path || slices.Contains(repo.busl, path) {
			return fmt.Sprintf("%s %s and later is under the Business Source License 1.1; %s", repo.name, repo.since, only)
		}
		return fmt.Sprintf("not known to be under the MPL-2.0 (%s %s and later is under the Business Source License 1.1); %s", repo.name, repo.since, only)
	}
	return ""
}

// Finding is one module the main module may not use, and where it shows.
type Finding struct {
	// Module is the module path, with its version when known.
	Module string
	Reason string
	// Where lists the main module's packages that import it (directly or
	// through another module) and the go.mod and go.sum lines naming it.
	Where []string
}

func (f Finding) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "module %s: %s\n", f.Module, f.Reason)
	for _, w := range f.Where {
		fmt.Fprintf(&b, "    %s\n", w)
	}
	return b.String()
}

// Check returns what the main module may not use: packages (tests
// included) of a forbidden module or of a module whose LICENSE file is
// the Business Source License, and go.mod or go.sum lines naming a
// forbidden module. Findings are sorted by module; nil means clean.
func Check(pkgs []Package, goMod, goSum []byte) []Finding {
	byPath := make(map[string]*Package, len(pkgs))
	for i := range pkgs {
		byPath[pkgs[i].ImportPath] = &pkgs[i]
	}
	licences := map[string]string{} // module dir -> reason, "" when fine
	versions := map[string]string{} // module path -> version in the build
	// why says why the package at path may not be used, and its module.
	why := func(path string) (reason, module string) {
		p := byPath[path]
		if p == nil || p.Module == nil || p.Module.Main {
			return "", ""
		}
		m := p.Module
		module = m.Path
		if m.Version != "" {
			versions[m.Path] = m.Version
		}
		if r := Forbidden(m.Path); r != "" {
			return r, module
		}
		if m.Replace != nil {
			if r := Forbidden(m.Replace.Path); r != "" {
				return r, module
			}
		}
		dir := m.Dir
		if m.Replace != nil && m.Replace.Dir != "" {
			dir = m.Replace.Dir
		}
		if dir == "" {
			return "", ""
		}
		r, ok := licences[dir]
		if !ok {
			r = busl(dir)
			licences[dir] = r
		}
		return r, module
	}

	byModule := map[string]*Finding{}
	add := func(module, reason, where string) {
		f := byModule[module]
		if f == nil {
			f = &Finding{Module: module, Reason: reason}
			byModule[module] = f
		}
		if !slices.Contains(f.Where, where) {
			f.Where = append(f.Where, where)
		}
	}
	for _, p := range pkgs {
		if p.Module == nil || !p.Module.Main {
			continue
		}
		name := display(p)
		imports := p.Imports
		if plain := byPath[p.ForTest]; plain != nil && strip(p.ImportPath) == p.ForTest {
			// The package rebuilt with its tests: the plain package reports
			// what both import.
			imports = slices.DeleteFunc(slices.Clone(imports), func(imp string) bool {
				return slices.Contains(plain.Imports, strip(imp))
			})
		}
		for _, imp := range imports {
			if r, m := why(imp); r != "" {
				add(m, r, fmt.Sprintf("%s imports %s", name, strip(imp)))
				continue
			}
			dep := byPath[imp]
			if dep == nil || dep.Module == nil || dep.Module.Main {
				continue // a package of the main module reports for itself
			}
			seen := map[string]bool{} // one line per module it brings in
			for _, d := range dep.Deps {
				if r, m := why(d); r != "" && !seen[m] {
					seen[m] = true
					add(m, r, fmt.Sprintf("%s imports %s, which depends on it (e.g. %s)", name, strip(imp), strip(d)))
				}
			}
		}
	}
	// A module in the build that no package was traced to above (an
	// import go list reports in a form not matched) still fails.
	untraced := map[string][]string{}
	reasons := map[string]string{}
	for _, p := range pkgs {
		if r, m := why(p.ImportPath); r != "" && byModule[m] == nil {
			untraced[m] = append(untraced[m], strip(p.ImportPath))
			reasons[m] = r
		}
	}
	for m, paths := range untraced {
		add(m, reasons[m], fmt.Sprintf("%d of its packages are in the build of ./... (tests included), e.g. %s", len(paths), paths[0]))
	}
	for _, file := range []struct {
		name string
		b    []byte
	}{{"go.mod", goMod}, {"go.sum", goSum}} {
		for n, path := range namedModules(file.b) {
			if r := Forbidden(path); r != "" {
				add(path, r, fmt.Sprintf("%s:%d names it: %s", file.name, n, lineOf(file.b, n)))
			}
		}
	}

	var out []Finding
	for _, f := range byModule {
		if v := versions[f.Module]; v != "" {
			f.Module += "@" + v
		}
		slices.Sort(f.Where)
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b Finding) int { return strings.Compare(a.Module, b.Module) })
	return out
}

// display names a main-module package, marking the variants go list
// -test adds ("p [p.test]", the test binary "p.test").
func display(p Package) string {
	switch {
	case p.ForTest != "" && strings.HasPrefix(p.ImportPath, p.ForTest+"_test"):
		return p.ForTest + " (external tests)"
	case p.ForTest != "":
		return p.ForTest + " (tests)"
	case strings.HasSuffix(p.ImportPath, ".test"):
		return strings.TrimSuffix(p.ImportPath, ".test") + " (test binary)"
	}
	return p.ImportPath
}

// strip drops the " [p.test]" go list appends to a package rebuilt for a
// test.
func strip(path string) string {
	if i := strings.Index(path, " ["); i >= 0 {
		return path[:i]
	}
	return path
}

// namedModules returns, by line number, the module paths a go.mod or
// go.sum line names: every field that looks like a module path (go.sum's
// first field; go.mod's require, replace and exclude entries and both
// sides of a replace arrow). A path is matched whole, so
// github.com/hashicorp/nomad/api is not github.com/hashicorp/nomad.
func namedModules(b []byte) map[int]string {
	out := map[int]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		for _, f := range strings.Fields(line) {
			if Forbidden(f) != "" {
				out[n] = f
			}
		}
	}
	return out
}

func lineOf(b []byte, n int) string {
	lines := strings.Split(string(b), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	return strings.TrimSpace(lines[n-1])
}

// busl says why a module directory holds Business Source Licensed code
// ("" when its licence file, if any, is not the BUSL).
func busl(dir string) string {
	for _, name := range []string{"LICENSE", "LICENSE.md", "LICENSE.txt", "LICENCE", "COPYING"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		head := make([]byte, 8<<10)
		n, _ := io.ReadFull(f, head)
		f.Close()
		if bytes.Contains(head[:n], []byte("Business Source License")) {
			return fmt.Sprintf("its %s is the Business Source License, which hadar's main module may not depend on", name)
		}
		return ""
	}
	return ""
}
