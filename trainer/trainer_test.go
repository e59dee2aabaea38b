package trainer

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
)

func smallData(t *testing.T, seed uint64) (train, test *Dataset) {
	t.Helper()
	train, test, err := Generate(DefaultDataConfig(seed))
	if err != nil {
		t.Fatal(err)
	}
	return train, test
}

func TestGenerateIsDeterministicAndShardsPartition(t *testing.T) {
	a, at := smallData(t, 7)
	b, _ := smallData(t, 7)
	c, _ := smallData(t, 8)
	if !slices.Equal(a.X, b.X) || !slices.Equal(a.Y, b.Y) {
		t.Fatal("same seed gave different datasets")
	}
	if slices.Equal(a.X, c.X) {
		t.Fatal("different seeds gave the same dataset")
	}
	if a.Len()+at.Len() != 8000 || at.Len() != 2000 {
		t.Fatalf("split %d/%d, want 6000/2000", a.Len(), at.Len())
	}
	for _, k := range []int{1, 2, 3, 4} {
		n := 0
		for i := range k {
			s, err := a.Shard(i, k)
			if err != nil {
				t.Fatal(err)
			}
			// Sample j of shard i is sample i+j*k of the set.
			for j := range s.Len() {
				if !slices.Equal(s.Row(j), a.Row(i+j*k)) || s.Y[j] != a.Y[i+j*k] {
					t.Fatalf("k=%d shard %d sample %d is not sample %d", k, i, j, i+j*k)
				}
			}
			n += s.Len()
		}
		if n != a.Len() {
			t.Fatalf("k=%d: shards hold %d samples, want %d", k, n, a.Len())
		}
	}
	if _, err := a.Shard(4, 4); err == nil {
		t.Fatal("shard 4 of 4: want an error")
	}
}

// TestGradientMatchesFiniteDifferences checks backward against the loss it
// differentiates, for both models.
func TestGradientMatchesFiniteDifferences(t *testing.T) {
	train, _ := smallData(t, 3)
	for _, m := range []Model{Softmax, MLP} {
		t.Run(string(m), func(t *testing.T) {
			p, err := InitParams(m, train.Dim, 5, train.Classes, 3)
			if err != nil {
				t.Fatal(err)
			}
			ws := newWorkspace(p)
			x, y := train.Row(0), train.Y[0]
			grad := make([]float64, len(p.W))
			forward(p, x, y, ws)
			backward(p, x, y, ws, grad, 1)
			const h = 1e-6
			for i := 0; i < len(p.W); i += 7 {
				w := p.W[i]
				p.W[i] = w + h
				lp := forward(p, x, y, ws)
				p.W[i] = w - h
				lm := forward(p, x, y, ws)
				p.W[i] = w
				num := (lp - lm) / (2 * h)
				if math.Abs(num-grad[i]) > 1e-6*max(1, math.Abs(num)) {
					t.Fatalf("weight %d: backward %g, finite difference %g", i, grad[i], num)
				}
			}
		})
	}
}

func TestMerge(t *testing.T) {
	mk := func(w ...float64) Params { return Params{Model: Softmax, Dim: 1, Classes: 2, W: w} }
	a, b := mk(1, 2, 3, 4), mk(5, 6, 7, 8)
	tests := []struct {
		name    string
		params  []Params
		weights []float64
		want    []float64
		wantErr string
	}{
		{"single copy is identity", []Params{a}, []float64{17}, a.W, ""},
		{"identical params are a fixed point", []Params{a, a, a}, []float64{3, 1, 0.5}, a.W, ""},
		{"weights are honoured", []Params{a, b}, []float64{3, 1}, []float64{2, 3, 4, 5}, ""},
		{"zero weight contributes nothing", []Params{a, b}, []float64{0, 9}, b.W, ""},
		{"all zero weights average equally", []Params{a, b}, []float64{0, 0}, []float64{3, 4, 5, 6}, ""},
		{"no params", nil, nil, nil, "no parameters"},
		{"weights do not match", []Params{a, b}, []float64{1}, nil, "2 parameter sets but 1 weights"},
		{"negative weight", []Params{a, b}, []float64{1, -1}, nil, "weight 1 is -1"},
		{"NaN weight", []Params{a, b}, []float64{math.NaN(), 1}, nil, "weight 0 is NaN"},
		{"shapes differ", []Params{a, {Model: Softmax, Dim: 2, Classes: 2, W: make([]float64, 6)}}, []float64{1, 1}, nil, "copy 1 has shape"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Merge(tt.params, tt.weights)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range tt.want {
				if math.Abs(got.W[i]-tt.want[i]) > 1e-12 {
					t.Fatalf("merged %v, want %v", got.W, tt.want)
				}
			}
			if &got.W[0] == &tt.params[0].W[0] {
				t.Fatal("merge returned its input's storage")
			}
		})
	}
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		budget int
		speeds []float64
		want   []int
	}{
		{100, []float64{1}, []int{100}},
		{100, []float64{1, 1}, []int{50, 50}},
		{150, []float64{1, 0.5}, []int{100, 50}},
		{100, []float64{1, 0.5, 1.0 / 3}, []int{55, 27, 18}},
		{7, []float64{1, 1, 1}, []int{3, 2, 2}},
		{0, []float64{1, 2}, []int{0, 0}},
	}
	for _, tt := range tests {
		got, err := Allocate(tt.budget, tt.speeds)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("Allocate(%d, %v) = %v, want %v", tt.budget, tt.speeds, got, tt.want)
		}
	}
	if _, err := Allocate(10, []float64{1, 0}); err == nil {
		t.Error("zero speed: want an error")
	}
}

// TestSGDRestoreContinuesExactly: a model rebuilt from (params, velocity,
// step count) continues bit for bit, data order included.
func TestSGDRestoreContinuesExactly(t *testing.T) {
	train, _ := smallData(t, 5)
	cfg := DefaultTrainConfig(MLP, 5)
	cfg.Batch = 50 // several epochs' boundaries inside 400 steps of 6000 samples
	init, err := InitParams(MLP, train.Dim, cfg.Hidden, train.Classes, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	whole, _ := NewSGD(cfg, train, 2, init)
	for range 400 {
		whole.Step()
	}
	first, _ := NewSGD(cfg, train, 2, init)
	for range 150 {
		first.Step()
	}
	second, _ := NewSGD(cfg, train, 2, init)
	if err := second.SetParams(first.Params()); err != nil {
		t.Fatal(err)
	}
	if err := second.Restore(first.Steps(), first.Velocity()); err != nil {
		t.Fatal(err)
	}
	for range 250 {
		second.Step()
	}
	if !slices.Equal(whole.Params().W, second.Params().W) {
		t.Fatal("restored run diverged from the uninterrupted one")
	}
}

func TestRunsAreDeterministic(t *testing.T) {
	train, test := smallData(t, 4)
	cfg := DefaultTrainConfig(MLP, 4)
	hc := HadarEConfig{Copies: 3, Speeds: DefaultSpeeds(3), MergeEvery: 50}
	a, err := RunHadarE(context.Background(), train, test, cfg, 1500, hc)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := RunHadarE(context.Background(), train, test, cfg, 1500, hc)
	if !slices.Equal(a.Params.W, b.Params.W) || a.Test != b.Test {
		t.Fatal("two runs with the same seed differ")
	}
	if a.Steps != 1500 || a.CopySteps[0]+a.CopySteps[1]+a.CopySteps[2] != 1500 || a.Merges != 10 {
		t.Fatalf("steps %d, copy steps %v, merges %d; want 1500 steps over 10 merges", a.Steps, a.CopySteps, a.Merges)
	}
	if a.CopySteps[0] <= a.CopySteps[1] || a.CopySteps[1] <= a.CopySteps[2] {
		t.Fatalf("copy steps %v do not follow the speeds %v", a.CopySteps, hc.Speeds)
	}
	cfg.Seed = 5
	c, _ := RunHadarE(context.Background(), train, test, cfg, 1500, hc)
	if slices.Equal(a.Params.W, c.Params.W) {
		t.Fatal("different seeds gave the same parameters")
	}
}

// Tolerances of HadarE against the single job, for the same total steps.
// The loss tolerance is one-sided: averaging copies lowers the SGD noise and
// often ends below the single job's loss, which is not a failure.
const (
	accTolerancePP = 1.5  // percentage points of test accuracy
	lossTolerance  = 0.15 // relative test loss
)

// withinTolerance says whether got (HadarE) is as good as want (single job)
// up to the stated tolerances.
func withinTolerance(got, want Eval) bool {
	return 100*(want.Accuracy-got.Accuracy) <= accTolerancePP && got.Loss <= want.Loss*(1+lossTolerance)
}

// TestHadarEMatchesSingleJob is the acceptance test: k copies with
// unequal speeds, merged every round weighted by steps, reach the single
// job's test accuracy and loss for the same total steps.
func TestHadarEMatchesSingleJob(t *testing.T) {
	cc := DefaultCompareConfig()
	for _, m := range cc.Models {
		for _, seed := range cc.Seeds {
			dc := cc.Data
			dc.Seed = seed
			train, test, err := Generate(dc)
			if err != nil {
				t.Fatal(err)
			}
			tc := cc.Train
			tc.Model, tc.Seed = m, seed
			single, err := RunSingle(context.Background(), train, test, tc, cc.Steps)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range cc.Copies {
				hc := HadarEConfig{Copies: k, Speeds: DefaultSpeeds(k), MergeEvery: cc.MergeEvery}
				he, err := RunHadarE(context.Background(), train, test, tc, cc.Steps, hc)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s seed %d k=%d: single acc %.2f%% loss %.4f, HadarE acc %.2f%% loss %.4f (Δacc %+.2f pp, Δloss %+.1f%%)",
					m, seed, k, 100*single.Test.Accuracy, single.Test.Loss, 100*he.Test.Accuracy, he.Test.Loss,
					100*(he.Test.Accuracy-single.Test.Accuracy), 100*(he.Test.Loss-single.Test.Loss)/single.Test.Loss)
				if he.Steps != cc.Steps {
					t.Errorf("%s seed %d k=%d: HadarE did %d steps, want %d", m, seed, k, he.Steps, cc.Steps)
				}
				if !withinTolerance(he.Test, single.Test) {
					t.Errorf("%s seed %d k=%d: HadarE acc %.2f%% loss %.4f not within %.1f pp / %.0f%% of single acc %.2f%% loss %.4f",
						m, seed, k, 100*he.Test.Accuracy, he.Test.Loss, accTolerancePP, 100*lossTolerance, 100*single.Test.Accuracy, single.Test.Loss)
				}
			}
		}
	}
}

// TestUnmergedCopyFailsTheTolerance shows the acceptance test has power:
// keeping only the fastest copy's parameters (its share of the steps on its
// shard, never merged) is outside the tolerance for every seed.
func TestUnmergedCopyFailsTheTolerance(t *testing.T) {
	cc := DefaultCompareConfig()
	const k = 4
	for _, seed := range cc.Seeds {
		dc := cc.Data
		dc.Seed = seed
		train, test, err := Generate(dc)
		if err != nil {
			t.Fatal(err)
		}
		tc := cc.Train
		tc.Model, tc.Seed = MLP, seed
		single, err := RunSingle(context.Background(), train, test, tc, cc.Steps)
		if err != nil {
			t.Fatal(err)
		}
		nm, err := RunHadarE(context.Background(), train, test, tc, cc.Steps,
			HadarEConfig{Copies: k, Speeds: DefaultSpeeds(k), MergeEvery: cc.MergeEvery, NoMerge: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("mlp seed %d: single acc %.2f%% loss %.4f, unmerged fastest copy (%d steps) acc %.2f%% loss %.4f (Δloss %+.1f%%)",
			seed, 100*single.Test.Accuracy, single.Test.Loss, nm.CopySteps[0], 100*nm.Test.Accuracy, nm.Test.Loss,
			100*(nm.Test.Loss-single.Test.Loss)/single.Test.Loss)
		if withinTolerance(nm.Test, single.Test) {
			t.Errorf("seed %d: the unmerged copy passes the tolerance; the acceptance test could not tell merging from not merging", seed)
		}
	}
}

func TestParamsCodec(t *testing.T) {
	p, err := InitParams(MLP, 3, 2, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := EncodeParams(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := DecodeParams(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.W, q.W) || !p.SameShape(q) {
		t.Fatal("params did not round-trip exactly")
	}
	tests := []struct{ in, wantErr string }{
		{`{"model":"mlp","dim":3,"hidden":2,"classes":2,"weights":[1,2]}`, `field "weights": want 14 values, got 2`},
		{`{"model":"cnn","dim":3,"classes":2,"weights":[]}`, `field "model"`},
		{`{"model":"softmax","dim":0,"classes":2,"weights":[]}`, `field "dim"`},
		{`{"model":"softmax","dim":1,"classes":2,"weights":[1,2,3,4],"extra":1}`, `unknown field "extra"`},
		{`{"model":"softmax","dim":1,"classes":2,"weights":[1,2,3,4]} {}`, `trailing data`},
		{`{"model":"softmax","dim":1,"hidden":3,"classes":2,"weights":[1,2,3,4]}`, `field "hidden": want 0`},
		{`[`, `decode JSON`},
	}
	for _, tt := range tests {
		if _, err := DecodeParams([]byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("DecodeParams(%s) err = %v, want one containing %q", tt.in, err, tt.wantErr)
		}
	}
}

// FuzzDecodeParams: parameters come from files; whatever the bytes, the
// decoder returns valid parameters or an error, never panics, and what it
// accepts re-encodes to something it accepts again.
func FuzzDecodeParams(f *testing.F) {
	f.Add([]byte(`{"model":"softmax","dim":1,"classes":2,"weights":[1,2,3,4]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeParams(b)
		if err != nil {
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("decoded params do not validate: %v", err)
		}
		again, err := EncodeParams(p)
		if err != nil {
			t.Fatal(err)
		}
		q, err := DecodeParams(again)
		if err != nil || !slices.Equal(p.W, q.W) {
			t.Fatalf("re-decoding failed: %v", err)
		}
	})
}
