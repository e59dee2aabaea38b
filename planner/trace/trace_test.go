package trace

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
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
			if jobs[c.firstIdx] != c.first {
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
	cases := []struct{ name, in, want string }{
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
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseGavel(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v: want it to contain %q", err, c.want)
			}
		})
	}
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
		{ID: "a,b", Model: `Model "quoted", with comma`, ScaleFactor: 3, TotalSteps: 1e-7, Weight: 0.1, Arrival: 1e9, SLO: 1.5},
		{ID: "z", Model: "m", ScaleFactor: 1, TotalSteps: 123456789012345, Weight: 1, Arrival: 1e9 + 0.1},
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
	cases := []struct{ name, in, want string }{
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
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v: want it to contain %q", err, c.want)
			}
		})
	}
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
