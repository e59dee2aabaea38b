package licence

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const mainModule = "github.com/hadar-sched/hadar"

// fakeList renders packages as go list -json prints them.
func fakeList(t *testing.T, pkgs ...Package) string {
	t.Helper()
	var b strings.Builder
	for _, p := range pkgs {
		out, err := json.MarshalIndent(p, "", "\t")
		if err != nil {
			t.Fatal(err)
		}
		b.Write(out)
		b.WriteString("\n")
	}
	return b.String()
}

func mainPkg(path string, imports ...string) Package {
	return Package{ImportPath: path, Module: &Module{Path: mainModule, Main: true, Dir: "/src"}, Imports: imports, Deps: imports}
}

func dep(path, module, version, dir string, deps ...string) Package {
	return Package{ImportPath: path, Module: &Module{Path: module, Version: version, Dir: dir}, Imports: deps, Deps: deps}
}

// moduleDir is a module directory whose LICENSE starts with text.
func moduleDir(t *testing.T, text string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "LICENSE"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestForbidden(t *testing.T) {
	tests := []struct {
		path string
		want string // substring of the reason; "" for allowed
	}{
		{"github.com/hashicorp/nomad", "Nomad 1.7.0 and later is under the Business Source License 1.1"},
		{"github.com/hashicorp/nomad/api", ""},
		{"github.com/hashicorp/nomad/tools", "not known to be under the MPL-2.0"},
		{"github.com/hashicorp/nomadx", ""},
		{"github.com/hashicorp/consul", "Consul 1.17.0 and later is under the Business Source License 1.1"},
		{"github.com/hashicorp/consul/envoyextensions", "Business Source License"},
		{"github.com/hashicorp/consul/troubleshoot", "Business Source License"},
		{"github.com/hashicorp/consul/api", ""},
		{"github.com/hashicorp/consul/sdk", ""},
		{"github.com/hashicorp/consul/proto-public", ""},
		{"github.com/hashicorp/consul-template", ""},
		{"github.com/hashicorp/go-plugin", ""},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			got := Forbidden(tc.path)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("Forbidden(%q) = %q, want %q", tc.path, got, tc.want)
			}
			if tc.want != "" && strings.HasPrefix(tc.path, "github.com/hashicorp/consul") &&
				!strings.Contains(got, "github.com/hashicorp/consul/api, github.com/hashicorp/consul/proto-public, github.com/hashicorp/consul/sdk") {
				t.Errorf("the reason %q does not name what may be used instead", got)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	mpl := moduleDir(t, "Mozilla Public License, version 2.0\n")
	buslDir := moduleDir(t, "License text copyright (c) 2020 MariaDB Corporation Ab, All Rights Reserved.\n\"Business Source License\" is a trademark of MariaDB Corporation Ab.\n")
	nomadAPI := dep("github.com/hashicorp/nomad/api", "github.com/hashicorp/nomad/api", "v0.0.0-20260907080526-08ef8f3d26da", mpl)
	consulAPI := dep("github.com/hashicorp/consul/api", "github.com/hashicorp/consul/api", "v1.33.4", mpl)
	structs := dep("github.com/hashicorp/nomad/nomad/structs", nomad, "v1.11.3", buslDir)
	drivers := dep("github.com/hashicorp/nomad/plugins/drivers", nomad, "v1.11.3", buslDir, structs.ImportPath)
	consulAgent := dep("github.com/hashicorp/consul/agent", consul, "v1.22.0", buslDir)
	// A module of another name whose LICENSE is the BUSL, and one that
	// depends on Consul's BUSL module.
	vault := dep("example.com/vault/sdk", "example.com/vault", "v1.0.0", buslDir)
	wrapper := dep("example.com/wrapper", "example.com/wrapper", "v0.1.0", mpl, consulAgent.ImportPath)
	cleanMod := "module github.com/hadar-sched/hadar\n\nrequire github.com/hashicorp/nomad/api v0.0.0-20260907080526-08ef8f3d26da\n\nreplace github.com/hashicorp/nomad/api => github.com/hashicorp/nomad/api v0.0.0-20260907080526-08ef8f3d26da\n"
	cleanSum := "github.com/hashicorp/nomad/api v0.0.0-20260907080526-08ef8f3d26da h1:x=\ngithub.com/hashicorp/consul/api v1.33.4/go.mod h1:y=\n"

	tests := []struct {
		name       string
		pkgs       []Package
		goMod      string
		goSum      string
		wantModule []string   // the findings' modules, in order
		wantWhere  [][]string // per finding, substrings of its Where lines
	}{
		{
			name:  "the API clients alone",
			pkgs:  []Package{mainPkg(mainModule+"/sidecar", nomadAPI.ImportPath, consulAPI.ImportPath), nomadAPI, consulAPI},
			goMod: cleanMod, goSum: cleanSum,
		},
		{
			name:       "a package imports Nomad's plugin SDK",
			pkgs:       []Package{mainPkg(mainModule+"/driver/train", drivers.ImportPath), drivers, structs},
			goMod:      cleanMod,
			wantModule: []string{"github.com/hashicorp/nomad@v1.11.3"},
			wantWhere:  [][]string{{mainModule + "/driver/train imports github.com/hashicorp/nomad/plugins/drivers"}},
		},
		{
			name: "tests only: the test variant and the external tests",
			pkgs: []Package{
				mainPkg(mainModule+"/e2e", nomadAPI.ImportPath),
				{ImportPath: mainModule + "/e2e [" + mainModule + "/e2e.test]", ForTest: mainModule + "/e2e", Module: &Module{Path: mainModule, Main: true},
					Imports: []string{nomadAPI.ImportPath, structs.ImportPath}, Deps: []string{nomadAPI.ImportPath, structs.ImportPath}},
				{ImportPath: mainModule + "/e2e_test [" + mainModule + "/e2e.test]", ForTest: mainModule + "/e2e", Module: &Module{Path: mainModule, Main: true},
					Imports: []string{drivers.ImportPath + " [" + mainModule + "/e2e.test]"}, Deps: []string{drivers.ImportPath + " [" + mainModule + "/e2e.test]", structs.ImportPath}},
				{ImportPath: drivers.ImportPath + " [" + mainModule + "/e2e.test]", ForTest: mainModule + "/e2e", Module: drivers.Module, Imports: drivers.Imports, Deps: drivers.Deps},
				nomadAPI, structs,
			},
			wantModule: []string{"github.com/hashicorp/nomad@v1.11.3"},
			wantWhere: [][]string{{
				mainModule + "/e2e (tests) imports github.com/hashicorp/nomad/nomad/structs",
				mainModule + "/e2e (external tests) imports github.com/hashicorp/nomad/plugins/drivers",
			}},
		},
		{
			name:       "through another module, and a BUSL LICENSE",
			pkgs:       []Package{mainPkg(mainModule+"/sidecar/leader", wrapper.ImportPath, vault.ImportPath), wrapper, consulAgent, vault},
			wantModule: []string{"example.com/vault@v1.0.0", "github.com/hashicorp/consul@v1.22.0"},
			wantWhere: [][]string{
				{mainModule + "/sidecar/leader imports example.com/vault/sdk"},
				{mainModule + "/sidecar/leader imports example.com/wrapper, which depends on it (e.g. github.com/hashicorp/consul/agent)"},
			},
		},
		{
			name:       "in the build, imported by no package of the module",
			pkgs:       []Package{mainPkg(mainModule + "/x"), structs},
			wantModule: []string{"github.com/hashicorp/nomad@v1.11.3"},
			wantWhere:  [][]string{{"1 of its packages are in the build of ./... (tests included), e.g. github.com/hashicorp/nomad/nomad/structs"}},
		},
		{
			name:       "go.mod and go.sum name Nomad's BUSL module",
			pkgs:       []Package{mainPkg(mainModule+"/sidecar", nomadAPI.ImportPath), nomadAPI},
			goMod:      cleanMod + "require (\n\tgithub.com/hashicorp/nomad v1.11.3 // indirect\n)\n",
			goSum:      cleanSum + "github.com/hashicorp/nomad v1.11.3/go.mod h1:z=\ngithub.com/hashicorp/consul/troubleshoot v0.8.0 h1:w=\n",
			wantModule: []string{"github.com/hashicorp/consul/troubleshoot", "github.com/hashicorp/nomad"},
			wantWhere: [][]string{
				{"go.sum:4 names it: github.com/hashicorp/consul/troubleshoot v0.8.0"},
				{"go.mod:7 names it: github.com/hashicorp/nomad v1.11.3 // indirect", "go.sum:3 names it: github.com/hashicorp/nomad v1.11.3/go.mod"},
			},
		},
		{
			name:       "a replace to Nomad's BUSL module",
			pkgs:       []Package{mainPkg(mainModule + "/sidecar")},
			goMod:      "module " + mainModule + "\n\nreplace example.com/fork => github.com/hashicorp/nomad v1.11.3\n",
			wantModule: []string{"github.com/hashicorp/nomad"},
			wantWhere:  [][]string{{"go.mod:3 names it"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pkgs, err := ReadList(strings.NewReader(fakeList(t, tc.pkgs...)))
			if err != nil {
				t.Fatal(err)
			}
			got := Check(pkgs, []byte(tc.goMod), []byte(tc.goSum))
			var mods []string
			for _, f := range got {
				mods = append(mods, f.Module)
			}
			if strings.Join(mods, " ") != strings.Join(tc.wantModule, " ") {
				t.Fatalf("findings for modules %q, want %q:\n%v", mods, tc.wantModule, got)
			}
			for i, f := range got {
				if f.Reason == "" {
					t.Errorf("finding %s has no reason", f.Module)
				}
				all := strings.Join(f.Where, "\n")
				for _, w := range tc.wantWhere[i] {
					if !strings.Contains(all, w) {
						t.Errorf("finding %s lacks %q:\n%s", f.Module, w, all)
					}
				}
			}
		})
	}
}

// TestCheckTestVariantNotRepeated: the package rebuilt for its tests
// repeats the plain package's imports; those are reported once.
func TestCheckTestVariantNotRepeated(t *testing.T) {
	busl := moduleDir(t, "Business Source License 1.1\n")
	structs := dep("github.com/hashicorp/nomad/nomad/structs", nomad, "v1.11.3", busl)
	p := mainPkg(mainModule+"/driver", structs.ImportPath)
	tv := p
	tv.ImportPath, tv.ForTest = mainModule+"/driver ["+mainModule+"/driver.test]", mainModule+"/driver"
	got := Check([]Package{p, tv, structs}, nil, nil)
	if len(got) != 1 || len(got[0].Where) != 1 || strings.Contains(got[0].Where[0], "(tests)") {
		t.Fatalf("findings %v: want the plain package's import alone", got)
	}
}

func TestReadListMalformed(t *testing.T) {
	if _, err := ReadList(strings.NewReader(`{"ImportPath": "a"} {"ImportPath": `)); err == nil || !strings.Contains(err.Error(), "after 1 packages") {
		t.Fatalf("error %v, want one saying where the output broke", err)
	}
}
