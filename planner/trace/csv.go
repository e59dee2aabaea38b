package trace

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
)

// Header is the first line of hadar's own trace format.
var Header = []string{"id", "model", "scale_factor", "total_steps", "weight", "arrival_s", "slo_s"}

// Optional columns may follow Header, each at most once and in this
// order: the job's queue (planner.Job.Queue, "" = the default queue) and
// its priority inside it (planner.Job.Priority, 0 = Nomad's default).
var Optional = []string{"queue", "priority"}

// Parse reads hadar's own trace format: CSV (RFC 4180, so model names may
// hold commas when quoted) with the header line
// "id,model,scale_factor,total_steps,weight,arrival_s,slo_s", optionally
// followed by ",queue" and ",priority" (Optional), then one job a row. Lines starting with '#' are comments and blank lines are skipped.
// IDs must be unique; slo_s is seconds after arrival, 0 = none. Jobs are
// sorted stably by arrival.
func Parse(r io.Reader) ([]planner.Job, error) {
	jobs, _, err := parseCSV(r)
	return jobs, err
}

// parseCSV is Parse that also returns the line of each job ID.
func parseCSV(r io.Reader) ([]planner.Job, map[string]int, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1 // counted below, to name the columns in the error
	head, err := cr.Read()
	if err == io.EOF {
		return nil, nil, fmt.Errorf("trace: empty: want the header %q", strings.Join(Header, ","))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("trace: %w", err)
	}
	cols, ok := columns(trimAll(head))
	if !ok {
		line, _ := cr.FieldPos(0)
		return nil, nil, fmt.Errorf("trace line %d: header %q: want %q, optionally followed by %s", line, strings.Join(head, ","), strings.Join(Header, ","), strings.Join(Optional, " and "))
	}
	var jobs []planner.Job
	seen := map[string]int{}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("trace: %w", err)
		}
		line, _ := cr.FieldPos(0)
		j, err := parseRow(rec, cols)
		if err != nil {
			return nil, nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if first, dup := seen[j.ID]; dup {
			return nil, nil, fmt.Errorf("trace line %d: id %q already used on line %d: want unique job IDs", line, j.ID, first)
		}
		seen[j.ID] = line
		jobs = append(jobs, j)
	}
	if len(jobs) == 0 {
		return nil, nil, errors.New("trace: no jobs after the header: want one job a row")
	}
	sortByArrival(jobs)
	return jobs, seen, nil
}

func trimAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

// columns checks a header: Header, then optional columns in Optional's
// order; it returns every column's name.
func columns(head []string) ([]string, bool) {
	if len(head) < len(Header) || !slices.Equal(head[:len(Header)], Header) {
		return nil, false
	}
	next := 0
	for _, c := range head[len(Header):] {
		k := slices.Index(Optional, c)
		if k < next {
			return nil, false
		}
		next = k + 1
	}
	return head, true
}

func parseRow(rec []string, cols []string) (planner.Job, error) {
	if len(rec) != len(cols) {
		return planner.Job{}, fmt.Errorf("%d columns: want %d (%s)", len(rec), len(cols), strings.Join(cols, ","))
	}
	j := planner.Job{ID: strings.TrimSpace(rec[0]), Model: strings.TrimSpace(rec[1])}
	if j.ID == "" {
		return j, errors.New("id is empty: want a unique job ID")
	}
	if j.Model == "" {
		return j, errors.New("model is empty: want a model of the throughput profile")
	}
	if err := checkName("id", j.ID); err != nil {
		return j, err
	}
	if err := checkName("model", j.Model); err != nil {
		return j, err
	}
	var err error
	if j.ScaleFactor, err = positiveInt("scale_factor", rec[2]); err != nil {
		return j, err
	}
	if j.TotalSteps, err = positive("total_steps", rec[3]); err != nil {
		return j, err
	}
	if j.Weight, err = positive("weight", rec[4]); err != nil {
		return j, err
	}
	if j.Arrival, err = arrival("arrival_s", rec[5]); err != nil {
		return j, err
	}
	if j.SLO, err = nonNegative("slo_s", rec[6]); err != nil {
		return j, err
	}
	for k := len(Header); k < len(cols); k++ {
		cell := strings.TrimSpace(rec[k])
		switch cols[k] {
		case "queue":
			if cell != "" && !queue.ValidName(cell) {
				return j, fmt.Errorf("queue %q: want a queue name of letters, digits, '-', '_' or '.' (empty: the default queue)", cell)
			}
			j.Queue = cell
		case "priority":
			if cell == "" {
				continue
			}
			p, err := strconv.Atoi(cell)
			if err != nil || p < 0 {
				return j, fmt.Errorf("priority %q: want an integer >= 0 (Nomad's job priority; empty or 0: its default 50)", cell)
			}
			j.Priority = p
		}
	}
	if err := j.Validate(); err != nil {
		return j, err
	}
	return j, nil
}

// Write writes jobs in hadar's own format, in the order given, after
// validating each (a trace Parse would reject is never written). Numbers are
// written in the shortest form that reads back to the same float64.
func Write(w io.Writer, jobs []planner.Job) error {
	seen := map[string]bool{}
	for _, j := range jobs {
		if err := j.Validate(); err != nil {
			return fmt.Errorf("trace: write: %w", err)
		}
		if err := checkArrival(j.Arrival); err != nil {
			return fmt.Errorf("trace: write job %s: arrival %v s: %w", j.ID, j.Arrival, err)
		}
		if strings.TrimSpace(j.ID) != j.ID || strings.TrimSpace(j.Model) != j.Model {
			return fmt.Errorf("trace: write: job %q, model %q: leading or trailing spaces would not read back: trim them", j.ID, j.Model)
		}
		if err := errors.Join(checkName("id", j.ID), checkName("model", j.Model)); err != nil {
			return fmt.Errorf("trace: write job %s: %w", j.ID, err)
		}
		if strings.HasPrefix(j.ID, "#") {
			return fmt.Errorf("trace: write: job ID %q would read back as a comment: want an ID not starting with '#'", j.ID)
		}
		if seen[j.ID] {
			return fmt.Errorf("trace: write: job ID %q given twice: want unique IDs", j.ID)
		}
		seen[j.ID] = true
		if j.Queue != "" && !queue.ValidName(j.Queue) {
			return fmt.Errorf("trace: write job %s: queue %q: want a queue name of letters, digits, '-', '_' or '.'", j.ID, j.Queue)
		}
	}
	// The optional columns are written when some job needs them, so a
	// trace without queues reads as before.
	head := slices.Clone(Header)
	withQueue := slices.ContainsFunc(jobs, func(j planner.Job) bool { return j.Queue != "" })
	withPriority := slices.ContainsFunc(jobs, func(j planner.Job) bool { return j.Priority != 0 })
	if withQueue {
		head = append(head, "queue")
	}
	if withPriority {
		head = append(head, "priority")
	}
	bw := bufio.NewWriter(w)
	cw := csv.NewWriter(bw)
	if err := cw.Write(head); err != nil {
		return fmt.Errorf("trace: write: %w", err)
	}
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, j := range jobs {
		rec := []string{j.ID, j.Model, strconv.Itoa(j.ScaleFactor), num(j.TotalSteps), num(j.Weight), num(j.Arrival), num(j.SLO)}
		if withQueue {
			rec = append(rec, j.Queue)
		}
		if withPriority {
			rec = append(rec, strconv.Itoa(j.Priority))
		}
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("trace: write job %s: %w", j.ID, err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("trace: write: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("trace: write: %w", err)
	}
	return nil
}
