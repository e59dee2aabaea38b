package demo

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// Submission is one job of a workload: a file of jobspecs/ with its HCL
// variables, submitted At after the run starts.
type Submission struct {
	ID   string
	File string
	At   time.Duration
	// Vars are HCL variable values as HCL expressions ("600", `"A3C"`),
	// besides trainer, which the demo always sets.
	Vars map[string]string
	// Kind says what the job shows, for people.
	Kind string
}

// Workload is a named list of submissions.
type Workload struct {
	Name string
	Jobs []Submission
}

// single is a single-GPU job of the profile's model m: its emulated paces
// are the profile's figures, so the planner's belief and the emulation
// agree.
func single(id, m string, steps int, at time.Duration) Submission {
	return Submission{ID: id, File: "single-gpu.nomad.hcl", At: at, Kind: "1 GPU",
		Vars: map[string]string{"steps": strconv.Itoa(steps), "model": strconv.Quote(m), "paces": pacesHCL(m, 1)}}
}

// Workloads are the demo's workloads: "full" for a person (a few minutes
// of jobs, with forks and preemptions), "short" for the tests.
var Workloads = map[string]Workload{
	"full": {Name: "full", Jobs: []Submission{
		{ID: "plain", File: "stock-device.nomad.hcl", At: 0, Kind: "plain Nomad", Vars: map[string]string{"steps": "1500"}},
		{ID: "fork", File: "forkable.nomad.hcl", At: 0, Kind: "forkable", Vars: map[string]string{"steps": "2400"}},
		single("rec", "Recommendation (batch size 1024)", 2400, 0),
		single("resnet50", "ResNet-50 (batch size 16)", 900, 15*time.Second),
		{ID: "net4", File: "network-sensitive.nomad.hcl", At: 30 * time.Second, Kind: "4 workers, sensitive", Vars: map[string]string{"steps": "12000"}},
		{ID: "lm2", File: "gang.nomad.hcl", At: 45 * time.Second, Kind: "gang of 2", Vars: map[string]string{"steps": "8000"}},
		{ID: "custom", File: "throughput.nomad.hcl", At: 60 * time.Second, Kind: "own throughput", Vars: map[string]string{"steps": "2400"}},
		single("a3c", "A3C", 500, 60*time.Second),
	}},
	"short": {Name: "short", Jobs: []Submission{
		{ID: "plain", File: "stock-device.nomad.hcl", At: 0, Kind: "plain Nomad", Vars: map[string]string{"steps": "300"}},
		{ID: "fork", File: "forkable.nomad.hcl", At: 0, Kind: "forkable", Vars: map[string]string{"steps": "300"}},
		single("rec", "Recommendation (batch size 1024)", 600, 5*time.Second),
	}},
}

// pacesHCL is the emulate steps_per_sec map of a job of model m at sf
// workers, from the embedded profile: device model -> steps/s.
func pacesHCL(m string, sf int) string {
	p := profile.Default()
	var b strings.Builder
	b.WriteString("{\n")
	for _, model := range []string{V100, P100, K80} {
		v, err := p.Throughput(m, sf, TypeOf(model), false)
		if err != nil || v <= 0 {
			continue
		}
		fmt.Fprintf(&b, "  %q = %s\n", model, strconv.FormatFloat(v, 'f', -1, 64))
	}
	b.WriteString("}")
	return b.String()
}

// varsFile renders the HCL variables file of a submission.
func (s Submission) varsFile(trainer string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "trainer = %q\n", trainer)
	for _, k := range sortedKeys(s.Vars) {
		fmt.Fprintf(&b, "%s = %s\n", k, s.Vars[k])
	}
	return b.String()
}

// Parse reads the submission's jobspec from dir and has Nomad parse it
// (HCL2, with its variables), then gives the job the submission's ID.
func (s Submission) Parse(c *api.Client, dir, trainer string) (*api.Job, error) {
	src, err := os.ReadFile(filepath.Join(dir, s.File))
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", s.ID, err)
	}
	job, err := c.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: string(src), Variables: s.varsFile(trainer), Canonicalize: true})
	if err != nil {
		return nil, fmt.Errorf("job %s: parse %s: %w", s.ID, s.File, err)
	}
	job.ID, job.Name = &s.ID, &s.ID
	return job, nil
}

// NomadOwn turns a managed job into what a person would submit to stock
// Nomad for the same training: no hadar meta, no gate, the template group
// run with count = workers (one GPU each, wherever Nomad's own placement
// puts them). A distributed job's workers get torchrun's variables from
// Nomad's interpolation: RANK from the allocation index, rank 0's address
// and the job's own port, and GROUP_RANK from the node's meta node_index
// (every loopback client has the same host name, and the trainer tells
// nodes apart by it). A job without hadar meta is returned unchanged.
func NomadOwn(job *api.Job, masterPort int) (*api.Job, error) {
	if !jobspec.IsManaged(job) {
		return job, nil
	}
	spec, err := jobspec.Parse(job)
	if err != nil {
		return nil, fmt.Errorf("nomad's own placement: %w", err)
	}
	out := *job
	out.Meta = map[string]string{}
	for k, v := range job.Meta {
		if !strings.HasPrefix(k, "hadar.") {
			out.Meta[k] = v
		}
	}
	out.Constraints = withoutGate(job.Constraints)
	out.TaskGroups = nil
	for _, g := range job.TaskGroups {
		ng := *g
		ng.Constraints = withoutGate(g.Constraints)
		if *g.Name == spec.Group {
			n := spec.Workers
			ng.Count = &n
			if n > 1 {
				ng.Tasks = nil
				for _, t := range g.Tasks {
					nt := *t
					if t.Name == spec.Task {
						nt.Env = map[string]string{}
						for k, v := range t.Env {
							nt.Env[k] = v
						}
						nt.Env["RANK"] = "${NOMAD_ALLOC_INDEX}"
						nt.Env["WORLD_SIZE"] = strconv.Itoa(n)
						nt.Env["MASTER_ADDR"] = "127.0.0.1"
						nt.Env["MASTER_PORT"] = strconv.Itoa(masterPort)
						nt.Env["GROUP_RANK"] = "${meta.node_index}"
					}
					ng.Tasks = append(ng.Tasks, &nt)
				}
			}
		}
		out.TaskGroups = append(out.TaskGroups, &ng)
	}
	return &out, nil
}

func withoutGate(cs []*api.Constraint) []*api.Constraint {
	var out []*api.Constraint
	for _, c := range cs {
		if c.LTarget != jobspec.GateAttribute {
			out = append(out, c)
		}
	}
	return out
}

// JobInfo is what the demo knows of one job of the workload, parsed from
// its jobspec: what the sidecar reads from its meta, or, for a job
// without hadar meta, its GPU count and the paces its emulate block keeps.
type JobInfo struct {
	Submission
	Managed bool
	Spec    jobspec.Spec // when Managed
	// Paces are the emulated steps/s per planner type (the job's own
	// figures at its width); Spread those over several nodes (empty: as
	// Paces).
	Paces, Spread map[planner.GPUType]float64
	// Pinned is the one GPU type an unmanaged job asks for ("" for any).
	Pinned planner.GPUType
	Steps  float64
	GPUs   int
}

// Describe parses what the demo needs of a job from its Nomad form.
func Describe(s Submission, job *api.Job) (JobInfo, error) {
	ji := JobInfo{Submission: s, Managed: jobspec.IsManaged(job), GPUs: 1}
	if ji.Managed {
		spec, err := jobspec.Parse(job)
		if err != nil {
			return ji, fmt.Errorf("job %s: %w", s.ID, err)
		}
		ji.Spec, ji.Steps, ji.GPUs = spec, float64(spec.Steps), spec.Workers
	}
	for _, g := range job.TaskGroups {
		for _, t := range g.Tasks {
			em, ok := t.Config["emulate"]
			if !ok {
				continue
			}
			ji.Paces, ji.Spread = emulatePaces(em)
			if ji.Steps == 0 {
				ji.Steps = number(t.Config["total_steps"])
			}
			if t.Resources != nil {
				for _, d := range t.Resources.Devices {
					for _, c := range d.Constraints {
						if c.LTarget == "${device.model}" && (c.Operand == "=" || c.Operand == "") {
							ji.Pinned = TypeOf(c.RTarget)
						}
					}
				}
			}
		}
	}
	if len(ji.Paces) == 0 {
		return ji, fmt.Errorf("job %s (%s): no emulate block with steps_per_sec: the demo runs emulated jobs only", s.ID, s.File)
	}
	if ji.Steps <= 0 {
		return ji, fmt.Errorf("job %s (%s): no steps (hadar.steps or total_steps)", s.ID, s.File)
	}
	return ji, nil
}

// emulatePaces reads the emulate block of a task config as Nomad's API
// returns it (blocks are lists of maps).
func emulatePaces(v any) (paces, spread map[planner.GPUType]float64) {
	paces, spread = map[planner.GPUType]float64{}, map[planner.GPUType]float64{}
	for _, block := range asMaps(v) {
		for key, dst := range map[string]map[planner.GPUType]float64{"steps_per_sec": paces, "spread_steps_per_sec": spread} {
			for _, m := range asMaps(block[key]) {
				for model, x := range m {
					if t := TypeOf(model); t != "" {
						dst[t] = number(x)
					}
				}
			}
		}
	}
	return paces, spread
}

func asMaps(v any) []map[string]any {
	switch x := v.(type) {
	case map[string]any:
		return []map[string]any{x}
	case []any:
		var out []map[string]any
		for _, e := range x {
			out = append(out, asMaps(e)...)
		}
		return out
	case []map[string]any:
		return x
	}
	return nil
}

func number(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return 0
}

// byArrival sorts submissions by submit time, then ID.
func byArrival(subs []Submission) []Submission {
	out := append([]Submission(nil), subs...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].At != out[j].At {
			return out[i].At < out[j].At
		}
		return out[i].ID < out[j].ID
	})
	return out
}
