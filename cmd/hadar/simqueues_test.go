package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const mediumTrace = "../../planner/trace/testdata/gavel/medium_test.trace"

func writeQueues(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "queues.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Two Gavel traces, one per team, mapped to queues; each policy flat,
// in queues and on static partitions; results per queue in JSON and in
// the table.
func TestSimQueues(t *testing.T) {
	q := writeQueues(t, `
queue "a" {
  guarantee = { v100 = 18, p100 = 18, k80 = 18 }
}
queue "b" {
  guarantee = { v100 = 18, p100 = 18, k80 = 18 }
  policy    = "fifo"
}
`)
	args := []string{"sim", "--trace", gavelTrace + "@a," + mediumTrace + "@b", "--queues", q, "--queue-modes", "flat,queues,static", "--policies", "gavel-maxmin"}
	out, errs, code := runCLI(t, append(args, "--format", "json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Results []struct {
			Policy        string  `json:"policy"`
			JobsCompleted int     `json:"jobs_completed"`
			QueueFairness float64 `json:"queue_fairness"`
			Queues        []struct {
				Queue           string  `json:"queue"`
				Jobs            int     `json:"jobs"`
				AvgJCTS         float64 `json:"avg_jct_s"`
				GuaranteedGPUs  float64 `json:"guaranteed_gpu_s"`
				BelowGuaranteeS float64 `json:"below_guarantee_s"`
			} `json:"queues"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(got.Results) != 3 {
		t.Fatalf("%d results, want 3", len(got.Results))
	}
	for i, want := range []string{"gavel-maxmin+flat", "gavel-maxmin+queues", "gavel-maxmin+static"} {
		r := got.Results[i]
		if r.Policy != want || r.JobsCompleted != 40 || len(r.Queues) != 2 || r.Queues[0].Queue != "a" || r.Queues[1].Queue != "b" ||
			r.Queues[0].Jobs != 20 || r.Queues[1].Jobs != 20 || !(r.Queues[0].AvgJCTS > 0) || !(r.Queues[0].GuaranteedGPUs > 0) || !(r.QueueFairness > 0) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	out, errs, code = runCLI(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "below guarantee (s)") || !strings.Contains(out, "gavel-maxmin+static") || strings.Count(out, "gavel-maxmin+queues") != 3 {
		t.Fatalf("table:\n%s", out)
	}
}

func TestSimQueuesRejectsBadInput(t *testing.T) {
	good := writeQueues(t, `queue "a" { guarantee = { v100 = 4 } }`)
	over := writeQueues(t, `queue "a" { guarantee = { v100 = 40 } }`)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"modes without queues", []string{"--queue-modes", "static"}, "--queue-modes needs --queues"},
		{"unknown mode", []string{"--queues", good, "--queue-modes", "shared"}, `--queue-modes: "shared"`},
		{"unreadable queues", []string{"--queues", filepath.Join(t.TempDir(), "none.hcl")}, "--queues"},
		{"guarantees over the cluster", []string{"--queues", over}, "v100: 40 guaranteed, 36 in the cluster"},
		{"static with an unguaranteed queue", []string{"--queues", good, "--queue-modes", "static"}, "fits on no type of queue default's guarantee"},
		{"bad queue name in the trace spec", []string{"--trace", gavelTrace + "@a b"}, `queue "a b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"sim", "--trace", gavelTrace, "--policies", "fifo"}, tc.args...)
			_, errs, code := runCLI(t, args...)
			if code == 0 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q: want a failure mentioning %q", code, errs, tc.want)
			}
		})
	}
}
