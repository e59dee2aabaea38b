package feasible

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

func ptr[T any](v T) *T { return &v }

// Models of the test nodes and their planner types.
const (
	v100   = "Tesla V100-SXM2-16GB"
	v100l  = "Tesla V100-SXM2-32GB"
	a100   = "NVIDIA A100-SXM4-40GB"
	k80    = "Tesla K80"
	oddGPU = "Mystery Accelerator 9000"
)

// typeOf maps the test models the way the sidecar's gpu_types rules do.
func typeOf(model string) planner.GPUType {
	for _, f := range []string{"v100", "a100", "k80"} {
		if strings.Contains(strings.ToLower(model), f) {
			return planner.GPUType(f)
		}
	}
	return ""
}

// gpus is a GPU group of model with memMiB of memory, compute capability
// cc, and healthy/unhealthy instances.
func gpus(model string, memMiB int64, cc string, healthy, unhealthy int) watch.GPUGroup {
	g := watch.GPUGroup{Model: model, Healthy: healthy,
		Attributes: map[string]string{"memory": fmt.Sprintf("%d MiB", memMiB), "compute_capability": cc},
		Typed: map[string]watch.Attribute{
			"memory":             {Kind: watch.AttrInt, Int: memMiB, Unit: "MiB"},
			"compute_capability": {Kind: watch.AttrString, Str: cc},
			"nvlink_domain_size": {Kind: watch.AttrInt, Int: int64(healthy)},
		}}
	for i := 0; i < healthy+unhealthy; i++ {
		g.Instances = append(g.Instances, watch.GPU{ID: fmt.Sprintf("%s-%d", model, i), Healthy: i < healthy})
	}
	return g
}

// node is a ready node of dc1, pool default, with hadar-train, 8 cores at
// 8000 MHz, 16 GiB (1 GiB reserved) and two healthy V100s; opts change it.
func node(id string, opts ...func(*watch.Node)) *watch.Node {
	n := &watch.Node{ID: id, Name: "name-" + id, Datacenter: "dc1", NodePool: "default", NodeClass: "gpu-large",
		Status: "ready", SchedulingEligibility: "eligible",
		Meta:       map[string]string{"rack": "r1"},
		Attributes: map[string]string{"kernel.name": "linux", "cpu.arch": "amd64", "os.version": "22.04", "nomad.version": "1.11.3", "driver.docker": "1"},
		Drivers:    map[string]bool{"hadar-train": true, "docker": false},
		Resources:  watch.Resources{CPU: 8000, MemoryMB: 16384, DiskMB: 100000},
		Reserved:   watch.Resources{CPU: 500, MemoryMB: 1024},
		Cores:      8,
		GPUs:       []watch.GPUGroup{gpus(v100, 16384, "7.0", 2, 0)},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

func withGPUs(gs ...watch.GPUGroup) func(*watch.Node) {
	return func(n *watch.Node) { n.GPUs = gs }
}

// trainJob is a valid managed job: group "train", task "trainer" (driver
// hadar-train, cpu 500, memory 1024) asking for device, gated at job
// level; opts change it before it is parsed.
func trainJob(id, device string, opts ...func(*api.Job)) *api.Job {
	j := api.NewBatchJob(id, id, "global", 50)
	j.Namespace = ptr("default")
	j.Meta = map[string]string{jobspec.KeyModel: "ResNet-18", jobspec.KeySteps: "1000"}
	j.Constrain(jobspec.GateConstraint())
	t := api.NewTask("trainer", "hadar-train")
	t.Require(&api.Resources{CPU: ptr(500), MemoryMB: ptr(1024), Devices: []*api.RequestedDevice{{Name: device, Count: ptr(uint64(1))}}})
	j.AddTaskGroup(api.NewTaskGroup("train", 1).AddTask(t))
	for _, o := range opts {
		o(j)
	}
	return j
}

func group(j *api.Job) *api.TaskGroup { return j.TaskGroups[0] }
func gpuTask(j *api.Job) *api.Task    { return j.TaskGroups[0].Tasks[0] }

// snapshot holds nodes and the managed job j (and others).
func snapshot(nodes []*watch.Node, jobs ...*watch.Job) *watch.Snapshot {
	s := &watch.Snapshot{Nodes: map[string]*watch.Node{}, Jobs: map[watch.JobKey]*watch.Job{}, Usage: map[string]*watch.Usage{}}
	for _, n := range nodes {
		s.Nodes[n.ID] = n
	}
	for _, j := range jobs {
		s.Jobs[j.Key()] = j
	}
	return s
}

// managedJob is j as the watcher shows it.
func managedJob(t testing.TB, j *api.Job) *watch.Job {
	t.Helper()
	spec, err := jobspec.Parse(j)
	if err != nil {
		t.Fatalf("parse %s: %v", *j.ID, err)
	}
	return &watch.Job{Namespace: "default", ID: *j.ID, Type: "batch", Managed: true, Spec: &spec, Raw: j, JobModifyIndex: 1}
}

// eval evaluates j on nodes, checking that an Evaluator agrees.
func eval(t *testing.T, j *api.Job, nodes ...*watch.Node) Result {
	t.Helper()
	wj := managedJob(t, j)
	snap := snapshot(nodes, wj)
	r := Evaluate(j, *wj.Spec, snap, typeOf)
	if c := NewEvaluator(typeOf).Evaluate(wj, snap); !reflect.DeepEqual(c, r) {
		t.Fatalf("Evaluator %+v, Evaluate %+v", c, r)
	}
	return r
}

func types(r Result, node string) []planner.GPUType {
	var out []planner.GPUType
	for _, t := range []planner.GPUType{"a100", "k80", "v100"} {
		if r.Allows(node, t) {
			out = append(out, t)
		}
	}
	return out
}

// TestConstraintOperators: each operator, on each kind of target, at job
// level, against Nomad's semantics.
func TestConstraintOperators(t *testing.T) {
	n := func(opts ...func(*watch.Node)) *watch.Node { return node("n1", opts...) }
	attr := func(k, v string) func(*watch.Node) { return func(n *watch.Node) { n.Attributes[k] = v } }
	meta := func(k, v string) func(*watch.Node) { return func(n *watch.Node) { n.Meta[k] = v } }
	for _, c := range []struct {
		name     string
		l, op, r string
		node     *watch.Node
		want     bool
	}{
		{"= literal", "${attr.kernel.name}", "=", "linux", n(), true},
		{"= other", "${attr.kernel.name}", "=", "windows", n(), false},
		{"==", "${attr.kernel.name}", "==", "linux", n(), true},
		{"is", "${attr.kernel.name}", "is", "linux", n(), true},
		{"empty operator reads as =", "${attr.kernel.name}", "", "linux", n(), true},
		{"= missing attribute", "${attr.nope}", "=", "x", n(), false},
		{"!= other", "${attr.kernel.name}", "!=", "windows", n(), true},
		{"!= same", "${attr.kernel.name}", "!=", "linux", n(), false},
		{"not", "${attr.kernel.name}", "not", "windows", n(), true},
		{"!= missing attribute", "${meta.gpu_broken}", "!=", "true", n(), true},
		{"< numeric, not lexical", "${attr.n}", "<", "10", n(attr("n", "9")), true},
		{"> numeric", "${attr.n}", ">", "10", n(attr("n", "9")), false},
		{"<= float", "${attr.n}", "<=", "1.5", n(attr("n", "1.25")), true},
		{">= int and float", "${attr.n}", ">=", "2.5", n(attr("n", "3")), true},
		{"< lexical", "${attr.kernel.name}", "<", "mac", n(), true},
		{"> lexical, a number against a word", "${attr.n}", ">", "abc", n(attr("n", "10")), false},
		{"< missing", "${attr.nope}", "<", "10", n(), false},
		{"regexp", "${attr.os.version}", "regexp", `^22\.`, n(), true},
		{"regexp no match", "${attr.os.version}", "regexp", `^20\.`, n(), false},
		{"regexp invalid", "${attr.os.version}", "regexp", `(`, n(), false},
		{"set_contains", "${meta.features}", "set_contains", "nvlink, ib", n(meta("features", "ib,nvlink, rdma")), true},
		{"set_contains missing item", "${meta.features}", "set_contains", "nvlink,roce", n(meta("features", "ib,nvlink")), false},
		{"set_contains_all", "${meta.features}", "set_contains_all", "ib", n(meta("features", "ib,nvlink")), true},
		{"set_contains_any", "${meta.features}", "set_contains_any", "roce, nvlink", n(meta("features", "ib,nvlink")), true},
		{"set_contains_any none", "${meta.features}", "set_contains_any", "roce,x", n(meta("features", "ib,nvlink")), false},
		{"version", "${attr.nomad.version}", "version", ">= 1.10, < 2.0", n(), true},
		{"version too old", "${attr.nomad.version}", "version", ">= 1.12", n(), false},
		{"version: a prerelease never matches a release constraint", "${attr.v}", "version", ">= 1.2", n(attr("v", "1.3.0-beta1")), false},
		{"version invalid", "${attr.nomad.version}", "version", "~~1", n(), false},
		{"version of a non-version", "${attr.kernel.name}", "version", ">= 1.0", n(), false},
		{"semver: a prerelease orders by semver", "${attr.v}", "semver", ">= 1.2.0", n(attr("v", "1.3.0-beta1")), true},
		{"semver below", "${attr.v}", "semver", ">= 1.2.0, < 1.3.0-alpha", n(attr("v", "1.3.0-beta1")), false},
		{"semver: a prerelease is below its release", "${attr.v}", "semver", "< 1.3.0", n(attr("v", "1.3.0-beta1")), true},
		{"semver !=", "${attr.nomad.version}", "semver", "!= 1.11.3", n(), false},
		{"semver invalid", "${attr.nomad.version}", "semver", ">= banana", n(), false},
		{"is_set", "${meta.rack}", "is_set", "", n(), true},
		{"is_set missing", "${meta.nope}", "is_set", "", n(), false},
		{"is_not_set", "${meta.nope}", "is_not_set", "", n(), true},
		{"is_not_set present", "${meta.rack}", "is_not_set", "", n(), false},
		{"node.unique.id", "${node.unique.id}", "=", "n1", n(), true},
		{"node.unique.name", "${node.unique.name}", "=", "name-n1", n(), true},
		{"node.datacenter", "${node.datacenter}", "=", "dc1", n(), true},
		{"node.class", "${node.class}", "regexp", "^gpu-", n(), true},
		{"node.pool", "${node.pool}", "=", "default", n(), true},
		{"meta", "${meta.rack}", "=", "r2", n(), false},
		{"target on both sides", "${attr.a}", "=", "${meta.b}", n(attr("a", "x"), meta("b", "x")), true},
		{"target on both sides, differing", "${attr.a}", "=", "${meta.b}", n(attr("a", "x"), meta("b", "y")), false},
		{"unknown interpolation", "${env.HOME}", "=", "/root", n(), false},
		{"unknown operator", "${attr.kernel.name}", "~=", "linux", n(), false},
		{"distinct_property is not filtered on", "${meta.rack}", "distinct_property", "1", n(), true},
		{"distinct_hosts is not filtered on", "", "distinct_hosts", "true", n(), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := trainJob("j", "nvidia/gpu", func(j *api.Job) {
				j.Constraints = append(j.Constraints, &api.Constraint{LTarget: c.l, Operand: c.op, RTarget: c.r})
			})
			r := eval(t, j, c.node)
			if got := r.Nodes["n1"].Workers > 0; got != c.want {
				t.Fatalf("allowed %v, want %v (%+v)", got, c.want, r)
			}
			if c.want {
				return
			}
			key := c.l + " " + c.op + " " + c.r
			if c.op == "" {
				key = c.l + " = " + c.r
			}
			if r.Excluded[key] != 1 || r.Why != "constraint "+key+": no node matches" {
				t.Fatalf("excluded %v, why %q", r.Excluded, r.Why)
			}
		})
	}
}

// TestConstraintLevels: job, group and task constraints (of every task of
// the template group) all apply; hadar's gate, refusal note and generated
// groups do not.
func TestConstraintLevels(t *testing.T) {
	windows := &api.Constraint{LTarget: "${attr.kernel.name}", Operand: "=", RTarget: "windows"}
	linux := &api.Constraint{LTarget: "${attr.kernel.name}", Operand: "=", RTarget: "linux"}
	for _, c := range []struct {
		name  string
		edit  func(*api.Job)
		allow bool
	}{
		{"none", func(*api.Job) {}, true},
		{"job", func(j *api.Job) { j.Constrain(windows) }, false},
		{"group", func(j *api.Job) { group(j).Constrain(windows) }, false},
		{"GPU task", func(j *api.Job) { gpuTask(j).Constrain(windows) }, false},
		{"another task", func(j *api.Job) {
			group(j).AddTask(api.NewTask("logs", "hadar-train").Constrain(windows))
		}, false},
		{"all levels met", func(j *api.Job) {
			j.Constrain(linux)
			group(j).Constrain(linux)
			gpuTask(j).Constrain(linux)
		}, true},
		{"refusal note", func(j *api.Job) {
			j.Constrain(&api.Constraint{LTarget: jobform.ErrorAttribute, Operand: "=", RTarget: "hadar.steps is not a number"})
		}, true},
		{"gate at group level", func(j *api.Job) {
			j.Constraints = nil
			group(j).Constrain(jobspec.GateConstraint())
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := trainJob("j", "nvidia/gpu", c.edit)
			r := eval(t, j, node("n1"))
			if got := len(r.Nodes) == 1; got != c.allow {
				t.Fatalf("allowed %v, want %v: %+v", got, c.allow, r)
			}
		})
	}

	// The placed form hadar writes (gate moved, one group per worker
	// pinned to its node and models) plans like the template it came from.
	j := trainJob("j", "nvidia/gpu", func(j *api.Job) { group(j).Constrain(linux) })
	spec, err := jobspec.Parse(j)
	if err != nil {
		t.Fatal(err)
	}
	placed, err := jobform.Placed(j, spec, []jobform.Unit{{ID: 0, Port: 29500, Workers: []jobform.Worker{{Node: "n1", Type: "v100", Models: []string{v100}, Addr: "10.0.0.1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(placed.TaskGroups) != 2 {
		t.Fatalf("placed form has %d groups", len(placed.TaskGroups))
	}
	nodes := []*watch.Node{node("n1"), node("n2")}
	if a, b := eval(t, j, nodes...), eval(t, placed, nodes...); !reflect.DeepEqual(a, b) || len(a.Nodes) != 2 {
		t.Fatalf("template %+v, placed %+v", a, b)
	}
}

// TestDistinctHosts: reported, not filtered on.
func TestDistinctHosts(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*api.Job)
		want bool
	}{
		{"none", func(*api.Job) {}, false},
		{"job", func(j *api.Job) { j.Constrain(&api.Constraint{Operand: "distinct_hosts"}) }, true},
		{"group, true", func(j *api.Job) { group(j).Constrain(&api.Constraint{Operand: "distinct_hosts", RTarget: "true"}) }, true},
		{"group, false", func(j *api.Job) { group(j).Constrain(&api.Constraint{Operand: "distinct_hosts", RTarget: "false"}) }, false},
		{"unparsable means on", func(j *api.Job) { j.Constrain(&api.Constraint{Operand: "distinct_hosts", RTarget: "yes"}) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := eval(t, trainJob("j", "nvidia/gpu", c.edit), node("n1"))
			if r.DistinctHosts != c.want || len(r.Nodes) != 1 {
				t.Fatalf("distinct hosts %v, want %v; %+v", r.DistinctHosts, c.want, r)
			}
		})
	}
}

// TestPoolsAndDatacenters: the job's node pool ("default" when unset,
// "all" for every pool) and datacenters (with * globs, every one when
// unset), and only ready nodes.
func TestPoolsAndDatacenters(t *testing.T) {
	in := func(dc, pool string) *watch.Node {
		return node("n1", func(n *watch.Node) { n.Datacenter, n.NodePool = dc, pool })
	}
	for _, c := range []struct {
		name string
		pool string
		dcs  []string
		node *watch.Node
		want bool
		why  string
	}{
		{"defaults", "", nil, in("dc1", "default"), true, ""},
		{"unset pool is default", "", nil, in("dc1", ""), true, ""},
		{"default pool only", "", nil, in("dc1", "gpu"), false, `node pool "default": no node of the cluster is in it`},
		{"named pool", "gpu", nil, in("dc1", "gpu"), true, ""},
		{"other pool", "gpu", nil, in("dc1", "default"), false, `node pool "gpu": no node of the cluster is in it`},
		{"all pools", "all", nil, in("dc1", "batch"), true, ""},
		{"datacenter", "", []string{"dc2", "dc1"}, in("dc1", "default"), true, ""},
		{"other datacenter", "", []string{"dc2"}, in("dc1", "default"), false, `datacenters ["dc2"]: no node of node pool "default" is in them`},
		{"glob", "", []string{"eu-*-1"}, in("eu-west-1", "default"), true, ""},
		{"glob no match", "", []string{"eu-*-1"}, in("eu-west-2", "default"), false, `datacenters ["eu-*-1"]: no node of node pool "default" is in them`},
		{"star", "", []string{"*"}, in("anything", "default"), true, ""},
		{"prefix glob", "", []string{"dc*"}, in("dc7", "default"), true, ""},
		{"suffix glob", "", []string{"*-gpu"}, in("dc1", "default"), false, `datacenters ["*-gpu"]: no node of node pool "default" is in them`},
		{"down", "", nil, node("n1", func(n *watch.Node) { n.Status = "down" }), false, "no node of the job's node pool and datacenters is ready"},
		{"ineligible is the planner's business", "", nil, node("n1", func(n *watch.Node) { n.SchedulingEligibility = "ineligible"; n.Drain = true }), true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := trainJob("j", "nvidia/gpu", func(j *api.Job) {
				if c.pool != "" {
					j.NodePool = ptr(c.pool)
				}
				j.Datacenters = c.dcs
			})
			r := eval(t, j, c.node)
			if got := len(r.Nodes) == 1; got != c.want || r.Why != c.why {
				t.Fatalf("allowed %v, why %q; want %v, %q", got, r.Why, c.want, c.why)
			}
		})
	}
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, subject string
		want             bool
	}{
		{"", "", true}, {"", "a", false}, {"*", "", true}, {"*", "abc", true}, {"abc", "abc", true}, {"abc", "abd", false},
		{"a*", "abc", true}, {"a*", "ba", false}, {"*c", "abc", true}, {"*c", "cb", false}, {"a*c", "ac", true},
		{"a*c", "abbc", true}, {"a*c", "abcd", false}, {"a*b*c", "aXbYc", true}, {"a*b*c", "aXcYb", false},
		{"a*a", "a", false}, {"a*a", "aa", true}, {"**", "x", true}, {"*b*", "abc", true}, {"*b*", "ac", false},
		{"dc[1]", "dc1", false}, {"dc?", "dc1", false},
	} {
		if got := newGlob(c.pattern).match(c.subject); got != c.want {
			t.Errorf("glob(%q, %q) = %v, want %v", c.pattern, c.subject, got, c.want)
		}
	}
}

// TestDrivers: a node without the task's driver, detected and healthy,
// is excluded; without driver info its driver.<name> attribute counts.
func TestDrivers(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*watch.Node)
		want bool
	}{
		{"detected and healthy", func(*watch.Node) {}, true},
		{"unhealthy", func(n *watch.Node) { n.Drivers["hadar-train"] = false }, false},
		{"absent", func(n *watch.Node) { delete(n.Drivers, "hadar-train") }, false},
		{"attribute only", func(n *watch.Node) { n.Drivers = nil; n.Attributes["driver.hadar-train"] = "1" }, true},
		{"attribute off", func(n *watch.Node) { n.Drivers = nil; n.Attributes["driver.hadar-train"] = "0" }, false},
		{"attribute unparsable", func(n *watch.Node) { n.Drivers = nil; n.Attributes["driver.hadar-train"] = "yes" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := eval(t, trainJob("j", "nvidia/gpu"), node("n1", c.edit))
			if got := len(r.Nodes) == 1; got != c.want {
				t.Fatalf("allowed %v, want %v: %+v", got, c.want, r)
			}
			if !c.want && (r.Excluded[`missing driver "hadar-train"`] != 1 || r.Why != `missing driver "hadar-train": no node has that task driver detected and healthy`) {
				t.Fatalf("excluded %v, why %q", r.Excluded, r.Why)
			}
		})
	}
	// A second task's driver counts too.
	j := trainJob("j", "nvidia/gpu", func(j *api.Job) { group(j).AddTask(api.NewTask("logs", "docker")) })
	if r := eval(t, j, node("n1")); len(r.Nodes) != 0 || r.Excluded[`missing driver "docker"`] != 1 {
		t.Fatalf("docker sidecar task on a node with docker unhealthy: %+v", r)
	}
}

// TestDevices: the GPU request pins models by name and by device
// constraints (on ${device.model}, ${device.attr.*} with units,
// ${device.vendor}); a node allows a type when an allowed model of it has
// a healthy GPU.
func TestDevices(t *testing.T) {
	mixed := node("n1", withGPUs(gpus(a100, 40960, "8.0", 4, 0), gpus(v100, 16384, "7.0", 2, 0), gpus(v100l, 32768, "7.0", 1, 1)))
	dc := func(l, op, r string) func(*api.Job) {
		return func(j *api.Job) {
			d := gpuTask(j).Resources.Devices[0]
			d.Constraints = append(d.Constraints, &api.Constraint{LTarget: l, Operand: op, RTarget: r})
		}
	}
	all := map[planner.GPUType][]string{"a100": {a100}, "v100": {v100, v100l}}
	for _, c := range []struct {
		name   string
		device string
		edit   func(*api.Job)
		node   *watch.Node
		want   map[planner.GPUType][]string
		why    string
	}{
		{"nvidia/gpu", "nvidia/gpu", nil, mixed, all, ""},
		{"gpu", "gpu", nil, mixed, all, ""},
		{"model by name", "nvidia/gpu/" + v100l, nil, mixed, map[planner.GPUType][]string{"v100": {v100l}}, ""},
		{"model by name, absent", "nvidia/gpu/" + k80, nil, mixed, nil,
			`device "nvidia/gpu/Tesla K80": no node has a healthy GPU that matches`},
		{"${device.model} =", "nvidia/gpu", dc("${device.model}", "=", a100), mixed, map[planner.GPUType][]string{"a100": {a100}}, ""},
		{"${device.model} set_contains_any", "nvidia/gpu", dc("${device.model}", "set_contains_any", v100+","+k80), mixed,
			map[planner.GPUType][]string{"v100": {v100}}, ""},
		{"${device.model} regexp", "nvidia/gpu", dc("${device.model}", "regexp", "V100"), mixed, map[planner.GPUType][]string{"v100": {v100, v100l}}, ""},
		{"memory in GiB against MiB", "nvidia/gpu", dc("${device.attr.memory}", ">=", "32 GiB"), mixed,
			map[planner.GPUType][]string{"a100": {a100}, "v100": {v100l}}, ""},
		{"memory equal across units", "nvidia/gpu", dc("${device.attr.memory}", "=", "16GiB"), mixed, map[planner.GPUType][]string{"v100": {v100}}, ""},
		{"memory >", "nvidia/gpu", dc("${device.attr.memory}", ">", "32 GiB"), mixed, map[planner.GPUType][]string{"a100": {a100}}, ""},
		{"memory in decimal GB", "nvidia/gpu", dc("${device.attr.memory}", ">", "40 GB"), mixed, map[planner.GPUType][]string{"a100": {a100}}, ""},
		{"memory without a unit does not compare", "nvidia/gpu", dc("${device.attr.memory}", ">=", "1"), mixed, nil,
			`device "nvidia/gpu" with constraint ${device.attr.memory} >= 1: no node has a healthy GPU that matches`},
		{"memory against watts does not compare", "nvidia/gpu", dc("${device.attr.memory}", "<", "1 W"), mixed, nil,
			`device "nvidia/gpu" with constraint ${device.attr.memory} < 1 W: no node has a healthy GPU that matches`},
		{"!= across units", "nvidia/gpu", dc("${device.attr.memory}", "!=", "40 GiB"), mixed, map[planner.GPUType][]string{"v100": {v100, v100l}}, ""},
		{"unitless int", "nvidia/gpu", dc("${device.attr.nvlink_domain_size}", ">=", "4"), mixed, map[planner.GPUType][]string{"a100": {a100}}, ""},
		{"version on a string attribute", "nvidia/gpu", dc("${device.attr.compute_capability}", "version", ">= 8.0"), mixed,
			map[planner.GPUType][]string{"a100": {a100}}, ""},
		{"vendor", "nvidia/gpu", dc("${device.vendor}", "=", "nvidia"), mixed, all, ""},
		{"type", "gpu", dc("${device.type}", "!=", "gpu"), mixed, nil,
			`device "gpu" with constraint ${device.type} != gpu: no node has a healthy GPU that matches`},
		{"is_set attribute", "nvidia/gpu", dc("${device.attr.nope}", "is_not_set", ""), mixed, all, ""},
		{"unhealthy group", "nvidia/gpu/" + a100, nil, node("n1", withGPUs(gpus(a100, 40960, "8.0", 0, 4))), nil,
			`device "nvidia/gpu/NVIDIA A100-SXM4-40GB": no node has a healthy GPU that matches`},
		{"model without a planner type", "nvidia/gpu", nil, node("n1", withGPUs(gpus(oddGPU, 8192, "9.0", 1, 0))), nil,
			`GPU models ["Mystery Accelerator 9000"] match the device request but hadar maps none of them to a GPU type (add them to the sidecar's gpu_types)`},
		{"no GPUs", "nvidia/gpu", nil, node("n1", withGPUs()), nil, `device "nvidia/gpu": no node has a healthy GPU that matches`},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := trainJob("j", c.device)
			if c.edit != nil {
				c.edit(j)
			}
			r := eval(t, j, c.node)
			if got := r.Nodes["n1"].Models; !reflect.DeepEqual(got, c.want) || r.Why != c.why {
				t.Fatalf("models %v, why %q; want %v, %q", got, r.Why, c.want, c.why)
			}
			if got := types(r, "n1"); len(got) != len(c.want) {
				t.Fatalf("types %v, want those of %v", got, c.want)
			}
		})
	}
}

// TestHostVolumes: a node must offer each host volume the group mounts,
// writable unless the mount is read-only.
func TestHostVolumes(t *testing.T) {
	vols := func(m map[string]watch.HostVolume) func(*watch.Node) {
		return func(n *watch.Node) { n.HostVolumes = m }
	}
	mount := func(source string, readOnly, perAlloc bool) func(*api.Job) {
		return func(j *api.Job) {
			group(j).Volumes = map[string]*api.VolumeRequest{"data": {Name: "data", Type: "host", Source: source, ReadOnly: readOnly, PerAlloc: perAlloc},
				"ckpt": {Name: "ckpt", Type: "csi", Source: "ckpt-vol"}}
		}
	}
	for _, c := range []struct {
		name string
		edit func(*api.Job)
		node *watch.Node
		why  string
	}{
		{"no volumes", nil, node("n1"), ""},
		{"offered", mount("imagenet", true, false), node("n1", vols(map[string]watch.HostVolume{"imagenet": {ReadOnly: true}})), ""},
		{"missing", mount("imagenet", true, false), node("n1"), `missing host volume "imagenet": no node offers it (writable, unless the volume is read_only)`},
		{"read-only for a writer", mount("imagenet", false, false), node("n1", vols(map[string]watch.HostVolume{"imagenet": {ReadOnly: true}})),
			`missing host volume "imagenet": no node offers it (writable, unless the volume is read_only)`},
		{"writable for a writer", mount("scratch", false, false), node("n1", vols(map[string]watch.HostVolume{"scratch": {}})), ""},
		{"dynamic: the rest is Nomad's", mount("scratch", false, false), node("n1", vols(map[string]watch.HostVolume{"scratch": {ReadOnly: true, Dynamic: true}})), ""},
		{"per allocation", mount("shard", true, true), node("n1", vols(map[string]watch.HostVolume{"shard[0]": {}})), ""},
		{"per allocation, missing", mount("shard", true, true), node("n1", vols(map[string]watch.HostVolume{"shard": {}})),
			`missing host volume "shard[0]": no node offers it (writable, unless the volume is read_only)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := trainJob("j", "nvidia/gpu")
			if c.edit != nil {
				c.edit(j)
			}
			if r := eval(t, j, c.node); r.Why != c.why || (len(r.Nodes) == 1) != (c.why == "") {
				t.Fatalf("why %q, want %q; %+v", r.Why, c.why, r)
			}
		})
	}
}

// usage is an allocation of job holding res on node.
func usage(id, node string, job watch.JobKey, res watch.Resources) *watch.Usage {
	return &watch.Usage{AllocID: id, NodeID: node, Job: job, Resources: res}
}

// TestResources: one worker's group must fit what the node has left after
// its reservation and the allocations of work hadar does not plan; the
// node holds as many workers as fit, at most one per allowed GPU.
func TestResources(t *testing.T) {
	eight := withGPUs(gpus(v100, 16384, "7.0", 8, 0))
	human := watch.JobKey{Namespace: "default", ID: "human"}
	other := watch.JobKey{Namespace: "default", ID: "other-managed"}
	refused := watch.JobKey{Namespace: "default", ID: "refused"}
	task := func(cpu, mem int) func(*api.Job) {
		return func(j *api.Job) { gpuTask(j).Resources.CPU, gpuTask(j).Resources.MemoryMB = ptr(cpu), ptr(mem) }
	}
	for _, c := range []struct {
		name    string
		edit    func(*api.Job)
		node    *watch.Node
		usage   []*watch.Usage
		workers int
		why     string
		ask     watch.Resources
	}{
		{"GPUs bound the workers", nil, node("n1"), nil, 2, "", watch.Resources{CPU: 500, MemoryMB: 1024, DiskMB: 300}},
		{"memory bounds the workers", task(500, 4096), node("n1", eight), nil, 3, "", watch.Resources{CPU: 500, MemoryMB: 4096, DiskMB: 300}},
		{"cpu bounds the workers", task(2000, 512), node("n1", eight), nil, 3, "", watch.Resources{CPU: 2000, MemoryMB: 512, DiskMB: 300}},
		{"a job hadar does not manage holds memory", task(500, 4096), node("n1", eight),
			[]*watch.Usage{usage("h1", "n1", human, watch.Resources{CPU: 100, MemoryMB: 14000})}, 0,
			"memory: a worker asks 4096 MB, the most a node has free is 1360 MB", watch.Resources{CPU: 500, MemoryMB: 4096, DiskMB: 300}},
		{"cpu exhausted", task(7600, 512), node("n1"), nil, 0,
			"cpu: a worker asks 7600 MHz, the most a node has free is 7500 MHz", watch.Resources{CPU: 7600, MemoryMB: 512, DiskMB: 300}},
		{"a managed job's share is the planner's", task(500, 4096), node("n1", eight),
			[]*watch.Usage{usage("m1", "n1", other, watch.Resources{MemoryMB: 14000})}, 3, "", watch.Resources{CPU: 500, MemoryMB: 4096, DiskMB: 300}},
		{"a refused managed job's share is not", task(500, 4096), node("n1", eight),
			[]*watch.Usage{usage("r1", "n1", refused, watch.Resources{MemoryMB: 8000})}, 1, "", watch.Resources{CPU: 500, MemoryMB: 4096, DiskMB: 300}},
		{"other nodes' usage does not count", task(500, 4096), node("n1", eight),
			[]*watch.Usage{usage("h1", "n2", human, watch.Resources{MemoryMB: 14000})}, 3, "", watch.Resources{CPU: 500, MemoryMB: 4096, DiskMB: 300}},
		{"disk", func(j *api.Job) { group(j).EphemeralDisk = &api.EphemeralDisk{SizeMB: ptr(60000)} }, node("n1", eight), nil, 1, "",
			watch.Resources{CPU: 500, MemoryMB: 1024, DiskMB: 60000}},
		{"secrets memory counts", func(j *api.Job) { gpuTask(j).Resources.SecretsMB = ptr(3072) }, node("n1", eight), nil, 3, "",
			watch.Resources{CPU: 500, MemoryMB: 4096, DiskMB: 300}},
		{"tasks of a group add up", func(j *api.Job) {
			group(j).AddTask(&api.Task{Name: "logs", Driver: "hadar-train", Resources: &api.Resources{CPU: ptr(100), MemoryMB: ptr(3072)}})
		}, node("n1", eight), nil, 3, "", watch.Resources{CPU: 600, MemoryMB: 4096, DiskMB: 300}},
		{"defaults for a task without resources", func(j *api.Job) {
			group(j).AddTask(&api.Task{Name: "logs", Driver: "hadar-train"})
		}, node("n1"), nil, 2, "", watch.Resources{CPU: 600, MemoryMB: 1324, DiskMB: 300}},
		{"a prestart task runs before the main ones", func(j *api.Job) {
			group(j).AddTask(&api.Task{Name: "fetch", Driver: "hadar-train", Lifecycle: &api.TaskLifecycle{Hook: "prestart"},
				Resources: &api.Resources{CPU: ptr(100), MemoryMB: ptr(7000)}})
		}, node("n1", eight), nil, 2, "", watch.Resources{CPU: 500, MemoryMB: 7000, DiskMB: 300}},
		{"a prestart sidecar runs beside them", func(j *api.Job) {
			group(j).AddTask(&api.Task{Name: "proxy", Driver: "hadar-train", Lifecycle: &api.TaskLifecycle{Hook: "prestart", Sidecar: true},
				Resources: &api.Resources{CPU: ptr(100), MemoryMB: ptr(3072)}})
		}, node("n1", eight), nil, 3, "", watch.Resources{CPU: 600, MemoryMB: 4096, DiskMB: 300}},
		{"a poststop task runs after", func(j *api.Job) {
			group(j).AddTask(&api.Task{Name: "upload", Driver: "hadar-train", Lifecycle: &api.TaskLifecycle{Hook: "poststop"},
				Resources: &api.Resources{CPU: ptr(3000), MemoryMB: ptr(512)}})
		}, node("n1", eight), nil, 2, "", watch.Resources{CPU: 3000, MemoryMB: 1024, DiskMB: 300}},
		{"whole cores at the node's mean speed", func(j *api.Job) {
			gpuTask(j).Resources.CPU, gpuTask(j).Resources.Cores = nil, ptr(3)
		}, node("n1", eight), nil, 2, "", watch.Resources{MemoryMB: 1024, DiskMB: 300}},
		{"more cores than the node has", func(j *api.Job) {
			gpuTask(j).Resources.CPU, gpuTask(j).Resources.Cores = nil, ptr(12)
		}, node("n1", eight), nil, 0, "cores: a worker asks 12, the most a node has free is 8", watch.Resources{MemoryMB: 1024, DiskMB: 300}},
		{"a node that reports no capacity is not judged on it", task(500, 99999), node("n1", func(n *watch.Node) { n.Resources = watch.Resources{} }),
			nil, 2, "", watch.Resources{CPU: 500, MemoryMB: 99999, DiskMB: 300}},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := trainJob("j", "nvidia/gpu")
			if c.edit != nil {
				c.edit(j)
			}
			wj := managedJob(t, j)
			om := managedJob(t, trainJob(other.ID, "nvidia/gpu"))
			rj := &watch.Job{Namespace: "default", ID: refused.ID, Managed: true, SpecErr: &jobspec.FieldError{Job: refused.ID, Field: "hadar.steps", Want: "a number"}}
			snap := snapshot([]*watch.Node{c.node}, wj, om, rj, &watch.Job{Namespace: "default", ID: human.ID})
			for _, u := range c.usage {
				snap.Usage[u.AllocID] = u
			}
			r := Evaluate(j, *wj.Spec, snap, typeOf)
			if r.Nodes["n1"].Workers != c.workers || r.Why != c.why || r.Ask != c.ask {
				t.Fatalf("workers %d, why %q, ask %+v; want %d, %q, %+v", r.Nodes["n1"].Workers, r.Why, r.Ask, c.workers, c.why, c.ask)
			}
			if c := NewEvaluator(typeOf).Evaluate(wj, snap); !reflect.DeepEqual(c, r) {
				t.Fatalf("Evaluator %+v, Evaluate %+v", c, r)
			}
		})
	}
}

// TestWhy: one line that says what to change; several rules each with
// the nodes they excluded, in Nomad's order.
func TestWhy(t *testing.T) {
	j := trainJob("j", "nvidia/gpu", func(j *api.Job) {
		j.Constrain(&api.Constraint{LTarget: "${attr.kernel.name}", Operand: "=", RTarget: "linux"})
		j.Datacenters = []string{"dc*"}
	})
	nodes := []*watch.Node{
		node("pool", func(n *watch.Node) { n.NodePool = "batch" }),
		node("win1", func(n *watch.Node) { n.Attributes["kernel.name"] = "windows" }),
		node("win2", func(n *watch.Node) { n.Attributes["kernel.name"] = "windows" }),
		node("elsewhere", func(n *watch.Node) { n.Datacenter = "lab" }),
		node("nogpu", withGPUs()),
		node("down", func(n *watch.Node) { n.Status = "down" }),
	}
	r := eval(t, j, nodes...)
	want := `no node passes every placement rule: node pool "default" excludes 1 node; datacenters ["dc*"] excludes 1 node; ` +
		`not being ready excludes 1 node; constraint ${attr.kernel.name} = linux excludes 2 nodes; device "nvidia/gpu" excludes 1 node`
	if r.Why != want {
		t.Fatalf("why\n%s\nwant\n%s", r.Why, want)
	}
	wantEx := map[string]int{`node pool "default"`: 1, `datacenters ["dc*"]`: 1, "node not ready": 1, "${attr.kernel.name} = linux": 2, "missing devices": 1}
	if !reflect.DeepEqual(r.Excluded, wantEx) {
		t.Fatalf("excluded %v, want %v", r.Excluded, wantEx)
	}
	// One node left: no Why, and the others still counted.
	r = eval(t, j, append(nodes, node("ok"))...)
	if r.Why != "" || len(r.Nodes) != 1 || r.Excluded["${attr.kernel.name} = linux"] != 2 {
		t.Fatalf("%+v", r)
	}
	if got := r.Allowed(); !reflect.DeepEqual(got, map[string]map[planner.GPUType]bool{"ok": {"v100": true}}) {
		t.Fatalf("allowed %v", got)
	}
	if r := eval(t, j); r.Why != "no node in the cluster" {
		t.Fatalf("empty cluster: %q", r.Why)
	}
}

// TestEvaluateRefused: a job the evaluator cannot read says why instead
// of allowing anything.
func TestEvaluateRefused(t *testing.T) {
	snap := snapshot([]*watch.Node{node("n1")})
	e := NewEvaluator(typeOf)
	bad := &watch.Job{Namespace: "default", ID: "bad", Managed: true, SpecErr: &jobspec.FieldError{Job: "bad", Field: "hadar.steps", Value: "x", Want: "want a number"}}
	if r := e.Evaluate(bad, snap); len(r.Nodes) != 0 || !strings.Contains(r.Why, "hadar.steps") {
		t.Fatalf("refused spec: %+v", r)
	}
	j := trainJob("j", "nvidia/gpu")
	spec, err := jobspec.Parse(j)
	if err != nil {
		t.Fatal(err)
	}
	spec.Group = "gone"
	if r := Evaluate(j, spec, snap, typeOf); len(r.Nodes) != 0 || r.Why != `job "j": template group "gone" is missing` {
		t.Fatalf("missing group: %+v", r)
	}
}
