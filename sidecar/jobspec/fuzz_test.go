package jobspec

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
)

// FuzzParse feeds Parse jobs decoded from JSON (the shape Nomad's API
// returns) with job meta overridden by "key=value" lines. Parse must not
// panic, must fail only with a *FieldError that names a field and a fix,
// and what it accepts must satisfy the contract's bounds.
func FuzzParse(f *testing.F) {
	valid, err := json.Marshal(validJob(baseMeta()))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid, "")
	f.Add(valid, "hadar.workers=4\nhadar.gang=false\nhadar.throughput=v100=40,k80=12")
	f.Add(valid, "hadar.steps=1e\nhadar.weight=NaN")
	f.Add(valid, "hadar.workers=2-8")
	f.Add(valid, "hadar.workers=1,2,4\nhadar.gang=false")
	f.Add(valid, "hadar.workers=4,2")
	f.Add([]byte(`{"ID":"x","Type":"batch","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu/Tesla K80"}]}}]}],"Constraints":[{"LTarget":"${meta.hadar.gate}","RTarget":"waiting-for-hadar","Operand":"="}]}`),
		"hadar.throughput=v100=1\nhadar.steps=10")
	f.Add([]byte(`{"ID":"x","Type":"batch","TaskGroups":[null]}`), "hadar.steps=1")
	f.Add([]byte(`{"ID":"x","Type":"batch","TaskGroups":[{"Tasks":[null,{"Resources":{"Devices":[null]}}],"Constraints":[null]}]}`), "")
	f.Fuzz(func(t *testing.T, jobJSON []byte, meta string) {
		var job api.Job
		if err := json.Unmarshal(jobJSON, &job); err != nil {
			return
		}
		for _, line := range strings.Split(meta, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				if job.Meta == nil {
					job.Meta = map[string]string{}
				}
				job.Meta[k] = v
			}
		}
		s, err := Parse(&job)
		if err != nil {
			fe, ok := err.(*FieldError)
			if !ok {
				t.Fatalf("error %T is not a *FieldError: %v", err, err)
			}
			if fe.Field == "" || fe.Want == "" || err.Error() == "" {
				t.Fatalf("FieldError without field or fix: %+v", fe)
			}
			return
		}
		if !IsManaged(&job) {
			t.Fatal("accepted a job IsManaged calls human-owned")
		}
		if s.Steps <= 0 || s.Steps > MaxSteps || s.Workers < 1 || s.Workers > MaxWorkers ||
			!(s.Weight > 0) || s.Weight > MaxWeight || (s.Sensitivity != SensitivityAuto && !(s.Sensitivity >= 1 && s.Sensitivity <= MaxSensitivity)) ||
			s.MinRunTime < 0 || s.MinRunTime > MaxMinRunTime {
			t.Fatalf("accepted spec out of bounds: %+v", s)
		}
		if s.Widths != nil {
			if len(s.Widths) < 2 || s.Widths[0] != s.Workers || s.Widths[len(s.Widths)-1] > MaxWorkers || s.Forkable {
				t.Fatalf("accepted widths out of bounds: %+v", s)
			}
			for i := 1; i < len(s.Widths); i++ {
				if s.Widths[i] <= s.Widths[i-1] {
					t.Fatalf("accepted widths not ascending: %v", s.Widths)
				}
			}
			if err := s.Job("x", 0).Validate(); err != nil {
				t.Fatalf("accepted elastic spec the planner refuses: %v", err)
			}
		}
		if s.Model == "" && len(s.Throughput) == 0 {
			t.Fatalf("accepted spec without model or throughput: %+v", s)
		}
		for typ, x := range s.Throughput {
			if !planner.GPUType(typ).ValidName() || !(x > 0) || math.IsInf(x, 0) {
				t.Fatalf("accepted throughput %q=%v", typ, x)
			}
		}
		if !HasGate(&job) || len(s.Gates) == 0 || s.Task == "" || s.Device == "" {
			t.Fatalf("accepted an ungated or GPU-less job: %+v", s)
		}
		if s.Gang && s.Workers == 1 && !strings.EqualFold(strings.TrimSpace(job.Meta[KeyGang]), "true") {
			t.Fatalf("gang on one worker without hadar.gang: %+v", s)
		}
	})
}
