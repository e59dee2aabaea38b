package contract

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const fixtureDir = "testdata/merge-dir"

func readFixture[T any](t *testing.T, rel string, parse func([]byte) (T, error)) T {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	v, err := parse(b)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return v
}

// The merge directory fixture is the contract's: a closed round 2, the
// two copies' files of round 3 (one in float32, one with a float64
// tensor, as the Python library and the Go trainer write them), a third
// copy waiting to join, and round 3 as the closer must close it. The
// Python library's tests close the same round and compare.
func TestMergeFixture(t *testing.T) {
	base := readFixture(t, "round-2/merged.json", ParseMerged)
	c0 := readFixture(t, "round-3/copy-0.json", ParseMergeFile)
	c1 := readFixture(t, "round-3/copy-1.json", ParseMergeFile)
	want := readFixture(t, "round-3/merged.json", ParseMerged)
	var joiners []Candidate
	for i := range 3 {
		m := readFixture(t, filepath.Join("members", "copy-"+string(rune('0'+i))+".json"), ParseMember)
		if m.Copy != i || m.JobID != "digits" {
			t.Fatalf("heartbeat %d: %+v", i, m)
		}
		if m.State == "joining" {
			joiners = append(joiners, Candidate{Copy: m.Copy, MergeEvery: m.MergeEvery})
		}
	}
	got, err := Close(base, []*MergeFile{c1, c0}, joiners, 1, 100, time.Date(2026, 11, 21, 23, 59, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		t.Fatalf("round 3 closed as\n%s\nwant\n%s", gb, wb)
	}
	// The arithmetic, independently: 100 and 50 steps weigh 2/3 and 1/3.
	w, _ := want.State["0.weight"].Floats()
	a, _ := c0.State["0.weight"].Floats()
	b, _ := c1.State["0.weight"].Floats()
	for i := range w {
		if x := 2*a[i]/3 + b[i]/3; math.Abs(w[i]-x) > 1e-12 {
			t.Errorf("0.weight[%d] = %v, want %v", i, w[i], x)
		}
	}
	if want.State["0.weight"].DType != "float64" || want.State["h"].DType != "float16" || want.StepsDone != 450 {
		t.Errorf("merged dtypes %s/%s, steps %d", want.State["0.weight"].DType, want.State["h"].DType, want.StepsDone)
	}
	var sum int64
	for _, c := range want.Targets {
		sum += c.Steps
	}
	if sum != want.TotalSteps-want.StepsDone {
		t.Errorf("targets %+v sum to %d, want the remaining %d", want.Targets, sum, want.TotalSteps-want.StepsDone)
	}
}

func TestMergeStatesRules(t *testing.T) {
	f := func(dtype string, vs ...float64) State {
		tt, err := FloatTensor(dtype, []int{len(vs)}, vs)
		if err != nil {
			t.Fatal(err)
		}
		return State{"w": tt}
	}
	for _, tc := range []struct {
		name    string
		states  []State
		weights []float64
		want    []float64
		dtype   string
		err     string
	}{
		{"weighted", []State{f("float64", 1, 2), f("float64", 3, 6)}, []float64{3, 1}, []float64{1.5, 3}, "float64", ""},
		{"all weights 0 average equally", []State{f("float32", 1), f("float32", 3)}, []float64{0, 0}, []float64{2}, "float32", ""},
		{"a zero weight does not count", []State{f("float32", 1), f("float32", 3)}, []float64{0, 5}, []float64{3}, "float32", ""},
		{"float16 and bfloat16 widen to float32", []State{f("float16", 1), f("bfloat16", 2)}, []float64{1, 1}, []float64{1.5}, "float32", ""},
		{"one state", []State{f("bfloat16", 0.5)}, []float64{7}, []float64{0.5}, "bfloat16", ""},
		{"negative weight", []State{f("float32", 1)}, []float64{-1}, nil, "", "weight 0"},
		{"other shape", []State{f("float32", 1), f("float32", 1, 2)}, []float64{1, 1}, nil, "", "shape"},
		{"other names", []State{f("float32", 1), {"v": f("float32", 1)["w"]}}, []float64{1, 1}, nil, "", "missing"},
	} {
		got, err := MergeStates(tc.states, tc.weights)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		vs, _ := got["w"].Floats()
		if got["w"].DType != tc.dtype || !slices.Equal(vs, tc.want) {
			t.Errorf("%s: %s %v, want %s %v", tc.name, got["w"].DType, vs, tc.dtype, tc.want)
		}
	}
}

// Rounding to the narrow float types is to nearest, ties to even, and
// what is written reads back as the nearest representable value.
func TestNarrowFloats(t *testing.T) {
	for _, tc := range []struct {
		dtype string
		in    float64
		want  float64
	}{
		{"float16", 1.0 / 3, 0.333251953125},
		{"float16", 65504, 65504},
		{"float16", 70000, math.Inf(1)},
		{"float16", -2.5e-7, -2.384185791015625e-07},
		{"float16", 1 + 1.0/2048, 1}, // a tie: to the even mantissa
		{"bfloat16", 1.0 / 3, 0.333984375},
		{"bfloat16", -3, -3},
		{"float32", 0.1, float64(float32(0.1))},
	} {
		tt, err := FloatTensor(tc.dtype, []int{1}, []float64{tc.in})
		if err != nil {
			t.Fatal(err)
		}
		got, err := tt.Floats()
		if err != nil || got[0] != tc.want {
			t.Errorf("%s(%v) = %v, %v; want %v", tc.dtype, tc.in, got, err, tc.want)
		}
	}
}

func TestTensorValidate(t *testing.T) {
	nan, _ := FloatTensor("float64", []int{1}, []float64{math.NaN()})
	for _, tc := range []struct {
		name string
		t    Tensor
		want string
	}{
		{"unknown dtype", Tensor{DType: "complex64", Shape: []int{1}, Data: make([]byte, 8)}, "dtype"},
		{"short data", Tensor{DType: "float32", Shape: []int{2, 2}, Data: make([]byte, 15)}, "15 bytes, want 16"},
		{"negative dimension", Tensor{DType: "int8", Shape: []int{-1}}, "shape"},
		{"too many elements", Tensor{DType: "int8", Shape: []int{1 << 20, 1 << 20}}, "at most"},
		{"NaN", nan, "finite"},
	} {
		if err := tc.t.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := (Tensor{DType: "bool", Shape: []int{}, Data: []byte{1}}).Validate(); err != nil {
		t.Errorf("a scalar bool: %v", err)
	}
}

func TestParseMergeFilesRefuse(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(fixtureDir, "round-3/copy-0.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"version 2", `"version": 3`, `"version": 2`, "version"},
		{"unknown field", `"version": 3`, `"version": 3, "params": {}`, "unknown field"},
		{"round 0", `"round": 3`, `"round": 0`, "round"},
		{"negative steps", `"steps": 100`, `"steps": -1`, "steps"},
	} {
		in := strings.Replace(string(b), tc.from, tc.to, 1)
		if in == string(b) {
			t.Fatalf("%s: %q not in the fixture", tc.name, tc.from)
		}
		if _, err := ParseMergeFile([]byte(in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestNextTargets(t *testing.T) {
	for _, tc := range []struct {
		name      string
		remaining int64
		cands     []Candidate
		want      []Contribution
	}{
		{"room for all", 1000, []Candidate{{0, 100}, {3, 0}}, []Contribution{{Copy: 0, Steps: 100}, {Copy: 3, Steps: 0}}},
		{"shared by speed", 50, []Candidate{{0, 100}, {1, 50}, {2, 80}}, []Contribution{{Copy: 0, Steps: 22}, {Copy: 1, Steps: 11}, {Copy: 2, Steps: 17}}},
		{"unknown sized like the closer", 10, []Candidate{{0, 0}, {1, 20}}, []Contribution{{Copy: 0, Steps: 5}, {Copy: 1, Steps: 5}}},
		{"a zero share is no member", 1, []Candidate{{0, 10}, {1, 10}}, []Contribution{{Copy: 0, Steps: 1}}},
		{"nothing left", 0, []Candidate{{0, 10}}, []Contribution{}},
	} {
		if got := NextTargets(tc.remaining, tc.cands, 20); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestCheckpointNames(t *testing.T) {
	var fx struct {
		Entries         []string `json:"entries"`
		NewestFirst     []string `json:"newest_first"`
		NewestFirstPT   []string `json:"newest_first_pt"`
		NewestFirstJSON []string `json:"newest_first_json"`
	}
	b, err := os.ReadFile("testdata/checkpoints.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	for ext, want := range map[string][]string{"": fx.NewestFirst, "pt": fx.NewestFirstPT, "json": fx.NewestFirstJSON} {
		if got := Checkpoints(fx.Entries, ext); !slices.Equal(got, want) {
			t.Errorf("ext %q: %v, want %v", ext, got, want)
		}
	}
	if n := CheckpointName(1200, "pt"); n != "ckpt-1200.pt" {
		t.Errorf("CheckpointName: %s", n)
	}
}

func TestWorkerEnvFixture(t *testing.T) {
	var fx struct {
		Worker struct {
			Rank       int    `json:"rank"`
			WorldSize  int    `json:"world_size"`
			NodeRank   int    `json:"node_rank"`
			MasterAddr string `json:"master_addr"`
			MasterPort int    `json:"master_port"`
			RunID      string `json:"run_id"`
		} `json:"worker"`
		Env      map[string]string `json:"env"`
		Defaults map[string]string `json:"defaults"`
	}
	b, err := os.ReadFile("testdata/worker-env.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	w := fx.Worker
	set, defaults := WorkerEnv{Rank: w.Rank, WorldSize: w.WorldSize, NodeRank: w.NodeRank, MasterAddr: w.MasterAddr, MasterPort: w.MasterPort, RunID: w.RunID}.Env()
	if !reflect.DeepEqual(set, fx.Env) || !reflect.DeepEqual(defaults, fx.Defaults) {
		t.Fatalf("env\n got %v %v\nwant %v %v", set, defaults, fx.Env, fx.Defaults)
	}
	if RunID("resnet-a", 0) != w.RunID {
		t.Fatalf("RunID %q", RunID("resnet-a", 0))
	}
}

func TestPathElement(t *testing.T) {
	for in, want := range map[string]string{"train": "train", "a/b": "a%2Fb", "..": "%2E.", "50%": "50%25", ".x": "%2Ex"} {
		if got := PathElement(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// FuzzParseMergeFile: any bytes give a file or an error, never a panic.
func FuzzParseMergeFile(f *testing.F) {
	for _, p := range []string{"round-3/copy-0.json", "round-3/copy-1.json"} {
		b, err := os.ReadFile(filepath.Join(fixtureDir, p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMergeFile(b)
		if err == nil {
			for _, tt := range m.State {
				if tt.Validate() != nil {
					t.Fatalf("accepted an invalid tensor %+v", tt)
				}
			}
		}
	})
}
