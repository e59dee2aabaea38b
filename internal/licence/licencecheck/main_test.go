package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeGo writes a go command that prints list as go list would, and
// fails with code when code is not 0.
func fakeGo(t *testing.T, list string, code int) string {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "list.json")
	if err := os.WriteFile(out, []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\ncat " + out + "\n"
	if code != 0 {
		script = "#!/bin/sh\necho 'go: something broke' >&2\nexit 3\n"
	}
	bin := filepath.Join(dir, "go")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func moduleDir(t *testing.T, goMod string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

const clean = `{"ImportPath": "example.com/m/a", "Module": {"Path": "example.com/m", "Main": true}, "Imports": ["github.com/hashicorp/nomad/api"]}
{"ImportPath": "github.com/hashicorp/nomad/api", "Module": {"Path": "github.com/hashicorp/nomad/api", "Version": "v0.0.0-1"}}
`

const busl = `{"ImportPath": "example.com/m/a", "Module": {"Path": "example.com/m", "Main": true}, "Imports": ["github.com/hashicorp/nomad/plugins/base"]}
{"ImportPath": "github.com/hashicorp/nomad/plugins/base", "Module": {"Path": "github.com/hashicorp/nomad", "Version": "v1.11.3"}}
`

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		list    string
		goMod   string
		goFails bool
		wantOK  bool
		wantErr string
		want    []string
	}{
		{name: "clean", list: clean, goMod: "module example.com/m\n", wantOK: true, want: []string{"licence-check: ok: 2 packages"}},
		{name: "an import of Nomad's BUSL module", list: busl, goMod: "module example.com/m\n",
			want: []string{"licence-check: FAIL", "module github.com/hashicorp/nomad@v1.11.3: Nomad 1.7.0 and later is under the Business Source License 1.1",
				"example.com/m/a imports github.com/hashicorp/nomad/plugins/base", "e2e/tools/README.md"}},
		{name: "go.mod requires it", list: clean, goMod: "module example.com/m\n\nrequire github.com/hashicorp/nomad v1.11.3\n",
			want: []string{"go.mod:3 names it: require github.com/hashicorp/nomad v1.11.3"}},
		{name: "go list fails", list: clean, goMod: "module example.com/m\n", goFails: true, wantErr: "go: something broke"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code := 0
			if tc.goFails {
				code = 3
			}
			var out bytes.Buffer
			ok, err := run(context.Background(), []string{"-C", moduleDir(t, tc.goMod), "-go", fakeGo(t, tc.list, code)}, &out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.wantOK {
				t.Errorf("ok = %v, want %v", ok, tc.wantOK)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
