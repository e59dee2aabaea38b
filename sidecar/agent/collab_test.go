package agent

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/sidecar/config"
)

// The collaborators come from the configuration alone, the overlay loaded
// into the profile the network model then reads; a profile or an overlay
// that does not load stops them, saying which.
func TestNewCollaborators(t *testing.T) {
	client, _ := api.NewClient(&api.Config{Address: "http://127.0.0.1:1"})
	cfg, err := config.Config{Scheduling: config.Scheduling{GPUTypes: map[string]string{"Tesla X": "x100"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	var loaded *belief.Profile
	c, err := newCollaborators(cfg, client, hclog.NewNullLogger(), func(p *belief.Profile) error { loaded = p; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if c.client != client || c.watcher == nil || c.feas == nil || c.net == nil || c.applier != nil {
		t.Fatalf("collaborators %+v: want all but the applier", c)
	}
	if loaded == nil || loaded != c.prof {
		t.Fatal("the overlay was not loaded into the profile kept")
	}
	if got := c.types.Type("Tesla X"); got != "x100" {
		t.Fatalf("gpu_types not followed: %q", got)
	}

	boom := errors.New("boom")
	if _, err := newCollaborators(cfg, client, hclog.NewNullLogger(), func(*belief.Profile) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("an overlay that does not load: %v", err)
	}
	cfg.Profile = filepath.Join(t.TempDir(), "missing.json")
	if _, err := newCollaborators(cfg, client, hclog.NewNullLogger(), func(*belief.Profile) error { return nil }); err == nil || !strings.Contains(err.Error(), "profile") {
		t.Fatalf("a profile that does not load: %v", err)
	}
}
