package demo

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hadar-sched/hadar/internal/report"
)

// Summary is the demo's result: per job, its completion time measured
// under hadar and under Nomad's own placement, and the simulator's
// prediction of both.
type Summary struct {
	Jobs []SummaryJob `json:"jobs"`
	// Makespan and average JCT per column, in seconds (NaN-free: a column
	// with a job cut off gives its lower bound).
	Makespan map[string]float64 `json:"makespan_s"`
	AvgJCT   map[string]float64 `json:"avg_jct_s"`
	// Notes say what the numbers are (models, cut-offs).
	Notes []string `json:"notes"`
	// Counts of what happened in the hadar run.
	HadarEvents map[string]int `json:"hadar_events"`
}

// SummaryJob is one job's line.
type SummaryJob struct {
	ID       string  `json:"id"`
	Kind     string  `json:"kind"`
	HadarS   float64 `json:"hadar_s"`               // measured; 0 if it failed
	HadarSim float64 `json:"hadar_sim_s"`           // predicted
	NomadS   float64 `json:"nomad_s,omitempty"`     // measured; 0 if not run
	NomadCut bool    `json:"nomad_cut,omitempty"`   // NomadS is a lower bound: stopped unfinished
	NomadEst float64 `json:"nomad_est_s,omitempty"` // when cut: extrapolated from its progress
	NomadSim float64 `json:"nomad_sim_s"`           // predicted (the model)
	Failed   string  `json:"failed,omitempty"`
}

// Columns of the summary.
const (
	colHadar    = "hadar"
	colHadarSim = "hadar sim"
	colNomad    = "nomad"
	colNomadSim = "nomad sim"
)

func summarize(infos []JobInfo, hadar, nomad *runResult, hp, np Prediction) Summary {
	s := Summary{Makespan: map[string]float64{}, AvgJCT: map[string]float64{}, HadarEvents: map[string]int{}}
	for _, ji := range infos {
		j := SummaryJob{ID: ji.ID, Kind: ji.Kind, HadarSim: hp.JCT[ji.ID], NomadSim: np.JCT[ji.ID]}
		if d, ok := hadar.jct[ji.ID]; ok {
			j.HadarS = d.Seconds()
		}
		if f, ok := hadar.failed[ji.ID]; ok {
			j.Failed = "hadar run: " + f
		}
		if nomad != nil {
			if d, ok := nomad.jct[ji.ID]; ok {
				j.NomadS = d.Seconds()
			} else if done, ok := nomad.done[ji.ID]; ok {
				at := nomad.cutOff - ji.At
				j.NomadS, j.NomadCut = at.Seconds(), true
				if done > 0 {
					// As fast as it went so far: a lower bound with its own
					// start-up included.
					j.NomadEst = at.Seconds() * ji.Steps / done
				}
			}
			if f, ok := nomad.failed[ji.ID]; ok {
				j.Failed = strings.TrimPrefix(j.Failed+"; nomad run: "+f, "; ")
			}
		}
		s.Jobs = append(s.Jobs, j)
	}
	add := func(col string, v func(SummaryJob) float64) {
		sum, n := 0.0, 0
		for i, j := range s.Jobs {
			x := v(j)
			if x <= 0 {
				continue
			}
			s.Makespan[col] = math.Max(s.Makespan[col], infos[i].At.Seconds()+x)
			sum += x
			n++
		}
		if n > 0 {
			s.AvgJCT[col] = sum / float64(n)
		}
	}
	add(colHadar, func(j SummaryJob) float64 { return j.HadarS })
	add(colHadarSim, func(j SummaryJob) float64 { return j.HadarSim })
	add(colNomadSim, func(j SummaryJob) float64 { return j.NomadSim })
	if nomad != nil {
		add(colNomad, func(j SummaryJob) float64 { return j.NomadS })
	}
	s.HadarEvents = map[string]int{"preemptions": hadar.preemptions, "forks": hadar.forks, "unforks": hadar.unforks, "merges": hadar.merges,
		"resumes from a checkpoint": hadar.resumes, "checkpoints on a stop": hadar.checkpoints}
	s.Notes = append(s.Notes,
		"hadar: measured on this cluster, from submission to the end of the job's last allocation; the sidecar ran "+hp.Policy+".",
		"hadar sim: planner/sim (the engine the sidecar runs) on the same cluster, jobs and settings, time-compressed; the job without hadar meta is taken as holding its GPU the whole run.",
		"nomad sim: the same engine with a model of Nomad's own placement: first fit in arrival order over nodes, blind to GPU types, a job starting once all its workers fit, never preempted (Nomad has no such scheduler mode; the model is the demo's, internal/demo.NomadModel).")
	if nomad == nil {
		s.Notes = append(s.Notes, "nomad: not run (-baseline=false).")
	} else {
		s.Notes = append(s.Notes, "nomad: measured on the same cluster: the same jobs without the gate and without hadar meta, the template group run with count = workers, placed by Nomad itself.")
		if nomad.cutOff > 0 {
			s.Notes = append(s.Notes, fmt.Sprintf("nomad: the run was stopped after %s to keep the demo short: a value with '>' is a lower bound, '~' extrapolates from the steps done by then.", nomad.cutOff.Round(time.Second)))
		}
	}
	return s
}

// write prints the table and writes summary.txt, summary.csv,
// summary.json and the completion-time plot (PNG and SVG) into dir.
func (s Summary) write(w io.Writer, dir string) ([]string, error) {
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\tkind\thadar\thadar sim\tNomad's own\tNomad model sim\t")
	for _, j := range s.Jobs {
		nomad := dur(j.NomadS)
		if j.NomadCut {
			nomad = "> " + nomad
			if j.NomadEst > 0 {
				nomad += " (~" + dur(j.NomadEst) + ")"
			}
		}
		if j.NomadS == 0 && !j.NomadCut {
			nomad = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", j.ID, j.Kind, dur(j.HadarS), dur(j.HadarSim), nomad, dur(j.NomadSim))
	}
	// A column with a job cut off gives lower bounds only.
	cut := ""
	for _, j := range s.Jobs {
		if j.NomadCut {
			cut = "> "
		}
	}
	for _, row := range []struct {
		name string
		m    map[string]float64
	}{{"makespan", s.Makespan}, {"average JCT", s.AvgJCT}} {
		nomad := dur(row.m[colNomad])
		if nomad != "-" {
			nomad = cut + nomad
		}
		fmt.Fprintf(tw, "%s\t\t%s\t%s\t%s\t%s\t\n", row.name, dur(row.m[colHadar]), dur(row.m[colHadarSim]), nomad, dur(row.m[colNomadSim]))
	}
	tw.Flush()
	fmt.Fprintf(&table, "\nhadar run: %d preemptions, %d forks, %d unforks, %d merges of HadarE copies, %d resumes from a checkpoint, %d checkpoints written on a stop\n",
		s.HadarEvents["preemptions"], s.HadarEvents["forks"], s.HadarEvents["unforks"], s.HadarEvents["merges"], s.HadarEvents["resumes from a checkpoint"], s.HadarEvents["checkpoints on a stop"])
	for _, j := range s.Jobs {
		if j.Failed != "" {
			fmt.Fprintf(&table, "FAILED %s: %s\n", j.ID, j.Failed)
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&table, "- %s\n", n)
	}
	fmt.Fprintf(w, "job completion times (submission to end; m:ss):\n%s", table.String())
	var files []string
	txt := filepath.Join(dir, "summary.txt")
	if err := os.WriteFile(txt, []byte(table.String()), 0o644); err != nil {
		return files, err
	}
	files = append(files, txt)
	js, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return files, err
	}
	jsPath := filepath.Join(dir, "summary.json")
	if err := os.WriteFile(jsPath, js, 0o644); err != nil {
		return files, err
	}
	files = append(files, jsPath)
	csvPath := filepath.Join(dir, "summary.csv")
	if err := s.writeCSV(csvPath); err != nil {
		return files, err
	}
	files = append(files, csvPath)
	var names []string
	series := []report.Series{{Name: "hadar (measured)"}, {Name: "hadar (simulated)"}, {Name: "Nomad's own (measured)"}, {Name: "Nomad model (simulated)"}}
	for _, j := range s.Jobs {
		names = append(names, j.ID)
		series[0].Values = append(series[0].Values, j.HadarS)
		series[1].Values = append(series[1].Values, j.HadarSim)
		series[2].Values = append(series[2].Values, j.NomadS)
		series[3].Values = append(series[3].Values, j.NomadSim)
	}
	plotted, err := report.SaveBars(filepath.Join(dir, "jct"), "Job completion time: hadar and Nomad's own placement", "JCT (s)", names, series)
	files = append(files, plotted...)
	return files, err
}

func (s Summary) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	_ = cw.Write([]string{"job", "kind", "hadar_s", "hadar_sim_s", "nomad_s", "nomad_cut", "nomad_est_s", "nomad_sim_s", "failed"})
	for _, j := range s.Jobs {
		_ = cw.Write([]string{j.ID, j.Kind, ff(j.HadarS), ff(j.HadarSim), ff(j.NomadS), strconv.FormatBool(j.NomadCut), ff(j.NomadEst), ff(j.NomadSim), j.Failed})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

func ff(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// dur shows seconds as m:ss.
func dur(s float64) string {
	if s <= 0 {
		return "-"
	}
	return clock(time.Duration(s * float64(time.Second)))
}
