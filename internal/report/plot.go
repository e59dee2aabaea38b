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

// WriteDir writes, for every result, its per-job CSV, and the plots, each
// as SVG and PNG (Save): the JCT CDF of all policies (jct_cdf) and each
// policy's GPU utilization over time per type (utilization_<policy>).
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
	saved, err := Save(cdf, 7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "jct_cdf"))
	files = append(files, saved...)
	if err != nil {
		return files, err
	}
	for _, r := range rs {
		p, err := Utilization(r)
		if err != nil {
			return files, err
		}
		saved, err := Save(p, 7*vg.Inch, 4*vg.Inch, filepath.Join(dir, "utilization_"+r.Scheduler))
		files = append(files, saved...)
		if err != nil {
			return files, err
		}
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
	p.X.Min = 0
	p.Y.Min, p.Y.Max = 0, 1.05
	p.Add(plotter.NewGrid())
	for j, t := range r.Types {
		pts := binned(r.Samples, j, utilizationBins)
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

// utilizationBins bounds the points of a utilization line: a policy that
// time-slices changes what it holds every round, and thousands of rounds
// drawn one by one fill the plot with a solid block of vertical lines.
const utilizationBins = 300

// binned averages type j's busy fraction over at most n equal spans of
// the run's time (each sample weighs the time to the next one).
func binned(ss []sim.Sample, j, n int) plotter.XYs {
	if len(ss) == 0 {
		return nil
	}
	t0, t1 := ss[0].Time, ss[len(ss)-1].Time
	if len(ss) <= n || t1 <= t0 {
		pts := make(plotter.XYs, 0, len(ss))
		for _, s := range ss {
			pts = append(pts, plotter.XY{X: s.Time / 3600, Y: s.Busy[j]})
		}
		return pts
	}
	width := (t1 - t0) / float64(n)
	sum := make([]float64, n)
	weight := make([]float64, n)
	for i, s := range ss {
		w := width / 100 // the last sample: a sliver
		if i+1 < len(ss) {
			w = ss[i+1].Time - s.Time
		}
		b := min(n-1, int((s.Time-t0)/width))
		sum[b] += s.Busy[j] * w
		weight[b] += w
	}
	pts := make(plotter.XYs, 0, n)
	for b := range n {
		if weight[b] > 0 {
			pts = append(pts, plotter.XY{X: (t0 + (float64(b)+0.5)*width) / 3600, Y: sum[b] / weight[b]})
		}
	}
	return pts
}
