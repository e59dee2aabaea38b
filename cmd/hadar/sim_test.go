package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner/profile"
)

const gavelTrace = "../../planner/trace/testdata/gavel/small_test.trace"

func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

// simResults runs hadar sim with args and --format json and returns its
// results, failing the test on an exit or output that is not JSON.
func simResults(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	out, errs, code := runCLI(t, append(append([]string{"sim"}, args...), "--format", "json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	return got.Results
}

func TestSimJSONContract(t *testing.T) {
	results := simResults(t, "--trace", gavelTrace, "--policies", "fifo,gavel-maxmin,hadar,hadare")
	if len(results) != 4 {
		t.Fatalf("%d results, want 4", len(results))
	}
	for i, want := range []string{"fifo", "gavel-maxmin", "hadar", "hadare"} {
		r := results[i]
		if r["policy"] != want {
			t.Fatalf("result %d is %v, want %s", i, r["policy"], want)
		}
		for _, k := range []string{"makespan_s", "avg_jct_s", "p99_jct_s", "utilization", "jobs_completed", "jobs_total", "gpu_h_per_job"} {
			if _, ok := r[k].(float64); !ok {
				t.Fatalf("result %s lacks numeric %q: %v", want, k, r)
			}
		}
		if r["jobs_completed"] != r["jobs_total"] || r["jobs_total"].(float64) != 20 {
			t.Fatalf("%s completed %v of %v jobs, want 20 of 20", want, r["jobs_completed"], r["jobs_total"])
		}
	}
}

// TestSimGPUHoursPerJob checks the GPU-h/job column: the table's header
// ends with it, every policy's row has one more column than before, and
// the summary's value is the per-job CSV's GPU seconds, summed over the
// completed jobs, in hours per job.
func TestSimGPUHoursPerJob(t *testing.T) {
	out, errs, code := runCLI(t, "sim", "--trace", gavelTrace, "--policies", "fifo,hadar")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var header string
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		fs := strings.Fields(line)
		switch {
		case len(fs) > 0 && fs[0] == "policy":
			header = strings.Join(fs, " ")
		case len(fs) == 9 && (fs[0] == "fifo" || fs[0] == "hadar"):
			rows[fs[0]] = fs
		}
	}
	if want := "policy makespan (h) avg JCT (h) p99 JCT (h) utilization completed restarts comm (h) GPU-h/job"; header != want {
		t.Fatalf("header %q, want %q\n%s", header, want, out)
	}
	if len(rows) != 2 {
		t.Fatalf("want a 9-column row for fifo and hadar:\n%s", out)
	}

	dir := t.TempDir()
	if _, errs, code := runCLI(t, "sim", "--trace", gavelTrace, "--policies", "fifo,hadar", "--out", dir, "--format", "csv"); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	sum := readCSV(t, filepath.Join(dir, "summary.csv"))
	if h := sum[0]; h[len(h)-1] != "gpu_h_per_job" {
		t.Fatalf("summary.csv header %v lacks gpu_h_per_job last", h)
	}
	for _, row := range sum[1:] {
		pol := row[0]
		jobs := readCSV(t, filepath.Join(dir, "jobs_"+pol+".csv"))
		held, done := 0.0, 0
		for _, j := range jobs[1:] {
			var finish, gs float64
			fmt.Sscan(j[5], &finish)
			fmt.Sscan(j[8], &gs)
			if finish > 0 {
				held += gs
				done++
			}
		}
		var got float64
		fmt.Sscan(row[len(row)-1], &got)
		want := held / 3600 / float64(done)
		if done != 20 || want <= 0 || math.Abs(got-want) > 1e-3 {
			t.Errorf("%s: gpu_h_per_job %v, want %v (%d jobs done)", pol, got, want, done)
		}
		if tw := fmt.Sprintf("%.2f", want); rows[pol][8] != tw {
			t.Errorf("%s: table GPU-h/job %s, want %s", pol, rows[pol][8], tw)
		}
	}
}

func readCSV(t *testing.T, name string) [][]string {
	t.Helper()
	fh, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	rows, err := csv.NewReader(fh).ReadAll()
	if err != nil || len(rows) < 2 {
		t.Fatalf("%s: %d rows, %v", name, len(rows), err)
	}
	return rows
}

func TestSimOutDirWritesPlotsAndCSVs(t *testing.T) {
	dir := t.TempDir()
	_, errs, code := runCLI(t, "sim", "--trace", gavelTrace, "--policies", "fifo,hadar", "--out", dir, "--format", "csv")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, name := range []string{"jobs_fifo.csv", "jobs_hadar.csv", "summary.csv", "jct_cdf.svg", "utilization_fifo.svg", "utilization_hadar.svg"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, ".svg") && !bytes.Contains(data, []byte("<svg")) {
			t.Fatalf("%s is not an SVG", name)
		}
		if strings.HasPrefix(name, "jobs_") && bytes.Count(data, []byte("\n")) != 21 {
			t.Fatalf("%s has %d lines, want header + 20 jobs", name, bytes.Count(data, []byte("\n")))
		}
	}
}

func TestSimRejectsBadInput(t *testing.T) {
	corrupt := filepath.Join(t.TempDir(), "bad.trace")
	if err := os.WriteFile(corrupt, []byte("ResNet-18 (batch size 16)\tcmd\tdir\t--n\t1\tmany\t1\t1\t-1\t0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown policy", []string{"--trace", gavelTrace, "--policies", "gavel-fastest"}, "unknown policy"},
		{"bad cluster", []string{"--trace", gavelTrace, "--cluster", "v100=lots"}, "--cluster"},
		{"unknown GPU type", []string{"--trace", gavelTrace, "--cluster", "tpu=8"}, "tpu"},
		{"no jobs", []string{}, "--trace"},
		{"both inputs", []string{"--trace", gavelTrace, "--synthetic", "5"}, "not both"},
		{"corrupt trace", []string{"--trace", corrupt}, "total_steps"},
		{"bad format", []string{"--trace", gavelTrace, "--format", "xml"}, "--format"},
		{"bad fidelity", []string{"--trace", gavelTrace, "--fidelity", "exact"}, "--fidelity"},
		{"bad prices", []string{"--trace", gavelTrace, "--prices", "v100=free"}, "--prices"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errs, code := runCLI(t, append([]string{"sim"}, tc.args...)...)
			if code == 0 {
				t.Fatal("want a failure")
			}
			if !strings.Contains(errs, tc.want) {
				t.Fatalf("stderr %q does not mention %q", errs, tc.want)
			}
		})
	}
}

// Sia (planner/sia, issue 35) runs through hadar sim beside Gavel's
// max-min and Hadar on a synthetic workload and completes every job.
func TestSimSiaCompletesEveryJob(t *testing.T) {
	results := simResults(t, "--synthetic", "40", "--seed", "1", "--load", "0.8", "--cluster", "v100=8,p100=8,k80=8",
		"--policies", "sia,gavel-maxmin,hadar")
	if len(results) != 3 || results[0]["policy"] != "sia" {
		t.Fatalf("results %v, want sia, gavel-maxmin, hadar", results)
	}
	for _, r := range results {
		if r["jobs_completed"] != r["jobs_total"] || r["jobs_total"].(float64) != 40 {
			t.Fatalf("%s completed %v of %v jobs, want 40 of 40", r["policy"], r["jobs_completed"], r["jobs_total"])
		}
	}
}

// --elastic (issue 35): with half the jobs elastic Sia and Hadar choose
// widths and their results change; sia:rigid and Gavel's max-min run
// elastic jobs at their scale factor, so theirs are those of the rigid
// workload.
func TestSimElasticFlag(t *testing.T) {
	args := []string{"--synthetic", "40", "--seed", "1", "--load", "0.8", "--cluster", "v100=8,p100=8,k80=8",
		"--policies", "sia,sia:rigid,gavel-maxmin,hadar"}
	rigid := simResults(t, args...)
	elastic := simResults(t, append(args, "--elastic", "0.5")...)
	if len(elastic) != 4 || elastic[1]["policy"] != "sia:rigid" {
		t.Fatalf("results %v, want sia, sia:rigid, gavel-maxmin, hadar", elastic)
	}
	for i, r := range elastic {
		if r["jobs_completed"] != r["jobs_total"] {
			t.Fatalf("%s completed %v of %v jobs", r["policy"], r["jobs_completed"], r["jobs_total"])
		}
		same := fmt.Sprint(r) == fmt.Sprint(rigid[i])
		if chooses := r["policy"] == "sia" || r["policy"] == "hadar"; same == chooses {
			t.Errorf("%s: elastic %v, rigid %v: want equal only for the policies that do not choose widths", r["policy"], r, rigid[i])
		}
	}
	if fmt.Sprint(rigid[0]["avg_jct_s"]) != fmt.Sprint(rigid[1]["avg_jct_s"]) {
		t.Errorf("rigid workload: sia %v and sia:rigid %v differ", rigid[0], rigid[1])
	}
	if _, errs, code := runCLI(t, append([]string{"sim"}, append(args, "--elastic", "2")...)...); code == 0 || !strings.Contains(errs, "--elastic") {
		t.Errorf("--elastic 2: exit %d, %q", code, errs)
	}
}

func TestSimWorkload(t *testing.T) {
	f, err := parseSimFlags([]string{"--workload", "philly-8h", "--seed", "2", "--policies", "fifo"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := buildSim(f, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.jobs) != 160 || s.cluster.TotalGPUs() != 64 || s.cluster.Capacity("v100") != 16 || s.cluster.Capacity("k80") != 24 {
		t.Errorf("philly-8h: %d jobs on %d GPUs (v100 %d, k80 %d), want 160 on 64 (16, 24)",
			len(s.jobs), s.cluster.TotalGPUs(), s.cluster.Capacity("v100"), s.cluster.Capacity("k80"))
	}
	// --cluster replaces the workload's cluster; sizes are capped to it.
	f, err = parseSimFlags([]string{"--workload", "philly-48h", "--cluster", "v100=8,p100=8", "--policies", "fifo"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = buildSim(f, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, j := range s.jobs {
		if j.ScaleFactor > 8 {
			t.Fatalf("%s on %d GPUs, want at most 8 on an 8-GPU-a-type cluster", j.ID, j.ScaleFactor)
		}
	}
	if len(s.jobs) != 960 || s.cluster.TotalGPUs() != 16 {
		t.Errorf("philly-48h on v100=8,p100=8: %d jobs, %d GPUs", len(s.jobs), s.cluster.TotalGPUs())
	}
	// The trace-drawn workload on a cluster of 4 GPUs a type: its 8-GPU
	// jobs run on 4, and every job keeps a trace run time (1 h or more).
	f, err = parseSimFlags([]string{"--workload", "philly-trace-8h", "--cluster", "v100=4,k80=4", "--policies", "fifo"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = buildSim(f, io.Discard); err != nil {
		t.Fatal(err)
	}
	if len(s.jobs) != 160 {
		t.Errorf("philly-trace-8h: %d jobs, want 160", len(s.jobs))
	}
	for _, j := range s.jobs {
		thr, err := profile.Default().Throughput(j.Model, j.ScaleFactor, "v100", false)
		if err != nil || j.ScaleFactor > 4 || j.TotalSteps/thr < 3599 {
			t.Fatalf("philly-trace-8h on v100=4,k80=4: %s on %d GPUs, %.0f s on the V100 (%v), want at most 4 GPUs and 1 h or more", j.ID, j.ScaleFactor, j.TotalSteps/thr, err)
		}
	}
}

func TestSimWorkloadErrors(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"--workload", "sia"}, []string{"--workload", "philly-8h, philly-48h"}},
		{[]string{"--workload", "philly-8h", "--trace", gavelTrace}, []string{"--workload", "--trace"}},
		{[]string{"--workload", "philly-8h", "--synthetic", "10"}, []string{"--workload", "--synthetic"}},
		{[]string{"--workload", "philly-8h", "--rate", "3"}, []string{"--workload", "--rate"}},
		{[]string{"--workload", "philly-8h", "--load", "0.9"}, []string{"--workload", "--load"}},
		{[]string{"--workload", "philly-8h", "--sizes", "gavel"}, []string{"--workload", "--sizes"}},
		{[]string{"--workload", "philly-8h", "--unprofiled", "refuse"}, []string{"--unprofiled", "extrapolate"}},
		{[]string{"--workload", "philly-8h", "--cluster", "v100=lots"}, []string{"--cluster"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errs, code := runCLI(t, append([]string{"sim", "--policies", "fifo"}, tc.args...)...)
			if code == 0 {
				t.Fatal("want a failure")
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr %q does not mention %q", errs, w)
				}
			}
		})
	}
}
