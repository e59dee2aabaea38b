package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBuildReportsProgress builds a fresh two-package module: gobuild
// counts the packages, reports progress lines off a terminal, names the
// two it compiled, and writes the binary; a compile error comes back
// with the compiler's message.
func TestBuildReportsProgress(t *testing.T) {
	dir := t.TempDir()
	// A unique constant, so the build cache cannot hold the packages.
	uniq := time.Now().UnixNano()
	files := map[string]string{
		"go.mod":      "module example.com/gb\n\ngo 1.22\n",
		"lib/lib.go":  fmt.Sprintf("package lib\n\nconst N = %d\n", uniq),
		"main.go":     "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/gb/lib\"\n)\n\nfunc main() { fmt.Println(lib.N) }\n",
		"bad/main.go": "package main\n\nfunc main() { undefinedThing() }\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "bin", "gb")
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"-C", dir, "-name", "gb", "-every", "1ms", "-o", out, "."}, &stdout); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	got := stdout.String()
	for _, want := range []string{"gb: resolving packages", "gb: compiling, 0/", "built gb into " + out, "(2 packages compiled,"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "\r") {
		t.Errorf("carriage returns off a terminal:\n%q", got)
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	err := run(context.Background(), []string{"-C", dir, "-o", filepath.Join(dir, "bin", "bad"), "./bad"}, &stdout)
	if err == nil || !strings.Contains(err.Error(), "undefinedThing") {
		t.Fatalf("a compile error: got %v", err)
	}
}
