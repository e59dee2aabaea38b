// Package release builds hadar's release archives (make dist): every
// binary for each platform, stamped with the release version, packed as
// hadar_<version>_<os>_<arch>.tar.gz with the jobspec, policies and
// documents an operator installs from, and a SHA256SUMS beside them; and
// verifies what it built: the checksums, each binary's platform and stamp
// (read from the Go build information every binary carries, whatever its
// platform), and `-version` of those this machine can run.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// StampVar and CommitVar are the variables -ldflags -X sets
// (package version): the release version and the commit it was built
// from.
const (
	StampVar  = "github.com/hadar-sched/hadar/version.stamp"
	CommitVar = "github.com/hadar-sched/hadar/version.commit"
)

// Binary is one program of the release.
type Binary struct {
	// Name is its file name; Dir its folder in the archive ("" or
	// "plugins", what a Nomad client's plugin_dir takes as it is).
	Name, Dir string
	// Package is its main package.
	Package string
}

// Binaries are the programs every archive holds.
func Binaries() []Binary {
	return []Binary{
		{Name: "hadar", Package: "./cmd/hadar"},
		{Name: "hadar-trainer", Package: "./cmd/hadar-trainer"},
		{Name: "hadar-gpu", Dir: "plugins", Package: "./cmd/hadar-gpu"},
		{Name: "hadar-train", Dir: "plugins", Package: "./cmd/hadar-train"},
	}
}

// Files are the repository's files every archive holds, beside the
// binaries.
func Files() []string {
	return []string{"README.md", "CHANGELOG.md", "docs/deploy.md", "docs/upgrade.md", "docs/driver.md", "docs/sidecar.md",
		"docs/status.md", "docs/observability.md", "docs/jobspec.md", "docs/trainer.md", "docs/results.md",
		"deploy/hadar-sidecar.nomad.hcl", "deploy/hadar-auth-method.json", "docs/acl/hadar-sidecar.nomad.hcl", "docs/acl/hadar-sidecar.consul.hcl",
		"deploy/systemd/nomad-client.service", "deploy/systemd/nomad-client-hadar.hcl", "deploy/systemd/hadar-sidecar.service", "deploy/systemd/sidecar.hcl",
		"deploy/grafana/hadar.json", "deploy/prometheus/hadar-alerts.yml", "deploy/prometheus/prometheus.nomad.hcl", "docs/acl/prometheus.nomad.hcl",
		"deploy/pack/hadar/metadata.hcl", "deploy/pack/hadar/variables.hcl", "deploy/pack/hadar/README.md",
		"deploy/pack/hadar/templates/_helpers.tpl", "deploy/pack/hadar/templates/hadar-sidecar.nomad.tpl", "deploy/pack/hadar/templates/hadar-auth-method.json.tpl", "docs/queues.md",
		"planner/profile/data/LICENSE.gavel",
		// The jobspecs docs/deploy.md runs, and the training library
		// their PyTorch ones use (pip install ./python): an operator
		// installs from the archive, not from a clone.
		"jobspecs/README.md", "jobspecs/dispatch.nomad.hcl", "jobspecs/forkable.nomad.hcl", "jobspecs/gang.nomad.hcl",
		"jobspecs/hadare-emulated.nomad.hcl", "jobspecs/network-sensitive.nomad.hcl", "jobspecs/pytorch-exec.nomad.hcl",
		"jobspecs/pytorch-elastic.nomad.hcl", "jobspecs/pytorch-hadar-train.nomad.hcl", "jobspecs/single-gpu.nomad.hcl", "jobspecs/stock-device.nomad.hcl",
		"jobspecs/throughput.nomad.hcl", "jobspecs/train-emulated.nomad.hcl", "docs/pytorch.md", "docs/training-contract.md",
		"python/README.md", "python/pyproject.toml", "python/hadar_train/__init__.py", "python/hadar_train/checkpoint.py",
		"python/hadar_train/elastic.py", "python/hadar_train/env.py", "python/hadar_train/files.py", "python/hadar_train/launch.py", "python/hadar_train/local.py",
		"python/hadar_train/membership.py", "python/hadar_train/progress.py", "python/hadar_train/run.py", "python/hadar_train/state.py",
		"python/hadar_train/examples/__init__.py", "python/hadar_train/examples/ddp.py", "python/hadar_train/examples/digits.py", "python/hadar_train/examples/elastic.py",
		"python/hadar_train/examples/hadare.py", "python/hadar_train/examples/single.py"}
}

// Platform is one target.
type Platform struct {
	OS, Arch string
	// CGO builds with cgo: hadar-gpu then loads NVML (libnvidia-ml.so)
	// at run time. Without it hadar-gpu serves declared inventories only.
	CGO bool
}

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// Platforms are the release's targets: linux/amd64 with cgo (NVML) and
// linux/arm64 without (cross-compiled with no C toolchain for arm64).
func Platforms() []Platform {
	return []Platform{{OS: "linux", Arch: "amd64", CGO: true}, {OS: "linux", Arch: "arm64"}}
}

// ArchiveName is the archive of a version and platform.
func ArchiveName(version string, p Platform) string {
	return fmt.Sprintf("hadar_%s_%s_%s.tar.gz", version, p.OS, p.Arch)
}

// Build compiles every binary for p into dir/<Dir>/<Name>, stamped with
// version and commit (empty: none stamped, Go's own record of the commit
// is then all `-version` can name); root is the repository.
func Build(ctx context.Context, root, version, commit string, p Platform, dir string) error {
	ldflags := "-s -w -X " + StampVar + "=" + version
	if commit != "" {
		ldflags += " -X " + CommitVar + "=" + commit
	}
	for _, b := range Binaries() {
		out := filepath.Join(dir, b.Dir, b.Name)
		cgo := "0"
		if p.CGO {
			cgo = "1"
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, b.Package)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS="+p.OS, "GOARCH="+p.Arch, "CGO_ENABLED="+cgo)
		if o, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s for %s: %v\n%s", b.Package, p, err, o)
		}
	}
	return nil
}

// Archive packs the binaries built in dir and the repository files of
// Files into out, under the folder hadar_<version>_<os>_<arch>/, the same
// bytes for the same inputs: entries sorted, owned by root, times set to
// modTime.
func Archive(root, dir, version string, p Platform, modTime time.Time, out string) error {
	prefix := strings.TrimSuffix(ArchiveName(version, p), ".tar.gz")
	type entry struct {
		name, src string
		mode      int64
	}
	var entries []entry
	for _, b := range Binaries() {
		entries = append(entries, entry{path.Join(prefix, b.Dir, b.Name), filepath.Join(dir, b.Dir, b.Name), 0o755})
	}
	for _, f := range Files() {
		entries = append(entries, entry{path.Join(prefix, f), filepath.Join(root, f), 0o644})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(gz)
	dirs := map[string]bool{}
	for _, e := range entries {
		for d := path.Dir(e.name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	for _, d := range ds {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: modTime, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, e := range entries {
		b, err := os.ReadFile(e.src)
		if err != nil {
			return fmt.Errorf("archive %s: %w", out, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: e.mode, Size: int64(len(b)), ModTime: modTime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// SumsFile is the checksums' file name, in sha256sum's format.
const SumsFile = "SHA256SUMS"

// WriteSums writes SHA256SUMS in dir for the named files of dir.
func WriteSums(dir string, names []string) error {
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		sum, err := fileSum(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	return os.WriteFile(filepath.Join(dir, SumsFile), []byte(b.String()), 0o644)
}

func fileSum(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Checked is what Verify checked of one binary.
type Checked struct {
	Archive, Binary string
	GOARCH          string
	CGO             bool
	// Ran is the binary's -version line, when this machine could run it.
	Ran string
}

// Verify checks a dist folder: every file SHA256SUMS lists has its sum,
// every archive of the version's platforms is listed and holds every
// binary and file; each binary is built for its archive's platform, with
// cgo as the platform says, and stamped with version; those this machine
// runs answer -version with it. scratch receives the unpacked binaries.
func Verify(dir, version string, scratch string) ([]Checked, error) {
	listed, err := readSums(filepath.Join(dir, SumsFile))
	if err != nil {
		return nil, err
	}
	for name, want := range listed {
		got, err := fileSum(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if got != want {
			return nil, fmt.Errorf("%s: SHA-256 %s, but %s says %s", name, got, SumsFile, want)
		}
	}
	var out []Checked
	for _, p := range Platforms() {
		name := ArchiveName(version, p)
		if _, ok := listed[name]; !ok {
			return nil, fmt.Errorf("%s is not in %s", name, SumsFile)
		}
		files, err := unpack(filepath.Join(dir, name), filepath.Join(scratch, p.OS+"-"+p.Arch))
		if err != nil {
			return nil, err
		}
		prefix := strings.TrimSuffix(name, ".tar.gz")
		for _, f := range Files() {
			if _, ok := files[path.Join(prefix, f)]; !ok {
				return nil, fmt.Errorf("%s lacks %s", name, f)
			}
		}
		for _, b := range Binaries() {
			bin, ok := files[path.Join(prefix, b.Dir, b.Name)]
			if !ok {
				return nil, fmt.Errorf("%s lacks %s", name, path.Join(b.Dir, b.Name))
			}
			c, err := checkBinary(bin, version, p)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", name, path.Join(b.Dir, b.Name), err)
			}
			c.Archive, c.Binary = name, path.Join(b.Dir, b.Name)
			out = append(out, c)
		}
	}
	return out, nil
}

func readSums(p string) (map[string]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			return nil, fmt.Errorf("%s: line %q: want \"<sha256>  <file>\"", p, sc.Text())
		}
		out[name] = sum
	}
	return out, sc.Err()
}

// unpack extracts an archive's regular files into dst and returns them by
// archive path.
func unpack(archive, dst string) (map[string]string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	tr := tar.NewReader(gz)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		clean := path.Clean(h.Name)
		if strings.HasPrefix(clean, "../") || path.IsAbs(clean) {
			return nil, fmt.Errorf("%s: entry %q leaves the archive's folder", archive, h.Name)
		}
		p := filepath.Join(dst, filepath.FromSlash(clean))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		w, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, os.FileMode(h.Mode)&0o755)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(w, tr)
		w.Close()
		if err != nil {
			return nil, err
		}
		out[clean] = p
	}
}

// checkBinary reads a binary's Go build information and, when it runs
// here, its -version.
func checkBinary(bin, version string, p Platform) (Checked, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return Checked{}, fmt.Errorf("no Go build information: %w", err)
	}
	set := map[string]string{}
	for _, s := range info.Settings {
		set[s.Key] = s.Value
	}
	c := Checked{GOARCH: set["GOARCH"], CGO: set["CGO_ENABLED"] == "1"}
	if set["GOOS"] != p.OS || set["GOARCH"] != p.Arch {
		return c, fmt.Errorf("built for %s/%s, not %s", set["GOOS"], set["GOARCH"], p)
	}
	if c.CGO != p.CGO {
		return c, fmt.Errorf("CGO_ENABLED=%s, want cgo %v", set["CGO_ENABLED"], p.CGO)
	}
	// -trimpath keeps -ldflags out of the build information: the stamp
	// is looked for in the binary's bytes (the -X string is stored whole).
	raw, err := os.ReadFile(bin)
	if err != nil {
		return c, err
	}
	if !bytes.Contains(raw, []byte(version)) {
		return c, fmt.Errorf("the binary does not hold the version string %q: not stamped with it", version)
	}
	if p.OS == runtime.GOOS && p.Arch == runtime.GOARCH {
		out, err := exec.Command(bin, "-version").Output()
		if err != nil {
			return c, fmt.Errorf("-version: %w", err)
		}
		c.Ran = strings.TrimSpace(string(out))
		if f := strings.Fields(c.Ran); len(f) < 2 || f[1] != version {
			return c, fmt.Errorf("-version says %q, want version %s", c.Ran, version)
		}
		// docs/deploy.md shows the commit beside the version: a release
		// that cannot name its commit is not the one the docs describe.
		if !strings.Contains(c.Ran, "(commit ") {
			return c, fmt.Errorf("-version says %q: no commit", c.Ran)
		}
	}
	return c, nil
}
