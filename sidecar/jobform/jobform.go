// Package jobform turns a managed job's template into the Nomad job that
// runs a placement, and reads a placement back from a job. A managed job
// has two forms in Nomad (docs/sidecar.md, "How a placement is written"):
//
//   - held: the job as its author submitted it, or as hadar returns it
//     when it evicts the job: the template task group with count 1 and the
//     gate constraint, so Nomad keeps its evaluation blocked and the job
//     pending (never garbage-collected), and `nomad job status` shows why;
//   - placed: the template group with count 0 (it keeps the gate), plus one
//     generated task group per worker, "<template>-hadar-u<unit>-w<rank>",
//     each pinned to its node with a ${node.unique.id} constraint and to its
//     GPU models with a ${device.model} constraint on the GPU request, and
//     given the distributed-training environment torchrun uses.
//
// A unit keeps its number across rewrites as long as it runs on the same
// GPUs, so a rewrite that forks, unforks or moves one unit leaves every
// other generated group byte for byte as it was: Nomad ignores them and
// their allocations go on. Nothing hadar needs to remember is written into
// meta (a meta change restarts a running job); the generated groups are the
// record a restarted sidecar rebuilds placements from.
package jobform

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// Attributes the placed form constrains.
const (
	NodeAttribute  = "${node.unique.id}"
	ModelAttribute = "${device.model}"
	// PortLabel is the rendezvous port of a unit's rank 0.
	PortLabel = "hadar_rdzv"
)

// Unit is one placement unit of a job as written: a number stable while it
// runs on the same GPUs, and its workers in rank order.
type Unit struct {
	ID      int
	Workers []Worker
	// Port is the rendezvous port of rank 0 (MASTER_PORT).
	Port int
}

// Worker is one GPU of a unit.
type Worker struct {
	Node string
	Type planner.GPUType
	// Models are the device group names (${device.model}) of that type on
	// the node; the worker may use any of them.
	Models []string
	// Addr is the address of the unit's rank 0 node (MASTER_ADDR); it is
	// what the worker's environment carries.
	Addr string
}

// Planner returns the planner unit of u.
func (u Unit) Planner() planner.Unit {
	var out planner.Unit
	for _, w := range u.Workers {
		if n := len(out.Slots); n > 0 && out.Slots[n-1].Node == w.Node && out.Slots[n-1].Type == w.Type {
			out.Slots[n-1].Count++
			continue
		}
		out.Slots = append(out.Slots, planner.Slot{Node: w.Node, Type: w.Type, Count: 1})
	}
	return out
}

// GroupName is the generated group of worker rank of unit id (the naming
// contract lives in jobspec, which refuses templates that use it).
func GroupName(template string, unit, rank int) string {
	return jobspec.GeneratedGroupName(template, unit, rank)
}

// ParseGroupName reads a generated group's name; ok is false for any other
// group.
func ParseGroupName(name string) (template string, unit, rank int, ok bool) {
	return jobspec.ParseGeneratedGroup(name)
}

// clone deep-copies through JSON: api types carry pointers everywhere,
// and the template must never share memory with what is written.
func clone[T any](v T) (T, error) {
	var out T
	b, err := json.Marshal(v)
	if err != nil {
		return out, err
	}
	err = json.Unmarshal(b, &out)
	return out, err
}

// ErrorAttribute is the attribute of the constraint that carries hadar's
// error onto a job it refuses (the sidecar's refusal note): no node has
// it, so Nomad shows the error as the reason the job waits. Every form
// jobform writes drops it.
const ErrorAttribute = "${meta.hadar.error}"

// WithoutNotes returns cs without refusal notes (ErrorAttribute).
func WithoutNotes(cs []*api.Constraint) []*api.Constraint {
	var out []*api.Constraint
	for _, c := range cs {
		if c == nil || c.LTarget != ErrorAttribute {
			out = append(out, c)
		}
	}
	return out
}

func withoutGate(cs []*api.Constraint) []*api.Constraint {
	var out []*api.Constraint
	for _, c := range cs {
		if !jobspec.IsGate(c) {
			out = append(out, c)
		}
	}
	return out
}

func withGate(cs []*api.Constraint) []*api.Constraint {
	if slices.ContainsFunc(cs, jobspec.IsGate) {
		return cs
	}
	return append(cs, jobspec.GateConstraint())
}

// template returns the job's template group.
func template(job *api.Job, spec jobspec.Spec) (*api.TaskGroup, error) {
	for _, g := range job.TaskGroups {
		if g != nil && g.Name != nil && *g.Name == spec.Group {
			return g, nil
		}
	}
	return nil, fmt.Errorf("job %q: template group %q is missing", spec.JobID, spec.Group)
}

// Held returns the held form of job: generated groups removed, the
// template group with count 1 and the gate.
func Held(job *api.Job, spec jobspec.Spec) (*api.Job, error) {
	out, err := clone(job)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", spec.JobID, err)
	}
	var keep []*api.TaskGroup
	for _, g := range out.TaskGroups {
		if _, _, _, gen := ParseGroupName(deref(g.Name)); !gen {
			keep = append(keep, g)
		}
	}
	out.TaskGroups = keep
	out.Constraints = WithoutNotes(out.Constraints)
	t, err := template(out, spec)
	if err != nil {
		return nil, err
	}
	one := 1
	t.Count = &one
	if !jobspec.HasGate(out) {
		t.Constraints = withGate(t.Constraints)
	}
	return out, nil
}

// Placed returns the placed form of job running units (the whole
// placement: units not listed are removed). Generated groups of units that
// are already written with the same workers are kept as they are, so
// Nomad leaves their allocations alone.
func Placed(job *api.Job, spec jobspec.Spec, units []Unit) (*api.Job, error) {
	out, err := clone(job)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", spec.JobID, err)
	}
	current, err := Units(job, spec)
	if err != nil {
		return nil, err
	}
	t, err := template(out, spec)
	if err != nil {
		return nil, err
	}
	existing := map[string]*api.TaskGroup{}
	var kept []*api.TaskGroup
	for _, g := range out.TaskGroups {
		if _, _, _, gen := ParseGroupName(deref(g.Name)); gen {
			existing[*g.Name] = g
		} else {
			kept = append(kept, g)
		}
	}
	// The gate moves from the job to the template group: job-level
	// constraints apply to the generated groups too.
	if slices.ContainsFunc(out.Constraints, jobspec.IsGate) {
		out.Constraints = withoutGate(out.Constraints)
	}
	out.Constraints = WithoutNotes(out.Constraints)
	t.Constraints = withGate(t.Constraints)
	zero := 0
	t.Count = &zero
	out.TaskGroups = kept
	seen := map[int]bool{}
	for _, u := range units {
		if seen[u.ID] || u.ID < 0 {
			return nil, fmt.Errorf("job %q: unit number %d given twice or negative", spec.JobID, u.ID)
		}
		seen[u.ID] = true
		if len(u.Workers) == 0 {
			return nil, fmt.Errorf("job %q: unit %d has no workers", spec.JobID, u.ID)
		}
		same := false
		for _, c := range current {
			same = same || (c.ID == u.ID && sameWorkers(c, u))
		}
		for rank := range u.Workers {
			name := GroupName(spec.Group, u.ID, rank)
			if g := existing[name]; same && g != nil {
				out.TaskGroups = append(out.TaskGroups, g)
				continue
			}
			g, err := worker(t, spec, u, rank)
			if err != nil {
				return nil, err
			}
			out.TaskGroups = append(out.TaskGroups, g)
		}
	}
	return out, nil
}

func sameWorkers(a, b Unit) bool {
	if len(a.Workers) != len(b.Workers) || a.Port != b.Port {
		return false
	}
	for i := range a.Workers {
		x, y := a.Workers[i], b.Workers[i]
		if x.Node != y.Node || x.Type != y.Type {
			return false
		}
	}
	return true
}

// worker builds the generated group of one worker from the template.
func worker(t *api.TaskGroup, spec jobspec.Spec, u Unit, rank int) (*api.TaskGroup, error) {
	g, err := clone(t)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", spec.JobID, err)
	}
	w := u.Workers[rank]
	name := GroupName(spec.Group, u.ID, rank)
	g.Name = &name
	one := 1
	g.Count = &one
	g.Scaling = nil // a policy for the template is not one per worker
	g.Constraints = append(withoutGate(g.Constraints), api.NewConstraint(NodeAttribute, "=", w.Node))
	// The unit's layout: which nodes, in order, and each worker's place.
	var nodes []string
	local, localSize := 0, 0
	for i, x := range u.Workers {
		if !slices.Contains(nodes, x.Node) {
			nodes = append(nodes, x.Node)
		}
		if x.Node == w.Node {
			if i < rank {
				local++
			}
			localSize++
		}
	}
	env := map[string]string{
		contract.EnvRank: strconv.Itoa(rank), contract.EnvWorldSize: strconv.Itoa(len(u.Workers)),
		contract.EnvLocalRank: strconv.Itoa(local), contract.EnvLocalWorldSize: strconv.Itoa(localSize),
		contract.EnvGroupRank: strconv.Itoa(slices.Index(nodes, w.Node)), contract.EnvNodeRank: strconv.Itoa(slices.Index(nodes, w.Node)),
		contract.EnvMasterAddr: u.Workers[0].Addr, contract.EnvMasterPort: strconv.Itoa(u.Port),
		contract.EnvUnit: strconv.Itoa(u.ID), contract.EnvTemplate: spec.Group,
		contract.EnvGPUType: string(w.Type), contract.EnvTotalSteps: strconv.FormatInt(spec.Steps, 10), contract.EnvManagedBy: "hadar-sidecar",
	}
	if len(w.Models) == 1 {
		env[contract.EnvGPUModel] = w.Models[0]
	}
	found := false
	for _, task := range g.Tasks {
		if task == nil || task.Name != spec.Task {
			continue
		}
		found = true
		if task.Env == nil {
			task.Env = map[string]string{}
		}
		for k, v := range env {
			task.Env[k] = v
		}
		if task.Resources == nil {
			continue
		}
		for _, d := range task.Resources.Devices {
			if d == nil || d.Name != spec.Device {
				continue
			}
			var cs []*api.Constraint
			for _, c := range d.Constraints {
				if c != nil && c.LTarget != ModelAttribute {
					cs = append(cs, c)
				}
			}
			models := slices.Clone(w.Models)
			sort.Strings(models)
			if len(models) == 0 {
				return nil, fmt.Errorf("job %q: worker %d of unit %d on node %s: no GPU model of type %s there", spec.JobID, rank, u.ID, w.Node, w.Type)
			}
			d.Constraints = append(cs, api.NewConstraint(ModelAttribute, "set_contains_any", strings.Join(models, ",")))
		}
	}
	if !found {
		return nil, fmt.Errorf("job %q: template group %q has no task %q", spec.JobID, spec.Group, spec.Task)
	}
	if rank == 0 {
		// Rank 0 reserves the rendezvous port: Nomad refuses the placement
		// rather than start a unit whose port another task holds.
		net := &api.NetworkResource{ReservedPorts: []api.Port{{Label: PortLabel, Value: u.Port}}}
		if len(g.Networks) > 0 && g.Networks[0] != nil {
			net = g.Networks[0]
			net.ReservedPorts = append(net.ReservedPorts, api.Port{Label: PortLabel, Value: u.Port})
		} else {
			g.Networks = append(g.Networks, net)
		}
	}
	return g, nil
}

// Units reads the placement written in job: its generated groups, by unit
// and rank. A unit with a missing rank or a group not in the placed form's
// shape is an error: the job was edited by hand.
func Units(job *api.Job, spec jobspec.Spec) ([]Unit, error) {
	byUnit := map[int]map[int]Worker{}
	ports := map[int]int{}
	for _, g := range job.TaskGroups {
		tmpl, id, rank, ok := ParseGroupName(deref(g.Name))
		if !ok || tmpl != spec.Group {
			continue
		}
		w, port, err := readWorker(g, spec)
		if err != nil {
			return nil, fmt.Errorf("job %q group %q: %w", spec.JobID, *g.Name, err)
		}
		if byUnit[id] == nil {
			byUnit[id] = map[int]Worker{}
		}
		byUnit[id][rank] = w
		if rank == 0 {
			ports[id] = port
		}
	}
	var out []Unit
	for id, ranks := range byUnit {
		u := Unit{ID: id, Port: ports[id]}
		for r := range len(ranks) {
			w, ok := ranks[r]
			if !ok {
				return nil, fmt.Errorf("job %q unit %d: rank %d is missing (ranks must be 0..%d): the job was edited by hand", spec.JobID, id, r, len(ranks)-1)
			}
			u.Workers = append(u.Workers, w)
		}
		out = append(out, u)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out, nil
}

func readWorker(g *api.TaskGroup, spec jobspec.Spec) (Worker, int, error) {
	var w Worker
	for _, c := range g.Constraints {
		if c != nil && c.LTarget == NodeAttribute && (c.Operand == "=" || c.Operand == "") {
			w.Node = c.RTarget
		}
	}
	if w.Node == "" {
		return w, 0, fmt.Errorf("no %s constraint", NodeAttribute)
	}
	port := 0
	for _, t := range g.Tasks {
		if t == nil || t.Name != spec.Task {
			continue
		}
		w.Type = planner.GPUType(t.Env[contract.EnvGPUType])
		w.Addr = t.Env[contract.EnvMasterAddr]
		if p, err := strconv.Atoi(t.Env[contract.EnvMasterPort]); err == nil {
			port = p
		}
		if t.Resources != nil {
			for _, d := range t.Resources.Devices {
				for _, c := range d.Constraints {
					if c != nil && c.LTarget == ModelAttribute {
						w.Models = strings.Split(c.RTarget, ",")
					}
				}
			}
		}
	}
	if w.Type == "" {
		return w, 0, fmt.Errorf("no %s in task %q's env", contract.EnvGPUType, spec.Task)
	}
	return w, port, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
