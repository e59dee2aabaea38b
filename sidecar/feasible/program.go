package feasible

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// Nomad's node pools with a meaning of their own (nomad/structs/node_pool.go).
const (
	poolDefault = "default"
	poolAll     = "all"
)

// The device hadar schedules: what watch keeps of a node's devices.
const (
	gpuVendor = "nvidia"
	gpuType   = "gpu"
)

// Nomad's task defaults (api.DefaultResources, api.DefaultEphemeralDisk),
// for a job read without them.
const (
	defaultCPU      = 100
	defaultMemoryMB = 300
	defaultDiskMB   = 300
)

// stage is a step of Nomad's placement pipeline, in the order Nomad runs
// them (scheduler/feasible/stack.go): the nodes of the job's pool and
// datacenters that are ready, then the job's constraints, then the task
// group's drivers, constraints and devices, then bin packing. A node is
// excluded at the first stage it fails.
type stage uint8

const (
	stageNone stage = iota
	stagePool
	stageDatacenter
	stageReady
	stageJobConstraint
	stageDriver
	stageGroupConstraint
	stageDevice
	stageGPUType
	stageHostVolume
	stageResources
)

// Keys of Result.Excluded that are not a constraint or a pool: Nomad's
// own words where it has them (scheduler/feasible/feasible.go).
const (
	keyNotReady = "node not ready"
	keyDevices  = "missing devices"
	keyNoType   = "GPU model without a hadar GPU type"
)

// constraint is one placement constraint; key is how Nomad writes it in
// ConstraintFiltered: "LTarget Operand RTarget".
type constraint struct {
	l, op, r string
	key      string
}

func newConstraint(l, op, r string) constraint {
	return constraint{l: l, op: op, r: r, key: l + " " + op + " " + r}
}

// driver is a task driver the group needs; key its Excluded key.
type driver struct {
	name, key string
}

// hostVolume is a host volume the group mounts: the node must offer
// source, writable unless readOnly.
type hostVolume struct {
	source   string
	readOnly bool
	key      string
}

// task is what one task of the group asks for.
type task struct {
	cpu, memoryMB int64
	cores         int
	// lifecycle: "" for a main task, else its hook; sidecar for a
	// prestart task that runs beside the main ones.
	hook    string
	sidecar bool
}

// program is a managed job's placement rules, read once from the job.
type program struct {
	pool, poolKey string
	dcNames       []string
	dcs           []globPattern
	dcKey         string
	jobCons       []constraint
	drivers       []driver
	groupCons     []constraint
	volumes       []hostVolume
	// device is the GPU request's name; vendor, typ and model its parts
	// (Nomad's RequestedDevice.ID); devCons its constraints.
	device             string
	vendor, typ, model string
	devCons            []constraint
	tasks              []task
	diskMB             int64
	distinctHosts      bool
	m                  *matchers
	typeOf             func(string) planner.GPUType
	fits               *fitCache
}

// compile reads job's rules. spec is the job's parsed contract: the
// template group and the GPU request are read from it. It fails only
// when the job does not have the shape spec says.
func compile(job *api.Job, spec jobspec.Spec, typeOf func(string) planner.GPUType, fits *fitCache) (*program, error) {
	if job == nil {
		return nil, fmt.Errorf("job %q: no job to evaluate", spec.JobID)
	}
	var g *api.TaskGroup
	for _, tg := range job.TaskGroups {
		if tg != nil && tg.Name != nil && *tg.Name == spec.Group {
			g = tg
		}
	}
	if g == nil {
		return nil, fmt.Errorf("job %q: template group %q is missing", spec.JobID, spec.Group)
	}
	p := &program{pool: poolDefault, dcNames: job.Datacenters, m: newMatchers(), typeOf: typeOf, diskMB: defaultDiskMB, fits: fits}
	if job.NodePool != nil && *job.NodePool != "" {
		p.pool = *job.NodePool
	}
	p.poolKey = fmt.Sprintf("node pool %q", p.pool)
	if len(p.dcNames) == 0 {
		p.dcNames = []string{"*"} // Nomad's default since 1.5 (api.Job.Canonicalize)
	}
	for _, dc := range p.dcNames {
		p.dcs = append(p.dcs, newGlob(dc))
	}
	p.dcKey = "datacenters " + quoteList(p.dcNames)
	var distinct bool
	p.jobCons, distinct = placement(job.Constraints)
	p.distinctHosts = distinct
	p.groupCons, distinct = placement(g.Constraints)
	p.distinctHosts = p.distinctHosts || distinct
	var names []string
	for name := range g.Volumes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v := g.Volumes[name]
		if v == nil || v.Type != "host" {
			continue // CSI volumes are not planned with
		}
		src := v.Source
		if v.PerAlloc {
			// Nomad appends the allocation's index; each group hadar
			// generates runs one allocation, index 0.
			src += "[0]"
		}
		p.volumes = append(p.volumes, hostVolume{source: src, readOnly: v.ReadOnly, key: fmt.Sprintf("missing host volume %q", src)})
	}
	if g.EphemeralDisk != nil && g.EphemeralDisk.SizeMB != nil {
		p.diskMB = int64(*g.EphemeralDisk.SizeMB)
	}
	found := false
	for _, t := range g.Tasks {
		if t == nil {
			continue
		}
		if t.Driver != "" && !slices.ContainsFunc(p.drivers, func(d driver) bool { return d.name == t.Driver }) {
			p.drivers = append(p.drivers, driver{t.Driver, fmt.Sprintf("missing driver %q", t.Driver)})
		}
		// Task constraints join the group's (TaskGroupConstraints in
		// Nomad's stack.go); distinct_hosts counts at job and group level
		// only.
		cs, _ := placement(t.Constraints)
		p.groupCons = append(p.groupCons, cs...)
		p.tasks = append(p.tasks, taskAsk(t))
		if t.Name != spec.Task || t.Resources == nil {
			continue
		}
		for _, d := range t.Resources.Devices {
			if d != nil && d.Name == spec.Device && !found {
				found = true
				p.device = d.Name
				p.vendor, p.typ, p.model = deviceID(d.Name)
				for _, c := range d.Constraints {
					if c != nil {
						p.devCons = append(p.devCons, newConstraint(c.LTarget, operand(c.Operand), c.RTarget))
					}
				}
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("job %q: task %q of group %q has no device %q", spec.JobID, spec.Task, spec.Group, spec.Device)
	}
	sort.Slice(p.drivers, func(i, j int) bool { return p.drivers[i].name < p.drivers[j].name })
	return p, nil
}

// placement keeps the constraints Nomad filters nodes with, leaving out
// hadar's own (the gate and the refusal note, which no node satisfies on
// purpose) and the ones about several allocations, and reports whether
// distinct_hosts is on. distinct_property is left out: it limits how many
// allocations share a property value, which depends on where the other
// workers go, not on one node.
func placement(cs []*api.Constraint) (out []constraint, distinctHosts bool) {
	for _, c := range cs {
		if c == nil || c.LTarget == jobspec.GateAttribute || c.LTarget == jobform.ErrorAttribute {
			continue
		}
		switch op := operand(c.Operand); op {
		case opDistinctHosts:
			// On unless its value parses as false (Nomad's
			// DistinctHostsIterator.hasDistinctHostsConstraint).
			on, err := strconv.ParseBool(c.RTarget)
			distinctHosts = distinctHosts || c.RTarget == "" || err != nil || on
		case opDistinctProperty:
		default:
			out = append(out, newConstraint(c.LTarget, op, c.RTarget))
		}
	}
	return out, distinctHosts
}

// deviceID splits a device request's name as Nomad does
// (RequestedDevice.ID): "type", "vendor/type" or "vendor/type/name".
func deviceID(name string) (vendor, typ, model string) {
	parts := strings.SplitN(name, "/", 3)
	switch len(parts) {
	case 1:
		return "", parts[0], ""
	case 2:
		return parts[0], parts[1], ""
	}
	return parts[0], parts[1], parts[2]
}

// taskAsk is what a task asks for, with Nomad's defaults for what the job
// leaves out (api.Resources.Canonicalize: cpu 100 unless cores are set,
// memory 300); secrets memory counts as memory (BinPackIterator).
func taskAsk(t *api.Task) task {
	out := task{cpu: defaultCPU, memoryMB: defaultMemoryMB}
	if r := t.Resources; r != nil {
		if r.CPU != nil {
			out.cpu = int64(*r.CPU)
		}
		if r.Cores != nil && *r.Cores > 0 {
			// Nomad gives a task with cores their bandwidth, not a cpu
			// figure (a job may not set both).
			out.cores, out.cpu = *r.Cores, 0
		}
		if r.MemoryMB != nil {
			out.memoryMB = int64(*r.MemoryMB)
		}
		if r.SecretsMB != nil {
			out.memoryMB += int64(*r.SecretsMB)
		}
	}
	if l := t.Lifecycle; l != nil {
		out.hook, out.sidecar = l.Hook, l.Sidecar
	}
	return out
}

// ask is one worker's group on node n: CPU, memory and disk, and whole
// cores. Like Nomad's AllocatedResources.Comparable, a prestart task that
// is not a sidecar, and a poststop task, run apart from the main tasks, so
// only the largest of the three phases counts; a task's reserved cores
// always count, at the node's mean core speed (Nomad sums the speeds of
// the very cores it picks).
func (p *program) ask(n *watch.Node) (watch.Resources, int) {
	var main, pre, post watch.Resources
	var flat watch.Resources
	cores := 0
	for _, t := range p.tasks {
		r := watch.Resources{CPU: t.cpu, MemoryMB: t.memoryMB}
		if t.cores > 0 {
			cores += t.cores
			if n.Cores > 0 {
				flat.CPU += int64(t.cores) * n.Resources.CPU / int64(n.Cores)
			}
		}
		switch {
		case t.hook == api.TaskLifecycleHookPrestart && t.sidecar:
			pre, main = pre.Add(r), main.Add(r)
		case t.hook == api.TaskLifecycleHookPrestart:
			pre = pre.Add(r)
		case t.hook == api.TaskLifecycleHookPoststop:
			post = post.Add(r)
		default:
			main = main.Add(r)
		}
	}
	out := flat.Add(watch.Resources{
		CPU:      max(main.CPU, pre.CPU, post.CPU),
		MemoryMB: max(main.MemoryMB, pre.MemoryMB, post.MemoryMB),
		DiskMB:   p.diskMB,
	})
	return out, cores
}

// verdict is the outcome for one node: allowed (stage none) with its fit,
// or the stage and key that excluded it, with what Why needs to explain.
type verdict struct {
	stage stage
	key   string
	fit   NodeFit
	// stageGPUType: the matching models without a planner type.
	models []string
	// stageResources: the exhausted dimension's ask and what the node
	// has free of it.
	ask, free int64
}

// judge runs the pipeline on one node. free is what allocations of work
// hadar does not plan leave of the node; known is false when the node
// reports no capacity (then resources are not judged).
func (p *program) judge(n *watch.Node, free watch.Resources, known bool) verdict {
	if p.pool != poolAll && nodePool(n) != p.pool {
		return verdict{stage: stagePool, key: p.poolKey}
	}
	if !slices.ContainsFunc(p.dcs, func(g globPattern) bool { return g.match(n.Datacenter) }) {
		return verdict{stage: stageDatacenter, key: p.dcKey}
	}
	if n.Status != api.NodeStatusReady {
		return verdict{stage: stageReady, key: keyNotReady}
	}
	if c, ok := p.failed(p.jobCons, n); !ok {
		return verdict{stage: stageJobConstraint, key: c.key}
	}
	for _, d := range p.drivers {
		if !hasDriver(n, d.name) {
			return verdict{stage: stageDriver, key: d.key}
		}
	}
	if c, ok := p.failed(p.groupCons, n); !ok {
		return verdict{stage: stageGroupConstraint, key: c.key}
	}
	var mask uint64 // the matching groups, by index in n.GPUs, when it has at most 64
	var matched []*watch.GPUGroup
	for i := range n.GPUs {
		if g := &n.GPUs[i]; g.Healthy > 0 && p.deviceMatches(g) {
			matched = append(matched, g)
			if i < 64 {
				mask |= 1 << i
			}
		}
	}
	if len(matched) == 0 {
		return verdict{stage: stageDevice, key: keyDevices}
	}
	fit, gpus := p.fits.models(n, mask, len(n.GPUs) <= 64, matched, p.typeOf)
	if len(fit.Models) == 0 {
		var untyped []string
		for _, g := range matched {
			untyped = append(untyped, g.Model)
		}
		return verdict{stage: stageGPUType, key: keyNoType, models: untyped}
	}
	for _, v := range p.volumes {
		if !hasVolume(n, v) {
			return verdict{stage: stageHostVolume, key: v.key}
		}
	}
	// One worker per GPU: the node's allowed healthy GPUs bound the
	// workers whatever their CPU and memory.
	fit.Workers = gpus
	if known {
		ask, cores := p.ask(n)
		dims := [...]struct {
			key       string
			ask, free int64
		}{
			{"cores exhausted", int64(cores), int64(n.Cores)}, {"cpu exhausted", ask.CPU, free.CPU},
			{"memory exhausted", ask.MemoryMB, free.MemoryMB}, {"disk exhausted", ask.DiskMB, free.DiskMB},
		}
		// Nomad's order: cores as it picks them (BinPackIterator), then
		// ComparableResources.Superset's.
		for _, d := range dims {
			if d.ask <= 0 {
				continue
			}
			if d.free < d.ask {
				return verdict{stage: stageResources, key: d.key, ask: d.ask, free: d.free}
			}
			fit.Workers = int(min(d.free/d.ask, int64(fit.Workers)))
		}
	}
	return verdict{fit: fit}
}

// failed returns the first constraint n fails; ok is true when it passes
// them all.
func (p *program) failed(cs []constraint, n *watch.Node) (constraint, bool) {
	for _, c := range cs {
		l, lOK := resolveNode(c.l, n)
		r, rOK := resolveNode(c.r, n)
		if !p.m.checkNode(c.op, l, r, lOK, rOK) {
			return c, false
		}
	}
	return constraint{}, true
}

// hasDriver is Nomad's DriverChecker: the driver's info when the node
// reports one, else its driver.<name> attribute.
func hasDriver(n *watch.Node, d string) bool {
	if ok, reported := n.Drivers[d]; reported {
		return ok
	}
	v, ok := n.Attributes["driver."+d]
	if !ok {
		return false
	}
	on, err := strconv.ParseBool(v)
	return err == nil && on
}

// hasVolume is Nomad's HostVolumeChecker for one volume: the node offers
// the source, and a static read-only volume only to a read-only mount. A
// dynamic volume's state, capabilities and claims live in Nomad's state
// store, not on the node: hadar checks that the node has it, and Nomad
// the rest.
func hasVolume(n *watch.Node, v hostVolume) bool {
	hv, ok := n.HostVolumes[v.source]
	return ok && (hv.Dynamic || v.readOnly || !hv.ReadOnly)
}

// deviceMatches is Nomad's nodeDeviceMatches for the GPU request: the
// request's vendor, type and name, where given, are the group's, and the
// group meets every device constraint.
func (p *program) deviceMatches(g *watch.GPUGroup) bool {
	if p.model != "" && p.model != g.Model || p.vendor != "" && p.vendor != gpuVendor || p.typ != "" && p.typ != gpuType {
		return false
	}
	for _, c := range p.devCons {
		l, lOK := resolveDevice(c.l, g)
		r, rOK := resolveDevice(c.r, g)
		if !p.m.checkDevice(c.op, l, r, lOK, rOK) {
			return false
		}
	}
	return true
}

func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// fitCache shares the Models maps of NodeFits: every job whose GPU
// request matches the same GPU groups of a node gets the same map (Results
// are never modified), which saves a map per job and node. A nil cache
// shares nothing.
type fitCache struct {
	byNode map[*watch.Node]map[uint64]fitShare
}

type fitShare struct {
	models map[planner.GPUType][]string
	gpus   int
}

func newFitCache() *fitCache { return &fitCache{byNode: map[*watch.Node]map[uint64]fitShare{}} }

// models returns the allowed models of n by planner type, and their
// healthy GPUs, for the matching groups (mask says which, when shareable).
func (c *fitCache) models(n *watch.Node, mask uint64, shareable bool, matched []*watch.GPUGroup, typeOf func(string) planner.GPUType) (NodeFit, int) {
	shareable = shareable && c != nil
	if shareable {
		if f, ok := c.byNode[n][mask]; ok {
			return NodeFit{Models: f.models}, f.gpus
		}
	}
	var f fitShare
	for _, g := range matched {
		t := typeOf(g.Model)
		if t == "" {
			continue
		}
		if f.models == nil {
			f.models = map[planner.GPUType][]string{}
		}
		f.models[t] = append(f.models[t], g.Model)
		f.gpus += g.Healthy
	}
	for _, ms := range f.models {
		sort.Strings(ms)
	}
	if shareable {
		if c.byNode[n] == nil {
			c.byNode[n] = map[uint64]fitShare{}
		}
		c.byNode[n][mask] = f
	}
	return NodeFit{Models: f.models}, f.gpus
}

// forget drops what the cache holds for nodes that are not current.
func (c *fitCache) forget(current func(*watch.Node) bool) {
	for n := range c.byNode {
		if !current(n) {
			delete(c.byNode, n)
		}
	}
}
