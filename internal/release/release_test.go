package release

import (
	"bytes"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/internal/hostpath"
)

// stage writes stand-ins for the binaries (their bytes do not matter to
// the archive).
func stage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range Binaries() {
		p := filepath.Join(dir, b.Dir, b.Name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("binary "+b.Name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// The same inputs pack to the same bytes, with every binary and file
// under the release's folder, binaries executable, plugins in plugins/.
func TestArchiveIsReproducible(t *testing.T) {
	root, dir, out := repoRoot(t), stage(t), t.TempDir()
	p := Platform{OS: "linux", Arch: "arm64"}
	when := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	a, b := filepath.Join(out, "a.tar.gz"), filepath.Join(out, "b.tar.gz")
	for _, f := range []string{a, b} {
		if err := Archive(root, dir, "v1.2.3", p, when, f); err != nil {
			t.Fatal(err)
		}
	}
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ab, bb) {
		t.Fatal("two packs of the same inputs differ")
	}
	files, err := unpack(a, filepath.Join(out, "x"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hadar_v1.2.3_linux_arm64/hadar", "hadar_v1.2.3_linux_arm64/plugins/hadar-gpu", "hadar_v1.2.3_linux_arm64/plugins/hadar-train",
		"hadar_v1.2.3_linux_arm64/deploy/hadar-sidecar.nomad.hcl", "hadar_v1.2.3_linux_arm64/docs/upgrade.md", "hadar_v1.2.3_linux_arm64/CHANGELOG.md",
		"hadar_v1.2.3_linux_arm64/deploy/systemd/nomad-client.service", "hadar_v1.2.3_linux_arm64/deploy/systemd/hadar-sidecar.service",
		"hadar_v1.2.3_linux_arm64/deploy/grafana/hadar.json", "hadar_v1.2.3_linux_arm64/deploy/prometheus/hadar-alerts.yml",
		"hadar_v1.2.3_linux_arm64/deploy/prometheus/prometheus.nomad.hcl", "hadar_v1.2.3_linux_arm64/docs/acl/prometheus.nomad.hcl"} {
		p, ok := files[want]
		if !ok {
			t.Fatalf("the archive lacks %s (has %v)", want, files)
		}
		st, _ := os.Stat(p)
		if exe := st.Mode()&0o111 != 0; exe != !strings.Contains(filepath.Base(want), ".") {
			t.Errorf("%s: mode %v", want, st.Mode())
		}
	}
}

// Verify catches an archive changed after its sum was written.
func TestVerifyCatchesATamperedArchive(t *testing.T) {
	root, dir, out := repoRoot(t), stage(t), t.TempDir()
	var names []string
	for _, p := range Platforms() {
		name := ArchiveName("v1.2.3", p)
		if err := Archive(root, dir, "v1.2.3", p, time.Unix(0, 0), filepath.Join(out, name)); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if err := WriteSums(out, names); err != nil {
		t.Fatal(err)
	}
	sums, _ := os.ReadFile(filepath.Join(out, SumsFile))
	if n := strings.Count(string(sums), "\n"); n != 2 {
		t.Fatalf("SHA256SUMS has %d lines:\n%s", n, sums)
	}
	// Stand-ins are no Go binaries: Verify goes as far as the binaries.
	if _, err := Verify(out, "v1.2.3", t.TempDir()); err == nil || !strings.Contains(err.Error(), "no Go build information") {
		t.Fatalf("Verify of stand-ins: %v", err)
	}
	f := filepath.Join(out, names[0])
	b, _ := os.ReadFile(f)
	b[len(b)/2] ^= 0xff
	os.WriteFile(f, b, 0o644)
	if _, err := Verify(out, "v1.2.3", t.TempDir()); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("Verify of a tampered archive: %v", err)
	}
}

// checkBinary on real Go binaries: the stamp, the platform and cgo from
// the build information, and -version where this machine runs it.
func TestCheckBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	dir := t.TempDir()
	build := func(arch, cgo, version string, commit ...string) string {
		out := filepath.Join(dir, arch+"-"+cgo+"-"+version+strings.Join(commit, ""))
		ldflags := "-X " + StampVar + "=" + version
		for _, c := range commit {
			ldflags += " -X " + CommitVar + "=" + c
		}
		// -buildvcs=false: the commit must come from the stamp, as where
		// the build cannot ask git.
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "../../version/testdata/probe")
		cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED="+cgo)
		if o, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, o)
		}
		return out
	}
	host := runtime.GOARCH
	native := build(host, "0", "v1.2.3", "abc123")
	unstamped := build(host, "0", "v1.2.3")
	arm := build("arm64", "0", "v1.2.3", "abc123")
	for name, tc := range map[string]struct {
		bin     string
		version string
		p       Platform
		want    string
		ran     bool
	}{
		"native, runs":     {native, "v1.2.3", Platform{OS: "linux", Arch: host}, "", host == runtime.GOARCH},
		"no commit":        {unstamped, "v1.2.3", Platform{OS: "linux", Arch: host}, "no commit", false},
		"arm64, read only": {arm, "v1.2.3", Platform{OS: "linux", Arch: "arm64"}, "", host == "arm64"},
		"wrong version":    {arm, "v9.9.9", Platform{OS: "linux", Arch: "arm64"}, "not stamped with it", false},
		"wrong platform":   {arm, "v1.2.3", Platform{OS: "linux", Arch: "amd64"}, "built for linux/arm64", false},
		"cgo expected":     {arm, "v1.2.3", Platform{OS: "linux", Arch: "arm64", CGO: true}, "CGO_ENABLED=0", false},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := checkBinary(tc.bin, tc.version, tc.p)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkBinary = %v, want %q", err, tc.want)
			}
			if tc.want == "" && (c.Ran != "") != tc.ran {
				t.Fatalf("ran %q, want ran %v", c.Ran, tc.ran)
			}
			if tc.want == "" && c.Ran != "" && !strings.HasPrefix(c.Ran, "probe v1.2.3 (commit abc123) ") {
				t.Fatalf("-version said %q", c.Ran)
			}
		})
	}
}

// linkedDocs are the repository files docs/deploy.md links to or names
// as the archive's: its relative Markdown links and the paths in its
// table of the archive's contents.
func linkedDocs(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`\]\(([^)#:\s]+)(#[^)]*)?\)`).FindAllStringSubmatch(string(b), -1) {
		seen[path.Clean(path.Join("docs", m[1]))] = true
	}
	for _, m := range regexp.MustCompile("`((?:docs|deploy)/[^`*\\s]+|README\\.md|CHANGELOG\\.md)`").FindAllStringSubmatch(string(b), -1) {
		if _, err := os.Stat(filepath.Join(root, m[1])); err == nil {
			seen[m[1]] = true
		}
	}
	// Paths in its command lines too: `nomad job run ... jobspecs/x.hcl`
	// fails on an archive that lacks the file.
	for _, m := range regexp.MustCompile(`(?:^|[\s=(])((?:jobspecs|deploy|docs|python)/[\w./-]+\.(?:hcl|json|yml|md|toml|py))\b`).FindAllStringSubmatch(string(b), -1) {
		if _, err := os.Stat(filepath.Join(root, m[1])); err == nil {
			seen[m[1]] = true
		}
	}
	var out []string
	for f := range seen {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// The archive is all an operator installs from: every document
// docs/deploy.md links to is in it, with the jobspecs and the Pack.
func TestArchiveHoldsEveryLinkedDoc(t *testing.T) {
	root := repoRoot(t)
	in := map[string]bool{}
	for _, f := range Files() {
		in[f] = true
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("Files names %s: %v", f, err)
		}
	}
	docs := linkedDocs(t, root)
	if len(docs) < 8 {
		t.Fatalf("found only %v in docs/deploy.md", docs)
	}
	for _, f := range docs {
		if st, err := os.Stat(filepath.Join(root, f)); err == nil && st.IsDir() {
			// A folder (the Pack): every file in it.
			filepath.WalkDir(filepath.Join(root, f), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					rel, _ := filepath.Rel(root, p)
					if !in[filepath.ToSlash(rel)] {
						t.Errorf("docs/deploy.md names %s, whose %s the archive lacks", f, rel)
					}
				}
				return nil
			})
			continue
		}
		if !in[f] {
			t.Errorf("docs/deploy.md links to %s, which the archive lacks", f)
		}
	}
}

// The jobspecs and the training library ship whole: a file added to
// either is in the archive, or this fails naming it.
func TestArchiveHoldsTheJobspecsAndLibrary(t *testing.T) {
	root := repoRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "jobspecs", "python").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	in := map[string]bool{}
	for _, f := range Files() {
		in[f] = true
	}
	n := 0
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "python/tests/") || path.Base(f) == ".gitignore" {
			continue
		}
		n++
		if !in[f] {
			t.Errorf("the archive lacks %s: add it to Files", f)
		}
	}
	if n < 20 {
		t.Fatalf("git ls-files found only %d files of jobspecs/ and python/", n)
	}
}

// What make dist stamps and what the docs show agree: before the first
// tag, the version is the CHANGELOG's unreleased one with -dev-<n>-g<commit>
// (not v0.0.0-<n>-g<commit>), the docs' examples name that release, and
// the commit is stamped beside it.
func TestMakeVersionAgreesWithDocs(t *testing.T) {
	root := repoRoot(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	out, err := exec.Command("make", "-s", "-C", root, "print-version").Output()
	if err != nil {
		t.Fatalf("make print-version: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("make print-version said %q", out)
	}
	version, commit := f[0], f[1]
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("no git checkout: %v", err)
	}
	if !strings.HasPrefix(commit, strings.TrimSpace(string(head))) {
		t.Errorf("COMMIT %s, HEAD %s", commit, head)
	}
	cl, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## (v[0-9]+\.[0-9]+\.[0-9]+)`).FindSubmatch(cl)
	if m == nil {
		t.Fatal("CHANGELOG.md names no release")
	}
	release := string(m[1])
	if version != release && !strings.HasPrefix(version, release+"-") {
		t.Errorf("make dist stamps %s, CHANGELOG.md's release is %s", version, release)
	}
	deploy, _ := os.ReadFile(filepath.Join(root, "docs", "deploy.md"))
	for _, v := range regexp.MustCompile(`hadar_(v[0-9][^_]*)_linux`).FindAllSubmatch(deploy, -1) {
		if string(v[1]) != release {
			t.Errorf("docs/deploy.md shows %s, the release is %s", v[1], release)
		}
	}
}
