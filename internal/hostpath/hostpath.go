// Package hostpath is what the demo and the end-to-end harness both ask
// of this host's paths: the hadar checkout they run from, and the mount
// points Nomad left under their folders. One definition each, so the two
// cannot drift apart (issue 34, item 5).
package hostpath

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/driver/mountinfo"
)

// module is the line of go.mod that marks hadar's checkout.
const module = "module github.com/hadar-sched/hadar\n"

// RepoRoot is the hadar checkout the working directory is in: the first
// folder at or above it whose go.mod is hadar's module.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte(module)) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no checkout of github.com/hadar-sched/hadar at or above the working directory")
		}
		dir = parent
	}
}

// Under reports whether path is one of dirs or inside one. An empty path
// is in none, and an empty dir holds nothing (not every absolute path).
func Under(path string, dirs []string) bool {
	if path == "" {
		return false
	}
	for _, d := range dirs {
		if d != "" && (path == d || strings.HasPrefix(path, d+"/")) {
			return true
		}
	}
	return false
}

// Mount is a mount point and its file system's type.
type Mount struct {
	Point, FSType string
}

// MountsUnder lists the mount points at or below any of dirs, deepest
// first, so they can be unmounted in that order (Nomad mounts tmpfs
// secrets/ and private/ in every allocation when it runs as root). None
// when the mount table cannot be read.
func MountsUnder(dirs []string) []Mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	return mountsIn(f, dirs)
}

// mountsIn is MountsUnder over a mountinfo table.
func mountsIn(r io.Reader, dirs []string) []Mount {
	var out []Mount
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// Fields: id parent major:minor root mountpoint options... - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		m := Mount{Point: mountinfo.Unescape(fields[4])}
		for i, x := range fields {
			if x == "-" && i+1 < len(fields) {
				m.FSType = fields[i+1]
			}
		}
		if Under(m.Point, dirs) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i].Point) > len(out[j].Point) })
	return out
}
