package queue_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/trace"
)

var update = flag.Bool("update", false, "rewrite testdata/*-teams.csv from their generator")

// team is one team of a generated trace: Gavel-style synthetic jobs
// (trace.Synthesize) arriving from At on.
type team struct {
	name string
	jobs int
	rate float64 // arrivals per hour (0: all at At)
	at   float64 // seconds
	seed int64
}

// teamTraces are the multi-team traces of docs/results.md ("Teams on one
// fleet"): one team floods the cluster at t=0, the others burst later.
var teamTraces = map[string][]team{
	"two-teams.csv": {
		{"flood", 240, 0, 0, 1},
		{"burst", 60, 30, 24 * 3600, 2},
	},
	"four-teams.csv": {
		{"flood", 240, 0, 0, 1},
		{"burst-1", 40, 20, 12 * 3600, 2},
		{"burst-2", 40, 20, 36 * 3600, 3},
		{"burst-3", 40, 20, 60 * 3600, 4},
	},
}

func teamJobs(t *testing.T, teams []team) []planner.Job {
	t.Helper()
	var all []planner.Job
	for _, tm := range teams {
		jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: tm.jobs, RatePerHour: tm.rate, Seed: tm.seed, Profile: profile.Default(), Reference: "v100"})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			j.ID = fmt.Sprintf("%s/%s", tm.name, j.ID)
			j.Queue = tm.name
			j.Arrival += tm.at
			all = append(all, j)
		}
	}
	return all
}

// TestTeamTracesMatchTheirGenerator keeps the committed traces what the
// generator writes (-update rewrites them).
func TestTeamTracesMatchTheirGenerator(t *testing.T) {
	for name, teams := range teamTraces {
		var buf bytes.Buffer
		if err := trace.Write(&buf, teamJobs(t, teams)); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", name)
		if *update {
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./planner/queue -run TestTeamTraces -update)", err)
		}
		if !bytes.Equal(got, buf.Bytes()) {
			t.Fatalf("%s differs from its generator: run go test ./planner/queue -run TestTeamTraces -update", path)
		}
		jobs, err := trace.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, j := range jobs {
			seen[j.Queue]++
		}
		for _, tm := range teams {
			if seen[tm.name] != tm.jobs {
				t.Fatalf("%s: queue %s has %d jobs, want %d", name, tm.name, seen[tm.name], tm.jobs)
			}
		}
	}
}
