package report

import (
	"fmt"
	"io"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// pngDPI gives a 7-inch plot about 1000 pixels across: sharp on screens
// and in documents.
const pngDPI = 144

// Save writes the plot as base.svg and base.png and returns both paths.
// The SVG embeds its fonts and the PNG is rendered with gonum's own copy
// of them (Liberation), so both read the same on a machine without any
// font installed: an SVG that only names Liberation Serif, which a fresh
// Debian lacks, is shown with a substitute font of other widths, and text
// laid out for Liberation runs over the edge. The legend is drawn beside
// the data, never over it, in a column as wide as its longest name.
func Save(p *plot.Plot, w, h vg.Length, base string) ([]string, error) {
	svg := vgsvg.NewWith(vgsvg.UseWH(w, h), vgsvg.EmbedFonts(true))
	draw2(p, draw.New(svg))
	png := vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(pngDPI))}
	draw2(p, draw.New(png))
	var files []string
	for _, out := range []struct {
		path string
		c    io.WriterTo
	}{{base + ".svg", svg}, {base + ".png", png}} {
		if err := writeFile(out.path, out.c); err != nil {
			return files, err
		}
		files = append(files, out.path)
	}
	return files, nil
}

// margin keeps tick labels and the title off the image's edges.
const margin = vg.Length(6)

// draw2 draws the plot with margins, and its legend in a column on the
// right.
func draw2(p *plot.Plot, c draw.Canvas) {
	c = draw.Crop(c, margin, -margin, margin, -margin)
	orig := p.Legend
	legend := orig
	lw := legend.Rectangle(c).Size().X
	if lw == 0 {
		p.Draw(c)
		return
	}
	gap := 2 * margin
	// The plot is drawn without its legend, which is drawn apart; the
	// caller's plot is left as it was.
	p.Legend = plot.NewLegend()
	defer func() { p.Legend = orig }()
	p.Draw(draw.Crop(c, 0, -(lw + gap), 0, 0))
	top := vg.Length(0)
	if p.Title.Text != "" {
		top = p.Title.TextStyle.Rectangle(p.Title.Text).Size().Y + p.Title.Padding
	}
	legend.Top, legend.Left = true, true
	legend.XOffs, legend.YOffs = 0, 0
	legend.Padding = vg.Points(3)
	legend.Draw(draw.Crop(c, c.Size().X-lw, 0, 0, -(top + margin)))
}

func writeFile(path string, c io.WriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return nil
}

// Series is one named set of values, one per group of a bar chart.
type Series struct {
	Name   string
	Values []float64
}

// SaveBars draws a grouped bar chart, one group per name and one bar per
// series in it, and saves it with Save (base.svg, base.png).
func SaveBars(base, title, ylabel string, names []string, series []Series) ([]string, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(4)
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	w := vg.Points(float64(min(60, 360/max(1, len(names)))) / float64(max(1, len(series))))
	for i, s := range series {
		if len(s.Values) != len(names) {
			return nil, fmt.Errorf("bar chart %s: series %q has %d values for %d groups", base, s.Name, len(s.Values), len(names))
		}
		bars, err := plotter.NewBarChart(plotter.Values(s.Values), w)
		if err != nil {
			return nil, fmt.Errorf("bar chart %s: series %q: %w", base, s.Name, err)
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(2*i-len(series)+1) / 2
		p.Add(bars)
		p.Legend.Add(s.Name, bars)
	}
	p.NominalX(names...)
	// Headroom: the tallest bar stops short of the title.
	p.Y.Max *= 1.05
	return Save(p, 8*vg.Inch, 4.5*vg.Inch, base)
}
