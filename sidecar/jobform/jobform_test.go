package jobform

import (
	"encoding/json"
	"maps"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/confine"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

func submitted(t *testing.T) (*api.Job, jobspec.Spec) {
	t.Helper()
	j := api.NewBatchJob("resnet-a", "resnet-a", "global", 50)
	j.Meta = map[string]string{"hadar.model": "ResNet-18 (batch size 16)", "hadar.steps": "5000", "hadar.workers": "3"}
	j.Constrain(jobspec.GateConstraint())
	j.Constrain(api.NewConstraint("${attr.kernel.name}", "=", "linux"))
	task := api.NewTask("train", "hadar-train")
	task.Env = map[string]string{"LR": "0.1"}
	one := uint64(1)
	task.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: &one,
		Constraints: []*api.Constraint{api.NewConstraint("${device.attr.memory}", ">=", "8 GiB")}}}})
	j.AddTaskGroup(api.NewTaskGroup("train", 1).AddTask(task))
	spec, err := jobspec.Parse(j)
	if err != nil {
		t.Fatal(err)
	}
	return j, spec
}

func group(j *api.Job, name string) *api.TaskGroup {
	for _, g := range j.TaskGroups {
		if *g.Name == name {
			return g
		}
	}
	return nil
}

func asJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	unit0 = Unit{ID: 0, Port: 29500, Workers: []Worker{
		{Node: "n1", Type: "v100", Models: []string{"Tesla V100-SXM2-16GB"}, Addr: "10.0.0.1"},
		{Node: "n1", Type: "v100", Models: []string{"Tesla V100-SXM2-16GB"}, Addr: "10.0.0.1"},
		{Node: "n2", Type: "p100", Models: []string{"Tesla P100", "Tesla P100-PCIE"}, Addr: "10.0.0.1"},
	}}
	unit1 = Unit{ID: 1, Port: 29501, Workers: []Worker{
		{Node: "n3", Type: "k80", Models: []string{"Tesla K80"}, Addr: "10.0.0.3"},
	}}
)

func TestPlacedForm(t *testing.T) {
	j, spec := submitted(t)
	before := asJSON(t, j)
	placed, err := Placed(j, spec, []Unit{unit0})
	if err != nil {
		t.Fatal(err)
	}
	if asJSON(t, j) != before {
		t.Fatal("Placed changed its input job")
	}
	if jobspec.HasGate(placed) && !strings.Contains(asJSON(t, group(placed, "train").Constraints), jobspec.GateValue) {
		t.Fatal("the gate is not on the template group")
	}
	for _, c := range placed.Constraints {
		if jobspec.IsGate(c) {
			t.Fatal("the job-level gate is still there: it would hold the generated groups")
		}
	}
	if *group(placed, "train").Count != 0 {
		t.Fatalf("template count %d, want 0", *group(placed, "train").Count)
	}
	if len(placed.TaskGroups) != 4 {
		t.Fatalf("%d groups, want the template and 3 workers", len(placed.TaskGroups))
	}
	// Worker 2: second node, first worker there.
	g := group(placed, "train-hadar-u0-w2")
	if g == nil || *g.Count != 1 {
		t.Fatalf("worker group missing or count != 1: %+v", g)
	}
	var node *api.Constraint
	for _, c := range g.Constraints {
		if jobspec.IsGate(c) {
			t.Fatal("a worker group carries the gate")
		}
		if c.LTarget == NodeAttribute {
			node = c
		}
	}
	if node == nil || node.RTarget != "n2" {
		t.Fatalf("node constraint %+v, want n2", node)
	}
	// The contract's worker environment (its fixture is this worker), the
	// unit's hadar variables, and the template's own. On hadar-train the
	// driver sets the paths: the sidecar does not.
	env := g.Tasks[0].Env
	want := workerEnvFixture(t)
	maps.Copy(want, map[string]string{"LR": "0.1", contract.EnvUnit: "0", contract.EnvTemplate: "train", contract.EnvGPUType: "p100",
		contract.EnvTotalSteps: "5000", contract.EnvManagedBy: "hadar-sidecar"})
	if !reflect.DeepEqual(env, want) {
		t.Fatalf("env\n got %v\nwant %v", env, want)
	}
	// Two workers on n1: each its own process on its own GPU, LOCAL_RANK 0.
	for _, name := range []string{"train-hadar-u0-w0", "train-hadar-u0-w1"} {
		e := group(placed, name).Tasks[0].Env
		if e[contract.EnvLocalRank] != "0" || e[contract.EnvLocalWorldSize] != "1" || e[contract.EnvNodeRank] != "0" || e[contract.EnvGroupRank] != e[contract.EnvRank] {
			t.Fatalf("%s: LOCAL_RANK %s LOCAL_WORLD_SIZE %s NODE_RANK %s GROUP_RANK %s RANK %s", name, e[contract.EnvLocalRank], e[contract.EnvLocalWorldSize],
				e[contract.EnvNodeRank], e[contract.EnvGroupRank], e[contract.EnvRank])
		}
	}
	task := g.Tasks[0]
	if task.KillSignal != DefaultKillSignal || *task.KillTimeout != DefaultKillTimeout || len(g.Volumes) != 0 || len(task.VolumeMounts) != 0 {
		t.Fatalf("kill %q after %v, volumes %v mounts %v: want SIGTERM, 30s and no storage on hadar-train", task.KillSignal, *task.KillTimeout, g.Volumes, task.VolumeMounts)
	}
	dev := g.Tasks[0].Resources.Devices[0]
	if len(dev.Constraints) != 2 || dev.Constraints[1].LTarget != ModelAttribute || dev.Constraints[1].Operand != "set_contains_any" ||
		dev.Constraints[1].RTarget != "Tesla P100,Tesla P100-PCIE" || dev.Constraints[0].LTarget != "${device.attr.memory}" {
		t.Fatalf("device constraints %s", asJSON(t, dev.Constraints))
	}
	// Rank 0 holds the rendezvous port; rank 1 does not.
	r0 := group(placed, "train-hadar-u0-w0")
	if len(r0.Networks) != 1 || r0.Networks[0].ReservedPorts[0].Value != 29500 || r0.Tasks[0].Env[contract.EnvGPUModel] != "Tesla V100-SXM2-16GB" {
		t.Fatalf("rank 0: networks %s, env %v", asJSON(t, r0.Networks), r0.Tasks[0].Env)
	}
	if len(group(placed, "train-hadar-u0-w1").Networks) != 0 {
		t.Fatal("rank 1 reserves a port")
	}
	// The template's env is untouched.
	if len(group(placed, "train").Tasks[0].Env) != 1 {
		t.Fatal("the template's env changed")
	}
}

func TestUnitsRoundTrip(t *testing.T) {
	j, spec := submitted(t)
	placed, err := Placed(j, spec, []Unit{unit1, unit0})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Units(placed, spec)
	if err != nil {
		t.Fatal(err)
	}
	want := []Unit{unit0, unit1}
	// Read back, Addr is the unit's rendezvous address.
	want[0].Workers = append([]Worker(nil), unit0.Workers...)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back\n got %+v\nwant %+v", got, want)
	}
	if p := got[0].Planner(); !reflect.DeepEqual(p, planner.Unit{Slots: []planner.Slot{{Node: "n1", Type: "v100", Count: 2}, {Node: "n2", Type: "p100", Count: 1}}}) {
		t.Fatalf("planner unit %+v", p)
	}
}

// A fork adds a unit and leaves every group of the unit already running
// exactly as it was: Nomad then ignores it and its allocations go on.
func TestForkKeepsRunningGroupsIdentical(t *testing.T) {
	j, spec := submitted(t)
	one, err := Placed(j, spec, []Unit{unit0})
	if err != nil {
		t.Fatal(err)
	}
	two, err := Placed(one, spec, []Unit{unit0, unit1})
	if err != nil {
		t.Fatal(err)
	}
	for r := range 3 {
		name := groupname.Format("train", 0, r)
		if asJSON(t, group(one, name)) != asJSON(t, group(two, name)) {
			t.Fatalf("group %s changed on fork", name)
		}
	}
	if group(two, "train-hadar-u1-w0") == nil {
		t.Fatal("the new unit's group is missing")
	}
	// Unfork: back to unit 0 only.
	back, err := Placed(two, spec, []Unit{unit0})
	if err != nil {
		t.Fatal(err)
	}
	if asJSON(t, back) != asJSON(t, one) {
		t.Fatal("unforking did not give back the one-unit form")
	}
	// A unit moved to other GPUs is rewritten.
	moved := unit1
	moved.Workers = []Worker{{Node: "n4", Type: "k80", Models: []string{"Tesla K80"}, Addr: "10.0.0.4"}}
	m, err := Placed(two, spec, []Unit{unit0, moved})
	if err != nil {
		t.Fatal(err)
	}
	if asJSON(t, group(m, "train-hadar-u1-w0")) == asJSON(t, group(two, "train-hadar-u1-w0")) {
		t.Fatal("a moved unit's group was kept")
	}
}

func TestHeldForm(t *testing.T) {
	j, spec := submitted(t)
	placed, err := Placed(j, spec, []Unit{unit0, unit1})
	if err != nil {
		t.Fatal(err)
	}
	held, err := Held(placed, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(held.TaskGroups) != 1 || *held.TaskGroups[0].Count != 1 || !jobspec.HasGate(held) {
		t.Fatalf("held form: %d groups, count %d, gated %v", len(held.TaskGroups), *held.TaskGroups[0].Count, jobspec.HasGate(held))
	}
	if us, _ := Units(held, spec); len(us) != 0 {
		t.Fatalf("held form still has units %+v", us)
	}
	// The held form parses as a valid managed job again.
	if _, err := jobspec.Parse(held); err != nil {
		t.Fatalf("held form does not parse: %v", err)
	}
}

func TestUnitsRefusesHandEdits(t *testing.T) {
	j, spec := submitted(t)
	placed, _ := Placed(j, spec, []Unit{unit0})
	var groups []*api.TaskGroup
	for _, g := range placed.TaskGroups {
		if *g.Name != "train-hadar-u0-w1" {
			groups = append(groups, g)
		}
	}
	placed.TaskGroups = groups
	if _, err := Units(placed, spec); err == nil || !strings.Contains(err.Error(), "rank 1 is missing") {
		t.Fatalf("err = %v, want a missing rank", err)
	}
	placed, _ = Placed(j, spec, []Unit{unit0})
	group(placed, "train-hadar-u0-w0").Constraints = nil
	if _, err := Units(placed, spec); err == nil || !strings.Contains(err.Error(), NodeAttribute) {
		t.Fatalf("err = %v, want a missing node constraint", err)
	}
}

// workerEnvFixture is contract/testdata/worker-env.json's environment (the
// defaults included): worker 2 of unit0 below.
func workerEnvFixture(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../contract/testdata/worker-env.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Env, Defaults map[string]string
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	maps.Copy(fx.Env, fx.Defaults)
	return fx.Env
}

// jobOn is submitted's job with its task on driver, forkable or not.
func jobOn(t *testing.T, driver string, forkable bool) (*api.Job, jobspec.Spec) {
	t.Helper()
	j, _ := submitted(t)
	*j.ID = "digits"
	j.Namespace = new("research")
	j.Meta["hadar.workers"] = "1"
	if forkable {
		j.Meta["hadar.forkable"] = "true"
	}
	j.TaskGroups[0].Tasks[0].Driver = driver
	spec, err := jobspec.Parse(j)
	if err != nil {
		t.Fatal(err)
	}
	return j, spec
}

// On Nomad's own drivers the sidecar writes what hadar-train would set:
// the job's ID, the progress file where it reads it, the checkpoint and
// merge directories on shared storage (host volumes mounted, or on
// raw_exec the node's own paths), keyed as hadar-train keys them.
func TestNomadDriversGetTheContract(t *testing.T) {
	u := Unit{ID: 7, Port: 29600, Workers: []Worker{{Node: "n3", Type: "k80", Models: []string{"Tesla K80"}, Addr: "10.0.0.3"}}}
	for _, tc := range []struct {
		driver   string
		forkable bool
		env      map[string]string
		mounts   map[string]string // destination -> volume
	}{
		{"exec", false, map[string]string{
			contract.EnvCheckpointDir: "/hadar/checkpoints/research/digits/train/train",
		}, map[string]string{"/hadar/checkpoints": "hadar-checkpoints"}},
		{"docker", true, map[string]string{
			contract.EnvCheckpointDir: "/hadar/checkpoints/research/digits/train/train/copy-7",
			contract.EnvMergeDir:      "/hadar/merge/research/digits", contract.EnvCopyIndex: "7",
		}, map[string]string{"/hadar/checkpoints": "hadar-checkpoints", "/hadar/merge": "hadar-merge"}},
		{"raw_exec", true, map[string]string{
			contract.EnvCheckpointDir: "${meta.hadar.checkpoint_root}/research/digits/train/train/copy-7",
			contract.EnvMergeDir:      "${meta.hadar.merge_root}/research/digits", contract.EnvCopyIndex: "7",
		}, map[string]string{}},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			j, spec := jobOn(t, tc.driver, tc.forkable)
			placed, err := Placed(j, spec, []Unit{u})
			if err != nil {
				t.Fatal(err)
			}
			g := group(placed, "train-hadar-u7-w0")
			task := g.Tasks[0]
			maps.Copy(tc.env, map[string]string{contract.EnvJobID: "digits", contract.EnvProgressFile: "${NOMAD_TASK_DIR}/hadar-progress.json"})
			for k, v := range tc.env {
				if task.Env[k] != v {
					t.Errorf("env %s = %q, want %q", k, task.Env[k], v)
				}
			}
			if !tc.forkable && (task.Env[contract.EnvMergeDir] != "" || task.Env[contract.EnvCopyIndex] != "") {
				t.Errorf("a job that is not forkable got merge env %v", task.Env)
			}
			mounts := map[string]string{}
			for _, m := range task.VolumeMounts {
				mounts[*m.Destination] = *m.Volume
				if *m.ReadOnly {
					t.Errorf("mount %s is read-only", *m.Destination)
				}
				if v := g.Volumes[*m.Volume]; v == nil || v.Type != "host" || v.Source != *m.Volume {
					t.Errorf("mount %s: group volume %+v, want host volume %s", *m.Destination, v, *m.Volume)
				}
			}
			if !reflect.DeepEqual(mounts, tc.mounts) || len(g.Volumes) != len(tc.mounts) {
				t.Errorf("mounts %v, volumes %v; want %v", mounts, g.Volumes, tc.mounts)
			}
			if task.KillSignal != "SIGTERM" || *task.KillTimeout != 30*time.Second {
				t.Errorf("kill %q after %v", task.KillSignal, *task.KillTimeout)
			}
			// The template is left as it was.
			tmpl := group(placed, "train")
			if len(tmpl.Volumes) != 0 || tmpl.Tasks[0].Env[contract.EnvCheckpointDir] != "" || tmpl.Tasks[0].KillSignal != "" {
				t.Errorf("the template changed: %s", asJSON(t, tmpl))
			}
		})
	}
}

// The operator's options, and what the template already says, win.
func TestStorageOptionsAndTemplateChoices(t *testing.T) {
	j, spec := jobOn(t, "exec", true)
	task := j.TaskGroups[0].Tasks[0]
	long, dest, vol := 60*time.Second, "/hadar/checkpoints", "team-ckpt"
	task.KillTimeout, task.KillSignal = &long, "SIGUSR1"
	task.VolumeMounts = []*api.VolumeMount{{Volume: &vol, Destination: &dest}}
	j.TaskGroups[0].Volumes = map[string]*api.VolumeRequest{"team-ckpt": {Name: "team-ckpt", Type: "host", Source: "team-ckpt"}}
	task.Env["NCCL_ASYNC_ERROR_HANDLING"] = "0"
	u := Unit{ID: 2, Port: 29601, Workers: []Worker{{Node: "n3", Type: "k80", Models: []string{"Tesla K80"}, Addr: "10.0.0.3"}}}
	placed, err := PlacedWith(j, spec, []Unit{u}, Options{MountDir: "/hadar", MergeVolume: "nfs-merge", KillTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g := group(placed, "train-hadar-u2-w0")
	pt := g.Tasks[0]
	if pt.KillSignal != "SIGUSR1" || *pt.KillTimeout != long {
		t.Errorf("kill %q after %v: the template's signal and longer timeout stand", pt.KillSignal, *pt.KillTimeout)
	}
	if pt.Env["NCCL_ASYNC_ERROR_HANDLING"] != "0" {
		t.Errorf("the task's own NCCL_ASYNC_ERROR_HANDLING was overwritten")
	}
	// The template mounts its own volume at the checkpoint mount point:
	// that one is used; the merge volume is the operator's.
	if len(pt.VolumeMounts) != 2 || *pt.VolumeMounts[0].Volume != "team-ckpt" || *pt.VolumeMounts[1].Volume != "hadar-merge" ||
		g.Volumes["hadar-merge"].Source != "nfs-merge" || g.Volumes[checkpointVolumeName] != nil {
		t.Errorf("mounts %s, volumes %s", asJSON(t, pt.VolumeMounts), asJSON(t, g.Volumes))
	}
}

// Without shared storage (a sidecar with no storage block) a task on
// Nomad's own drivers asks for no host volume a node may lack: its
// checkpoints go to its allocation's data directory.
func TestWithoutSharedStorage(t *testing.T) {
	for _, driver := range []string{"exec", "raw_exec", "docker"} {
		j, spec := jobOn(t, driver, true)
		u := Unit{ID: 1, Port: 29601, Workers: []Worker{{Node: "n3", Type: "k80", Models: []string{"Tesla K80"}, Addr: "10.0.0.3"}}}
		placed, err := PlacedWith(j, spec, []Unit{u}, Options{NoSharedStorage: true})
		if err != nil {
			t.Fatal(err)
		}
		g := group(placed, "train-hadar-u1-w0")
		pt := g.Tasks[0]
		if len(g.Volumes) != 0 || len(pt.VolumeMounts) != 0 {
			t.Errorf("%s: volumes %s, mounts %s: want none", driver, asJSON(t, g.Volumes), asJSON(t, pt.VolumeMounts))
		}
		if ck := pt.Env[contract.EnvCheckpointDir]; !strings.HasPrefix(ck, "${NOMAD_ALLOC_DIR}/data/checkpoints/") {
			t.Errorf("%s: checkpoint dir %q: want it in the allocation", driver, ck)
		}
		if pt.KillSignal != DefaultKillSignal || *pt.KillTimeout != DefaultKillTimeout {
			t.Errorf("%s: kill %q after %v: still the time to checkpoint", driver, pt.KillSignal, *pt.KillTimeout)
		}
	}
}

// The storage layout's path elements are hadar-train's (confine.Element),
// with "$" kept out of Nomad's interpolation.
func TestPathElementsAreTheDrivers(t *testing.T) {
	for _, name := range []string{"digits", "a/b", "..", ".hidden", "50%", "x-y_z.1"} {
		want, err := confine.Element(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := element(name); got != want {
			t.Errorf("%q: %q, the driver's %q", name, got, want)
		}
	}
	if got := element("${attr.x}"); strings.Contains(got, "$") {
		t.Errorf("%q keeps a $", got)
	}
}

// TestWorkersCarryTheJobsRun: every worker gets the Nomad job's create
// index as HADAR_JOB_RUN, which a purged job registered again gets anew:
// the driver starts a new run fresh from it (issue 33 item 7).
func TestWorkersCarryTheJobsRun(t *testing.T) {
	j, spec := submitted(t)
	idx := uint64(4242)
	j.CreateIndex = &idx
	placed, err := Placed(j, spec, []Unit{unit0})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range placed.TaskGroups {
		if _, gen := groupname.Parse(*g.Name); gen && g.Tasks[0].Env[contract.EnvJobRun] != "4242" {
			t.Fatalf("%s: %s = %q, want the job's create index", *g.Name, contract.EnvJobRun, g.Tasks[0].Env[contract.EnvJobRun])
		}
	}
}

// TestElasticWorkersGetTheirWidths: every worker of an elastic job gets
// its widths (hadar.workers) as HADAR_WIDTHS, ascending and
// comma-separated, so that its script need not repeat them; a rigid
// job's workers do not get it.
func TestElasticWorkersGetTheirWidths(t *testing.T) {
	for _, tc := range []struct{ workers, want string }{
		{"1-4", "1,2,3,4"}, {"2,4,8", "2,4,8"}, {"3", ""},
	} {
		j, _ := submitted(t)
		j.Meta["hadar.workers"] = tc.workers
		spec, err := jobspec.Parse(j)
		if err != nil {
			t.Fatal(err)
		}
		placed, err := Placed(j, spec, []Unit{unit0, unit1})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, g := range placed.TaskGroups {
			if _, gen := groupname.Parse(*g.Name); !gen {
				if _, ok := g.Tasks[0].Env[contract.EnvWidths]; ok {
					t.Errorf("hadar.workers %q: the template %s has %s", tc.workers, *g.Name, contract.EnvWidths)
				}
				continue
			}
			n++
			got, ok := g.Tasks[0].Env[contract.EnvWidths]
			if tc.want == "" && ok {
				t.Errorf("hadar.workers %q (rigid): %s has %s = %q, want none", tc.workers, *g.Name, contract.EnvWidths, got)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("hadar.workers %q: %s has %s = %q, want %q", tc.workers, *g.Name, contract.EnvWidths, got, tc.want)
			}
		}
		if n != len(unit0.Workers)+len(unit1.Workers) {
			t.Errorf("hadar.workers %q: %d workers placed, want %d", tc.workers, n, len(unit0.Workers)+len(unit1.Workers))
		}
	}
}
