package feasible

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// TestAgreesWithNomad: Nomad is the reference. On a real agent (two
// declared V100s, node meta, hadar-train), each job is planned by Nomad's
// own scheduler (the plan API: a dry run that places nothing) and by
// Evaluate on the view the watcher lists; both must find the job
// placeable, or not, alike, and name the same constraint when Nomad names
// one.
func TestAgreesWithNomad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Nomad agent; skipped with -short")
	}
	gpus := "fingerprint_period = \"1s\"\n"
	for i := range 2 {
		gpus += fmt.Sprintf("gpu {\n  id = \"g%d\"\n  model = %q\n  memory = \"16GiB\"\n  healthy = true\n}\n", i, v100)
	}
	a := harness.StartAgent(t, harness.Options{
		Plugins: map[string]string{"hadar-gpu": gpus, "hadar-train": fmt.Sprintf("checkpoint_root = %q", harness.SharedDir(t))},
		Meta:    map[string]string{"rack": "r1", "features": "ib,nvlink"},
	})
	ctx := context.Background()
	snap, err := watch.List(ctx, a.Client, watch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Nodes) != 1 {
		t.Fatalf("%d nodes", len(snap.Nodes))
	}
	for _, n := range snap.Nodes {
		mem := n.GPUs[0].Typed["memory"]
		if n.Resources.CPU <= 0 || n.Resources.MemoryMB <= 0 || n.Cores <= 0 || !n.Drivers["hadar-train"] ||
			n.Attributes["kernel.name"] != "linux" || mem != (watch.Attribute{Kind: watch.AttrInt, Int: 16384, Unit: "MiB"}) {
			t.Fatalf("node as watched: resources %+v, cores %d, drivers %v, kernel %q, GPU memory %+v",
				n.Resources, n.Cores, n.Drivers, n.Attributes["kernel.name"], mem)
		}
	}

	con := func(l, op, r string) *api.Constraint { return &api.Constraint{LTarget: l, Operand: op, RTarget: r} }
	devCon := func(c *api.Constraint) func(*api.Job) {
		return func(j *api.Job) {
			d := gpuTask(j).Resources.Devices[0]
			d.Constraints = append(d.Constraints, c)
		}
	}
	for _, c := range []struct {
		name   string
		device string
		edit   func(*api.Job)
		want   bool
	}{
		{"plain", "nvidia/gpu", nil, true},
		{"kernel", "nvidia/gpu", func(j *api.Job) { j.Constrain(con("${attr.kernel.name}", "=", "windows")) }, false},
		{"version", "nvidia/gpu", func(j *api.Job) { j.Constrain(con("${attr.nomad.version}", "version", ">= 1.11")) }, true},
		{"semver", "nvidia/gpu", func(j *api.Job) { j.Constrain(con("${attr.nomad.version}", "semver", "< 1.0.0")) }, false},
		{"numeric order", "nvidia/gpu", func(j *api.Job) { j.Constrain(con("${attr.cpu.numcores}", ">", "10000")) }, false},
		{"regexp on meta", "nvidia/gpu", func(j *api.Job) { group(j).Constrain(con("${meta.rack}", "regexp", "^r[0-9]$")) }, true},
		{"set_contains", "nvidia/gpu", func(j *api.Job) { group(j).Constrain(con("${meta.features}", "set_contains", "nvlink,ib")) }, true},
		{"set_contains_any", "nvidia/gpu", func(j *api.Job) { group(j).Constrain(con("${meta.features}", "set_contains_any", "roce,x")) }, false},
		{"!= on a missing key", "nvidia/gpu", func(j *api.Job) { group(j).Constrain(con("${meta.broken}", "!=", "true")) }, true},
		{"is_not_set", "nvidia/gpu", func(j *api.Job) { group(j).Constrain(con("${meta.rack}", "is_not_set", "")) }, false},
		{"task constraint", "nvidia/gpu", func(j *api.Job) { gpuTask(j).Constrain(con("${node.datacenter}", "!=", "dc1")) }, false},
		{"datacenter glob", "nvidia/gpu", func(j *api.Job) { j.Datacenters = []string{"d*"} }, true},
		{"other datacenter", "nvidia/gpu", func(j *api.Job) { j.Datacenters = []string{"eu-*"} }, false},
		{"every pool", "nvidia/gpu", func(j *api.Job) { j.NodePool = ptr("all") }, true},
		{"model by name", "nvidia/gpu/" + v100, nil, true},
		{"other model", "nvidia/gpu/" + k80, nil, false},
		{"GPU memory in GiB", "nvidia/gpu", devCon(con("${device.attr.memory}", ">=", "12 GiB")), true},
		{"GPU memory too small", "nvidia/gpu", devCon(con("${device.attr.memory}", ">=", "32 GiB")), false},
		{"GPU memory without a unit", "nvidia/gpu", devCon(con("${device.attr.memory}", ">=", "1")), false},
		{"GPU model regexp", "gpu", devCon(con("${device.model}", "regexp", "V100")), true},
		{"memory", "nvidia/gpu", func(j *api.Job) { gpuTask(j).Resources.MemoryMB = ptr(1 << 30) }, false},
		{"cpu", "nvidia/gpu", func(j *api.Job) { gpuTask(j).Resources.CPU = ptr(1 << 30) }, false},
		{"a core", "nvidia/gpu", func(j *api.Job) { gpuTask(j).Resources.CPU, gpuTask(j).Resources.Cores = nil, ptr(1) }, true},
		{"driver", "nvidia/gpu", func(j *api.Job) { group(j).AddTask(api.NewTask("side", "docker")) }, false},
		{"distinct_property", "nvidia/gpu", func(j *api.Job) { j.Constrain(con("${meta.rack}", "distinct_property", "1")) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			gated := trainJob("feasible-"+strings.ReplaceAll(c.name, " ", "-"), c.device, func(j *api.Job) {
				gpuTask(j).Config = map[string]any{"command": "/bin/true", "total_steps": 1}
				if c.edit != nil {
					c.edit(j)
				}
			})
			spec, err := jobspec.Parse(gated)
			if err != nil {
				t.Fatal(err)
			}
			got := Evaluate(gated, spec, snap, typeOf)
			// Nomad plans the job as hadar would release it: ungated.
			free := *gated
			free.Constraints = slices.DeleteFunc(slices.Clone(gated.Constraints), jobspec.IsGate)
			plan, _, err := a.Client.Jobs().Plan(&free, false, nil)
			if err != nil {
				t.Fatalf("plan: %v", err)
			}
			failed := plan.FailedTGAllocs["train"]
			nomad := failed == nil
			if nomad != c.want || (len(got.Nodes) > 0) != c.want {
				t.Fatalf("placeable: Nomad %v, hadar %v (why %q), want %v; Nomad's metrics %+v", nomad, len(got.Nodes) > 0, got.Why, c.want, failed)
			}
			if failed == nil {
				return
			}
			for k := range failed.ConstraintFiltered {
				if k != "missing drivers" && got.Excluded[k] == 0 {
					t.Errorf("Nomad filtered on %q, hadar on %v", k, got.Excluded)
				}
			}
			for dim := range failed.DimensionExhausted {
				if got.Excluded[dim+" exhausted"] == 0 {
					t.Errorf("Nomad exhausted %q, hadar excluded %v", dim, got.Excluded)
				}
			}
			t.Logf("Nomad: filtered %v, exhausted %v; hadar: %s", failed.ConstraintFiltered, failed.DimensionExhausted, got.Why)
		})
	}

	// A job hadar does not manage runs and holds most of the node's
	// memory: a worker that asked for more than is left fits nowhere, by
	// Nomad's count and hadar's alike, and one that asks for less still
	// fits.
	free := Free(snap)[a.NodeID].MemoryMB
	hog, err := a.Client.Jobs().ParseHCL(hogHCL(harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer"), free-1000), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Client.Jobs().Register(hog, nil); err != nil {
		t.Fatal(err)
	}
	// Stopped, not purged: the harness waits for its allocation to end
	// before it collects and purges. A purge while the task is still being
	// set up let Nomad collect the allocation while its task runner went
	// on to mount secrets/ and private/, left behind (make test run 57).
	t.Cleanup(func() { a.Client.Jobs().Deregister(*hog.ID, false, nil) })
	err = harness.Eventually(ctx, 60*time.Second, 200*time.Millisecond, func() error {
		// Running, not only placed: the usage counts a placed allocation.
		allocs, _, err := a.Client.Jobs().Allocations(*hog.ID, false, nil)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(allocs, func(al *api.AllocationListStub) bool { return al.ClientStatus == api.AllocClientStatusRunning }) {
			return fmt.Errorf("the hog is not running yet: %d allocations", len(allocs))
		}
		if snap, err = watch.List(ctx, a.Client, watch.Config{}); err != nil {
			return err
		}
		for _, u := range snap.Usage {
			if u.Job.ID == *hog.ID && u.MemoryMB == free-1000 {
				return nil
			}
		}
		return fmt.Errorf("no usage of the running hog in %v", snap.Usage)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		memory int
		want   bool
	}{{500, true}, {2000, false}} {
		gated := trainJob(fmt.Sprintf("feasible-after-hog-%d", c.memory), "nvidia/gpu", func(j *api.Job) {
			gpuTask(j).Config = map[string]any{"command": "/bin/true", "total_steps": 1}
			gpuTask(j).Resources.MemoryMB = ptr(c.memory)
		})
		spec, err := jobspec.Parse(gated)
		if err != nil {
			t.Fatal(err)
		}
		got := Evaluate(gated, spec, snap, typeOf)
		ungated := *gated
		ungated.Constraints = slices.DeleteFunc(slices.Clone(gated.Constraints), jobspec.IsGate)
		plan, _, err := a.Client.Jobs().Plan(&ungated, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		failed := plan.FailedTGAllocs["train"]
		if (failed == nil) != c.want || (len(got.Nodes) > 0) != c.want {
			t.Fatalf("memory %d beside the hog: Nomad placeable %v (%+v), hadar %v (%s); want %v", c.memory, failed == nil, failed, len(got.Nodes) > 0, got.Why, c.want)
		}
		t.Logf("memory %d beside the hog: hadar %q", c.memory, got.Why)
	}
}

// hogHCL is a job hadar does not manage that trains on one GPU for long
// and reserves memory MB.
func hogHCL(trainer string, memory int64) string {
	return fmt.Sprintf(`job "hog" {
  type = "batch"
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver       = "hadar-train"
      kill_timeout = "10s"
      config {
        command     = %q
        args        = ["--model", "mlp", "--progress-interval", "500ms"]
        total_steps = 10000000
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 1
          }
        }
      }
      resources {
        cpu    = 100
        memory = %d
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
`, trainer, memory)
}
