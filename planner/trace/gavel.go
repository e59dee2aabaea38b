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

// gavelColumns names the columns of Gavel's trace format in order.
var gavelColumns = [...]string{
	"job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir",
	"total_steps", "scale_factor", "priority_weight", "SLO", "arrival_time",
}

// legacyColumns names the columns of Gavel's earlier 7-column format, the
// one its Philly-derived per-VC traces (scheduler/traces/msr/) use.
var legacyColumns = [...]string{
	"job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps",
	"arrival_time", "scale_factor",
}

// maxLine bounds one trace line; Gavel's lines are a few hundred bytes.
const maxLine = 1 << 20

// ParseGavel reads Gavel's trace formats: one job a line, tab-separated, in
// either of the two layouts Gavel's code has read, told apart by the number
// of columns of the first job line (a file must not mix them):
//
//   - 10 columns: job_type, command, working_directory, num_steps_arg,
//     needs_data_dir, total_steps, scale_factor, priority_weight, SLO,
//     arrival_time (scheduler/utils.py parse_trace today);
//   - 7 columns, the legacy layout of the Philly-derived per-VC traces:
//     job_type, command, num_steps_arg, needs_data_dir, total_steps,
//     arrival_time, scale_factor. Weight is 1 and there is no SLO.
//
// Jobs get IDs "job-0000", "job-0001", ... in line order (blank lines
// skipped), then are sorted stably by arrival. The command, working
// directory and num_steps_arg columns are not used by hadar and are only
// counted.
//
// SLO: Gavel treats a negative SLO as none, read here as 0. A positive
// Gavel SLO is a multiple of the job's duration, which a trace does not
// carry, so it is rejected rather than guessed at; write such jobs in hadar's
// CSV format with the deadline in seconds. 0 also means none.
func ParseGavel(r io.Reader) ([]planner.Job, error) {
	jobs, _, _, err := parseGavel(r)
	return jobs, err
}

// parseGavel is ParseGavel that also returns the line of each job ID and
// the name of the layout read.
func parseGavel(r io.Reader) ([]planner.Job, map[string]int, string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	var jobs []planner.Job
	lines := map[string]int{}
	line, firstLine, columns := 0, 0, 0
	for sc.Scan() {
		line++
		text := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" {
			continue
		}
		f := strings.Split(text, "\t")
		if columns == 0 {
			if len(f) != len(gavelColumns) && len(f) != len(legacyColumns) {
				return nil, nil, "", fmt.Errorf("trace line %d: %d tab-separated columns: want %d (%s) or Gavel's legacy %d (%s)",
					line, len(f), len(gavelColumns), strings.Join(gavelColumns[:], ", "), len(legacyColumns), strings.Join(legacyColumns[:], ", "))
			}
			columns, firstLine = len(f), line
		}
		if len(f) != columns {
			names := gavelColumns[:]
			if columns == len(legacyColumns) {
				names = legacyColumns[:]
			}
			return nil, nil, "", fmt.Errorf("trace line %d: %d tab-separated columns: want %d (%s) like the first job on line %d",
				line, len(f), columns, strings.Join(names, ", "), firstLine)
		}
		id := fmt.Sprintf("job-%04d", len(jobs))
		var j planner.Job
		var err error
		if columns == len(legacyColumns) {
			j, err = parseLegacyLine(f, id)
		} else {
			j, err = parseGavelLine(f, id)
		}
		if err != nil {
			return nil, nil, "", fmt.Errorf("trace line %d: %w", line, err)
		}
		jobs = append(jobs, j)
		lines[id] = line
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, nil, "", fmt.Errorf("trace line %d: longer than %d bytes: want one job a line", line+1, maxLine)
		}
		return nil, nil, "", fmt.Errorf("trace: read after line %d: %w", line, err)
	}
	if len(jobs) == 0 {
		return nil, nil, "", errors.New("trace: no jobs: want one tab-separated job a line")
	}
	sortByArrival(jobs)
	format := FormatGavel
	if columns == len(legacyColumns) {
		format = FormatGavelLegacy
	}
	return jobs, lines, format, nil
}

func parseGavelLine(f []string, id string) (planner.Job, error) {
	j := planner.Job{ID: id}
	var err error
	if j.Model, err = jobType(f[0]); err != nil {
		return j, err
	}
	if err := needsDataDir(f[4]); err != nil {
		return j, err
	}
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
	if j.Arrival, err = arrival("arrival_time", f[9]); err != nil {
		return j, err
	}
	if err := j.Validate(); err != nil {
		return j, err
	}
	return j, nil
}

// parseLegacyLine reads one line of the 7-column layout. Gavel's reader of
// this layout skipped scale factor 0 silently; here it is an error naming the
// line like any other bad value (Gavel's own per-VC traces hold none).
func parseLegacyLine(f []string, id string) (planner.Job, error) {
	j := planner.Job{ID: id, Weight: 1}
	var err error
	if j.Model, err = jobType(f[0]); err != nil {
		return j, err
	}
	if err := needsDataDir(f[3]); err != nil {
		return j, err
	}
	if j.TotalSteps, err = positive("total_steps", f[4]); err != nil {
		return j, err
	}
	if j.Arrival, err = arrival("arrival_time", f[5]); err != nil {
		return j, err
	}
	if j.ScaleFactor, err = positiveInt("scale_factor", f[6]); err != nil {
		return j, err
	}
	if err := j.Validate(); err != nil {
		return j, err
	}
	return j, nil
}

func jobType(s string) (string, error) {
	m := strings.TrimSpace(s)
	if m == "" {
		return "", errors.New("job_type is empty: want a model of the throughput profile, e.g. \"ResNet-18 (batch size 16)\"")
	}
	return m, checkName("job_type", m)
}

func needsDataDir(s string) error {
	if _, err := strconv.Atoi(strings.TrimSpace(s)); err != nil {
		return fmt.Errorf("needs_data_dir %q: want 0 or 1", s)
	}
	return nil
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
