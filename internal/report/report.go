// Package report renders simulation results: a side-by-side table, JSON,
// CSV, per-job CSV files and plots.
package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/hadar-sched/hadar/planner/sim"
)

// Summary is one policy's line of the comparison; its JSON names are the
// `hadar sim --format json` contract.
type Summary struct {
	Policy        string  `json:"policy"`
	MakespanS     float64 `json:"makespan_s"`
	AvgJCTS       float64 `json:"avg_jct_s"`
	P99JCTS       float64 `json:"p99_jct_s"`
	Utilization   float64 `json:"utilization"`
	JobsCompleted int     `json:"jobs_completed"`
	JobsTotal     int     `json:"jobs_total"`
	Restarts      int     `json:"restarts"`
	Rounds        int     `json:"rounds"`
	// CommOverheadS is the time jobs spent communicating, summed over
	// jobs (set when a network model is in use).
	CommOverheadS float64 `json:"comm_overhead_s,omitempty"`
	// GPUHoursPerJob is the mean GPU time, in hours, held by a completed
	// job (restart and merge time included); 0 when none completed.
	GPUHoursPerJob float64 `json:"gpu_h_per_job"`
	// Queues has one line per queue when the run has queues (docs/queues.md);
	// QueueFairness is Jain's index across them.
	Queues           []QueueSummary `json:"queues,omitempty"`
	QueueFairness    float64        `json:"queue_fairness,omitempty"`
	BusyWhileWaiting float64        `json:"busy_while_waiting,omitempty"`
}

// Summarize turns a result into its summary line.
func Summarize(r sim.Result) Summary {
	s := Summary{Policy: r.Scheduler, MakespanS: r.Makespan, AvgJCTS: r.AvgJCT, P99JCTS: r.P99JCT,
		Utilization: r.Utilization, JobsCompleted: r.Completed, JobsTotal: r.Total, Rounds: r.Rounds, CommOverheadS: r.CommOverhead,
		Queues: queueSummaries(r), QueueFairness: r.QueueFairness, BusyWhileWaiting: r.BusyWhileWaiting}
	held := 0.0
	for _, j := range r.Jobs {
		s.Restarts += j.Restarts
		if j.Finish > 0 { // completed: Finish is set only then
			held += j.GPUSeconds
		}
	}
	if r.Completed > 0 {
		s.GPUHoursPerJob = held / 3600 / float64(r.Completed)
	}
	return s
}

// WriteJSON writes {"results":[...]}.
func WriteJSON(w io.Writer, rs []sim.Result) error {
	out := struct {
		Results []Summary `json:"results"`
	}{Results: make([]Summary, 0, len(rs))}
	for _, r := range rs {
		out.Results = append(out.Results, Summarize(r))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// WriteCSV writes one summary row per policy.
func WriteCSV(w io.Writer, rs []sim.Result) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"policy", "makespan_s", "avg_jct_s", "p99_jct_s", "utilization", "jobs_completed", "jobs_total", "restarts", "rounds", "comm_overhead_s", "gpu_h_per_job"})
	for _, r := range rs {
		s := Summarize(r)
		_ = cw.Write([]string{s.Policy, f(s.MakespanS), f(s.AvgJCTS), f(s.P99JCTS), strconv.FormatFloat(s.Utilization, 'f', 4, 64),
			strconv.Itoa(s.JobsCompleted), strconv.Itoa(s.JobsTotal), strconv.Itoa(s.Restarts), strconv.Itoa(s.Rounds), f(s.CommOverheadS),
			strconv.FormatFloat(s.GPUHoursPerJob, 'f', 4, 64)})
	}
	cw.Flush()
	return cw.Error()
}

func f(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// WriteTable writes a human-readable comparison; the first result is the
// baseline the ratio columns compare against.
func WriteTable(w io.Writer, rs []sim.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tmakespan (h)\tavg JCT (h)\tp99 JCT (h)\tutilization\tcompleted\trestarts\tcomm (h)\tGPU-h/job\t")
	for _, r := range rs {
		s := Summarize(r)
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.1f%%\t%d/%d\t%d\t%.2f\t%.2f\t\n", s.Policy, s.MakespanS/3600, s.AvgJCTS/3600, s.P99JCTS/3600,
			100*s.Utilization, s.JobsCompleted, s.JobsTotal, s.Restarts, s.CommOverheadS/3600, s.GPUHoursPerJob)
	}
	return tw.Flush()
}

// WriteJobsCSV writes one row per job of one result.
func WriteJobsCSV(w io.Writer, r sim.Result) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"job", "model", "scale_factor", "arrival_s", "start_s", "finish_s", "jct_s", "restarts", "gpu_seconds"})
	for _, j := range r.Jobs {
		_ = cw.Write([]string{j.ID, j.Model, strconv.Itoa(j.SF), f(j.Arrival), f(j.Start), f(j.Finish), f(j.JCT), strconv.Itoa(j.Restarts), f(j.GPUSeconds)})
	}
	cw.Flush()
	return cw.Error()
}
