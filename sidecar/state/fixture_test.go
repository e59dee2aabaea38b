package state

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/engine"
)

// Every state format a release wrote is read by every later release
// (docs/upgrade.md): testdata/v<N> holds what a real sidecar of the
// release that introduced format N saved (e2e TestWriteStateFixtures
// writes it), through both stores. A release that changes the format
// bumps Version, adds testdata/v<Version>, and keeps reading the older
// ones: by migrating them on load.

// fixture is testdata/v<N>/fixture.json: what the generator saw.
type fixture struct {
	Version        int    `json:"version"`
	Policy         string `json:"policy"`
	JournalEntries int    `json:"journal_entries"`
	Generation     uint64 `json:"generation"`
	Index          uint64 `json:"index"`
}

func fixtureDirs(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join("testdata", "v*"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(dirs)
	return dirs
}

// The release that writes format Version ships its fixture.
func TestFixtureOfThisFormat(t *testing.T) {
	dir := filepath.Join("testdata", fmt.Sprintf("v%d", Version))
	for _, f := range []string{"sidecar.db", "variables.json", "fixture.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("state format %d has no fixture %s: write it with `go test ./e2e -run TestWriteStateFixtures -state-fixtures` (docs/upgrade.md): %v", Version, f, err)
		}
	}
}

func readFixture(t *testing.T, dir string) fixture {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "fixture.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f fixture
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// checkSaved holds a loaded state to what the fixture recorded: the
// engine's snapshot opens (format, version, checksum) and names its
// scheduler, the agent's bookkeeping is there, the journal is whole.
func checkSaved(t *testing.T, f fixture, saved *Saved, journal []Entry) {
	t.Helper()
	if saved == nil {
		t.Fatal("no saved state in the fixture")
	}
	raw, err := engine.Open(saved.Engine, engine.SnapshotFormat, engine.SnapshotVersion)
	if err != nil {
		t.Fatalf("the engine snapshot of the fixture does not open: %v", err)
	}
	var head struct {
		Scheduler struct {
			Name string `json:"name"`
		} `json:"scheduler"`
	}
	if err := json.Unmarshal(raw, &head); err != nil || !strings.HasPrefix(head.Scheduler.Name, f.Policy) {
		t.Fatalf("the snapshot's scheduler %q (%v), want %s", head.Scheduler.Name, err, f.Policy)
	}
	if len(saved.Agent) == 0 || saved.Generation != f.Generation || saved.Index != f.Index || saved.At.IsZero() {
		t.Fatalf("saved state: agent %d bytes, generation %d (want %d), index %d (want %d), at %v", len(saved.Agent), saved.Generation, f.Generation, saved.Index, f.Index, saved.At)
	}
	if len(journal) != f.JournalEntries {
		t.Fatalf("%d journal entries, want %d", len(journal), f.JournalEntries)
	}
	kinds := map[string]bool{}
	for _, e := range journal {
		kinds[e.Kind] = true
		if e.Job == "" || e.Generation == 0 || e.Generation > f.Generation {
			t.Fatalf("journal entry %+v: no job, or no generation", e)
		}
	}
	if !kinds["start"] {
		t.Fatalf("the journal has no start: %v", kinds)
	}
}

func TestReadsEveryFormatsFixture(t *testing.T) {
	dirs := fixtureDirs(t)
	if len(dirs) == 0 {
		t.Fatal("no state fixture in testdata")
	}
	ctx := context.Background()
	for _, dir := range dirs {
		f := readFixture(t, dir)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			var fromFile, fromVars *Saved
			var fileJournal []Entry
			t.Run("file", func(t *testing.T) {
				// A copy: opening a state file may write to it.
				p := filepath.Join(t.TempDir(), "sidecar.db")
				copyFile(t, filepath.Join(dir, "sidecar.db"), p)
				b, err := OpenBolt(p, 0)
				if err != nil {
					t.Fatalf("the file store of format %d does not open: %v", f.Version, err)
				}
				defer b.Close()
				if fromFile, err = b.Load(ctx); err != nil {
					t.Fatal(err)
				}
				if fileJournal, err = b.Journal(ctx, 0); err != nil {
					t.Fatal(err)
				}
				checkSaved(t, f, fromFile, fileJournal)
				// And the next save goes on from it.
				if err := b.Save(ctx, fromFile); err != nil {
					t.Fatalf("saving over the format %d state: %v", f.Version, err)
				}
			})
			vars := loadVars(t, dir)
			stores := map[string]func(t *testing.T) *api.Client{"variables (Nomad's API as the fake serves it)": func(t *testing.T) *api.Client {
				fv := newFakeVars(t)
				for _, v := range vars {
					fv.set(v.Path, v.Items)
				}
				return fv.client("fixture")
			}}
			if !testing.Short() {
				stores["variables (a real Nomad server)"] = func(t *testing.T) *api.Client {
					c := nomad.Agent(t).Client
					for _, v := range vars {
						if _, _, err := c.Variables().Create(&api.Variable{Path: v.Path, Items: v.Items}, nil); err != nil {
							t.Fatal(err)
						}
					}
					t.Cleanup(func() {
						for _, v := range vars {
							c.Variables().Delete(v.Path, nil)
						}
					})
					return c
				}
			}
			for name, client := range stores {
				t.Run(name, func(t *testing.T) {
					v := NewVariables(client(t), "", "hadar/sidecar")
					defer v.Close()
					var err error
					if fromVars, err = v.Load(ctx); err != nil {
						t.Fatalf("the Variables store of format %d does not load: %v", f.Version, err)
					}
					js, err := v.Journal(ctx, 0)
					if err != nil {
						t.Fatal(err)
					}
					checkSaved(t, f, fromVars, js)
					if fromFile != nil && (!reflect.DeepEqual(fromVars.Engine, fromFile.Engine) || string(fromVars.Agent) != string(fromFile.Agent)) {
						t.Fatal("the two stores of the fixture hold different states")
					}
					// The next leader appends and saves over it.
					if _, err := v.Append(ctx, Entry{Job: "default/next", Kind: "start", Generation: f.Generation + 1}); err != nil {
						t.Fatalf("appending to the format %d journal: %v", f.Version, err)
					}
					next := *fromVars
					next.Generation = f.Generation + 1
					if err := v.Save(ctx, &next); err != nil {
						t.Fatalf("saving over the format %d state: %v", f.Version, err)
					}
				})
			}
		})
	}
}

type fixtureVar struct {
	Path  string            `json:"path"`
	Items map[string]string `json:"items"`
}

func loadVars(t *testing.T, dir string) []fixtureVar {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "variables.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []fixtureVar
	if err := json.Unmarshal(b, &vs); err != nil || len(vs) == 0 {
		t.Fatalf("variables.json: %d variables, %v", len(vs), err)
	}
	return vs
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
