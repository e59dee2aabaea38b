package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/hadar-sched/hadar/netmodel"
	"github.com/hadar-sched/hadar/planner/placement"
)

// runNetmodel is `hadar netmodel calibrate`: the network model's fit to
// Gavel's consolidated versus unconsolidated throughputs, as markdown.
func runNetmodel(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "calibrate" {
		fmt.Fprintln(stderr, "usage: hadar netmodel calibrate\n\nPrints the network model's calibration against Gavel's throughputs (docs/netmodel.md).")
		return errUsage
	}
	fs := flag.NewFlagSet("hadar netmodel calibrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: calibrate takes no arguments", fs.Arg(0))
	}
	rep, err := netmodel.DefaultCalibration()
	if err != nil {
		return err
	}
	return rep.WriteMarkdown(stdout)
}

// writePlacementNotes prints, under the results table, each delay run's
// preemptions and each auto-tuner's timer scale over time.
func writePlacementNotes(w io.Writer, labels []string, placers []*placement.Policy) error {
	var b strings.Builder
	for i, p := range placers {
		if p == nil || (p.Name() != placement.Delay && p.Name() != placement.DelayAutotune) {
			continue
		}
		ps := p.Preemptions()
		evicted, most := 0, 0
		for _, e := range ps {
			if e.Evicted {
				evicted++
			}
			most = max(most, e.Count)
		}
		fmt.Fprintf(&b, "\n%s: %d preemptions (%d evictions), at most %d per job\n", labels[i], len(ps), evicted, most)
		if t := p.Tuner(); t != nil {
			fmt.Fprintf(&b, "  auto-tuner timer scale over time (class 0 = least sensitive):\n  %8s  %5s  %8s  %s\n", "time(h)", "class", "scale", "mean cost")
			for _, pt := range t.Trajectory() {
				cost := "-"
				if !math.IsNaN(pt.Cost) {
					cost = fmt.Sprintf("%.3f", pt.Cost)
				}
				fmt.Fprintf(&b, "  %8.2f  %5d  %8.4f  %s\n", pt.Time/3600, pt.Class, pt.Scale, cost)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeTunerCSVs writes autotune-<run>.csv (time_s, class, scale, cost)
// for every auto-tuned run, for plotting the trajectory.
func writeTunerCSVs(dir string, labels []string, placers []*placement.Policy) ([]string, error) {
	var files []string
	for i, p := range placers {
		if p == nil || p.Tuner() == nil {
			continue
		}
		var b strings.Builder
		b.WriteString("time_s,class,scale,cost\n")
		for _, pt := range p.Tuner().Trajectory() {
			cost := ""
			if !math.IsNaN(pt.Cost) {
				cost = fmt.Sprintf("%g", pt.Cost)
			}
			fmt.Fprintf(&b, "%g,%d,%g,%s\n", pt.Time, pt.Class, pt.Scale, cost)
		}
		name := filepath.Join(dir, "autotune-"+strings.NewReplacer("/", "_", "+", "_").Replace(labels[i])+".csv")
		if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
			return files, err
		}
		files = append(files, name)
	}
	return files, nil
}
