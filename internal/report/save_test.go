package report

import (
	"context"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

// ink reports whether a pixel is drawn on (not the white background).
func ink(img image.Image, x, y int) bool {
	r, g, b, a := img.At(x, y).RGBA()
	return a > 0 && (r < 0xe000 || g < 0xe000 || b < 0xe000)
}

func readPNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return img
}

// TestSaveLegendInside draws a plot whose legend names are longer than
// gonum's own layout leaves room for: both files are written, the SVG
// carries its font, and in the PNG the legend's text is drawn inside the
// image, the outermost columns and rows left blank.
func TestSaveLegendInside(t *testing.T) {
	p := plot.New()
	p.Title.Text = "long policy names"
	for i, name := range []string{"gavel-makespan-agnostic (a very long policy name)", "hadare", "gavel-maxmin-agnostic"} {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(i)}, {X: 1, Y: float64(i + 1)}})
		if err != nil {
			t.Fatal(err)
		}
		l.Color = palette[i]
		p.Add(l)
		p.Legend.Add(name, l)
	}
	base := filepath.Join(t.TempDir(), "legend")
	files, err := Save(p, 7*vg.Inch, 4*vg.Inch, base)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(files, " ") != base+".svg "+base+".png" {
		t.Fatalf("files %v", files)
	}
	svg, err := os.ReadFile(base + ".svg")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(svg), "@font-face") {
		t.Error("the SVG does not embed its font: a machine without Liberation shows other widths")
	}
	img := readPNG(t, base+".png")
	b := img.Bounds()
	if b.Dx() != 7*pngDPI || b.Dy() != 4*pngDPI {
		t.Fatalf("PNG is %dx%d, want %dx%d", b.Dx(), b.Dy(), 7*pngDPI, 4*pngDPI)
	}
	// Nothing touches the edges: a cut legend runs off the right one.
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Max.X - 4; x < b.Max.X; x++ {
			if ink(img, x, y) {
				t.Fatalf("ink at (%d, %d), on the right edge: the legend is cut", x, y)
			}
		}
	}
	// The legend is there: ink in the right quarter, above the middle.
	found := false
	for y := b.Min.Y; y < b.Dy()/2 && !found; y++ {
		for x := b.Max.X * 3 / 4; x < b.Max.X-4; x++ {
			if ink(img, x, y) {
				found = true
				break
			}
		}
	}
	if !found {
		t.Error("no legend drawn in the right quarter of the PNG")
	}
	if p.Legend.Left || p.Legend.Top {
		t.Error("Save changed the plot's own legend settings")
	}
}

// TestSaveBars checks the grouped bar chart: both files, and a series of
// the wrong length refused with its name.
func TestSaveBars(t *testing.T) {
	base := filepath.Join(t.TempDir(), "bars")
	names := []string{"plain", "fork", "rec"}
	files, err := SaveBars(base, "JCT", "s", names, []Series{
		{Name: "hadar (measured)", Values: []float64{150, 120, 90}},
		{Name: "Nomad's own (measured)", Values: []float64{150, 230, 190}},
	})
	if err != nil || len(files) != 2 {
		t.Fatalf("files %v, err %v", files, err)
	}
	readPNG(t, base+".png")
	_, err = SaveBars(base, "JCT", "s", names, []Series{{Name: "short", Values: []float64{1}}})
	if err == nil || !strings.Contains(err.Error(), `"short"`) {
		t.Fatalf("a series of 1 value for 3 groups: got %v", err)
	}
}

// TestUtilizationBinned: a policy that flips every round gives a line
// of at most utilizationBins points at its average, not thousands of
// vertical strokes.
func TestUtilizationBinned(t *testing.T) {
	var ss []sim.Sample
	for i := range 10000 {
		ss = append(ss, sim.Sample{Time: float64(i) * 360, Busy: []float64{float64(i % 2)}})
	}
	pts := binned(ss, 0, utilizationBins)
	if len(pts) == 0 || len(pts) > utilizationBins {
		t.Fatalf("%d points, want 1..%d", len(pts), utilizationBins)
	}
	for _, p := range pts {
		if math.Abs(p.Y-0.5) > 0.02 {
			t.Fatalf("bin at %.2f h averages %.3f, want 0.5", p.X, p.Y)
		}
	}
	if got := binned(ss[:10], 0, utilizationBins); len(got) != 10 {
		t.Fatalf("few samples are drawn as they are: %d points for 10", len(got))
	}
}

// TestWriteDirPNG: the simulator's plots come as SVG and PNG.
func TestWriteDirPNG(t *testing.T) {
	c, err := planner.ParseClusterSpec("v100=4,p100=4,k80=4", 4)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := trace.Synthesize(trace.SynthConfig{Jobs: 8, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := speed.Model{Profile: profile.Default()}
	s, err := registry.New("fifo", registry.Options{Speed: m})
	if err != nil {
		t.Fatal(err)
	}
	r, err := sim.Run(context.Background(), sim.Config{Cluster: c, Jobs: jobs, Speed: m}, s)
	if err != nil {
		t.Fatal(err)
	}
	r.Scheduler = "fifo"
	dir := t.TempDir()
	files, err := WriteDir(dir, []sim.Result{r})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"jct_cdf.svg", "jct_cdf.png", "utilization_fifo.svg", "utilization_fifo.png"} {
		found := false
		for _, f := range files {
			found = found || f == filepath.Join(dir, want)
		}
		if !found {
			t.Errorf("%s not written (files %v)", want, files)
		}
	}
	readPNG(t, filepath.Join(dir, "jct_cdf.png"))
}
