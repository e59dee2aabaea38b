// Package version is the release every hadar binary reports: `hadar
// version`, each command's -version flag, and the plugins' PluginInfo
// version Nomad shows and compares. The release build stamps it with
// -ldflags "-X github.com/hadar-sched/hadar/version.stamp=<git
// describe>" (make build, make plugins, make dist); a plain `go build`
// falls back on what the Go toolchain recorded in the binary.
package version

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// stamp and commit are set at link time (-X); never written at run
// time. commit is stamped beside the version because the Go build
// information's vcs.revision is missing wherever the build could not ask
// git (a source tree without .git, -buildvcs=false, some CI checkouts),
// and the release's `hadar version` must name its commit all the same.
var stamp, commit string

// Fallback is reported when neither the link stamp nor the Go build
// information names a version (go run, go test, a build outside a git
// checkout).
const Fallback = "v0.0.0-dev"

// semver is what Nomad's plugin loader (hashicorp/go-version) accepts:
// a plugin whose version does not parse is not loaded.
var semver = regexp.MustCompile(`^v?[0-9]+(\.[0-9]+)*(-[0-9A-Za-z\-~]+(\.[0-9A-Za-z\-~]+)*)?(\+[0-9A-Za-z\-~]+(\.[0-9A-Za-z\-~]+)*)?$`)

// Version is this build's release: the link stamp, else the module
// version Go recorded (a pseudo-version from the commit when built in a
// git checkout), else a development version naming the commit, else
// Fallback.
func Version() string {
	info, _ := debug.ReadBuildInfo()
	return resolve(stamp, info)
}

// resolve is Version on explicit inputs (tests).
func resolve(stamped string, info *debug.BuildInfo) string {
	if s := strings.TrimSpace(stamped); s != "" {
		return s
	}
	if info == nil {
		return Fallback
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return Fallback
	}
	v := Fallback + "+g" + rev[:min(12, len(rev))]
	if dirty {
		v += ".dirty"
	}
	return v
}

// Plugin is Version in the form Nomad's plugin loader requires (semantic
// versioning): a stamp that is not one is reported as Fallback with the
// stamp's characters that semver allows as build metadata, so the plugin
// still loads and the build can still be told apart.
func Plugin() string { return pluginOf(Version()) }

func pluginOf(v string) string {
	if semver.MatchString(v) {
		return v
	}
	var b strings.Builder
	for _, r := range v {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '-':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	meta := strings.Trim(b.String(), "-")
	if meta == "" {
		return Fallback
	}
	return Fallback + "+" + meta
}

// Commit is the git commit the binary was built from: the link stamp,
// else what Go recorded, with "-dirty" when the tree had changes ("" when
// unknown).
func Commit() string {
	info, _ := debug.ReadBuildInfo()
	return commitOf(commit, info)
}

// commitOf is Commit on explicit inputs (tests).
func commitOf(stamped string, info *debug.BuildInfo) string {
	if s := strings.TrimSpace(stamped); s != "" {
		return s
	}
	if info == nil {
		return ""
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}

// String is the line `-version` prints: the program, its release, the
// commit when known, the Go release and the platform.
func String(program string) string {
	s := fmt.Sprintf("%s %s", program, Version())
	if c := Commit(); c != "" {
		s += " (commit " + c + ")"
	}
	return s + fmt.Sprintf(" %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// IsFlag reports whether args ask a command for its version alone: one
// argument, -version, --version or "version". Commands whose flags are
// parsed elsewhere (plugins, the trainer) check it first.
func IsFlag(args []string) bool {
	if len(args) != 1 {
		return false
	}
	switch args[0] {
	case "-version", "--version", "version":
		return true
	}
	return false
}
