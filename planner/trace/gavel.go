// Package trace reads and writes job traces (Gavel's tab-separated format and
// hadar's own CSV, see docs/formats.md) and synthesizes Gavel-style workloads.
//
// Every job a function here returns passes planner.Job.Validate, and jobs
// come sorted by arrival (stably, so equal arrivals keep their input order).
package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hadar-sched/hadar/planner"
)

// gavelColumns names Gavel's trace columns in order.
var gavelColumns = [...]string{
	"job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir",
	"total_steps", "scale_factor", "priority_weight", "SLO", "arrival_time",
}

// maxLine bounds one trace line; Gavel's lines are a few hundred bytes.
const maxLine = 1 << 20

// ParseGavel reads Gavel's trace format: one job a line, ten tab-separated
// columns (job_type, command, working_directory, num_steps_arg,
// needs_data_dir, total_steps, scale_factor, priority_weight, SLO,
// arrival_time). Jobs get IDs "job-0000", "job-0001", ... in line order
// (blank lines skipped), then are sorted stably by arrival. The command,
// working directory and num_steps_arg columns are not used by hadar and are
// only counted.
//
// SLO: Gavel treats a negative SLO as none, read here as 0. A positive
// Gavel SLO is a multiple of the job's duration, which a trace does not
// carry, so it is rejected rather than guessed at; write such jobs in hadar's
// CSV format with the deadline in seconds. 0 also means none.
func ParseGavel(r io.Reader) ([]planner.Job, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	var jobs []planner.Job
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" {
			continue
		}
		j, err := parseGavelLine(text, fmt.Sprintf("job-%04d", len(jobs)))
		if err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		jobs = append(jobs, j)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("trace line %d: longer than %d bytes: want one job a line", line+1, maxLine)
		}
		return nil, fmt.Errorf("trace: read after line %d: %w", line, err)
	}
	if len(jobs) == 0 {
		return nil, errors.New("trace: no jobs: want one tab-separated job a line")
	}
	sortByArrival(jobs)
	return jobs, nil
}

func parseGavelLine(text, id string) (planner.Job, error) {
	f := strings.Split(text, "\t")
	if len(f) != len(gavelColumns) {
		return planner.Job{}, fmt.Errorf("%d tab-separated columns: want %d (%s)", len(f), len(gavelColumns), strings.Join(gavelColumns[:], ", "))
	}
	j := planner.Job{ID: id, Model: strings.TrimSpace(f[0])}
	if j.Model == "" {
		return j, errors.New("job_type is empty: want a model of the throughput profile, e.g. \"ResNet-18 (batch size 16)\"")
	}
	if err := checkName("job_type", j.Model); err != nil {
		return j, err
	}
	if _, err := strconv.Atoi(strings.TrimSpace(f[4])); err != nil {
		return j, fmt.Errorf("needs_data_dir %q: want 0 or 1", f[4])
	}
	var err error
	if j.TotalSteps, err = positive("total_steps", f[5]); err != nil {
		return j, err
	}
	if j.ScaleFactor, err = positiveInt("scale_factor", f[6]); err != nil {
		return j, err
	}
	if j.Weight, err = positive("priority_weight", f[7]); err != nil {
		return j, err
	}
	slo, err := finite("SLO", f[8])
	if err != nil {
		return j, err
	}
	if slo > 0 {
		return j, fmt.Errorf("SLO %q: a positive Gavel SLO is a multiple of the job's duration, which the trace lacks: use -1 for none, or hadar's CSV format with slo_s in seconds", f[8])
	}
	if j.Arrival, err = nonNegative("arrival_time", f[9]); err != nil {
		return j, err
	}
	if err := j.Validate(); err != nil {
		return j, err
	}
	return j, nil
}

// checkName rejects invalid UTF-8 and control characters in IDs and model
// names: they are never meant, and a newline or tab would not survive a trip
// through either format.
func checkName(field, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q: not valid UTF-8: want text", field, s)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return fmt.Errorf("%s %q: control character at byte %d: want printable text", field, s, i)
	}
	return nil
}

func finite(field, s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s %q: want a finite number", field, s)
	}
	return v, nil
}

func positive(field, s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive number", field, s)
	}
	return v, nil
}

func nonNegative(field, s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("%s %q: want a number of seconds >= 0", field, s)
	}
	return v, nil
}

func positiveInt(field, s string) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive integer", field, s)
	}
	return v, nil
}

// sortByArrival orders jobs by arrival, keeping the input order of ties so
// that a trace's job order stays meaningful (e.g. FIFO among t=0 jobs).
func sortByArrival(jobs []planner.Job) {
	slices.SortStableFunc(jobs, func(a, b planner.Job) int {
		switch {
		case a.Arrival < b.Arrival:
			return -1
		case a.Arrival > b.Arrival:
			return 1
		}
		return 0
	})
}
