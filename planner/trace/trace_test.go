package trace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
)

func TestParseGavelTraces(t *testing.T) {
	cases := []struct {
		file     string
		jobs     int
		allAtT0  bool
		first    planner.Job // the job of the file's first line
		firstIdx int         // its index after sorting by arrival
	}{
		{"small_test.trace", 20, false, planner.Job{ID: "job-0000", Model: "Transformer (batch size 128)", ScaleFactor: 2, TotalSteps: 346, Weight: 1}, 0},
		{"medium_test.trace", 20, false, planner.Job{ID: "job-0000", Model: "Transformer (batch size 128)", ScaleFactor: 1, TotalSteps: 20776, Weight: 1}, 0},
		{"artifact_evaluation.trace", 15, true, planner.Job{ID: "job-0000", Model: "ResNet-50 (batch size 64)", ScaleFactor: 1, TotalSteps: 2931, Weight: 1}, 0},
		{"max_min_fairness.trace", 96, false, planner.Job{ID: "job-0000", Model: "ResNet-18 (batch size 128)", ScaleFactor: 4, TotalSteps: 925982, Weight: 1}, 0},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			jobs, err := Load(filepath.Join("testdata", "gavel", c.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(jobs) != c.jobs {
				t.Fatalf("%d jobs, want %d", len(jobs), c.jobs)
			}
			if !reflect.DeepEqual(jobs[c.firstIdx], c.first) {
				t.Errorf("first job %+v, want %+v", jobs[c.firstIdx], c.first)
			}
			ids := map[string]bool{}
			for i, j := range jobs {
				if err := j.Validate(); err != nil {
					t.Error(err)
				}
				if ids[j.ID] {
					t.Errorf("duplicate ID %s", j.ID)
				}
				ids[j.ID] = true
				if i > 0 && j.Arrival < jobs[i-1].Arrival {
					t.Errorf("job %d arrives at %v before job %d at %v", i, j.Arrival, i-1, jobs[i-1].Arrival)
				}
				if c.allAtT0 && j.Arrival != 0 {
					t.Errorf("%s arrives at %v, want 0", j.ID, j.Arrival)
				}
				if j.SLO != 0 {
					t.Errorf("%s SLO %v, want 0 (the traces say -1)", j.ID, j.SLO)
				}
			}
			if err := profile.Default().Check(jobs, []planner.GPUType{"v100", "p100", "k80"}); err != nil {
				t.Errorf("default profile cannot run the trace: %v", err)
			}
		})
	}
	// max_min_fairness spreads arrivals over about 13 hours.
	jobs, err := Load("testdata/gavel/max_min_fairness.trace")
	if err != nil {
		t.Fatal(err)
	}
	if last := jobs[len(jobs)-1].Arrival; last < 10*3600 || last > 16*3600 {
		t.Errorf("last arrival %v s, want about 13 h", last)
	}
}

func TestParseGavelSortsStably(t *testing.T) {
	in := "b\tc\td\t-n\t1\t10\t1\t1\t-1\t50\n" +
		"\n" +
		"a\tc\td\t-n\t0\t20\t2\t2\t-1.0\t7.5\r\n" +
		"c\tc\td\t-n\t1\t30.5\t1\t1\t0\t50\n"
	jobs, err := ParseGavel(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []planner.Job{
		{ID: "job-0001", Model: "a", ScaleFactor: 2, TotalSteps: 20, Weight: 2, Arrival: 7.5},
		{ID: "job-0000", Model: "b", ScaleFactor: 1, TotalSteps: 10, Weight: 1, Arrival: 50},
		{ID: "job-0002", Model: "c", ScaleFactor: 1, TotalSteps: 30.5, Weight: 1, Arrival: 50},
	}
	if !reflect.DeepEqual(jobs, want) {
		t.Fatalf("got %+v\nwant %+v", jobs, want)
	}
}

func TestParseGavelErrors(t *testing.T) {
	const good = "m\tcmd\tdir\t-n\t1\t100\t1\t1\t-1\t0"
	replace := func(col int, v string) string {
		f := strings.Split(good, "\t")
		f[col] = v
		return strings.Join(f, "\t")
	}
	cases := []errorCase{
		{"columns", good + "\textra", "trace line 1: 11 tab-separated columns: want 10 (job_type, command"},
		{"few columns", "m cmd dir", "trace line 1: 1 tab-separated columns: want 10"},
		{"line number", good + "\n\n" + replace(6, "x"), `trace line 3: scale_factor "x": want a positive integer`},
		{"empty model", replace(0, " "), "job_type is empty"},
		{"control", replace(0, "m\x01"), `job_type "m\x01": control character at byte 1`},
		{"utf8", replace(0, "m\xff"), "not valid UTF-8"},
		{"needs_data_dir", replace(4, "yes"), `needs_data_dir "yes": want 0 or 1`},
		{"steps zero", replace(5, "0"), `total_steps "0": want a positive number`},
		{"steps nan", replace(5, "NaN"), `total_steps "NaN": want a positive number`},
		{"steps inf", replace(5, "+Inf"), `total_steps "+Inf": want a positive number`},
		{"sf zero", replace(6, "0"), `scale_factor "0": want a positive integer`},
		{"sf float", replace(6, "1.5"), `scale_factor "1.5": want a positive integer`},
		{"weight", replace(7, "-1"), `priority_weight "-1": want a positive number`},
		{"slo text", replace(8, "soon"), `SLO "soon": want a finite number`},
		{"slo positive", replace(8, "1.2"), `SLO "1.2": a positive Gavel SLO is a multiple`},
		{"arrival negative", replace(9, "-5"), `arrival_time "-5": want a number of seconds >= 0`},
		{"arrival text", replace(9, ""), `arrival_time "": want a number of seconds >= 0`},
		{"empty", "\n\n", "trace: no jobs"},
		{"too long", strings.Repeat("x", maxLine+1), "trace line 1: longer than"},
	}
	checkErrors(t, ParseGavel, cases)
}

func TestOwnRoundTrip(t *testing.T) {
	gavel, err := Load("testdata/gavel/max_min_fairness.trace")
	if err != nil {
		t.Fatal(err)
	}
	synth, err := Synthesize(SynthConfig{Jobs: 50, RatePerHour: 3, Seed: 7, HighPriorityFraction: 0.2, HighPriorityWeight: 5, SLOFactors: []float64{1.2, 2, 10}})
	if err != nil {
		t.Fatal(err)
	}
	odd := []planner.Job{
		{ID: "a,b", Model: `Model "quoted", with comma`, ScaleFactor: 3, TotalSteps: 1e-7, Weight: 0.1, Arrival: 1e8, SLO: 1.5},
		{ID: "z", Model: "m", ScaleFactor: 1, TotalSteps: 123456789012345, Weight: 1, Arrival: MaxArrival},
	}
	for name, jobs := range map[string][]planner.Job{"gavel": gavel, "synth": synth, "odd": odd} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := Write(&buf, jobs); err != nil {
				t.Fatal(err)
			}
			got, err := Parse(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatalf("%v\n%s", err, buf.String())
			}
			if !reflect.DeepEqual(got, jobs) {
				t.Fatalf("round trip changed the jobs:\n%s", buf.String())
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	const head = "id,model,scale_factor,total_steps,weight,arrival_s,slo_s\n"
	cases := []errorCase{
		{"empty", "", "trace: empty: want the header"},
		{"header", "id,model,sf\n", `trace line 1: header "id,model,sf": want "id,model,scale_factor,total_steps,weight,arrival_s,slo_s"`},
		{"no jobs", head, "no jobs after the header"},
		{"columns", head + "j,m,1,10,1,0\n", "trace line 2: 6 columns: want 7"},
		{"id", head + ",m,1,10,1,0,0\n", "trace line 2: id is empty"},
		{"model", head + "j, ,1,10,1,0,0\n", "trace line 2: model is empty"},
		{"control", head + "j,\"m\tx\",1,10,1,0,0\n", `trace line 2: model "m\tx": control character`},
		{"sf", head + "j,m,x,10,1,0,0\n", `trace line 2: scale_factor "x": want a positive integer`},
		{"steps", head + "j,m,1,-10,1,0,0\n", `total_steps "-10": want a positive number`},
		{"weight", head + "j,m,1,10,0,0,0\n", `weight "0": want a positive number`},
		{"arrival", head + "j,m,1,10,1,NaN,0\n", `arrival_s "NaN": want a number of seconds >= 0`},
		{"slo", head + "j,m,1,10,1,0,-1\n", `slo_s "-1": want a number of seconds >= 0`},
		{"duplicate", head + "j,m,1,10,1,0,0\n# comment\nj,m,1,10,1,0,0\n", `trace line 4: id "j" already used on line 2`},
		{"quote", head + "j,m\"x,1,10,1,0,0\n", "bare \" in non-quoted-field"},
	}
	checkErrors(t, Parse, cases)
}

func TestWriteRejectsInvalid(t *testing.T) {
	ok := planner.Job{ID: "j", Model: "m", ScaleFactor: 1, TotalSteps: 1, Weight: 1}
	bad := ok
	bad.TotalSteps = 0
	spaced := ok
	spaced.ID = " j"
	comment := ok
	comment.ID = "#1"
	control := ok
	control.Model = "m\nx"
	for name, jobs := range map[string][]planner.Job{"invalid": {bad}, "duplicate": {ok, ok}, "spaces": {spaced}, "comment": {comment}, "control": {control}} {
		if err := Write(&bytes.Buffer{}, jobs); err == nil {
			t.Errorf("%s: Write accepted %+v", name, jobs)
		}
	}
}

func TestLoadDetects(t *testing.T) {
	dir := t.TempDir()
	gavelText, err := os.ReadFile("testdata/gavel/small_test.trace")
	if err != nil {
		t.Fatal(err)
	}
	want, err := ParseGavel(bytes.NewReader(gavelText))
	if err != nil {
		t.Fatal(err)
	}
	var own bytes.Buffer
	if err := Write(&own, want); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, path := range []string{
		write("a.csv", own.Bytes()),
		write("a.jobs", own.Bytes()),
		write("b.tsv", gavelText),
		write("b.txt", gavelText),
	} {
		got, err := Load(path)
		if err != nil {
			t.Errorf("Load(%s): %v", path, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Load(%s) differs", path)
		}
	}
	for _, path := range []string{
		write("c.txt", []byte("hello\n")),
		write("d.trace", own.Bytes()), // wrong content for the extension
		filepath.Join(dir, "missing.trace"),
	} {
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("Load(%s) error %v: want one naming the path", path, err)
		}
	}
}

func TestSynthesizeDefaults(t *testing.T) {
	const n = 20000
	const rate = 4.0
	jobs, err := Synthesize(SynthConfig{Jobs: n, RatePerHour: rate, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != n {
		t.Fatalf("%d jobs, want %d", len(jobs), n)
	}
	p := profile.Default()
	sfCount := map[int]int{}
	long := 0
	for i, j := range jobs {
		if err := j.Validate(); err != nil {
			t.Fatal(err)
		}
		if i > 0 && j.Arrival < jobs[i-1].Arrival {
			t.Fatalf("jobs not sorted by arrival at %d", i)
		}
		sfCount[j.ScaleFactor]++
		thr, err := p.Throughput(j.Model, j.ScaleFactor, "v100", false)
		if err != nil || thr <= 0 {
			t.Fatalf("%s: (%q, %d) not runnable on v100: %v", j.ID, j.Model, j.ScaleFactor, err)
		}
		d := j.TotalSteps / thr // the drawn duration, up to rounding
		if d < 60*math.Pow(10, 1.5)*0.99 || d > 60*1e4*1.01 {
			t.Fatalf("%s: duration %v s outside Gavel's range", j.ID, d)
		}
		if d > 60*1e3*1.01 {
			long++
		}
		if j.Weight != 1 || j.SLO != 0 {
			t.Fatalf("%s: weight %v SLO %v, want 1 and none by default", j.ID, j.Weight, j.SLO)
		}
	}
	if jobs[0].Arrival != 0 {
		t.Errorf("first arrival %v, want 0", jobs[0].Arrival)
	}
	meanGap := jobs[n-1].Arrival / (n - 1)
	if want := 3600 / rate; math.Abs(meanGap-want)/want > 0.03 {
		t.Errorf("mean inter-arrival %v s, want %v s within 3%%", meanGap, want)
	}
	for sf, want := range map[int]float64{1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05} {
		if got := float64(sfCount[sf]) / n; math.Abs(got-want) > 0.015 {
			t.Errorf("scale factor %d: fraction %v, want %v within 0.015", sf, got, want)
		}
	}
	if got := float64(long) / n; math.Abs(got-0.2) > 0.015 {
		t.Errorf("long jobs: fraction %v, want 0.2 within 0.015", got)
	}
	// Every (model, sf) Gavel can run on v100 shows up: the draw is not stuck
	// on a few models.
	models := map[string]bool{}
	for _, j := range jobs {
		models[j.Model] = true
	}
	if len(models) != len(p.Models()) {
		t.Errorf("%d distinct models drawn, want all %d", len(models), len(p.Models()))
	}
}

func TestSynthesizeDeterministic(t *testing.T) {
	cfg := SynthConfig{Jobs: 300, RatePerHour: 2, Seed: 42, SLOFactors: []float64{1.2, 2, 10}, HighPriorityFraction: 0.2, HighPriorityWeight: 5}
	a, err := Synthesize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Synthesize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different jobs")
	}
	cfg.Seed = 43
	c, err := Synthesize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(a, c) {
		t.Fatal("different seeds, same jobs")
	}
	high, slo := 0, 0
	for _, j := range a {
		if j.Weight == 5 {
			high++
		}
		if j.SLO > 0 {
			slo++
		}
	}
	if high < 30 || high > 90 || slo != len(a) {
		t.Errorf("%d high-priority jobs (want about 60), %d with SLO (want all %d)", high, slo, len(a))
	}
	// Changing the scale-factor mix leaves arrivals alone (separate streams).
	cfg.Seed = 42
	cfg.ScaleFactors, cfg.ScaleFactorWeights = []int{1}, []float64{1}
	d, err := Synthesize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if a[i].Arrival != d[i].Arrival {
			t.Fatalf("job %d arrival %v changed to %v with the scale-factor mix", i, a[i].Arrival, d[i].Arrival)
		}
		if d[i].ScaleFactor != 1 {
			t.Fatalf("job %d scale factor %d, want 1", i, d[i].ScaleFactor)
		}
	}
}

func TestSynthesizeStatic(t *testing.T) {
	jobs, err := Synthesize(SynthConfig{Jobs: 100, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.Arrival != 0 {
			t.Fatalf("%s arrives at %v, want 0 in static mode", j.ID, j.Arrival)
		}
	}
	if jobs[0].ID != "job-0000" || jobs[99].ID != "job-0099" {
		t.Errorf("IDs %s..%s, want job-0000..job-0099", jobs[0].ID, jobs[99].ID)
	}
}

func TestSynthesizeModelsAndReference(t *testing.T) {
	// ResNet-50 bs128 cannot run on k80 at sf > 1, so with k80 as reference
	// only sf 1 jobs of it may appear.
	jobs, err := Synthesize(SynthConfig{Jobs: 500, Seed: 5, Reference: "k80",
		Models: []string{"ResNet-50 (batch size 128)", "A3C"}, ScaleFactors: []int{1, 2}, ScaleFactorWeights: []float64{1, 1}})
	if err == nil {
		t.Fatalf("want an error: nothing runs on k80 at sf 2 among these models; got %d jobs", len(jobs))
	} else if !strings.Contains(err.Error(), "at scale factor 2") {
		t.Errorf("error %v: want it to name scale factor 2", err)
	}
	jobs, err = Synthesize(SynthConfig{Jobs: 500, Seed: 5, Reference: "k80",
		Models: []string{"ResNet-50 (batch size 128)", "ResNet-18 (batch size 16)"}, ScaleFactors: []int{1, 2}, ScaleFactorWeights: []float64{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.Model == "ResNet-50 (batch size 128)" && j.ScaleFactor != 1 {
			t.Fatalf("%s: %q at sf %d cannot run on k80", j.ID, j.Model, j.ScaleFactor)
		}
	}
}

func TestSynthesizeErrors(t *testing.T) {
	d := GavelDurations()
	d.LongProb = 2
	cases := []struct {
		name string
		cfg  SynthConfig
		want string
	}{
		{"jobs", SynthConfig{}, "SynthConfig.Jobs 0"},
		{"rate", SynthConfig{Jobs: 1, RatePerHour: -1}, "SynthConfig.RatePerHour -1"},
		{"rate nan", SynthConfig{Jobs: 1, RatePerHour: math.NaN()}, "SynthConfig.RatePerHour NaN"},
		{"reference", SynthConfig{Jobs: 1, Reference: "a100"}, `SynthConfig.Reference "a100" is not a GPU type of the profile`},
		{"model", SynthConfig{Jobs: 1, Models: []string{"GPT"}}, `SynthConfig.Models: "GPT" is not in the profile`},
		{"no models", SynthConfig{Jobs: 1, Models: []string{}}, "SynthConfig.Models is empty"},
		{"weights", SynthConfig{Jobs: 1, ScaleFactors: []int{1, 2}, ScaleFactorWeights: []float64{1}}, "want one weight per scale factor"},
		{"sf", SynthConfig{Jobs: 1, ScaleFactors: []int{0}, ScaleFactorWeights: []float64{1}}, "want distinct positive integers"},
		{"zero weights", SynthConfig{Jobs: 1, ScaleFactors: []int{1}, ScaleFactorWeights: []float64{0}}, "want a finite positive sum"},
		{"unprofiled sf", SynthConfig{Jobs: 1, ScaleFactors: []int{3}, ScaleFactorWeights: []float64{1}}, "at scale factor 3: drop 3 from ScaleFactors"},
		{"durations", SynthConfig{Jobs: 1, Durations: &d}, "SynthConfig.Durations: LongProb 2"},
		{"priority", SynthConfig{Jobs: 1, HighPriorityFraction: 0.5}, "SynthConfig.HighPriorityWeight 0"},
		{"slo", SynthConfig{Jobs: 1, SLOFactors: []float64{0}}, "SynthConfig.SLOFactors: 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Synthesize(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v: want it to contain %q", err, c.want)
			}
		})
	}
	// A zero-weight scale factor nothing runs at is fine: it is never drawn.
	if _, err := Synthesize(SynthConfig{Jobs: 10, ScaleFactors: []int{1, 3}, ScaleFactorWeights: []float64{1, 0}}); err != nil {
		t.Errorf("zero-weight unprofiled sf: %v", err)
	}
}

func TestParseGavelLegacy(t *testing.T) {
	cases := []struct {
		file    string
		jobs    int
		sfs     map[int]int // scale factor -> jobs
		first   planner.Job // the job of the file's first line
		lastArr float64
	}{
		{"2869ce.trace", 533, map[int]int{1: 65, 2: 6, 4: 11, 8: 379, 16: 2, 32: 70},
			planner.Job{ID: "job-0000", Model: "Transformer (batch size 128)", ScaleFactor: 4, TotalSteps: 5352613, Weight: 1}, 8141054},
		{"23dbec.trace", 9, map[int]int{1: 2, 8: 7},
			planner.Job{ID: "job-0000", Model: "Transformer (batch size 128)", ScaleFactor: 1, TotalSteps: 14612, Weight: 1}, 188011},
		{"11cb48-lines-1350-1400.trace", 51, map[int]int{1: 26, 2: 1, 4: 5, 8: 3, 16: 8, 32: 8},
			planner.Job{ID: "job-0000", Model: "ResNet-18 (batch size 256)", ScaleFactor: 1, TotalSteps: 53510, Weight: 1, Arrival: 6475459}, 6580142},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			jobs, lines, err := LoadWithLines(filepath.Join("testdata", "gavel", "msr", c.file))
			if err != nil {
				t.Fatal(err)
			}
			if lines.Format != FormatGavelLegacy {
				t.Errorf("format %q, want %q", lines.Format, FormatGavelLegacy)
			}
			if len(jobs) != c.jobs {
				t.Fatalf("%d jobs, want %d", len(jobs), c.jobs)
			}
			sfs := map[int]int{}
			for i, j := range jobs {
				sfs[j.ScaleFactor]++
				if j.Weight != 1 || j.SLO != 0 {
					t.Errorf("%s: weight %v SLO %v, want 1 and none", j.ID, j.Weight, j.SLO)
				}
				if i > 0 && j.Arrival < jobs[i-1].Arrival {
					t.Errorf("not sorted by arrival at %d", i)
				}
			}
			if !reflect.DeepEqual(sfs, c.sfs) {
				t.Errorf("scale factors %v, want %v", sfs, c.sfs)
			}
			first := jobs[slices.IndexFunc(jobs, func(j planner.Job) bool { return j.ID == "job-0000" })]
			if !reflect.DeepEqual(first, c.first) {
				t.Errorf("first job %+v, want %+v", first, c.first)
			}
			if got := jobs[len(jobs)-1].Arrival; got != c.lastArr {
				t.Errorf("last arrival %v, want %v", got, c.lastArr)
			}
			if lines.Line("job-0000") != 1 || lines.Line(jobs[len(jobs)-1].ID) < 1 {
				t.Errorf("lines: job-0000 on %d, want 1", lines.Line("job-0000"))
			}
		})
	}
}

func TestParseGavelLegacyErrors(t *testing.T) {
	const good = "m\tcmd %s\t--steps\t1\t100\t0.000000\t4"
	replace := func(col int, v string) string {
		f := strings.Split(good, "\t")
		f[col] = v
		return strings.Join(f, "\t")
	}
	const tenCols = "m\tcmd\tdir\t-n\t1\t100\t1\t1\t-1\t0"
	cases := []errorCase{
		{"columns", good + "\tx\tx", "trace line 1: 9 tab-separated columns: want 10 (job_type, command, working_directory"},
		{"names legacy", "a\tb", "or Gavel's legacy 7 (job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor)"},
		{"mixed", good + "\n\n" + tenCols, "trace line 3: 10 tab-separated columns: want 7 (job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor) like the first job on line 1"},
		{"mixed other way", tenCols + "\n" + good, "trace line 2: 7 tab-separated columns: want 10 (job_type"},
		{"empty model", replace(0, ""), "trace line 1: job_type is empty"},
		{"needs_data_dir", replace(3, "x"), `needs_data_dir "x": want 0 or 1`},
		{"steps", replace(4, "-1"), `total_steps "-1": want a positive number`},
		{"arrival", replace(5, "soon"), `arrival_time "soon": want a number of seconds >= 0`},
		{"sf zero", replace(6, "0"), `trace line 1: scale_factor "0": want a positive integer`},
		{"sf float", replace(6, "4.0"), `scale_factor "4.0": want a positive integer`},
		{"arrival ms", good + "\n" + replace(5, "6475459000.000000"), `trace line 2: arrival_time "6475459000.000000": 205 years after the trace start, past the 5-year limit (trace.MaxArrival): if the column is in milliseconds, divide it by 1000`},
	}
	checkErrors(t, ParseGavel, cases)
}

func TestArrivalLimit(t *testing.T) {
	cases := []struct {
		arrival string
		want    string // "" = accepted
	}{
		{"0", ""},
		{"8141054", ""},   // 94 days: Gavel's longest per-VC trace is about this
		{"157680000", ""}, // exactly MaxArrival
		{"157680001", "5-year limit (trace.MaxArrival): if the column is in milliseconds, divide it by 1000"},
		{"8141054000", "258 years after the trace start, past the 5-year limit (trace.MaxArrival): if the column is in milliseconds"},
		{"1700000000", "53.9 years after the trace start, past the 5-year limit (trace.MaxArrival): it looks like a Unix timestamp: subtract the trace's first arrival"},
		{"1700000000000", "it looks like a Unix timestamp in milliseconds: subtract the trace's first arrival and divide by 1000"},
		{"8141054000000", "if the column is in microseconds, divide it by 1e6"},
		{"1e300", "want seconds from the trace start"},
	}
	const head = "id,model,scale_factor,total_steps,weight,arrival_s,slo_s\n"
	for _, c := range cases {
		t.Run(c.arrival, func(t *testing.T) {
			inputs := map[string]func() error{
				"gavel": func() error {
					_, err := ParseGavel(strings.NewReader("m\tc\td\t-n\t1\t100\t1\t1\t-1\t" + c.arrival + "\n"))
					return err
				},
				"legacy": func() error {
					_, err := ParseGavel(strings.NewReader("m\tc\t-n\t1\t100\t" + c.arrival + "\t1\n"))
					return err
				},
				"csv": func() error {
					_, err := Parse(strings.NewReader(head + "j,m,1,100,1," + c.arrival + ",0\n"))
					return err
				},
			}
			for name, parse := range inputs {
				err := parse()
				switch {
				case c.want == "" && err != nil:
					t.Errorf("%s: %v", name, err)
				case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
					t.Errorf("%s: error %v: want it to contain %q", name, err, c.want)
				case c.want != "" && !strings.Contains(err.Error(), "trace line "):
					t.Errorf("%s: error %v: want it to name the line", name, err)
				}
			}
			// Write refuses what Parse would.
			v, _ := strconv.ParseFloat(c.arrival, 64)
			err := Write(&bytes.Buffer{}, []planner.Job{{ID: "j", Model: "m", ScaleFactor: 1, TotalSteps: 1, Weight: 1, Arrival: v}})
			if (err == nil) != (c.want == "") {
				t.Errorf("Write: error %v, want one: %v", err, c.want != "")
			}
		})
	}
}

func TestLoadWithLines(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, path, format string
		lines              map[string]int
	}{
		{"csv", write("a.csv", "# comment\nid,model,scale_factor,total_steps,weight,arrival_s,slo_s\nlate,m,1,10,1,50,0\n\n# c\n\"quoted, id\",m,1,10,1,0,0\nthird,m,2,10,1,0,0\n"),
			FormatHadar, map[string]int{"late": 3, "quoted, id": 6, "third": 7}},
		{"gavel", write("b.trace", "\nb\tc\td\t-n\t1\t10\t1\t1\t-1\t50\n\na\tc\td\t-n\t0\t20\t2\t2\t-1.0\t7.5\r\n"),
			FormatGavel, map[string]int{"job-0000": 2, "job-0001": 4}},
		{"legacy by content", write("c.jobs", "x\tc\t-n\t1\t10\t9\t1\ny\tc\t-n\t1\t10\t3\t16\n"),
			FormatGavelLegacy, map[string]int{"job-0000": 1, "job-0001": 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			jobs, lines, err := LoadWithLines(c.path)
			if err != nil {
				t.Fatal(err)
			}
			if lines.Format != c.format || lines.Path != c.path {
				t.Errorf("format %q path %q, want %q %q", lines.Format, lines.Path, c.format, c.path)
			}
			for _, j := range jobs {
				want := c.lines[j.ID]
				if got := lines.Line(j.ID); got != want {
					t.Errorf("%s on line %d, want %d", j.ID, got, want)
				}
				if got, w := lines.Where(j.ID), fmt.Sprintf("%s:%d", c.path, want); got != w {
					t.Errorf("Where(%s) = %q, want %q", j.ID, got, w)
				}
			}
		})
	}
	var none *Lines
	if got := none.Where("job-0003"); got != "job job-0003" {
		t.Errorf("nil Lines: Where = %q, want %q", got, "job job-0003")
	}
	if got := (&Lines{}).Where("x"); got != "job x" {
		t.Errorf("zero Lines: Where = %q, want %q", got, "job x")
	}
}

// errorCase is an input a parser must refuse with an error containing want.
type errorCase struct{ name, in, want string }

func checkErrors(t *testing.T, parse func(io.Reader) ([]planner.Job, error), cases []errorCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parse(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v: want it to contain %q", err, c.want)
			}
		})
	}
}

// TestPhillyTraceAgainstProfile runs a real Philly-derived trace, with jobs
// of up to 32 GPUs, through profile.Resolve in each mode: errors name the
// trace's lines, skipping keeps exactly the profiled jobs, and extrapolating
// keeps all of them with a profile that covers them.
func TestPhillyTraceAgainstProfile(t *testing.T) {
	path := filepath.Join("testdata", "gavel", "msr", "2869ce.trace")
	jobs, lines, err := LoadWithLines(path)
	if err != nil {
		t.Fatal(err)
	}
	p := profile.Default()
	types := []planner.GPUType{"v100", "p100", "k80"}
	profiled, pairs := 0, map[[2]any]bool{}
	for _, j := range jobs {
		if slices.Contains(p.ScaleFactors(j.Model), j.ScaleFactor) {
			profiled++
		} else {
			pairs[[2]any{j.Model, j.ScaleFactor}] = true
		}
	}
	if profiled == len(jobs) || profiled == 0 {
		t.Fatalf("%d of %d jobs profiled: the trace no longer tests unprofiled jobs", profiled, len(jobs))
	}

	_, err = p.Resolve(jobs, types, profile.Refuse, lines.Where)
	var ue *profile.UnprofiledError
	if !errors.As(err, &ue) || len(ue.Pairs) != len(pairs) {
		t.Fatalf("refuse: error %v: want an *UnprofiledError naming all %d pairs", err, len(pairs))
	}
	msg := err.Error()
	if n := strings.Count(msg, "first at "+path+":"); n != len(pairs) {
		t.Errorf("refuse: %d pairs named with a trace line, want %d:\n%s", n, len(pairs), msg)
	}
	if !strings.Contains(msg, `("ResNet-50 (batch size 64)", 32): `) {
		t.Errorf("refuse: want the 32-GPU ResNet-50 jobs named:\n%s", msg)
	}

	r, err := p.Resolve(jobs, types, profile.Skip, lines.Where)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Jobs) != profiled || r.Skipped() != len(jobs)-profiled {
		t.Errorf("skip: kept %d, skipped %d; want %d and %d", len(r.Jobs), r.Skipped(), profiled, len(jobs)-profiled)
	}

	r, err = p.Resolve(jobs, types, profile.Extrapolate, lines.Where)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Jobs) != len(jobs) || len(r.Unprofiled) != len(pairs) {
		t.Errorf("extrapolate: %d jobs and %d pairs, want %d and %d", len(r.Jobs), len(r.Unprofiled), len(jobs), len(pairs))
	}
	if err := r.Profile.Check(r.Jobs, types); err != nil {
		t.Errorf("extrapolate: the resolved profile does not cover the trace: %v", err)
	}
	if !strings.Contains(r.Report(), path+":") {
		t.Errorf("extrapolate: report does not name trace lines:\n%s", r.Report())
	}
}

func TestParseSizeMix(t *testing.T) {
	cases := []struct {
		in   string
		want SizeMix
		err  string
	}{
		{"gavel", GavelSizes(), ""},
		{"", GavelSizes(), ""},
		{" Philly ", PhillySizes(), ""},
		{"1=70, 2=10,4=15,8=5", SizeMix{[]int{1, 2, 4, 8}, []float64{70, 10, 15, 5}}, ""},
		{"16=1,32=0.5", SizeMix{[]int{16, 32}, []float64{1, 0.5}}, ""},
		{"alibaba", SizeMix{}, `size mix "alibaba": entry "alibaba": want gavel, philly, or SCALE_FACTOR=WEIGHT`},
		{"0=1", SizeMix{}, `entry "0=1"`},
		{"1.5=1", SizeMix{}, `entry "1.5=1"`},
		{"1=-1", SizeMix{}, `weight "-1" of scale factor 1: want a number >= 0`},
		{"1=NaN", SizeMix{}, `weight "NaN"`},
		{"1=1,1=2", SizeMix{}, "scale factor 1 given twice"},
	}
	for _, c := range cases {
		got, err := ParseSizeMix(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseSizeMix(%q): error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseSizeMix(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

func TestSynthesizePhilly(t *testing.T) {
	const n = 20000
	mix := PhillySizes()
	cfg := SynthConfig{Jobs: n, RatePerHour: 2, Seed: 3, ScaleFactors: mix.ScaleFactors, ScaleFactorWeights: mix.Weights}
	if _, err := Synthesize(cfg); err == nil || !strings.Contains(err.Error(), "at scale factor 16") || !strings.Contains(err.Error(), "set Extrapolate") {
		t.Fatalf("without Extrapolate: error %v, want one naming scale factor 16 and Extrapolate", err)
	}
	cfg.Extrapolate = true
	jobs, err := Synthesize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The jobs run with the profile Resolve extrapolates, and their steps
	// are durations from Gavel's distribution on that profile's v100
	// figures: Synthesize and Resolve extrapolate alike.
	r, err := profile.Default().Resolve(jobs, []planner.GPUType{"v100", "p100", "k80"}, profile.Extrapolate, nil)
	if err != nil {
		t.Fatal(err)
	}
	count := map[int]int{}
	models := map[int]map[string]bool{}
	for _, j := range jobs {
		count[j.ScaleFactor]++
		if models[j.ScaleFactor] == nil {
			models[j.ScaleFactor] = map[string]bool{}
		}
		models[j.ScaleFactor][j.Model] = true
		thr, err := r.Profile.Throughput(j.Model, j.ScaleFactor, "v100", false)
		if err != nil {
			t.Fatal(err)
		}
		if d := j.TotalSteps / thr; d < 60*math.Pow(10, 1.5)*0.99 || d > 60*1e4*1.01 {
			t.Fatalf("%s (%q, %d): duration %v s on the resolved profile, outside Gavel's range", j.ID, j.Model, j.ScaleFactor, d)
		}
	}
	total := 0.0
	for _, w := range mix.Weights {
		total += w
	}
	for i, sf := range mix.ScaleFactors {
		want := mix.Weights[i] / total
		if got := float64(count[sf]) / n; math.Abs(got-want) > 0.01+0.1*want {
			t.Errorf("scale factor %d: fraction %.4f, want %.4f", sf, got, want)
		}
	}
	// The 19 models Gavel profiles up to 8 GPUs are drawn at 16 and 32; the
	// 7 it profiles on one GPU only stay there.
	for sf, ms := range models {
		if want := map[bool]int{true: 26, false: 19}[sf == 1]; len(ms) != want {
			t.Errorf("%d models drawn at %d GPUs, want %d", len(ms), sf, want)
		}
	}
	// With the Gavel mix, Extrapolate changes nothing: every size is profiled.
	plain, err := Synthesize(SynthConfig{Jobs: 2000, RatePerHour: 2, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	extra, err := Synthesize(SynthConfig{Jobs: 2000, RatePerHour: 2, Seed: 3, Extrapolate: true})
	if err != nil || !reflect.DeepEqual(plain, extra) {
		t.Errorf("Gavel mix with Extrapolate differs from without (%v)", err)
	}
}

func TestRateForLoad(t *testing.T) {
	gavel := SynthConfig{Jobs: 1}
	v100 := func(n int) planner.Cluster {
		c, err := planner.ParseClusterSpec(fmt.Sprintf("v100=%d", n), 8)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// On a V100-only cluster with the V100 reference the load is exact:
	// check it against the offered work of a long synthesized stream.
	rate, err := RateForLoad(gavel, v100(64), 0.9)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40000
	jobs, err := Synthesize(SynthConfig{Jobs: n, RatePerHour: rate, Seed: 11})
	if err != nil {
		t.Fatal(err)
	}
	work := 0.0
	for _, j := range jobs {
		thr, _ := profile.Default().Throughput(j.Model, j.ScaleFactor, "v100", false)
		work += j.TotalSteps / thr * float64(j.ScaleFactor)
	}
	if got := work / (jobs[n-1].Arrival * 64); math.Abs(got-0.9) > 0.05 {
		t.Errorf("offered load %.3f at %.3f jobs/h, want 0.9 within 0.05", got, rate)
	}
	// Linear in the load and in the cluster.
	if r2, _ := RateForLoad(gavel, v100(128), 0.45); math.Abs(r2-rate) > 1e-9*rate {
		t.Errorf("twice the GPUs at half the load: %v, want %v", r2, rate)
	}
	// Slower types count for less than a V100, and for something.
	mixed, err := planner.ParseClusterSpec("v100=64,k80=64", 8)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := RateForLoad(gavel, mixed, 0.9); err != nil || r <= rate*1.05 || r >= rate*1.6 {
		t.Errorf("64 V100 + 64 K80: %v jobs/h (%v), want between 1.05 and 1.6 times the %v of 64 V100s", r, err, rate)
	}
	// The Philly mix asks for more GPU time per job: a lower rate.
	mix := PhillySizes()
	philly := SynthConfig{Jobs: 1, ScaleFactors: mix.ScaleFactors, ScaleFactorWeights: mix.Weights, Extrapolate: true}
	if r, err := RateForLoad(philly, v100(64), 0.9); err != nil || r >= rate*0.8 {
		t.Errorf("Philly mix: %v jobs/h (%v), want well below Gavel's %v", r, err, rate)
	}
	a100, _ := planner.ParseClusterSpec("a100=8", 8)
	for _, c := range []struct {
		cfg     SynthConfig
		cluster planner.Cluster
		load    float64
		want    string
	}{
		{gavel, v100(8), 0, "load 0: want a positive number"},
		{gavel, v100(8), math.Inf(1), "load +Inf"},
		{gavel, planner.Cluster{}, 1, "the cluster has no GPUs"},
		{gavel, a100, 1, `cluster type "a100" is not in the profile`},
		{SynthConfig{Jobs: 1, ScaleFactors: []int{16}, ScaleFactorWeights: []float64{1}}, v100(8), 1, "at scale factor 16"},
	} {
		if _, err := RateForLoad(c.cfg, c.cluster, c.load); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}

func TestSynthesizeArrivalLimit(t *testing.T) {
	_, err := Synthesize(SynthConfig{Jobs: 1000, RatePerHour: 0.01, Seed: 1})
	if err == nil || !strings.Contains(err.Error(), "1000 jobs at 0.01 per hour arrive over") || !strings.Contains(err.Error(), "raise RatePerHour or draw fewer jobs") {
		t.Errorf("error %v: want the arrival limit named with the fix", err)
	}
}
