package jobspec

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// validJob is a well-formed managed job: batch, one group whose task asks
// for one GPU, gated at job level, with the given job meta.
func validJob(meta map[string]string) *api.Job {
	j := api.NewBatchJob("resnet-a", "resnet-a", "global", 50)
	j.Meta = meta
	j.Constrain(GateConstraint())
	t := api.NewTask("train", "hadar-train")
	t.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: ptr(uint64(1))}}})
	j.AddTaskGroup(api.NewTaskGroup("workers", 1).AddTask(t))
	return j
}

func ptr[T any](v T) *T { return &v }

func baseMeta() map[string]string {
	return map[string]string{KeyModel: "ResNet-18 (batch size 16)", KeySteps: "50000"}
}

func with(kv ...string) map[string]string {
	m := baseMeta()
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "<delete>" {
			delete(m, kv[i])
			continue
		}
		m[kv[i]] = kv[i+1]
	}
	return m
}

func TestParseDefaults(t *testing.T) {
	s, err := Parse(validJob(baseMeta()))
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{
		JobID: "resnet-a", Namespace: "default", Model: "ResNet-18 (batch size 16)", Steps: 50000,
		Workers: 1, Weight: 1, Forkable: false, Gang: false, Sensitivity: SensitivityAuto, Priority: 50,
		Group: "workers", Task: "train", Device: "nvidia/gpu", Gates: []Gate{{Index: 0}},
	}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("Parse:\n got %+v\nwant %+v", s, want)
	}
}

// TestParseFields sets each key to accepted values and checks the field it
// lands in.
func TestParseFields(t *testing.T) {
	cases := []struct {
		name  string
		meta  map[string]string
		check func(Spec) bool
	}{
		{"model trimmed", with(KeyModel, "  A3C  "), func(s Spec) bool { return s.Model == "A3C" }},
		{"throughput alone", with(KeyModel, "<delete>", KeyThroughput, "v100=40,p100=21.5,k80=12"),
			func(s Spec) bool {
				return s.Model == "" && reflect.DeepEqual(s.Throughput, map[string]float64{"v100": 40, "p100": 21.5, "k80": 12})
			}},
		{"throughput with model, types lowercased, spaces", with(KeyThroughput, " V100 = 40 , a100=1e2"),
			func(s Spec) bool {
				return s.Model != "" && reflect.DeepEqual(s.Throughput, map[string]float64{"v100": 40, "a100": 100})
			}},
		{"steps", with(KeySteps, " 7 "), func(s Spec) bool { return s.Steps == 7 }},
		{"steps max", with(KeySteps, "1000000000000"), func(s Spec) bool { return s.Steps == MaxSteps }},
		{"workers 4 turns gang on", with(KeyWorkers, "4"), func(s Spec) bool { return s.Workers == 4 && s.Gang }},
		{"workers max", with(KeyWorkers, "256"), func(s Spec) bool { return s.Workers == 256 }},
		{"workers 4 gang off", with(KeyWorkers, "4", KeyGang, "false"), func(s Spec) bool { return s.Workers == 4 && !s.Gang }},
		{"gang on one worker", with(KeyGang, "TRUE"), func(s Spec) bool { return s.Gang }},
		{"workers one number is rigid", with(KeyWorkers, " 3 "), func(s Spec) bool { return s.Workers == 3 && s.Widths == nil }},
		{"workers range", with(KeyWorkers, "2-5"), func(s Spec) bool { return s.Workers == 2 && reflect.DeepEqual(s.Widths, []int{2, 3, 4, 5}) && s.Gang }},
		{"workers range spaces", with(KeyWorkers, " 1 - 2 "), func(s Spec) bool { return s.Workers == 1 && reflect.DeepEqual(s.Widths, []int{1, 2}) }},
		{"workers range from 1 turns gang on", with(KeyWorkers, "1-2"), func(s Spec) bool { return s.Gang }},
		{"workers list", with(KeyWorkers, "2, 4,8"), func(s Spec) bool { return s.Workers == 2 && reflect.DeepEqual(s.Widths, []int{2, 4, 8}) }},
		{"weight", with(KeyWeight, "2.5"), func(s Spec) bool { return s.Weight == 2.5 }},
		{"forkable", with(KeyForkable, "true"), func(s Spec) bool { return s.Forkable }},
		{"forkable false", with(KeyForkable, "False"), func(s Spec) bool { return !s.Forkable }},
		{"sensitivity auto", with(KeySensitivity, "Auto"), func(s Spec) bool { return s.Sensitivity == SensitivityAuto }},
		{"sensitivity 1", with(KeySensitivity, "1"), func(s Spec) bool { return s.Sensitivity == 1 }},
		{"sensitivity 1.8", with(KeySensitivity, "1.8"), func(s Spec) bool { return s.Sensitivity == 1.8 }},
		{"min run time", with(KeyMinRunTime, "1h30m"), func(s Spec) bool { return s.MinRunTime == 90*time.Minute }},
		{"queue trimmed", with(KeyQueue, " vision "), func(s Spec) bool { return s.Queue == "vision" }},
		{"unrelated meta kept out", with("owner", "ana", "hadarx", "1"), func(s Spec) bool { return s.Steps == 50000 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse(validJob(c.meta))
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(s) {
				t.Fatalf("unexpected spec %+v", s)
			}
		})
	}
}

// TestParseMetaErrors gives every key a bad value and checks the error
// names the key, the value and the fix.
func TestParseMetaErrors(t *testing.T) {
	cases := []struct {
		name  string
		meta  map[string]string
		field string
		value string
		want  string // substring of Want
	}{
		{"no model no throughput", with(KeyModel, "<delete>"), KeyModel, "", "or hadar.throughput"},
		{"empty model", with(KeyModel, " "), KeyModel, " ", "model name"},
		{"missing steps", with(KeySteps, "<delete>"), KeySteps, "", "missing"},
		{"steps 1e", with(KeySteps, "1e"), KeySteps, "1e", "positive integer"},
		{"steps zero", with(KeySteps, "0"), KeySteps, "0", "positive integer"},
		{"steps negative", with(KeySteps, "-5"), KeySteps, "-5", "positive integer"},
		{"steps float", with(KeySteps, "5.5"), KeySteps, "5.5", "positive integer"},
		{"steps huge", with(KeySteps, "1000000000001"), KeySteps, "1000000000001", "at most"},
		{"workers zero", with(KeyWorkers, "0"), KeyWorkers, "0", "from 1 to 256"},
		{"workers negative", with(KeyWorkers, "-2"), KeyWorkers, "-2", "from 1 to 256"},
		{"workers too many", with(KeyWorkers, "257"), KeyWorkers, "257", "from 1 to 256"},
		{"workers word", with(KeyWorkers, "four"), KeyWorkers, "four", "integer"},
		{"workers list unsorted", with(KeyWorkers, "4,2"), KeyWorkers, "4,2", "not ascending (2 after 4)"},
		{"workers list repeated", with(KeyWorkers, "2,2"), KeyWorkers, "2,2", "not ascending"},
		{"workers list zero", with(KeyWorkers, "0,2"), KeyWorkers, "0,2", `width "0"`},
		{"workers list empty entry", with(KeyWorkers, "4,"), KeyWorkers, "4,", `width ""`},
		{"workers list too many", with(KeyWorkers, "2,300"), KeyWorkers, "2,300", "from 1 to 256"},
		{"workers range reversed", with(KeyWorkers, "8-2"), KeyWorkers, "8-2", "range 8-2 is empty"},
		{"workers range of one", with(KeyWorkers, "4-4"), KeyWorkers, "4-4", "write one number"},
		{"workers range from 0", with(KeyWorkers, "0-4"), KeyWorkers, "0-4", `range ("2-8"`},
		{"workers range too wide", with(KeyWorkers, "2-257"), KeyWorkers, "2-257", "from 1 to 256"},
		{"workers range open", with(KeyWorkers, "2-"), KeyWorkers, "2-", "range"},
		{"elastic and forkable", with(KeyWorkers, "2-4", KeyForkable, "true"), KeyWorkers, "2-4", "hadar.forkable"},
		{"weight zero", with(KeyWeight, "0"), KeyWeight, "0", "positive number"},
		{"weight NaN", with(KeyWeight, "NaN"), KeyWeight, "NaN", "positive number"},
		{"weight Inf", with(KeyWeight, "+Inf"), KeyWeight, "+Inf", "positive number"},
		{"weight huge", with(KeyWeight, "1e7"), KeyWeight, "1e7", "up to"},
		{"forkable yes", with(KeyForkable, "yes"), KeyForkable, "yes", `"true" or "false"`},
		{"forkable 1", with(KeyForkable, "1"), KeyForkable, "1", `"true" or "false"`},
		{"gang maybe", with(KeyGang, "maybe"), KeyGang, "maybe", `"true" or "false"`},
		{"sensitivity below 1", with(KeySensitivity, "0.5"), KeySensitivity, "0.5", `"auto"`},
		{"sensitivity word", with(KeySensitivity, "high"), KeySensitivity, "high", `"auto"`},
		{"sensitivity huge", with(KeySensitivity, "101"), KeySensitivity, "101", "from 1 to 100"},
		{"min run time bare number", with(KeyMinRunTime, "30"), KeyMinRunTime, "30", "positive duration"},
		{"min run time zero", with(KeyMinRunTime, "0s"), KeyMinRunTime, "0s", "positive duration"},
		{"min run time negative", with(KeyMinRunTime, "-1m"), KeyMinRunTime, "-1m", "positive duration"},
		{"min run time too long", with(KeyMinRunTime, "800h"), KeyMinRunTime, "800h", "up to"},
		{"queue empty", with(KeyQueue, " "), KeyQueue, " ", "queue name"},
		{"queue bad name", with(KeyQueue, "team a"), KeyQueue, "team a", "queue name"},
		{"throughput no equals", with(KeyThroughput, "v100"), KeyThroughput, "v100", "TYPE=STEPS_PER_SEC"},
		{"throughput empty entry", with(KeyThroughput, "v100=4,,k80=1"), KeyThroughput, "v100=4,,k80=1", `entry ""`},
		{"throughput empty", with(KeyThroughput, ""), KeyThroughput, "", "TYPE=STEPS_PER_SEC"},
		{"throughput bad type", with(KeyThroughput, "v 100=4"), KeyThroughput, "v 100=4", "GPU type"},
		{"throughput zero", with(KeyThroughput, "v100=0"), KeyThroughput, "v100=0", "positive number"},
		{"throughput word", with(KeyThroughput, "v100=fast"), KeyThroughput, "v100=fast", "positive number"},
		{"throughput duplicate", with(KeyThroughput, "v100=1,V100=2"), KeyThroughput, "v100=1,V100=2", "given twice"},
		{"typo suggests", with("hadar.step", "5"), "hadar.step", "5", "did you mean hadar.steps?"},
		{"unknown lists known keys", with("hadar.colour", "red"), "hadar.colour", "red", "hadar.min_run_time"},
		{"unknown before missing", with(KeySteps, "<delete>", "hadar.stpes", "5"), "hadar.stpes", "5", "did you mean hadar.steps?"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(validJob(c.meta))
			fe := asFieldError(t, err)
			if fe.Field != c.field || fe.Value != c.value || !strings.Contains(fe.Want, c.want) {
				t.Fatalf("got field %q value %q want %q; expected field %q value %q want containing %q", fe.Field, fe.Value, fe.Want, c.field, c.value, c.want)
			}
			if fe.Job != "resnet-a" || !strings.Contains(err.Error(), `job "resnet-a": meta `+c.field) {
				t.Fatalf("error does not name the job and key: %v", err)
			}
		})
	}
}

func asFieldError(t *testing.T, err error) *FieldError {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	fe, ok := err.(*FieldError)
	if !ok {
		t.Fatalf("error %T is not a *FieldError: %v", err, err)
	}
	return fe
}

func TestParsePriority(t *testing.T) {
	// Nomad's job priority orders jobs inside their queue; absent, 0 (the
	// queues read it as Nomad's default 50).
	j := validJob(baseMeta())
	j.Priority = nil
	s, err := Parse(j)
	if err != nil || s.Priority != 0 || s.Job("x", 0).Priority != 0 {
		t.Fatalf("no priority: got %d (%v), want 0", s.Priority, err)
	}
	j.Priority = ptr(70)
	if s, err = Parse(j); err != nil || s.Priority != 70 || s.Job("x", 0).Priority != 70 {
		t.Fatalf("priority 70: got %d (%v)", s.Priority, err)
	}
}

func TestFieldErrorMessage(t *testing.T) {
	_, err := Parse(validJob(with(KeySteps, "1e")))
	want := `job "resnet-a": meta hadar.steps = "1e": want a positive integer number of training steps (at most 1000000000000), e.g. hadar.steps = "50000"`
	if err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
	j := validJob(baseMeta())
	j.Namespace = ptr("ml")
	j.Type = ptr("service")
	_, err = Parse(j)
	want = `job "resnet-a" (namespace "ml"): type = "service": want "batch"`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got  %v\nwant prefix %s", err, want)
	}
}

// TestParseShape covers the job shapes hadar refuses, and the device forms
// it accepts.
func TestParseShape(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*api.Job)
		field  string // substring of Field; "" = accepted
		want   string // substring of Want
	}{
		{"service", func(j *api.Job) { j.Type = ptr("service") }, "type", `want "batch"`},
		{"no type is service", func(j *api.Job) { j.Type = nil }, "type", `want "batch"`},
		{"system", func(j *api.Job) { j.Type = ptr("system") }, "type", `want "batch"`},
		{"no id", func(j *api.Job) { j.ID = nil }, "id", "job ID"},
		{"periodic run", func(j *api.Job) { j.ParentID = ptr("nightly") }, "parent", "own job"},
		{"dispatched job", func(j *api.Job) {
			j.ParentID, j.Dispatched = ptr("train"), true
			j.ParameterizedJob = &api.ParameterizedJobConfig{MetaOptional: []string{"hadar.steps"}}
		}, "parent", "Dispatched field is read-only"},
		{"periodic", func(j *api.Job) { j.Periodic = &api.PeriodicConfig{Enabled: ptr(true), Spec: ptr("@daily")} }, "periodic", "own job"},
		{"parameterized", func(j *api.Job) { j.ParameterizedJob = &api.ParameterizedJobConfig{} }, "parameterized", "own job"},
		{"two groups", func(j *api.Job) { j.AddTaskGroup(api.NewTaskGroup("b", 1)) }, "group", "exactly one task group"},
		{"no groups", func(j *api.Job) { j.TaskGroups = nil }, "group", "exactly one task group"},
		{"nil group", func(j *api.Job) { j.TaskGroups = []*api.TaskGroup{nil} }, "group", "exactly one task group"},
		{"group count any", func(j *api.Job) { j.TaskGroups[0].Count = ptr(7) }, "", ""},
		{"placed form: generated groups beside the template", func(j *api.Job) {
			j.Constraints = nil
			j.TaskGroups[0].Count = ptr(0)
			j.TaskGroups[0].Constrain(GateConstraint())
			for _, name := range []string{"workers-hadar-u0-w0", "workers-hadar-u0-w1", "workers-hadar-u12-w0"} {
				j.AddTaskGroup(api.NewTaskGroup(name, 1).AddTask(api.NewTask("train", "hadar-train")))
			}
		}, "", ""},
		{"generated groups without their template", func(j *api.Job) {
			j.TaskGroups[0].Name = ptr("other")
			j.AddTaskGroup(api.NewTaskGroup("workers-hadar-u0-w0", 1))
		}, "group", "exactly one task group"},
		{"generated-looking group alone is the template", func(j *api.Job) { j.TaskGroups[0].Name = ptr("x-hadar-u0-w0") }, "", "x-hadar-u0-w0"},
		{"no device", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices = nil }, "device", `device "nvidia/gpu"`},
		{"no resources", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources = nil }, "device", `device "nvidia/gpu"`},
		{"count 2", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Count = ptr(uint64(2)) }, `device "nvidia/gpu" count`, `hadar.workers = "2"`},
		{"count nil is 1", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Count = nil }, "", ""},
		{"device gpu", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Name = "gpu" }, "", ""},
		{"device with model", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Name = "nvidia/gpu/Tesla K80" }, "", ""},
		{"amd gpu", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Name = "amd/gpu" }, "device", `"nvidia/gpu"`},
		{"empty model", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Name = "nvidia/gpu/" }, "device", `"nvidia/gpu"`},
		{"other device beside the gpu", func(j *api.Job) {
			r := j.TaskGroups[0].Tasks[0].Resources
			r.Devices = append(r.Devices, &api.RequestedDevice{Name: "xilinx/fpga", Count: ptr(uint64(3))})
		}, "", ""},
		{"two gpu requests", func(j *api.Job) {
			t := api.NewTask("helper", "raw_exec")
			t.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "gpu"}}})
			j.TaskGroups[0].AddTask(t)
		}, `task "helper" device "gpu"`, "found a second one"},
		{"helper task without gpu", func(j *api.Job) { j.TaskGroups[0].AddTask(api.NewTask("logs", "raw_exec")) }, "", ""},
		{"group meta key", func(j *api.Job) { j.TaskGroups[0].Meta = map[string]string{KeyWorkers: "2"} }, `group "workers" meta`, "job-level meta"},
		{"task meta key", func(j *api.Job) { j.TaskGroups[0].Tasks[0].Meta = map[string]string{KeySteps: "2"} }, `task "train" meta`, "job-level meta"},
		{"no gate", func(j *api.Job) { j.Constraints = nil }, "gate", GateHCL},
		{"gate at group level", func(j *api.Job) {
			j.Constraints = nil
			j.TaskGroups[0].Constrain(GateConstraint())
		}, "", ""},
		{"gate with ==", func(j *api.Job) { j.Constraints[0].Operand = "==" }, "", ""},
		{"gate with no operator", func(j *api.Job) { j.Constraints[0].Operand = "" }, "", ""},
		{"gate wrong operator", func(j *api.Job) { j.Constraints[0].Operand = "!=" }, "job constraint 0", "exactly as"},
		{"gate wrong value", func(j *api.Job) { j.Constraints[0].RTarget = "open" }, "job constraint 0", "exactly as"},
		{"gate wrong value in group", func(j *api.Job) {
			j.TaskGroups[0].Constrain(api.NewConstraint(GateAttribute, "=", "x"))
		}, `group "workers" constraint 0`, "exactly as"},
		{"gate at task level", func(j *api.Job) {
			j.Constraints = nil
			j.TaskGroups[0].Tasks[0].Constrain(GateConstraint())
		}, `task "train" constraint 0`, "job or group level"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := validJob(baseMeta())
			c.mutate(j)
			s, err := Parse(j)
			if c.field == "" {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				if s.Task != "train" || (s.Group != "workers" && s.Group != c.want) || len(s.Gates) != 1 {
					t.Fatalf("spec %+v", s)
				}
				return
			}
			fe := asFieldError(t, err)
			if !strings.Contains(fe.Field, c.field) || !strings.Contains(fe.Want, c.want) {
				t.Fatalf("got field %q want %q; expected field containing %q, want containing %q", fe.Field, fe.Want, c.field, c.want)
			}
		})
	}
}

func TestDeviceModel(t *testing.T) {
	j := validJob(baseMeta())
	j.TaskGroups[0].Tasks[0].Resources.Devices[0].Name = "nvidia/gpu/Tesla V100-SXM2-16GB"
	s, err := Parse(j)
	if err != nil {
		t.Fatal(err)
	}
	if s.Device != "nvidia/gpu/Tesla V100-SXM2-16GB" || s.DeviceModel != "Tesla V100-SXM2-16GB" {
		t.Fatalf("device %q model %q", s.Device, s.DeviceModel)
	}
}

func TestIsManaged(t *testing.T) {
	cases := []struct {
		name string
		job  *api.Job
		want bool
	}{
		{"nil", nil, false},
		{"job meta", validJob(map[string]string{KeySteps: "x"}), true},
		{"unknown hadar key only", validJob(map[string]string{"hadar.foo": "1"}), true},
		{"no meta", validJob(nil), false},
		{"other meta", validJob(map[string]string{"owner": "ana", "hadar": "x", "Hadar.steps": "1"}), false},
		{"group meta only", func() *api.Job {
			j := validJob(nil)
			j.TaskGroups[0].Meta = map[string]string{KeySteps: "1"}
			return j
		}(), false},
		{"task meta only", func() *api.Job {
			j := validJob(nil)
			j.TaskGroups[0].Tasks[0].Meta = map[string]string{KeySteps: "1"}
			return j
		}(), false},
		{"parameterized template", func() *api.Job {
			j := validJob(baseMeta())
			j.ParameterizedJob = &api.ParameterizedJobConfig{MetaOptional: []string{KeySteps}}
			return j
		}(), false},
		{"its dispatched child", func() *api.Job {
			j := validJob(baseMeta())
			j.ParameterizedJob = &api.ParameterizedJobConfig{MetaOptional: []string{KeySteps}}
			j.ParentID, j.Dispatched = ptr("train"), true
			return j
		}(), true},
		{"periodic template", func() *api.Job {
			j := validJob(baseMeta())
			j.Periodic = &api.PeriodicConfig{Spec: ptr("@daily")}
			return j
		}(), false},
		{"its run", func() *api.Job {
			j := validJob(baseMeta())
			j.ParentID = ptr("nightly")
			return j
		}(), true},
	}
	for _, c := range cases {
		if got := IsManaged(c.job); got != c.want {
			t.Errorf("%s: IsManaged = %v, want %v", c.name, got, c.want)
		}
	}
	stubs := []struct {
		stub api.JobListStub
		want bool
	}{
		{api.JobListStub{Meta: baseMeta()}, true},
		{api.JobListStub{Meta: baseMeta(), ParameterizedJob: true}, false},
		{api.JobListStub{Meta: baseMeta(), Periodic: true}, false},
		{api.JobListStub{Meta: map[string]string{"owner": "ana"}}, false},
	}
	for _, c := range stubs {
		if got := IsManagedStub(&c.stub); got != c.want {
			t.Errorf("stub %+v: IsManagedStub = %v, want %v", c.stub, got, c.want)
		}
	}
}

func TestFindGates(t *testing.T) {
	j := validJob(baseMeta())
	j.Constrain(api.NewConstraint("${attr.kernel.name}", "=", "linux"))
	j.Constrain(GateConstraint())
	j.TaskGroups[0].Constrain(api.NewConstraint("${meta.rack}", "=", "r1"))
	j.TaskGroups[0].Constrain(GateConstraint())
	got := FindGates(j)
	want := []Gate{{Index: 0}, {Index: 2}, {Group: "workers", Index: 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FindGates = %v, want %v", got, want)
	}
	if got[2].String() != `group "workers" constraint 1` || got[0].String() != "job constraint 0" {
		t.Fatalf("String: %q %q", got[0], got[2])
	}
	if !HasGate(j) {
		t.Fatal("HasGate false")
	}
	j.Constraints, j.TaskGroups[0].Constraints = nil, nil
	if HasGate(j) || FindGates(nil) != nil {
		t.Fatal("gates found where none are")
	}
	// The gate a jobspec file writes: no operator.
	if !IsGate(&api.Constraint{LTarget: GateAttribute, RTarget: GateValue}) || IsGate(nil) {
		t.Fatal("IsGate")
	}
}

func TestKnownKeysIsACopy(t *testing.T) {
	k := KnownKeys()
	k[0] = "x"
	if KnownKeys()[0] != KeyModel {
		t.Fatal("KnownKeys shares its slice")
	}
}

// That GateHCL parses as the gate is checked against a real Nomad agent's
// parser in e2e (TestGateHCL): Nomad's own parser is not a dependency of
// this module.

// TestJobCarriesWidths: an elastic spec's widths reach the planner job
// (ScaleFactor the first), a rigid one's none.
func TestJobCarriesWidths(t *testing.T) {
	s, err := Parse(validJob(with(KeyWorkers, "2,4,8")))
	if err != nil {
		t.Fatal(err)
	}
	jb := s.Job("j", 0)
	if jb.ScaleFactor != 2 || !reflect.DeepEqual(jb.Widths, []int{2, 4, 8}) || !jb.Elastic() {
		t.Fatalf("elastic job: %+v", jb)
	}
	if err := jb.Validate(); err != nil {
		t.Fatal(err)
	}
	jb.Widths[0] = 3
	if s.Widths[0] != 2 {
		t.Fatal("Job shares the spec's widths")
	}
	r, err := Parse(validJob(with(KeyWorkers, "4")))
	if err != nil {
		t.Fatal(err)
	}
	if jb := r.Job("r", 0); jb.ScaleFactor != 4 || jb.Widths != nil || jb.Elastic() {
		t.Fatalf("rigid job: %+v", jb)
	}
}
