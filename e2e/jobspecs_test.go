package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/demo"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// jobspecsInventory declares two GPUs of each model the jobspecs name, so
// a four-worker job fits on the one node.
const jobspecsInventory = `
fingerprint_period = "2s"
gpu {
  id     = "v100-0"
  model  = "Tesla V100-SXM2-16GB"
  memory = "16GiB"
}
gpu {
  id     = "v100-1"
  model  = "Tesla V100-SXM2-16GB"
  memory = "16GiB"
}
gpu {
  id     = "p100-0"
  model  = "Tesla P100-PCIE-16GB"
  memory = "16GiB"
}
gpu {
  id     = "p100-1"
  model  = "Tesla P100-PCIE-16GB"
  memory = "16GiB"
}
gpu {
  id     = "k80-0"
  model  = "Tesla K80"
  memory = "12GiB"
}
gpu {
  id     = "k80-1"
  model  = "Tesla K80"
  memory = "12GiB"
}
`

// jobspecKind is what each file of jobspecs/ must be: its shape under the
// sidecar's contract (docs/jobspec.md), checked on the parsed job.
var jobspecKinds = map[string]func(t *testing.T, job *api.Job, spec *jobspec.Spec){
	"single-gpu.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 1)
		if s.Model == "" || s.Throughput != nil {
			t.Errorf("want a profile model and no declared throughput, got model %q throughput %v", s.Model, s.Throughput)
		}
		// Its emulated paces are the profile's figures for its model, so
		// what the planner believes is what the emulation does.
		wantProfilePaces(t, job, s.Model)
	},
	"forkable.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 1)
		if !s.Forkable {
			t.Error("want hadar.forkable")
		}
		wantProfilePaces(t, job, s.Model)
	},
	"gang.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 2)
		if !s.Gang {
			t.Error("want a gang")
		}
	},
	"network-sensitive.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 4)
		if s.Sensitivity <= 1 {
			t.Errorf("want a network sensitivity above 1, got %v", s.Sensitivity)
		}
	},
	"throughput.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 1)
		if len(s.Throughput) == 0 {
			t.Error("want a declared hadar.throughput")
		}
		info, err := demo.Describe(demo.Submission{ID: *job.ID, File: "throughput.nomad.hcl"}, job)
		if err != nil {
			t.Fatal(err)
		}
		for typ, v := range s.Throughput {
			if got := info.Paces[planner.GPUType(typ)]; got != v {
				t.Errorf("%s: emulated %v steps/s, declared %v", typ, got, v)
			}
		}
	},
	"stock-device.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantUnmanaged(t, job, s)
		var cs []string
		for _, d := range job.TaskGroups[0].Tasks[0].Resources.Devices {
			if d.Name != "nvidia/gpu" {
				t.Errorf("device %q: want Nomad's stock nvidia/gpu", d.Name)
			}
			for _, c := range d.Constraints {
				cs = append(cs, c.LTarget)
			}
		}
		if strings.Join(cs, ",") != "${device.model},${device.attr.memory}" {
			t.Errorf("device constraints on %v, want ${device.model} and ${device.attr.memory}", cs)
		}
	},
	"dispatch.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantUnmanaged(t, job, s)
		if job.ParameterizedJob == nil || strings.Join(job.ParameterizedJob.MetaRequired, ",") != "steps" {
			t.Errorf("want a parameterized job requiring meta steps, got %+v", job.ParameterizedJob)
		}
	},
	"train-emulated.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantUnmanaged(t, job, s)
	},
	"hadare-emulated.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantUnmanaged(t, job, s)
	},
	"pytorch-exec.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 2)
		if !s.Gang || len(s.Throughput) == 0 {
			t.Errorf("want a gang with a declared hadar.throughput, got gang %v throughput %v", s.Gang, s.Throughput)
		}
		wantPyTorch(t, job, "exec", "hadar_train.examples.ddp")
	},
	"pytorch-elastic.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 1)
		if !slices.Equal(s.Widths, []int{1, 2, 3, 4}) || !s.Gang {
			t.Errorf("want an elastic gang of widths 1-4, got widths %v gang %v", s.Widths, s.Gang)
		}
		wantPyTorch(t, job, "hadar-train", "hadar_train.examples.elastic")
	},
	"pytorch-hadar-train.nomad.hcl": func(t *testing.T, job *api.Job, s *jobspec.Spec) {
		wantManaged(t, s, 1)
		if !s.Forkable {
			t.Error("want hadar.forkable")
		}
		wantPyTorch(t, job, "hadar-train", "hadar_train.examples.hadare")
		if _, ok := job.TaskGroups[0].Tasks[0].Config["emulate"]; !ok {
			t.Error("want an emulate block (the GPU-less test machines keep its paces)")
		}
	},
}

// pythonVar is the value TestJobspecs gives the PyTorch jobspecs'
// variable "python", to see that the task runs it.
const pythonVar = "/opt/pytorch/bin/python3"

// wantPyTorch checks a PyTorch jobspec's task: the driver, the python
// variable as its command, and the library's example module it runs
// under the library's launcher (python -m hadar_train.run -m MODULE).
func wantPyTorch(t *testing.T, job *api.Job, driver, module string) {
	t.Helper()
	task := job.TaskGroups[0].Tasks[0]
	args, _ := task.Config["args"].([]any)
	if task.Driver != driver || len(args) < 4 || args[0] != "-m" || args[1] != "hadar_train.run" || args[2] != "-m" || args[3] != module {
		t.Errorf("task %s: driver %q, args %v; want %s running python -m hadar_train.run -m %s", task.Name, task.Driver, args, driver, module)
	}
}

func wantManaged(t *testing.T, s *jobspec.Spec, workers int) {
	t.Helper()
	if s == nil {
		t.Fatal("want a managed job (hadar.* meta and the gate)")
	}
	if s.Workers != workers {
		t.Errorf("workers: got %d, want %d", s.Workers, workers)
	}
	if s.Steps <= 0 {
		t.Errorf("steps: got %d", s.Steps)
	}
}

func wantUnmanaged(t *testing.T, job *api.Job, s *jobspec.Spec) {
	t.Helper()
	if s != nil || jobspec.IsManaged(job) {
		t.Fatal("want a job without hadar meta, which the sidecar leaves alone")
	}
}

// wantProfilePaces checks that a job's emulated steps/s on each GPU model
// are the throughput profile's figures for its hadar.model.
func wantProfilePaces(t *testing.T, job *api.Job, model string) {
	t.Helper()
	info, err := demo.Describe(demo.Submission{ID: *job.ID}, job)
	if err != nil {
		t.Fatal(err)
	}
	p := profile.Default()
	for typ, pace := range info.Paces {
		want, err := p.Throughput(model, 1, typ, false)
		if err != nil {
			t.Fatalf("profile of %q on %s: %v", model, typ, err)
		}
		if d := pace - want; d > 0.01 || d < -0.01 {
			t.Errorf("%s: emulated %v steps/s, the profile says %v for %q", typ, pace, want, model)
		}
	}
	if len(info.Paces) != 3 {
		t.Errorf("emulated paces for %d GPU types, want v100, p100 and k80", len(info.Paces))
	}
}

// TestJobspecs validates every file of jobspecs/: it parses through a real
// agent (/v1/jobs/parse) with its trainer variable declared and used, has
// the shape its comments promise under the sidecar's contract, and a real
// agent with hadar's plugins plans it: a managed job is held by the gate
// alone and places once ungated, a plain job places at once, a GPU
// constraint nothing meets is refused, and the parameterized job
// dispatches a child that runs to the end with the steps given.
func TestJobspecs(t *testing.T) {
	skipShort(t)
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "jobspecs", "*.nomad.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	sort.Strings(names)
	var want []string
	for n := range jobspecKinds {
		want = append(want, n)
	}
	sort.Strings(want)
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("jobspecs/ holds %v; this test knows %v: describe each new file's kind in jobspecKinds", names, want)
	}

	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	a := harness.StartAgent(t, harness.Options{Plugins: map[string]string{
		"hadar-gpu": jobspecsInventory,
		"hadar-train": fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"",
			harness.SharedDir(t), harness.SharedDir(t)),
	}})
	vars := fmt.Sprintf("trainer = %q\n", trainer)

	for _, name := range names {
		t.Run(strings.TrimSuffix(name, ".nomad.hcl"), func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(root, "jobspecs", name))
			if err != nil {
				t.Fatal(err)
			}
			// An unknown block or attribute fails the agent's parser; an
			// undeclared variable only fails the nomad CLI's (strict) one,
			// so check that the trainer given is the command of every task.
			fileVars, command := vars, trainer
			if strings.HasPrefix(name, "pytorch-") {
				// A PyTorch job's command is the Python interpreter.
				fileVars, command = fmt.Sprintf("python = %q\n", pythonVar), pythonVar
			}
			job, err := a.Client.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: string(src), Variables: fileVars, Canonicalize: true})
			if err != nil {
				t.Fatalf("the agent's parser: %v", err)
			}
			wantTrainer(t, job, command)
			var spec *jobspec.Spec
			if jobspec.IsManaged(job) {
				s, err := jobspec.Parse(job)
				if err != nil {
					t.Fatalf("the sidecar refuses it: %v", err)
				}
				spec = &s
			}
			jobspecKinds[name](t, job, spec)

			resp, _, err := a.Client.Jobs().Plan(job, true, nil)
			if err != nil {
				t.Fatalf("plan: %v", err)
			}
			switch {
			case job.ParameterizedJob != nil:
				// Nomad plans the template as a child would run: it fits.
				if len(resp.FailedTGAllocs) > 0 {
					t.Fatalf("a dispatched child would not place: %s", failedText(resp))
				}
				dispatch(t, a, job)
			case spec != nil:
				// The gate, and nothing else, holds it.
				wantGated(t, resp)
				own, err := demo.NomadOwn(job, 29500)
				if err != nil {
					t.Fatal(err)
				}
				resp, _, err := a.Client.Jobs().Plan(own, true, nil)
				if err != nil {
					t.Fatalf("plan without the gate: %v", err)
				}
				if len(resp.FailedTGAllocs) > 0 || placed(resp) != spec.Workers {
					t.Fatalf("without the gate: %d of %d workers placed, failed %v", placed(resp), spec.Workers, failedText(resp))
				}
			default:
				if len(resp.FailedTGAllocs) > 0 || placed(resp) == 0 {
					t.Fatalf("%d allocations placed, failed %v", placed(resp), failedText(resp))
				}
			}
		})
	}

	// A device constraint is enforced, not decoration: a GPU model the
	// node lacks leaves the stock-device job unplaced.
	t.Run("stock-device-absent-model", func(t *testing.T) {
		src, err := os.ReadFile(filepath.Join(root, "jobspecs", "stock-device.nomad.hcl"))
		if err != nil {
			t.Fatal(err)
		}
		job, err := a.Client.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: string(src), Variables: vars + "gpu_model = \"Tesla T4\"\n", Canonicalize: true})
		if err != nil {
			t.Fatal(err)
		}
		resp, _, err := a.Client.Jobs().Plan(job, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.FailedTGAllocs["train"] == nil || !strings.Contains(failedText(resp), "device") {
			t.Fatalf("a Tesla T4 job on a node without one: want a device failure, got %s", failedText(resp))
		}
	})
}

// wantTrainer checks that every task of job runs trainer: the jobspec
// declares the variable "trainer" and uses it, so `nomad job run -var
// trainer=...` (which refuses undeclared variables) works.
func wantTrainer(t *testing.T, job *api.Job, trainer string) {
	t.Helper()
	n := 0
	for _, g := range job.TaskGroups {
		for _, task := range g.Tasks {
			n++
			if got, _ := task.Config["command"].(string); got != trainer {
				t.Errorf("group %s task %s: command %q, want the trainer variable's value %q", *g.Name, task.Name, got, trainer)
			}
		}
	}
	if n == 0 {
		t.Error("the job has no task")
	}
}

// TestGateHCL: the block the sidecar's error messages tell authors to
// paste (jobspec.GateHCL) is valid HCL that Nomad reads as the gate.
func TestGateHCL(t *testing.T) {
	skipShort(t)
	src := "job \"j\" {\n  type = \"batch\"\n" + jobspec.GateHCL + "\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n"
	job, err := parser.Agent(t).Client.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: src})
	if err != nil {
		t.Fatalf("GateHCL does not parse: %v\n%s", err, src)
	}
	if len(job.Constraints) != 1 || !jobspec.IsGate(job.Constraints[0]) {
		t.Fatalf("GateHCL parses to %+v, not the gate", job.Constraints)
	}
}

// placed counts the allocations a plan wants to create (placed or, with
// FailedTGAllocs, not).
func placed(resp *api.JobPlanResponse) int {
	n := 0
	if resp.Annotations != nil {
		for _, u := range resp.Annotations.DesiredTGUpdates {
			n += int(u.Place)
		}
	}
	return n
}

func failedText(resp *api.JobPlanResponse) string {
	var out []string
	for g, m := range resp.FailedTGAllocs {
		out = append(out, fmt.Sprintf("%s: constraints %v, exhausted %v, class %v", g, m.ConstraintFiltered, m.DimensionExhausted, m.ClassFiltered))
	}
	sort.Strings(out)
	return "[" + strings.Join(out, "; ") + "]"
}

// wantGated checks that the plan of a managed job fails on every node by
// the gate's constraint and nothing else.
func wantGated(t *testing.T, resp *api.JobPlanResponse) {
	t.Helper()
	if len(resp.FailedTGAllocs) == 0 {
		t.Fatalf("a managed job placed without hadar: %d allocations", placed(resp))
	}
	for g, m := range resp.FailedTGAllocs {
		if len(m.DimensionExhausted) > 0 || m.NodesFiltered == 0 {
			t.Fatalf("group %s: want it filtered by the gate alone, got %s", g, failedText(resp))
		}
		for c := range m.ConstraintFiltered {
			if !strings.Contains(c, jobspec.GateAttribute) {
				t.Fatalf("group %s: filtered by %q besides the gate: %s", g, c, failedText(resp))
			}
		}
	}
}

// dispatch registers the parameterized job, checks that a dispatch
// without its required meta is refused, and runs one with steps = 30 to
// the end: the trainer reads the steps from the dispatch's meta.
func dispatch(t *testing.T, a *harness.Agent, job *api.Job) {
	t.Helper()
	if _, _, err := a.Client.Jobs().Register(job, nil); err != nil {
		t.Fatalf("register: %v", err)
	}
	if _, _, err := a.Client.Jobs().Dispatch(*job.ID, nil, nil, "", nil); err == nil {
		t.Fatal("a dispatch without meta steps was accepted")
	}
	d, _, err := a.Client.Jobs().Dispatch(*job.ID, map[string]string{"steps": "30"}, nil, "", nil)
	if err != nil {
		t.Fatalf("dispatch: %v", err)
	}
	var alloc *api.AllocationListStub
	err = harness.Eventually(t.Context(), 90*time.Second, 500*time.Millisecond, func() error {
		allocs, _, err := a.Client.Jobs().Allocations(d.DispatchedJobID, true, nil)
		if err != nil {
			return err
		}
		if len(allocs) != 1 {
			return fmt.Errorf("%d allocations of %s", len(allocs), d.DispatchedJobID)
		}
		alloc = allocs[0]
		switch alloc.ClientStatus {
		case api.AllocClientStatusComplete:
			return nil
		case api.AllocClientStatusFailed:
			return fmt.Errorf("allocation failed: %s", taskEvents(alloc.TaskStates))
		}
		return fmt.Errorf("allocation %s", alloc.ClientStatus)
	})
	if err != nil {
		t.Fatalf("dispatched child %s: %v", d.DispatchedJobID, err)
	}
	full, _, err := a.Client.Allocations().Info(alloc.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := waitProgress(t, a, full, 10*time.Second, func(p progress) bool { return p.StepsDone > 0 })
	if p.StepsDone != 30 {
		t.Fatalf("the dispatched child trained %d steps, want the 30 its meta gave", p.StepsDone)
	}
}
