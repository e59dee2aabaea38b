package version

import (
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for name, tc := range map[string]struct {
		stamp string
		info  *debug.BuildInfo
		want  string
	}{
		"stamp wins":           {"v0.3.0-4-gabc1234", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-2026"}}, "v0.3.0-4-gabc1234"},
		"stamp trimmed":        {" v0.3.0\n", nil, "v0.3.0"},
		"module version":       {"", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260101120000-0123456789ab+dirty"}}, "v0.0.0-20260101120000-0123456789ab+dirty"},
		"devel with commit":    {"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef0123", "false")}, "v0.0.0-dev+g0123456789ab"},
		"devel, dirty tree":    {"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef0123", "true")}, "v0.0.0-dev+g0123456789ab.dirty"},
		"devel without commit": {"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Fallback},
		"no build info":        {"", nil, Fallback},
	} {
		t.Run(name, func(t *testing.T) {
			if got := resolve(tc.stamp, tc.info); got != tc.want {
				t.Fatalf("resolve = %q, want %q", got, tc.want)
			}
		})
	}
}

// Every version a plugin reports must parse as Nomad's loader parses it
// (hashicorp/go-version), or Nomad refuses to load the plugin.
func TestPluginVersionIsSemver(t *testing.T) {
	for in, want := range map[string]string{
		"v0.3.0":                    "v0.3.0",
		"v0.3.0-12-gabc1234":        "v0.3.0-12-gabc1234",
		"v0.3.0-12-gabc1234-dirty":  "v0.3.0-12-gabc1234-dirty",
		"v0.0.0-dev+g0123456789ab":  "v0.0.0-dev+g0123456789ab",
		"abc1234":                   "v0.0.0-dev+abc1234",
		"my build/2 (test)":         "v0.0.0-dev+my-build-2--test",
		"///":                       Fallback,
		"v0.0.0-20260101-abc+dirty": "v0.0.0-20260101-abc+dirty",
	} {
		got := pluginOf(in)
		if got != want {
			t.Errorf("pluginOf(%q) = %q, want %q", in, got, want)
		}
		if !semver.MatchString(got) {
			t.Errorf("pluginOf(%q) = %q: not semver", in, got)
		}
	}
}

func TestIsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"-version"}, true},
		{[]string{"--version"}, true},
		{[]string{"version"}, true},
		{nil, false},
		{[]string{"-version", "x"}, false},
		{[]string{"train"}, false},
	} {
		if got := IsFlag(tc.args); got != tc.want {
			t.Errorf("IsFlag(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

// The stamp reaches a real binary through -ldflags -X, as make builds
// it: a program printing String shows it.
func TestStampThroughLdflags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "probe")
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X github.com/hadar-sched/hadar/version.stamp=v9.8.7-3-gfeedbee", "./testdata/probe")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "probe v9.8.7-3-gfeedbee ") || lines[1] != "v9.8.7-3-gfeedbee" {
		t.Fatalf("the stamped binary says %q", out)
	}
}

// The commit stamped at link time is what `hadar version` names, even
// where Go recorded none (a build without git); without a stamp, Go's
// record.
func TestCommitOf(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}}
	for name, tc := range map[string]struct {
		stamp string
		info  *debug.BuildInfo
		want  string
	}{
		"stamp, no vcs":  {"abc123\n", &debug.BuildInfo{}, "abc123"},
		"stamp wins":     {"abc123", &debug.BuildInfo{Settings: vcs}, "abc123"},
		"vcs alone":      {"", &debug.BuildInfo{Settings: vcs}, "0123456789abcdef-dirty"},
		"nothing":        {"", &debug.BuildInfo{}, ""},
		"no build info":  {"", nil, ""},
		"stamp, no info": {"abc123", nil, "abc123"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := commitOf(tc.stamp, tc.info); got != tc.want {
				t.Fatalf("commitOf = %q, want %q", got, tc.want)
			}
		})
	}
}
