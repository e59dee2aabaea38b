package train

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/plugintest"
)

// TestTaskConfigDecode decodes task config blocks as they reach the
// driver: the job's config as Nomad holds it (the JSON below is what
// `nomad job run -output` prints for the HCL in each comment: blocks and
// maps become lists of objects), encoded by the client with the schema.
func TestTaskConfigDecode(t *testing.T) {
	tests := []struct {
		name string
		json string
		want TaskConfig
		err  string
	}{
		{
			// command = "/usr/bin/python3", args = [...], work_dir = "/srv/train"
			name: "plain",
			json: `{"command": "/usr/bin/python3", "args": ["train.py", "--epochs", "3"], "work_dir": "/srv/train"}`,
			want: TaskConfig{Command: "/usr/bin/python3", Args: []string{"train.py", "--epochs", "3"}, WorkDir: "/srv/train"},
		},
		{
			// emulate { steps_per_sec = { "Tesla V100-SXM2-16GB" = 40, "Tesla K80" = 12.5 } }
			// hadare { copies = 2, copy_index = 1, merge_every = 40, merge_dir = "resnet" }
			name: "emulate and hadare",
			json: `{"command": "hadar-trainer", "total_steps": 5000,
				"emulate": [{"steps_per_sec": [{"Tesla K80": 12.5, "Tesla V100-SXM2-16GB": 40}]}],
				"hadare": [{"copies": 2, "copy_index": 1, "merge_every": 40, "merge_dir": "resnet"}]}`,
			want: TaskConfig{
				Command: "hadar-trainer", TotalSteps: 5000,
				Emulate: &EmulateConfig{StepsPerSec: RateMaps{{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12.5}}},
				HadarE:  &HadarEConfig{Copies: 2, CopyIndex: 1, MergeEvery: 40, MergeDir: "resnet"},
			},
		},
		{
			// 12.3 and 0.8 are not exact in binary: cty's msgpack sends
			// them as decimal strings, which must decode as numbers.
			name: "emulate with spread paces, dynamic copies",
			json: `{"command": "hadar-trainer",
				"emulate": [{"spread_factor": 0.8, "steps_per_sec": [{"Tesla K80": 12.3, "Tesla V100-SXM2-16GB": 40}], "spread_steps_per_sec": [{"Tesla K80": 9.7}]}],
				"hadare": [{"merge_every": 40}]}`,
			want: TaskConfig{
				Command: "hadar-trainer",
				Emulate: &EmulateConfig{StepsPerSec: RateMaps{{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12.3}}, SpreadStepsPerSec: RateMaps{{"Tesla K80": 9.7}}, SpreadFactor: 0.8},
				// copy_index unset: -1, so that 0 is an index.
				HadarE: &HadarEConfig{CopyIndex: -1, MergeEvery: 40},
			},
		},
		{
			name: "copy_index 0 is set",
			json: `{"command": "t", "hadare": [{"copies": 2, "copy_index": 0}]}`,
			want: TaskConfig{Command: "t", HadarE: &HadarEConfig{Copies: 2, CopyIndex: 0}},
		},
		{
			name: "no command",
			json: `{"args": ["x"]}`,
			err:  `"command" is required`,
		},
		{
			name: "rates not numbers",
			json: `{"command": "t", "emulate": [{"steps_per_sec": [{"Tesla K80": "fast"}]}]}`,
			err:  `number`,
		},
	}
	spec := taskConfigSpec.Proto()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]interface{}
			if err := json.Unmarshal([]byte(tc.json), &m); err != nil {
				t.Fatal(err)
			}
			b, err := plugintest.DriverConfig(spec, m)
			if err == nil {
				var got TaskConfig
				if err = taskConfigSpec.Decode(b, &got); err == nil {
					if !reflect.DeepEqual(got, tc.want) {
						t.Fatalf("got %+v (emulate %+v, hadare %+v)\nwant %+v (emulate %+v, hadare %+v)", got, got.Emulate, got.HadarE, tc.want, tc.want.Emulate, tc.want.HadarE)
					}
					if err := got.validate(); err != nil {
						t.Fatalf("valid config rejected: %v", err)
					}
				}
			}
			if tc.err == "" && err != nil {
				t.Fatal(err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func TestStepsPerSec(t *testing.T) {
	e := &EmulateConfig{StepsPerSec: RateMaps{{"A": 40}, {"B": 12}}}
	tests := []struct {
		models  []string
		want    float64
		wantErr bool
	}{
		{[]string{"A"}, 40, false},
		{[]string{"A", "B"}, 12, false}, // slowest GPU sets the pace
		{[]string{"C"}, 0, true},
		{nil, 0, true},
	}
	for _, tc := range tests {
		got, err := e.stepsPerSec(tc.models)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("stepsPerSec(%v) = %v, %v; want %v, err=%v", tc.models, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestLimits(t *testing.T) {
	// As Nomad's client fills Resources for a task: cpu 500, memory 256,
	// and memory_max 1024 (oversubscription) or -1 (unlimited).
	for _, tc := range []struct {
		name             string
		memMax           int64
		wantMax, wantLow int64
	}{
		{"memory only", 0, 256 << 20, 0},
		{"memory_max", 1024, 1024 << 20, 256 << 20},
		{"memory_max unlimited", -1, -1, 256 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := limits(&plugin.Resources{CPUShares: 500, MemoryMB: 256, MemoryMaxMB: tc.memMax,
				Linux: &plugin.LinuxResources{CPUShares: 500, MemoryLimitBytes: 256 << 20}})
			if l.CPUShares != 500 || l.MemoryMax != tc.wantMax || l.MemoryLow != tc.wantLow {
				t.Fatalf("limits %+v, want cpu 500, max %d, low %d", l, tc.wantMax, tc.wantLow)
			}
		})
	}
}
