package train

import (
	"reflect"
	"testing"

	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
)

// TestTaskConfigHCL decodes task config blocks the way a jobspec's reach
// the driver (HCL, then the list-of-maps form of maps).
func TestTaskConfigHCL(t *testing.T) {
	one := 1
	tests := []struct {
		name string
		hcl  string
		want TaskConfig
	}{
		{
			name: "plain",
			hcl: `config {
  command = "/usr/bin/python3"
  args    = ["train.py", "--epochs", "3"]
  work_dir = "/srv/train"
}`,
			want: TaskConfig{Command: "/usr/bin/python3", Args: []string{"train.py", "--epochs", "3"}, WorkDir: "/srv/train"},
		},
		{
			name: "emulate and hadare",
			hcl: `config {
  command     = "hadar-trainer"
  total_steps = 5000
  emulate {
    steps_per_sec = {
      "Tesla V100-SXM2-16GB" = 40
      "Tesla K80"            = 12.5
    }
  }
  hadare {
    copies      = 2
    copy_index  = 1
    merge_every = 40
    merge_dir   = "/shared/merge"
  }
}`,
			want: TaskConfig{
				Command: "hadar-trainer", TotalSteps: 5000,
				Emulate: &EmulateConfig{StepsPerSec: RateMap{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12.5}},
				HadarE:  &HadarEConfig{Copies: 2, CopyIndex: &one, MergeEvery: 40, MergeDir: "/shared/merge"},
			},
		},
		{
			// 12.3 and 0.8 are not exact in binary: cty's msgpack sends them
			// as decimal strings, which a float64 field refuses.
			name: "emulate with spread paces, dynamic copies",
			hcl: `config {
  command = "hadar-trainer"
  emulate {
    steps_per_sec = {
      "Tesla V100-SXM2-16GB" = 40
      "Tesla K80"            = 12.3
    }
    spread_steps_per_sec = {
      "Tesla K80" = 9.7
    }
    spread_factor = 0.8
  }
  hadare {
    merge_every = 40
  }
}`,
			want: TaskConfig{
				Command: "hadar-trainer",
				Emulate: &EmulateConfig{StepsPerSec: RateMap{"Tesla V100-SXM2-16GB": 40, "Tesla K80": 12.3}, SpreadStepsPerSec: RateMap{"Tesla K80": 9.7}, SpreadFactor: 0.8},
				HadarE:  &HadarEConfig{MergeEvery: 40},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got TaskConfig
			hclutils.NewConfigParser(taskConfigSpec).ParseHCL(t, tc.hcl, &got)
			if len(got.Args) == 0 {
				got.Args = nil
			}
			if got.Emulate != nil && len(got.Emulate.SpreadStepsPerSec) == 0 {
				got.Emulate.SpreadStepsPerSec = nil
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v (emulate %+v, hadare %+v)\nwant %+v", got, got.Emulate, got.HadarE, tc.want)
			}
			if err := got.validate(); err != nil {
				t.Fatalf("valid config rejected: %v", err)
			}
		})
	}
}

func TestStepsPerSec(t *testing.T) {
	e := &EmulateConfig{StepsPerSec: RateMap{"A": 40, "B": 12}}
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
