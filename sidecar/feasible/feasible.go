// Package feasible says where a managed job may run by Nomad's own
// placement rules, so that hadar plans only placements Nomad accepts
// instead of writing one, watching Nomad refuse it, and backing off.
//
// For each node it runs the rules Nomad's scheduler runs, in its order
// (scheduler/feasible in Nomad's source is the reference; each check names
// the Nomad function it follows): the job's node pool and datacenters, the
// node being ready, the job's constraints, the template group's task
// drivers and its group and task constraints, the GPU request (a model
// pinned by name, device constraints on ${device.model} and
// ${device.attr.*}), its host volumes, and whether one worker's CPU,
// memory and disk fit what the node has left. It leaves out what is the
// planner's business (eligibility and drain, GPUs held by other jobs),
// what depends on where the other workers go (distinct_hosts, reported in
// Result; distinct_property) and soft preferences (affinities, spreads).
//
// The rules read are the template group's (jobspec.Spec.Group): hadar's
// own gate, refusal note and the node pins of the groups it generates are
// not the author's rules. docs/jobspec.md, "What hadar plans with", says
// the same for job authors.
package feasible

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// NodeFit is what a job may use on one node.
type NodeFit struct {
	// Models are the GPU models the job may use there, by planner type,
	// sorted; each has a healthy GPU. What jobform pins a worker to.
	Models map[planner.GPUType][]string
	// Workers is how many of the job's workers the node can hold: at most
	// one per allowed healthy GPU, and as many as its CPU, memory and disk
	// fit after what allocations of work hadar does not plan hold (jobs
	// it does not manage, managed jobs whose spec it refuses). Sharing the
	// node with other jobs hadar plans is the planner's to weigh (Ask,
	// Free).
	Workers int
}

// Result is where a job may run.
type Result struct {
	// Nodes by node ID: the nodes the job may use, and how. A node not in
	// the map allows nothing.
	Nodes map[string]NodeFit
	// Ask is one worker's share of a node: its group's CPU (MHz), memory
	// and disk (MB), as Nomad fits it. A task that reserves whole cores
	// adds their bandwidth, which depends on the node: Ask leaves it out
	// and Cores counts them.
	Ask   watch.Resources
	Cores int
	// DistinctHosts is set when the job asks for distinct_hosts (at job or
	// group level): each worker on a node of its own. Nomad enforces the
	// job-level one across hadar's generated groups; the group-level one
	// is the author's intent too, though Nomad checks it per group only.
	DistinctHosts bool
	// Why is "" when some node allows some GPU type; else why none does,
	// in one line a person can act on, e.g.
	// `constraint ${attr.kernel.name} = windows: no node matches`.
	Why string
	// Excluded counts the nodes each rule excluded, by the first rule a
	// node failed: a constraint as Nomad writes it in ConstraintFiltered
	// ("${attr.kernel.name} = windows"), `node pool "gpu"`,
	// `datacenters ["dc2"]`, "node not ready", `missing driver "docker"`,
	// "missing devices", "GPU model without a hadar GPU type",
	// `missing host volume "imagenet"`, or a dimension ("memory
	// exhausted"; cpu, cores, disk).
	Excluded map[string]int
}

// Allows reports whether the job may use GPUs of type t on node.
func (r Result) Allows(node string, t planner.GPUType) bool {
	_, ok := r.Nodes[node].Models[t]
	return ok
}

// Allowed returns, by node ID, the GPU types the job may use there.
func (r Result) Allowed() map[string]map[planner.GPUType]bool {
	out := make(map[string]map[planner.GPUType]bool, len(r.Nodes))
	for id, f := range r.Nodes {
		m := make(map[planner.GPUType]bool, len(f.Models))
		for t := range f.Models {
			m[t] = true
		}
		out[id] = m
	}
	return out
}

// Evaluate returns where a managed job may run in snap: job is the job as
// Nomad holds it, spec its parsed contract, typeOf the planner's GPU type
// of a device model ("" for none). It reads everything afresh; an
// Evaluator caches across snapshots.
func Evaluate(job *api.Job, spec jobspec.Spec, snap *watch.Snapshot, typeOf func(model string) planner.GPUType) Result {
	p, err := compile(job, spec, typeOf, nil)
	if err != nil {
		return Result{Why: err.Error(), Excluded: map[string]int{}}
	}
	fixed := fixedUsage(snap)
	r, _ := p.evaluate(func(yield func(string, *watch.Node, watch.Resources, bool) bool) {
		for id, n := range snap.Nodes {
			free, known := freeOn(n, fixed[id])
			if !yield(id, n, free, known) {
				return
			}
		}
	}, len(snap.Nodes))
	return r
}

// Free returns, by node ID, what each node has left for the jobs hadar
// plans: its capacity less what it reserves and what allocations of work
// hadar does not plan hold. Nodes that report no capacity are left out.
func Free(snap *watch.Snapshot) map[string]watch.Resources {
	fixed := fixedUsage(snap)
	out := make(map[string]watch.Resources, len(snap.Nodes))
	for id, n := range snap.Nodes {
		if free, known := freeOn(n, fixed[id]); known {
			out[id] = free
		}
	}
	return out
}

// fixedUsage sums, by node, what allocations of work hadar does not plan
// hold: jobs it does not manage (or does not watch) and managed jobs whose
// spec it refuses. What the jobs it plans hold is the planner's to move.
func fixedUsage(snap *watch.Snapshot) map[string]watch.Resources {
	out := map[string]watch.Resources{}
	for _, u := range snap.Usage {
		if j := snap.Jobs[u.Job]; j != nil && j.Managed && j.Spec != nil {
			continue
		}
		out[u.NodeID] = out[u.NodeID].Add(u.Resources)
	}
	return out
}

// freeOn is what node n has left after used; known is false when n
// reports no capacity at all (a view built without it).
func freeOn(n *watch.Node, used watch.Resources) (watch.Resources, bool) {
	if n.Resources == (watch.Resources{}) {
		return watch.Resources{}, false
	}
	return n.Resources.Sub(n.Reserved).Sub(used), true
}

// nodeSeq yields every node with what it has free (and whether that is
// known).
type nodeSeq func(yield func(id string, n *watch.Node, free watch.Resources, known bool) bool)

// evaluate judges every node and assembles the Result; excludedBy maps
// each excluded node to its Excluded key.
func (p *program) evaluate(nodes nodeSeq, size int) (Result, map[string]string) {
	r := p.empty()
	r.Nodes = make(map[string]NodeFit, size)
	excludedBy := map[string]string{}
	nodes(func(id string, n *watch.Node, free watch.Resources, known bool) bool {
		v := p.judge(n, free, known)
		if v.stage == stageNone {
			r.Nodes[id] = v.fit
		} else {
			r.Excluded[v.key]++
			excludedBy[id] = v.key
		}
		return true
	})
	if len(r.Nodes) == 0 {
		// Rare and worth a second pass: the details only Why needs.
		var vs []verdict
		nodes(func(_ string, n *watch.Node, free watch.Resources, known bool) bool {
			vs = append(vs, p.judge(n, free, known))
			return true
		})
		r.Why = p.why(vs)
	}
	return r, excludedBy
}

// empty is a Result with the job's own facts and no node yet.
func (p *program) empty() Result {
	r := Result{Nodes: map[string]NodeFit{}, Excluded: map[string]int{}, DistinctHosts: p.distinctHosts}
	r.Ask, r.Cores = p.ask(&watch.Node{})
	return r
}

// Evaluator evaluates managed jobs against a stream of snapshots, and
// redoes only what changed: a job's rules are read again when its spec
// changes (JobModifyIndex), and only the nodes that changed since its last
// Result (the node itself, or what it has free) are judged again, on a
// copy of that Result. With neither, a job's Result is the one before.
// Results share their maps with the cache: never modify one. Safe for
// concurrent use.
type Evaluator struct {
	typeOf func(string) planner.GPUType

	mu sync.Mutex
	// types caches typeOf.
	types map[string]planner.GPUType
	// snap is the snapshot nodes reflect; gen counts the snapshots that
	// changed a node (added, removed, changed, or its free share), and
	// changes lists the nodes each one changed, oldest first.
	snap    *watch.Snapshot
	nodes   map[string]nodeState
	gen     uint64
	changes []nodeChange
	// maxChanges bounds changes; a job whose Result is older than the
	// log is judged afresh.
	maxChanges int
	jobs       map[watch.JobKey]*entry
	fits       *fitCache
	stats      EvaluatorStats
}

// EvaluatorStats count an Evaluator's work.
type EvaluatorStats struct {
	// Evaluations counts Evaluate calls; Cached those answered with the
	// Result before (nothing the job depends on changed).
	Evaluations, Cached uint64
	// Compiled counts jobs whose rules were read; Judged the node
	// verdicts computed.
	Compiled, Judged uint64
}

// Stats returns the Evaluator's counters.
func (e *Evaluator) Stats() EvaluatorStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

type nodeState struct {
	node  *watch.Node
	free  watch.Resources
	known bool
}

type nodeChange struct {
	gen uint64
	id  string
}

// defaultMaxChanges is the change log's length: a few relists' worth.
const defaultMaxChanges = 4096

// entry is one job's cache.
type entry struct {
	raw            *api.Job
	jobModifyIndex uint64
	p              *program
	err            error
	gen            uint64 // the Evaluator's gen result reflects
	result         Result
	// excludedBy maps each node the job may not use to its Excluded key.
	excludedBy map[string]string
}

// NewEvaluator returns an Evaluator; typeOf maps a device model to the
// planner's GPU type ("" for none) and must always give the same answer
// for a model.
func NewEvaluator(typeOf func(model string) planner.GPUType) *Evaluator {
	return &Evaluator{typeOf: typeOf, types: map[string]planner.GPUType{}, nodes: map[string]nodeState{}, jobs: map[watch.JobKey]*entry{},
		fits: newFitCache(), maxChanges: defaultMaxChanges}
}

// Evaluate returns where the managed job j may run in snap (a job whose
// spec is refused may run nowhere: Why says why).
func (e *Evaluator) Evaluate(j *watch.Job, snap *watch.Snapshot) Result {
	if j.Spec == nil || j.Raw == nil {
		why := fmt.Sprintf("job %q: not a managed job with a valid spec", j.ID)
		if j.SpecErr != nil {
			why = j.SpecErr.Error()
		}
		return Result{Why: why, Excluded: map[string]int{}}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stats.Evaluations++
	if snap != e.snap {
		e.refresh(snap)
	}
	k := j.Key()
	en := e.jobs[k]
	switch {
	case en == nil || en.raw != j.Raw || en.jobModifyIndex != j.JobModifyIndex:
		e.stats.Compiled++
		en = &entry{raw: j.Raw, jobModifyIndex: j.JobModifyIndex}
		e.jobs[k] = en
		if en.p, en.err = compile(j.Raw, *j.Spec, e.typeOfCached, e.fits); en.err != nil {
			en.result = Result{Why: en.err.Error(), Excluded: map[string]int{}}
			return en.result
		}
		e.judgeAll(en)
	case en.err != nil || en.gen == e.gen:
		e.stats.Cached++
	default:
		e.update(en)
	}
	return en.result
}

// judgeAll judges every node for en.
func (e *Evaluator) judgeAll(en *entry) {
	e.stats.Judged += uint64(len(e.nodes))
	en.result, en.excludedBy = en.p.evaluate(func(yield func(string, *watch.Node, watch.Resources, bool) bool) {
		for id, ns := range e.nodes {
			if !yield(id, ns.node, ns.free, ns.known) {
				return
			}
		}
	}, len(e.nodes))
	en.gen = e.gen
}

// update judges again, on a copy of en's Result, the nodes that changed
// since it; everything when the log no longer reaches back that far, when
// most nodes changed, or when no node is left (Why needs every verdict).
func (e *Evaluator) update(en *entry) {
	// Trimming may have cut the oldest generation in the log short: the
	// log is whole from the one after it.
	i := sort.Search(len(e.changes), func(i int) bool { return e.changes[i].gen > en.gen })
	// A Result without nodes explains itself with details of every node
	// (Why), which a change can alter under the same Excluded key.
	if len(e.changes) == 0 || e.changes[0].gen > en.gen || len(e.changes)-i > len(e.nodes)/4+1 || len(en.result.Nodes) == 0 {
		e.judgeAll(en)
		return
	}
	// Judge the changed nodes first: most changes (a node's usage, say)
	// leave the job's verdict as it was, and then the Result stands.
	type change struct {
		id      string
		gone    bool
		v       verdict
		differs bool
	}
	var cs []change
	done := map[string]bool{}
	differs := false
	for _, c := range e.changes[i:] {
		if done[c.id] {
			continue
		}
		done[c.id] = true
		ch := change{id: c.id}
		ns, ok := e.nodes[c.id]
		if ok {
			e.stats.Judged++
			ch.v = en.p.judge(ns.node, ns.free, ns.known)
		}
		oldKey, wasExcluded := en.excludedBy[c.id]
		oldFit, wasAllowed := en.result.Nodes[c.id]
		switch {
		case !ok:
			ch.gone, ch.differs = true, wasExcluded || wasAllowed
		case ch.v.stage == stageNone:
			ch.differs = !wasAllowed || !sameFit(oldFit, ch.v.fit)
		default:
			ch.differs = !wasExcluded || oldKey != ch.v.key
		}
		differs = differs || ch.differs
		cs = append(cs, ch)
	}
	if !differs {
		en.gen = e.gen
		return
	}
	r := en.result
	r.Nodes, r.Excluded = maps.Clone(r.Nodes), maps.Clone(r.Excluded)
	for _, ch := range cs {
		if !ch.differs {
			continue
		}
		if key, ok := en.excludedBy[ch.id]; ok {
			if r.Excluded[key]--; r.Excluded[key] == 0 {
				delete(r.Excluded, key)
			}
			delete(en.excludedBy, ch.id)
		} else {
			delete(r.Nodes, ch.id)
		}
		switch {
		case ch.gone:
		case ch.v.stage == stageNone:
			r.Nodes[ch.id] = ch.v.fit
		default:
			r.Excluded[ch.v.key]++
			en.excludedBy[ch.id] = ch.v.key
		}
	}
	if len(r.Nodes) == 0 {
		e.judgeAll(en)
		return
	}
	r.Why = "" // the Result before may have allowed no node
	en.result, en.gen = r, e.gen
}

// sameFit reports whether two fits say the same; shared Models maps
// (fitCache) compare by identity first.
func sameFit(a, b NodeFit) bool {
	if a.Workers != b.Workers || len(a.Models) != len(b.Models) {
		return false
	}
	if reflect.ValueOf(a.Models).UnsafePointer() == reflect.ValueOf(b.Models).UnsafePointer() {
		return true
	}
	return reflect.DeepEqual(a.Models, b.Models)
}

// refresh takes in a new snapshot: what each node has free, which nodes
// changed, and which jobs are gone from the cache's concern.
func (e *Evaluator) refresh(snap *watch.Snapshot) {
	e.snap = snap
	fixed := fixedUsage(snap)
	next := e.gen + 1
	var changed []nodeChange
	nodes := make(map[string]nodeState, len(snap.Nodes))
	for id, n := range snap.Nodes {
		free, known := freeOn(n, fixed[id])
		ns := nodeState{node: n, free: free, known: known}
		nodes[id] = ns
		if old, ok := e.nodes[id]; !ok || old != ns {
			changed = append(changed, nodeChange{next, id})
		}
	}
	for id := range e.nodes {
		if _, ok := nodes[id]; !ok {
			changed = append(changed, nodeChange{next, id})
		}
	}
	e.nodes = nodes
	e.fits.forget(func(n *watch.Node) bool { return nodes[n.ID].node == n })
	if len(changed) > 0 {
		e.gen = next
		e.changes = append(e.changes, changed...)
		if over := len(e.changes) - e.maxChanges; over > 0 {
			e.changes = slices.Delete(e.changes, 0, over)
		}
	}
	for k := range e.jobs {
		if j := snap.Jobs[k]; j == nil || !j.Managed {
			delete(e.jobs, k)
		}
	}
}

func (e *Evaluator) typeOfCached(model string) planner.GPUType {
	if t, ok := e.types[model]; ok {
		return t
	}
	t := e.typeOf(model)
	if len(e.types) < 4096 { // models come from nodes; bound the cache all the same
		e.types[model] = t
	}
	return t
}

// why explains, in one line, a Result that allows no node. A rule that
// excluded every node it saw says so alone; else each rule and how many
// nodes it excluded, in Nomad's order.
func (p *program) why(vs []verdict) string {
	if len(vs) == 0 {
		return "no node in the cluster"
	}
	type reason struct {
		stage       stage
		key         string
		nodes       int
		models      map[string]bool
		ask, bestOf int64 // resources: the ask, the most free of the dimension
	}
	byKey := map[string]*reason{}
	for _, v := range vs {
		r := byKey[v.key]
		if r == nil {
			r = &reason{stage: v.stage, key: v.key, models: map[string]bool{}, ask: v.ask, bestOf: v.free}
			byKey[v.key] = r
		}
		r.nodes++
		for _, m := range v.models {
			r.models[m] = true
		}
		r.bestOf = max(r.bestOf, v.free)
	}
	rs := make([]*reason, 0, len(byKey))
	for _, r := range byKey {
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].stage != rs[j].stage {
			return rs[i].stage < rs[j].stage
		}
		if rs[i].nodes != rs[j].nodes {
			return rs[i].nodes > rs[j].nodes
		}
		return rs[i].key < rs[j].key
	})
	if len(rs) == 1 {
		return p.phrase(rs[0].stage, rs[0].key, 0, rs[0].models, rs[0].ask, rs[0].bestOf)
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = p.phrase(r.stage, r.key, r.nodes, r.models, r.ask, r.bestOf)
	}
	return "no node passes every placement rule: " + strings.Join(parts, "; ")
}

// phrase says what one rule did: to every node it saw when nodes is 0,
// else to that many.
func (p *program) phrase(s stage, key string, nodes int, models map[string]bool, ask, bestOf int64) string {
	excludes := func(what string) string {
		if nodes == 1 {
			return what + " excludes 1 node"
		}
		return fmt.Sprintf("%s excludes %d nodes", what, nodes)
	}
	switch s {
	case stagePool:
		if nodes == 0 {
			return key + ": no node of the cluster is in it"
		}
		return excludes(key)
	case stageDatacenter:
		if nodes == 0 {
			return fmt.Sprintf("%s: no node of node pool %q is in them", key, p.pool)
		}
		return excludes(key)
	case stageReady:
		if nodes == 0 {
			return "no node of the job's node pool and datacenters is ready"
		}
		return excludes("not being ready")
	case stageJobConstraint, stageGroupConstraint:
		if nodes == 0 {
			return "constraint " + key + ": no node matches"
		}
		return excludes("constraint " + key)
	case stageDriver:
		if nodes == 0 {
			return key + ": no node has that task driver detected and healthy"
		}
		return excludes(key)
	case stageDevice:
		what := fmt.Sprintf("device %q", p.device)
		if len(p.devCons) > 0 {
			cs := make([]string, len(p.devCons))
			for i, c := range p.devCons {
				cs[i] = c.key
			}
			what += " with constraint " + strings.Join(cs, " and ")
		}
		if nodes == 0 {
			return what + ": no node has a healthy GPU that matches"
		}
		return excludes(what)
	case stageGPUType:
		ms := make([]string, 0, len(models))
		for m := range models {
			ms = append(ms, m)
		}
		sort.Strings(ms)
		what := fmt.Sprintf("GPU models %s match the device request but hadar maps none of them to a GPU type (add them to the sidecar's gpu_types)", quoteList(ms))
		switch nodes {
		case 0:
			return what
		case 1:
			return what + " (1 node)"
		}
		return fmt.Sprintf("%s (%d nodes)", what, nodes)
	case stageHostVolume:
		if nodes == 0 {
			return key + ": no node offers it (writable, unless the volume is read_only)"
		}
		return excludes(key)
	case stageResources:
		dim := strings.TrimSuffix(key, " exhausted")
		unit := " MB"
		switch dim {
		case "cpu":
			unit = " MHz"
		case "cores":
			unit = ""
		}
		what := fmt.Sprintf("%s: a worker asks %d%s, the most a node has free is %d%s", dim, ask, unit, max(bestOf, 0), unit)
		switch nodes {
		case 0:
			return what
		case 1:
			return what + " (1 node)"
		}
		return fmt.Sprintf("%s (%d nodes)", what, nodes)
	}
	return key
}
