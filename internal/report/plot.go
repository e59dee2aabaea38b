package report

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/hadar-sched/hadar/planner/sim"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff}, color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
}

// WriteDir writes, for every result, its per-job CSV, and the plots: the
// JCT CDF of all policies (jct_cdf.svg) and each policy's GPU utilization
// over time per type (utilization_<policy>.svg).
func WriteDir(dir string, rs []sim.Result) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("output directory %s: %w", dir, err)
	}
	var files []string
	for _, r := range rs {
		path := filepath.Join(dir, "jobs_"+r.Scheduler+".csv")
		fh, err := os.Create(path)
		if err != nil {
			return files, err
		}
		err = WriteJobsCSV(fh, r)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return files, fmt.Errorf("%s: %w", path, err)
		}
		files = append(files, path)
	}
	summary := filepath.Join(dir, "summary.csv")
	fh, err := os.Create(summary)
	if err != nil {
		return files, err
	}
	err = WriteCSV(fh, rs)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return files, fmt.Errorf("%s: %w", summary, err)
	}
	files = append(files, summary)

	cdf, err := JCTCDF(rs)
	if err != nil {
		return files, err
	}
	path := filepath.Join(dir, "jct_cdf.svg")
	if err := cdf.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return files, fmt.Errorf("%s: %w", path, err)
	}
	files = append(files, path)
	for _, r := range rs {
		p, err := Utilization(r)
		if err != nil {
			return files, err
		}
		path := filepath.Join(dir, "utilization_"+r.Scheduler+".svg")
		if err := p.Save(7*vg.Inch, 4*vg.Inch, path); err != nil {
			return files, fmt.Errorf("%s: %w", path, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// JCTCDF plots the cumulative distribution of job completion times.
func JCTCDF(rs []sim.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Job completion time CDF"
	p.X.Label.Text = "JCT (hours)"
	p.Y.Label.Text = "fraction of jobs"
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	for i, r := range rs {
		var jct []float64
		for _, j := range r.Jobs {
			if j.JCT > 0 {
				jct = append(jct, j.JCT/3600)
			}
		}
		if len(jct) == 0 {
			continue
		}
		sort.Float64s(jct)
		pts := make(plotter.XYs, len(jct))
		for k, v := range jct {
			pts[k] = plotter.XY{X: v, Y: float64(k+1) / float64(len(jct))}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("JCT CDF of %s: %w", r.Scheduler, err)
		}
		line.Color = palette[i%len(palette)]
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(r.Scheduler, line)
	}
	return p, nil
}

// Utilization plots the share of each GPU type held over time.
func Utilization(r sim.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "GPU utilization per type: " + r.Scheduler
	p.X.Label.Text = "time (hours)"
	p.Y.Label.Text = "GPUs held (fraction)"
	p.Y.Min, p.Y.Max = 0, 1.05
	p.Add(plotter.NewGrid())
	for j, t := range r.Types {
		pts := make(plotter.XYs, 0, len(r.Samples))
		for _, s := range r.Samples {
			pts = append(pts, plotter.XY{X: s.Time / 3600, Y: s.Busy[j]})
		}
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("utilization of %s: %w", r.Scheduler, err)
		}
		line.Color = palette[j%len(palette)]
		line.Width = vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(string(t), line)
	}
	return p, nil
}
