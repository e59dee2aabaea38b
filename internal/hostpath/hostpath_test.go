package hostpath

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestUnder(t *testing.T) {
	for _, c := range []struct {
		path string
		dirs []string
		want bool
	}{
		{"/a/b", []string{"/a"}, true},
		{"/a", []string{"/a"}, true},
		{"/ab", []string{"/a"}, false},
		{"", []string{"/a"}, false},
		{"/a/b", []string{""}, false}, // an empty dir holds nothing
		{"/x", []string{"/a", "/x"}, true},
	} {
		if got := Under(c.path, c.dirs); got != c.want {
			t.Errorf("Under(%q, %q) = %v", c.path, c.dirs, got)
		}
	}
}

// Mount points below the folders come deepest first, with their file
// system type and mountinfo's escapes undone.
func TestMountsIn(t *testing.T) {
	table := `22 1 0:21 / /proc rw - proc proc rw
30 22 0:40 / /d/alloc/x/secrets rw,nosuid - tmpfs tmpfs rw
31 22 0:41 / /d/alloc/x rw - tmpfs tmpfs rw
32 22 0:42 / /d/my\040dir rw - ext4 /dev/sda1 rw
33 22 0:43 / /dx rw - tmpfs tmpfs rw
short line
`
	got := mountsIn(strings.NewReader(table), []string{"/d"})
	want := []Mount{{"/d/alloc/x/secrets", "tmpfs"}, {"/d/alloc/x", "tmpfs"}, {"/d/my dir", "ext4"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// The checkout is found from a folder inside it.
func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "hostpath", "hostpath.go")); err != nil {
		t.Fatalf("root %s is not the checkout: %v", root, err)
	}
}
