// Command dist is `make dist`: hadar's release archives for every
// platform, their SHA256SUMS, and the check of what was built (package
// internal/release).
//
//	go run ./internal/release/dist -version v0.3.0 -commit $(git rev-parse HEAD) -out out/dist
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/internal/release"
)

func main() {
	version := flag.String("version", "", "the release version, as git describe gives it (make dist passes it)")
	out := flag.String("out", "out/dist", "where the archives and SHA256SUMS go (emptied first)")
	commit := flag.String("commit", "", "the commit the release is built from, as `git rev-parse HEAD` gives it (make dist passes it)")
	flag.Parse()
	if err := run(*version, *commit, *out); err != nil {
		fmt.Fprintf(os.Stderr, "dist: %v\n", err)
		os.Exit(1)
	}
}

func run(version, commit, out string) error {
	if version == "" {
		return fmt.Errorf("-version is empty: give the release version (make dist takes it from git describe)")
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("run from the repository's root: %w", err)
	}
	// The archives' times: the commit's, so that the same commit packs
	// to the same bytes.
	modTime := time.Unix(0, 0).UTC()
	if b, err := exec.Command("git", "log", "-1", "--format=%ct").Output(); err == nil {
		if s, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			modTime = time.Unix(s, 0).UTC()
		}
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	stage, err := os.MkdirTemp("", "hadar-dist-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ctx := context.Background()
	var names []string
	for _, p := range release.Platforms() {
		dir := filepath.Join(stage, "build", p.OS+"-"+p.Arch)
		fmt.Printf("building %s for %s (cgo %v)\n", version, p, p.CGO)
		if err := release.Build(ctx, root, version, commit, p, dir); err != nil {
			return err
		}
		name := release.ArchiveName(version, p)
		if err := release.Archive(root, dir, version, p, modTime, filepath.Join(out, name)); err != nil {
			return err
		}
		names = append(names, name)
	}
	if err := release.WriteSums(out, names); err != nil {
		return err
	}
	checked, err := release.Verify(out, version, filepath.Join(stage, "verify"))
	if err != nil {
		return fmt.Errorf("verifying %s: %w", out, err)
	}
	for _, c := range checked {
		ran := "not run here (another platform): platform and cgo from its Go build information, the version stamp found in its bytes"
		if c.Ran != "" {
			ran = "-version: " + c.Ran
		}
		fmt.Printf("verified %s %s: %s, cgo %v; %s\n", c.Archive, c.Binary, c.GOARCH, c.CGO, ran)
	}
	sums, _ := os.ReadFile(filepath.Join(out, release.SumsFile))
	fmt.Printf("\n%s%s in %s\n", sums, release.SumsFile, out)
	return nil
}
