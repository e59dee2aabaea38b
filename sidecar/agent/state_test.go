package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/state"
)

// TestCorruptStateStopsTheSidecar: a state file the sidecar cannot read
// stops it at start with the file named and the way out, before it
// contacts Nomad or plans anything.
func TestCorruptStateStopsTheSidecar(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sidecar.db")
	if err := os.WriteFile(path, []byte(strings.Repeat("garbage", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Config{State: StateConfig{Path: path}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	client, _ := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
	_, err = New(s, client, nil)
	if !errors.Is(err, state.ErrUnreadable) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("err = %v", err)
	}
}
