package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/state"
)

var stateFixtures = flag.Bool("state-fixtures", false, "TestWriteStateFixtures writes sidecar/state/testdata/v<state.Version> from a real sidecar run (docs/upgrade.md, \"For hadar's developers\")")

// FixtureVar is one Nomad variable of a Variables store fixture.
type fixtureVar struct {
	Path  string            `json:"path"`
	Items map[string]string `json:"items"`
}

// TestWriteStateFixtures is the generator of the state fixtures every
// later release must read (sidecar/state/fixture_test.go reads them): a
// real sidecar with an election and its state in Nomad Variables places
// and completes one job and keeps another running; then
// it stops, and what it saved is written as the release's fixtures: the
// variables under its prefix (variables.json) and the same state and
// journal through the file store (sidecar.db). It runs only when asked:
//
//	go test ./e2e -run TestWriteStateFixtures -state-fixtures
func TestWriteStateFixtures(t *testing.T) {
	if !*stateFixtures {
		t.Skip("the state fixtures' generator: run with -state-fixtures to write sidecar/state/testdata/v" + fmt.Sprint(state.Version))
	}
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "sidecar", "state", "testdata", fmt.Sprintf("v%d", state.Version))
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: "fx-srv", Mode: harness.ModeServer})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	a := harness.StartAgent(t, harness.Options{Name: "fx-v100", Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr},
		Meta: map[string]string{"rack": "r1"}, Plugins: map[string]string{"hadar-gpu": declare("va", "Tesla V100-SXM2-16GB", "16GiB", 2), "hadar-train": train}})
	c.nodes[a.NodeID], c.ids["fx-v100"] = "fx-v100", a.NodeID
	t.Cleanup(c.stopSidecar)
	sc := c.startSidecar(config.Config{
		Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "4s"},
		Service:    config.Service{Leader: &config.LeaderConfig{Enabled: true, TTL: "10s", LockDelay: "1s"}, State: &config.StateConfig{Store: "nomad"}},
	})
	c.submit(scJob{id: "done", steps: 200, gated: true})
	c.submit(scJob{id: "long", steps: 1000000, gated: true})
	c.waitFor("the short job completes", 3*time.Minute, func() error {
		if st := c.jobStatus("done"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	c.waitFor("the long job runs", 2*time.Minute, func() error {
		if len(c.running("long")) != 1 {
			return errNotYet
		}
		return nil
	})
	c.waitRounds(sc, 2)
	c.stopSidecar()

	ctx := context.Background()
	src := state.NewVariables(c.api, "default", config.DefaultStatePrefix)
	saved, err := src.Load(ctx)
	if err != nil || saved == nil {
		t.Fatalf("the sidecar's saved state: %v, %v", saved, err)
	}
	journal, err := src.Journal(ctx, 0)
	if err != nil || len(journal) == 0 {
		t.Fatalf("the sidecar's journal: %d entries, %v", len(journal), err)
	}
	src.Close()
	metas, _, err := c.api.Variables().PrefixList(config.DefaultStatePrefix+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	var vars []fixtureVar
	for _, m := range metas {
		v, _, err := c.api.Variables().Read(m.Path, nil)
		if err != nil {
			t.Fatal(err)
		}
		vars = append(vars, fixtureVar{Path: v.Path, Items: v.Items})
	}
	sort.Slice(vars, func(i, j int) bool { return vars[i].Path < vars[j].Path })
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(vars, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "variables.json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(out, "sidecar.db")
	os.Remove(dbPath)
	db, err := state.OpenBolt(dbPath, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range journal {
		if _, err := db.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Save(ctx, saved); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// What the reading test expects of the fixture.
	exp := map[string]any{"version": state.Version, "policy": "gavel-maxmin", "placement": "pack", "round_s": 4,
		"journal_entries": len(journal), "generation": saved.Generation, "index": saved.Index}
	b, _ = json.MarshalIndent(exp, "", " ")
	if err := os.WriteFile(filepath.Join(out, "fixture.json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d variables, %d journal entries, state of generation %d", out, len(vars), len(journal), saved.Generation)
}
