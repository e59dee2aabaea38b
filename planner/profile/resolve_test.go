package profile

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

// scaling is a profile whose per-GPU throughputs follow known laws:
//   - "m": v100 u = 10, 9, 8.1 at sf 1, 2, 4 (0.9 per doubling), spread
//     ratios 0.5 at sf 2 and 0.4 at sf 4; k80 0 at sf 4 (does not fit);
//   - "super": v100 u = 10, 12 at sf 1, 4 (super-linear);
//   - "gap": v100 at sf 2 and 8 only, k80 0 at sf 2 but positive at 8;
//   - "one": sf 1 only.
func scaling(t *testing.T) *Profile {
	t.Helper()
	p, err := New("test", []Entry{
		{Model: "m", ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"v100": 10, "k80": 4}},
		{Model: "m", ScaleFactor: 2, Consolidated: map[planner.GPUType]float64{"v100": 18, "k80": 6}, Spread: map[planner.GPUType]float64{"v100": 9}},
		{Model: "m", ScaleFactor: 4, Consolidated: map[planner.GPUType]float64{"v100": 32.4, "k80": 0}, Spread: map[planner.GPUType]float64{"v100": 12.96}},
		{Model: "super", ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"v100": 10}},
		{Model: "super", ScaleFactor: 4, Consolidated: map[planner.GPUType]float64{"v100": 48}},
		{Model: "gap", ScaleFactor: 2, Consolidated: map[planner.GPUType]float64{"v100": 20, "k80": 0}},
		{Model: "gap", ScaleFactor: 8, Consolidated: map[planner.GPUType]float64{"v100": 64, "k80": 8}},
		{Model: "one", ScaleFactor: 1, Consolidated: map[planner.GPUType]float64{"v100": 5, "k80": 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExtendRule(t *testing.T) {
	p := scaling(t)
	// Profile-wide medians, computed by hand from the entries above:
	// v100 efficiencies over each model's range, capped at 1: m 0.9,
	// super 1 (1.2 capped), gap (0.8/1)^(1/2); median of three = 0.9.
	// k80: m has 0 at its largest, gap 0 at its smallest: no evidence.
	// Spread ratio at the largest sf with one: m 0.4 (v100 only).
	const medV100 = 0.9
	type fig struct {
		model    string
		sf       int
		t        planner.GPUType
		spread   bool
		want     float64
		anchor   int
		borrowed bool
	}
	cases := []struct {
		name string
		fig
	}{
		{"above: anchor 4, e over 1..4", fig{"m", 8, "v100", false, 8 * 8.1 * 0.9, 4, false}},
		{"two doublings above", fig{"m", 16, "v100", false, 16 * 8.1 * 0.81, 4, false}},
		{"between 2 and 4: fitted through them", fig{"m", 3, "v100", false, 3 * 9 * math.Pow(0.9, math.Log2(1.5)), 2, false}},
		{"zero at the anchor stays zero", fig{"m", 8, "k80", false, 0, 4, false}},
		{"spread: ratio of the nearest multi-GPU size (4)", fig{"m", 8, "v100", true, 8 * 8.1 * 0.9 * 0.4, 4, false}},
		{"spread between 2 and 4: 4 is nearer to 3", fig{"m", 3, "v100", true, 3 * 9 * math.Pow(0.9, math.Log2(1.5)) * 0.4, 2, false}},
		{"super-linear capped at 1 above", fig{"super", 8, "v100", false, 8 * 12, 4, false}},
		{"super-linear not capped between", fig{"super", 2, "v100", false, 2 * 10 * math.Pow(1.2, 0.5), 1, false}},
		{"below the smallest: anchor 2, e over 2..8", fig{"gap", 1, "v100", false, 10 / math.Sqrt(0.8), 2, false}},
		{"zero at the other end, no k80 evidence elsewhere: linear", fig{"gap", 16, "k80", false, 16 * 1, 8, true}},
		{"above, e over 2..8", fig{"gap", 16, "v100", false, 16 * 8 * math.Sqrt(0.8), 8, false}},
		{"one size: borrow the median", fig{"one", 4, "v100", false, 4 * 5 * medV100 * medV100, 1, true}},
		{"one size: borrowed spread ratio", fig{"one", 4, "v100", true, 4 * 5 * medV100 * medV100 * 0.4, 1, true}},
		{"no evidence anywhere for k80: linear", fig{"one", 4, "k80", false, 4 * 1, 1, true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, xs, err := p.Extend([]Pair{{c.model, c.sf}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := q.Throughput(c.model, c.sf, c.t, c.spread)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-c.want) > 1e-9*max(1, c.want) {
				t.Errorf("Throughput = %v, want %v", got, c.want)
			}
			if len(xs) != 1 || xs[0].Anchor != c.anchor || xs[0].Pair != (Pair{c.model, c.sf}) {
				t.Fatalf("extrapolations %+v, want one anchored at %d", xs, c.anchor)
			}
			if from, ok := xs[0].EfficiencyFrom[c.t]; ok && (from != FromModel) != c.borrowed || !ok && c.want != 0 {
				t.Errorf("efficiency of %s from %q, want borrowed: %v", c.t, from, c.borrowed)
			}
			if _, err := p.Throughput(c.model, c.sf, c.t, false); err == nil {
				t.Error("Extend changed the profile it was called on")
			}
		})
	}
	// The consolidated k80 figure of "one" at sf 4 has no spread figure
	// anywhere to borrow: none, so spread falls back to consolidated.
	q, _, err := p.Extend([]Pair{{"one", 4}})
	if err != nil {
		t.Fatal(err)
	}
	if e := q.Entries()[slices.IndexFunc(q.Entries(), func(e Entry) bool { return e.Model == "one" && e.ScaleFactor == 4 })]; e.Spread["k80"] != 0 || e.Spread["v100"] == 0 {
		t.Errorf("spread %v: want a v100 figure and none for k80", e.Spread)
	}
}

func TestExtendErrorsAndNoop(t *testing.T) {
	p := scaling(t)
	if _, _, err := p.Extend([]Pair{{"m", 16}, {"gpt", 8}, {"bert", 2}, {"gpt", 1}}); err == nil ||
		!strings.Contains(err.Error(), `models the profile does not have at any scale factor ("bert", "gpt"): add entries for them`) {
		t.Errorf("unknown models: error %v", err)
	}
	if _, _, err := p.Extend([]Pair{{"m", 0}}); err == nil || !strings.Contains(err.Error(), `extend ("m", 0): want a positive scale factor`) {
		t.Errorf("sf 0: error %v", err)
	}
	q, xs, err := p.Extend([]Pair{{"m", 2}, {"one", 1}})
	if err != nil || q != p || xs != nil {
		t.Errorf("profiled pairs only: got %p %v %v, want the same profile and nothing extrapolated", q, xs, err)
	}
	q, xs, err = p.Extend([]Pair{{"m", 8}, {"m", 8}, {"m", 2}})
	if err != nil || len(xs) != 1 || len(q.Entries()) != len(p.Entries())+1 {
		t.Errorf("duplicate pair: %d extrapolations, %d entries (%v)", len(xs), len(q.Entries()), err)
	}
	if !strings.Contains(q.Source(), "test; 1 entries extrapolated") {
		t.Errorf("source %q: want it to say entries were extrapolated", q.Source())
	}
}

// TestExtendPredictsGavel holds each 8-GPU entry of Gavel's simulation
// profile out, extrapolates it from sf 1, 2 and 4, and compares: the rule
// must predict measured scaling, not just compute something.
func TestExtendPredictsGavel(t *testing.T) {
	full := Default()
	var kept []Entry
	var held []Pair
	for _, e := range full.Entries() {
		if e.ScaleFactor == 8 {
			held = append(held, Pair{e.Model, 8})
			continue
		}
		kept = append(kept, e)
	}
	p, err := New("held out", kept)
	if err != nil {
		t.Fatal(err)
	}
	q, _, err := p.Extend(held)
	if err != nil {
		t.Fatal(err)
	}
	var rule, linear []float64
	for _, k := range held {
		for _, ty := range full.Types() {
			want, _ := full.Throughput(k.Model, 8, ty, false)
			four, _ := full.Throughput(k.Model, 4, ty, false)
			if want <= 0 || four <= 0 {
				continue
			}
			got, err := q.Throughput(k.Model, 8, ty, false)
			if err != nil {
				t.Fatal(err)
			}
			rule = append(rule, math.Abs(got/want-1))
			linear = append(linear, math.Abs(2*four/want-1))
		}
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	r, l := median(rule), median(linear)
	t.Logf("held-out 8-GPU figures: %d, median relative error %.3f (linear from sf 4: %.3f)", len(rule), r, l)
	if len(rule) < 50 || r > 0.16 || r >= l {
		t.Errorf("median error %.3f over %d figures: want at most 0.16 and below linear scaling's %.3f", r, len(rule), l)
	}
}

func TestParseUnprofiled(t *testing.T) {
	for in, want := range map[string]Unprofiled{"": Refuse, "refuse": Refuse, "Skip": Skip, " extrapolate ": Extrapolate} {
		got, err := ParseUnprofiled(in)
		if err != nil || got != want {
			t.Errorf("ParseUnprofiled(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got.String() != strings.ToLower(strings.TrimSpace(in)) && in != "" {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	if _, err := ParseUnprofiled("drop"); err == nil || !strings.Contains(err.Error(), `unprofiled mode "drop": want refuse (the default), skip or extrapolate`) {
		t.Errorf("error %v", err)
	}
}

func TestResolve(t *testing.T) {
	p := scaling(t)
	job := func(id, model string, sf int) planner.Job {
		return planner.Job{ID: id, Model: model, ScaleFactor: sf, TotalSteps: 100, Weight: 1}
	}
	jobs := []planner.Job{
		job("a", "m", 1), job("b", "m", 16), job("c", "gpt", 2), job("d", "m", 16),
		job("e", "one", 4), job("f", "m", 16), job("g", "gpt", 2), job("h", "m", 2),
	}
	line := map[string]int{"a": 2, "b": 5, "c": 7, "d": 3, "e": 11, "f": 13, "g": 17, "h": 19}
	where := func(id string) string {
		return "vc.trace:" + string(rune('0'+line[id]/10)) + string(rune('0'+line[id]%10))
	}
	v100 := []planner.GPUType{"v100"}
	t.Run("refuse names each pair once", func(t *testing.T) {
		_, err := p.Resolve(jobs, v100, Refuse, where)
		want := `3 (model, scale factor) pairs of 6 jobs are not in the profile:
  ("gpt", 2): 2 jobs, first at vc.trace:07; model not in the profile
  ("m", 16): 3 jobs, first at vc.trace:05; profiled at scale factor 1, 2, 4
  ("one", 4): 1 job, first at vc.trace:11; profiled at scale factor 1
fix: add these entries to the profile, or skip those jobs or extrapolate them`
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("error:\n%v\nwant it to start:\n%s", err, want)
		}
		var ue *UnprofiledError
		if !errors.As(err, &ue) || ue.Mode != Refuse || len(ue.Pairs) != 3 {
			t.Errorf("want an *UnprofiledError with 3 pairs, got %#v", ue)
		}
	})
	t.Run("skip", func(t *testing.T) {
		r, err := p.Resolve(jobs, v100, Skip, where)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, j := range r.Jobs {
			ids = append(ids, j.ID)
		}
		if !slices.Equal(ids, []string{"a", "h"}) || r.Skipped() != 6 || r.Profile != p {
			t.Errorf("kept %v, skipped %d: want a, h and 6 with the same profile", ids, r.Skipped())
		}
		want := "skipped 6 of 8 jobs: their (model, scale factor) is not in the profile:\n" +
			"  (\"gpt\", 2): 2 jobs, first at vc.trace:07\n" +
			"  (\"m\", 16): 3 jobs, first at vc.trace:05\n" +
			"  (\"one\", 4): 1 job, first at vc.trace:11\n"
		if got := r.Report(); got != want {
			t.Errorf("report:\n%s\nwant:\n%s", got, want)
		}
		if jobs[1].ID != "b" {
			t.Error("Skip changed the caller's slice")
		}
	})
	t.Run("extrapolate refuses unknown models", func(t *testing.T) {
		_, err := p.Resolve(jobs, v100, Extrapolate, where)
		var ue *UnprofiledError
		if !errors.As(err, &ue) || ue.Mode != Extrapolate || len(ue.Pairs) != 1 || ue.Pairs[0].Pair.Model != "gpt" {
			t.Fatalf("error %v: want an *UnprofiledError for gpt alone", err)
		}
		if !strings.Contains(err.Error(), `1 (model, scale factor) pair of 2 jobs cannot be extrapolated: the profile has the model at no scale factor:
  ("gpt", 2): 2 jobs, first at vc.trace:07; model not in the profile
fix: add entries for these models to the profile, or skip their jobs`) {
			t.Errorf("error:\n%v", err)
		}
	})
	t.Run("extrapolate", func(t *testing.T) {
		known := slices.DeleteFunc(slices.Clone(jobs), func(j planner.Job) bool { return j.Model == "gpt" })
		r, err := p.Resolve(known, v100, Extrapolate, where)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Jobs) != len(known) || r.Skipped() != 0 || len(r.Unprofiled) != 2 {
			t.Fatalf("%d jobs, %d skipped, %d pairs", len(r.Jobs), r.Skipped(), len(r.Unprofiled))
		}
		if got, err := r.Profile.Throughput("m", 16, "v100", false); err != nil || math.Abs(got-16*8.1*0.81) > 1e-9 {
			t.Errorf("m at 16: %v, %v", got, err)
		}
		if err := r.Profile.Check(r.Jobs, v100); err != nil {
			t.Errorf("the resolved profile must pass Check on the resolved jobs: %v", err)
		}
		want := `extrapolated 2 (model, scale factor) entries for 4 of 6 jobs (the rule: docs/formats.md, "Jobs the profile does not cover"):
  ("m", 16): 3 jobs, first at vc.trace:05; from scale factor 4, per-GPU throughput kept per doubling: v100 0.9
  ("one", 4): 1 job, first at vc.trace:11; from scale factor 1, per-GPU throughput kept per doubling: k80 1 (no evidence) v100 0.9 (profile median)
`
		if got := r.Report(); got != want {
			t.Errorf("report:\n%s\nwant:\n%s", got, want)
		}
	})
	t.Run("covered", func(t *testing.T) {
		r, err := p.Resolve(jobs[:1], v100, Refuse, nil)
		if err != nil || r.Report() != "" || r.Profile != p || len(r.Jobs) != 1 {
			t.Errorf("got %+v, %v: want the input back and an empty report", r, err)
		}
	})
	t.Run("unrunnable and unknown type in every mode", func(t *testing.T) {
		in := []planner.Job{job("x", "m", 4), job("y", "m", 1), job("z", "m", 4)}
		for _, mode := range []Unprofiled{Refuse, Skip, Extrapolate} {
			_, err := p.Resolve(in, []planner.GPUType{"k80", "a100"}, mode, nil)
			for _, want := range []string{
				`GPU type "a100" is not in the profile (it has k80, v100)`,
			} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%v: error %v: want %q", mode, err, want)
				}
			}
			_, err = p.Resolve(in, []planner.GPUType{"k80"}, mode, nil)
			if want := `("m", 4): 2 jobs, first at job x: zero or no throughput on every cluster type (k80): add a GPU type it runs on or drop those jobs`; err == nil || err.Error() != want {
				t.Errorf("%v: error %v: want %q", mode, err, want)
			}
		}
		if _, err := p.Resolve(in, nil, Refuse, nil); err == nil || !strings.Contains(err.Error(), "no GPU types given") {
			t.Errorf("no types: %v", err)
		}
		if _, err := p.Resolve(in, v100, Unprofiled(7), nil); err == nil || !strings.Contains(err.Error(), "unprofiled mode 7") {
			t.Errorf("bad mode: %v", err)
		}
	})
}
