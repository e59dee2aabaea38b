package watch

import (
	"fmt"
	"maps"
	"math"
	"net"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// Snapshot is a consistent view of the cluster at one Nomad index. A
// Snapshot is immutable: the watcher never changes one it handed out, and
// callers must not change it (maps, and the values they point to, are
// shared with later snapshots).
type Snapshot struct {
	// Index is the highest Nomad raft index the snapshot reflects.
	Index uint64
	// Synced is when the last full re-list was applied; zero before the
	// first one.
	Synced time.Time
	// Nodes by node ID: every node of the cluster.
	Nodes map[string]*Node
	// Jobs in the watched namespaces, managed or not.
	Jobs map[JobKey]*Job
	// Allocs of managed jobs, by allocation ID.
	Allocs map[string]*Alloc
	// BlockedEvals of managed jobs, by evaluation ID.
	BlockedEvals map[string]*Eval
	// Unmanaged are the NVIDIA GPUs that live allocations of jobs hadar
	// does not manage hold (in every namespace, watched or not), sorted by
	// allocation ID: capacity the planner must leave alone.
	Unmanaged []Held
	// Usage by allocation ID: the CPU, memory and disk every live
	// allocation holds on its node, of every job (managed or not) in every
	// namespace. Nomad fits a new allocation into what these leave free.
	Usage map[string]*Usage

	// byJob indexes allocs by job, each sorted as AllocsOf returns them:
	// the agent asks for one job's allocations many times a pass, and a
	// scan of every allocation each time grows with the cluster. freeze
	// builds it once; a Snapshot built as a literal has none.
	byJob *allocIndex
}

// allocIndex is Snapshot.byJob: of indexes the map it was built from, so
// that a copy of a Snapshot given other Allocs does not use it.
type allocIndex struct {
	of   map[string]*Alloc
	size int
	jobs map[JobKey][]*Alloc
}

// Usage is what one live allocation holds of its node's CPU, memory and
// disk.
type Usage struct {
	AllocID string
	NodeID  string
	Job     JobKey
	Resources
}

// Resources are amounts of the dimensions Nomad's scheduler fits
// allocations by (structs.ComparableResources.Superset): CPU in MHz
// (Nomad's CPU shares), memory and disk in MB.
type Resources struct {
	CPU      int64
	MemoryMB int64
	DiskMB   int64
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{CPU: r.CPU + o.CPU, MemoryMB: r.MemoryMB + o.MemoryMB, DiskMB: r.DiskMB + o.DiskMB}
}

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources {
	return Resources{CPU: r.CPU - o.CPU, MemoryMB: r.MemoryMB - o.MemoryMB, DiskMB: r.DiskMB - o.DiskMB}
}

// usageOf returns what a live allocation holds, nil when it is terminal
// or Nomad reported no resources for it. Like Nomad's AllocsFit, only a
// client-terminal allocation (complete, failed, lost) frees its share;
// one told to stop still holds it.
func usageOf(a *api.Allocation) *Usage {
	if a == nil || a.AllocatedResources == nil {
		return nil
	}
	switch a.ClientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return nil
	}
	u := &Usage{AllocID: a.ID, NodeID: a.NodeID, Job: JobKey{namespace(a.Namespace), a.JobID}}
	// Every task is summed. Nomad counts a prestart task that is not a
	// sidecar (and a poststop one) only up to the main tasks' share
	// (AllocatedResources.Comparable), but the API drops the tasks'
	// lifecycles, so this errs on the side of a fuller node.
	for _, t := range a.AllocatedResources.Tasks {
		if t != nil {
			u.CPU += t.Cpu.CpuShares
			u.MemoryMB += t.Memory.MemoryMB
		}
	}
	u.DiskMB = a.AllocatedResources.Shared.DiskMB
	return u
}

// Held is the GPUs one allocation of an unmanaged job holds on its node.
type Held struct {
	AllocID string
	NodeID  string
	Job     JobKey
	// GPUs by device model (the device group's name).
	GPUs map[string]int
}

// heldBy returns the NVIDIA GPUs a live allocation holds, nil when it is
// terminal or holds none. One told to stop still holds its GPUs until its
// client reports it stopped.
func heldBy(a *api.Allocation) *Held {
	if a == nil {
		return nil
	}
	switch a.ClientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return nil
	}
	gpus := gpusOf(a.AllocatedResources)
	if len(gpus) == 0 {
		return nil
	}
	return &Held{AllocID: a.ID, NodeID: a.NodeID, Job: JobKey{namespace(a.Namespace), a.JobID}, GPUs: gpus}
}

// portsOf returns the host ports of allocated resources by label, from the
// group's ports and its networks' (nil when none).
func portsOf(ar *api.AllocatedResources) map[string]int {
	if ar == nil {
		return nil
	}
	var out map[string]int
	add := func(label string, value int) {
		if label == "" || value <= 0 {
			return
		}
		if out == nil {
			out = map[string]int{}
		}
		out[label] = value
	}
	for _, p := range ar.Shared.Ports {
		add(p.Label, p.Value)
	}
	for _, n := range ar.Shared.Networks {
		if n == nil {
			continue
		}
		for _, p := range n.ReservedPorts {
			add(p.Label, p.Value)
		}
		for _, p := range n.DynamicPorts {
			add(p.Label, p.Value)
		}
	}
	return out
}

// gpusOf counts the NVIDIA GPUs of allocated resources by device model
// (nil when none).
func gpusOf(ar *api.AllocatedResources) map[string]int {
	if ar == nil {
		return nil
	}
	var out map[string]int
	for _, t := range ar.Tasks {
		if t == nil {
			continue
		}
		for _, d := range t.Devices {
			if d != nil && d.Vendor == "nvidia" && d.Type == "gpu" && len(d.DeviceIDs) > 0 {
				if out == nil {
					out = map[string]int{}
				}
				out[d.Name] += len(d.DeviceIDs)
			}
		}
	}
	return out
}

// JobKey identifies a job: Nomad job IDs are unique per namespace.
type JobKey struct {
	Namespace string
	ID        string
}

func (k JobKey) String() string { return k.Namespace + "/" + k.ID }

// Node is what the sidecar needs of a Nomad client node.
type Node struct {
	ID         string
	Name       string
	Datacenter string
	NodePool   string
	NodeClass  string
	// Status is Nomad's: "initializing", "ready", "down", "disconnected".
	Status string
	// SchedulingEligibility is "eligible" or "ineligible".
	SchedulingEligibility string
	// Drain is true while the node drains.
	Drain bool
	// Rack is the node meta value under Config.RackMetaKey ("" if unset).
	Rack string
	// Meta is the node's meta (e.g. hadar.nic_gbps for the network model).
	Meta map[string]string
	// Attributes are the node's fingerprinted attributes, what constraints
	// read as ${attr.<name>} (e.g. kernel.name = "linux").
	Attributes map[string]string
	// Drivers by name: whether the task driver is detected and healthy,
	// for the drivers the node reports (Nomad places a task only where
	// its driver is both).
	Drivers map[string]bool
	// HostVolumes by name: the host volumes the node offers (a group's
	// volume of type "host" names one as its source).
	HostVolumes map[string]HostVolume
	// Resources is the node's capacity (Nomad's NodeResources: CPU MHz,
	// memory and disk MB); Reserved is what the node keeps from Nomad's
	// allocations (ReservedResources). Cores counts the node's usable CPU
	// cores (for tasks that reserve whole cores).
	Resources Resources
	Reserved  Resources
	Cores     int
	// Address is the node's IP address (its unique.network.ip-address
	// attribute, else the host of its HTTP address): where the rendezvous
	// of a distributed job on this node listens.
	Address string
	// GPUs are the node's NVIDIA GPU device groups, one per model, sorted
	// by model.
	GPUs []GPUGroup
	// ModifyIndex is the Nomad index of the node's last change.
	ModifyIndex uint64
}

// Schedulable reports whether Nomad may place new work on the node.
func (n *Node) Schedulable() bool {
	return n.Status == api.NodeStatusReady && n.SchedulingEligibility == api.NodeSchedulingEligible && !n.Drain
}

// HealthyGPUs counts the node's healthy GPUs of every model.
func (n *Node) HealthyGPUs() int {
	c := 0
	for _, g := range n.GPUs {
		c += g.Healthy
	}
	return c
}

// GPUGroup is one Nomad device group of vendor "nvidia", type "gpu": all
// GPUs of one model on a node. hadar-gpu and nomad-device-nvidia both
// report GPUs this way.
type GPUGroup struct {
	// Model is the group's name, what jobs match with ${device.model}.
	Model string
	// Attributes as Nomad renders them, e.g. memory = "16384 MiB".
	Attributes map[string]string
	// Typed holds the same attributes with their types and units, as
	// device constraints compare them (${device.attr.memory} >= 12 GiB).
	Typed map[string]Attribute
	// Instances sorted by ID.
	Instances []GPU
	// Healthy counts the healthy instances.
	Healthy int
}

// HostVolume is a host volume a node offers.
type HostVolume struct {
	ReadOnly bool
	// Dynamic is set for a volume created through Nomad's API rather
	// than the client's configuration.
	Dynamic bool
}

// AttributeKind says which value of an Attribute is set.
type AttributeKind uint8

// The kinds of Attribute.
const (
	AttrString AttributeKind = iota
	AttrInt
	AttrFloat
	AttrBool
)

// Attribute is a device attribute as Nomad types it: an integer, a float,
// a string or a boolean; numbers may carry a unit ("MiB", "MHz", "W").
type Attribute struct {
	Kind  AttributeKind
	Int   int64
	Float float64
	Str   string
	Bool  bool
	Unit  string
}

// convertAttribute types a's value. The API sets one value; were several
// set, the one Nomad's comparisons look at first wins (bool, string, int,
// float: plugins/shared/structs.Attribute's comparator).
func convertAttribute(a *api.Attribute) Attribute {
	switch {
	case a.BoolVal != nil:
		return Attribute{Kind: AttrBool, Bool: *a.BoolVal}
	case a.StringVal != nil:
		return Attribute{Kind: AttrString, Str: *a.StringVal}
	case a.IntVal != nil:
		return Attribute{Kind: AttrInt, Int: *a.IntVal, Unit: a.Unit}
	case a.FloatVal != nil:
		return Attribute{Kind: AttrFloat, Float: *a.FloatVal, Unit: a.Unit}
	}
	return Attribute{Kind: AttrString}
}

// GPU is one device instance.
type GPU struct {
	ID                string
	Healthy           bool
	HealthDescription string
	PCIBusID          string
}

// Job is a job of a watched namespace. Spec, SpecErr and Raw are set for
// managed jobs only.
type Job struct {
	Namespace string
	ID        string
	Name      string
	Type      string
	// Status is Nomad's: "pending", "running", "dead".
	Status string
	// Stop is set when the job was stopped (deregistered without purge).
	Stop bool
	// Version is a managed job's version, bumped by every spec change (0
	// for other jobs: the job list does not show it).
	Version uint64
	// ModifyIndex changes on any write to the job (status included);
	// JobModifyIndex only on spec changes: use it for check-and-set
	// registrations.
	ModifyIndex    uint64
	JobModifyIndex uint64
	SubmitTime     time.Time
	// Managed reports hadar.* keys in the job meta (jobspec.IsManaged).
	Managed bool
	// Spec is the parsed contract of a valid managed job.
	Spec *jobspec.Spec
	// SpecErr is why a managed job's spec is refused.
	SpecErr *jobspec.FieldError
	// Units are a valid managed job's placement units as written
	// (jobform.Units, parsed once here); UnitsErr why they could not be
	// read (a generated group a person edited out of shape).
	Units    []jobform.Unit
	UnitsErr error
	// Raw is the full job as Nomad returned it (managed jobs only). Never
	// modify it; re-read the job before writing it back.
	Raw *api.Job
}

// Key returns the job's key.
func (j *Job) Key() JobKey { return JobKey{j.Namespace, j.ID} }

// Alloc is an allocation of a managed job.
type Alloc struct {
	ID        string
	Name      string
	Namespace string
	JobID     string
	TaskGroup string
	// Worker is the worker TaskGroup names when it is a group hadar
	// generated (groupname.Parse, parsed once here), nil for any other
	// group: such an allocation is no worker of a placement.
	Worker *groupname.Worker
	// Task is the task that runs the training process (the job spec's GPU
	// task); Progress reads its progress file. "" when unknown.
	Task     string
	NodeID   string
	NodeName string
	// DesiredStatus is "run", "stop" or "evict"; ClientStatus is "pending",
	// "running", "complete", "failed", "lost" or "unknown".
	DesiredStatus      string
	DesiredDescription string
	ClientStatus       string
	ClientDescription  string
	JobVersion         uint64
	TaskStates         map[string]TaskState
	CreateTime         time.Time
	ModifyTime         time.Time
	ModifyIndex        uint64
	// GPUs are the NVIDIA GPUs Nomad gave it, by device model (nil when
	// none): what it holds while it is not terminal.
	GPUs map[string]int
	// Ports are the host ports Nomad gave it, by label (nil when none):
	// what its tasks may listen on until it is terminal.
	Ports map[string]int
}

// Job returns the key of the allocation's job.
func (a *Alloc) Job() JobKey { return JobKey{a.Namespace, a.JobID} }

// Terminal reports whether the allocation's tasks have finished for good
// (complete, failed or lost): its GPUs are free.
func (a *Alloc) Terminal() bool {
	switch a.ClientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return true
	}
	return false
}

// TaskState is a task's state in an allocation.
type TaskState struct {
	// State is "pending", "running" or "dead".
	State      string
	Failed     bool
	Restarts   uint64
	StartedAt  time.Time
	FinishedAt time.Time
	// Events are the task's last few events, oldest first
	// (Config.TaskEvents of them).
	Events []TaskEvent
}

// TaskEvent is one task event. hadar-train's progress events carry
// hadar.steps_done and friends in Details (docs/driver.md).
type TaskEvent struct {
	Type    string
	Time    time.Time
	Message string
	Details map[string]string
}

// Eval is a blocked evaluation of a managed job: why Nomad cannot place
// it now.
type Eval struct {
	ID                string
	Namespace         string
	JobID             string
	Status            string
	StatusDescription string
	TriggeredBy       string
	// FailedTGAllocs per task group: the nodes evaluated, filtered and
	// exhausted, with the constraint or dimension responsible (e.g.
	// "devices: no devices match request").
	FailedTGAllocs map[string]*api.AllocationMetric
	CreateTime     time.Time
	ModifyTime     time.Time
	ModifyIndex    uint64
}

// Job returns the key of the evaluation's job.
func (e *Eval) Job() JobKey { return JobKey{e.Namespace, e.JobID} }

// ManagedJobs returns the managed jobs sorted by key.
func (s *Snapshot) ManagedJobs() []*Job {
	var out []*Job
	for _, j := range s.Jobs {
		if j.Managed {
			out = append(out, j)
		}
	}
	sort.Slice(out, func(a, b int) bool { return lessKey(out[a].Key(), out[b].Key()) })
	return out
}

func lessKey(a, b JobKey) bool {
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.ID < b.ID
}

// AllocsOf returns the job's allocations sorted by creation time then ID.
// The slice may be shared with other callers: do not change it.
func (s *Snapshot) AllocsOf(k JobKey) []*Alloc {
	if x := s.byJob; x != nil && x.size == len(s.Allocs) && sameMap(x.of, s.Allocs) {
		out := x.jobs[k]
		return out[:len(out):len(out)] // an append copies, never grows the index
	}
	var out []*Alloc
	for _, a := range s.Allocs {
		if a.Job() == k {
			out = append(out, a)
		}
	}
	sortAllocs(out)
	return out
}

// indexAllocs builds s.byJob from s.Allocs.
func (s *Snapshot) indexAllocs() {
	x := &allocIndex{of: s.Allocs, size: len(s.Allocs), jobs: map[JobKey][]*Alloc{}}
	for _, a := range s.Allocs {
		x.jobs[a.Job()] = append(x.jobs[a.Job()], a)
	}
	for _, as := range x.jobs {
		sortAllocs(as)
	}
	s.byJob = x
}

func sortAllocs(as []*Alloc) {
	sort.Slice(as, func(i, j int) bool {
		if !as[i].CreateTime.Equal(as[j].CreateTime) {
			return as[i].CreateTime.Before(as[j].CreateTime)
		}
		return as[i].ID < as[j].ID
	})
}

// sameMap reports whether a and b are the same map (not merely equal).
func sameMap(a, b map[string]*Alloc) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// BlockedEvalsOf returns the job's blocked evaluations sorted by ID.
func (s *Snapshot) BlockedEvalsOf(k JobKey) []*Eval {
	var out []*Eval
	for _, e := range s.BlockedEvals {
		if e.Job() == k {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Equal reports whether two snapshots hold the same cluster state, ignoring
// Index and Synced. Tests compare a watched snapshot with a fresh re-list.
func (s *Snapshot) Equal(o *Snapshot) bool {
	return maps.EqualFunc(s.Nodes, o.Nodes, func(a, b *Node) bool { return reflect.DeepEqual(a, b) }) &&
		maps.EqualFunc(s.Jobs, o.Jobs, jobsEqual) &&
		maps.EqualFunc(s.Allocs, o.Allocs, func(a, b *Alloc) bool { return reflect.DeepEqual(a, b) }) &&
		maps.EqualFunc(s.BlockedEvals, o.BlockedEvals, func(a, b *Eval) bool { return reflect.DeepEqual(a, b) }) &&
		reflect.DeepEqual(s.Unmanaged, o.Unmanaged) &&
		maps.EqualFunc(s.Usage, o.Usage, func(a, b *Usage) bool { return *a == *b })
}

// Diff describes how o differs from s, for test failure messages; "" when
// Equal.
func (s *Snapshot) Diff(o *Snapshot) string {
	var d []string
	d = diffMap(d, "node", s.Nodes, o.Nodes, func(a, b *Node) bool { return reflect.DeepEqual(a, b) })
	d = diffMap(d, "job", s.Jobs, o.Jobs, jobsEqual)
	d = diffMap(d, "alloc", s.Allocs, o.Allocs, func(a, b *Alloc) bool { return reflect.DeepEqual(a, b) })
	d = diffMap(d, "blocked eval", s.BlockedEvals, o.BlockedEvals, func(a, b *Eval) bool { return reflect.DeepEqual(a, b) })
	if !reflect.DeepEqual(s.Unmanaged, o.Unmanaged) {
		d = append(d, fmt.Sprintf("GPUs held by unmanaged jobs: %v vs %v", s.Unmanaged, o.Unmanaged))
	}
	d = diffMap(d, "usage of alloc", s.Usage, o.Usage, func(a, b *Usage) bool { return *a == *b })
	return strings.Join(d, "; ")
}

func diffMap[K comparable, V any](d []string, what string, a, b map[K]V, eq func(V, V) bool) []string {
	var out []string
	for k, va := range a {
		vb, ok := b[k]
		switch {
		case !ok:
			out = append(out, what+" "+keyString(k)+" only in the first")
		case !eq(va, vb):
			out = append(out, what+" "+keyString(k)+" differs")
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, what+" "+keyString(k)+" only in the second")
		}
	}
	slices.Sort(out)
	return append(d, out...)
}

func keyString(k any) string {
	switch k := k.(type) {
	case string:
		return k
	case JobKey:
		return k.String()
	}
	return "?"
}

// jobsEqual compares jobs by what they say, not by the identity of Raw
// (two reads of one job version decode into different values).
func jobsEqual(a, b *Job) bool {
	x, y := *a, *b
	x.Raw, y.Raw = nil, nil
	return reflect.DeepEqual(x, y) && (a.Raw == nil) == (b.Raw == nil)
}

// convertNode keeps what the sidecar needs of a Nomad node.
func convertNode(n *api.Node, rackKey string) *Node {
	out := &Node{
		ID: n.ID, Name: n.Name, Datacenter: n.Datacenter, NodePool: n.NodePool, NodeClass: n.NodeClass,
		Status: n.Status, SchedulingEligibility: n.SchedulingEligibility, Drain: n.Drain || n.DrainStrategy != nil,
		Rack: n.Meta[rackKey], Meta: maps.Clone(n.Meta), Attributes: maps.Clone(n.Attributes), ModifyIndex: n.ModifyIndex,
	}
	if len(n.Drivers) > 0 {
		out.Drivers = make(map[string]bool, len(n.Drivers))
		for name, d := range n.Drivers {
			out.Drivers[name] = d != nil && d.Detected && d.Healthy
		}
	}
	if len(n.HostVolumes) > 0 {
		out.HostVolumes = make(map[string]HostVolume, len(n.HostVolumes))
		for name, v := range n.HostVolumes {
			if v != nil {
				out.HostVolumes[name] = HostVolume{ReadOnly: v.ReadOnly, Dynamic: v.ID != ""}
			}
		}
	}
	if r := n.NodeResources; r != nil {
		out.Resources = Resources{CPU: r.Cpu.CpuShares, MemoryMB: r.Memory.MemoryMB, DiskMB: r.Disk.DiskMB}
		out.Cores = int(r.Cpu.TotalCpuCores)
	}
	if r := n.ReservedResources; r != nil {
		out.Reserved = Resources{CPU: clampInt64(r.Cpu.CpuShares), MemoryMB: clampInt64(r.Memory.MemoryMB), DiskMB: clampInt64(r.Disk.DiskMB)}
	}
	out.Address = n.Attributes["unique.network.ip-address"]
	if out.Address == "" {
		if host, _, err := net.SplitHostPort(n.HTTPAddr); err == nil {
			out.Address = host
		}
	}
	if n.NodeResources != nil {
		for _, d := range n.NodeResources.Devices {
			if d == nil || d.Vendor != "nvidia" || d.Type != "gpu" {
				continue
			}
			out.GPUs = append(out.GPUs, convertGPUGroup(d))
		}
	}
	sort.Slice(out.GPUs, func(i, j int) bool { return out.GPUs[i].Model < out.GPUs[j].Model })
	return out
}

// clampInt64 converts an API's unsigned amount, saturating.
func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

func convertGPUGroup(d *api.NodeDeviceResource) GPUGroup {
	g := GPUGroup{Model: d.Name, Attributes: make(map[string]string, len(d.Attributes)), Typed: make(map[string]Attribute, len(d.Attributes))}
	for k, a := range d.Attributes {
		if a != nil {
			g.Attributes[k] = a.String()
			g.Typed[k] = convertAttribute(a)
		}
	}
	for _, inst := range d.Instances {
		if inst == nil {
			continue
		}
		gpu := GPU{ID: inst.ID, Healthy: inst.Healthy, HealthDescription: inst.HealthDescription}
		if inst.Locality != nil {
			gpu.PCIBusID = inst.Locality.PciBusID
		}
		if gpu.Healthy {
			g.Healthy++
		}
		g.Instances = append(g.Instances, gpu)
	}
	sort.Slice(g.Instances, func(i, j int) bool { return g.Instances[i].ID < g.Instances[j].ID })
	return g
}

// convertJob summarizes a full job; for a managed one it parses the spec
// and keeps the job itself.
// NewJob is the view of a job as Nomad returns it, as the watcher makes
// it: for tools and tests that build snapshots of their own.
func NewJob(j *api.Job) *Job { return convertJob(j) }

func convertJob(j *api.Job) *Job {
	out := &Job{
		Namespace: deref(j.Namespace), ID: deref(j.ID), Name: deref(j.Name), Type: deref(j.Type),
		Status: deref(j.Status), Stop: j.Stop != nil && *j.Stop,
		Managed: jobspec.IsManaged(j),
	}
	if j.Version != nil && out.Managed {
		out.Version = *j.Version
	}
	if j.ModifyIndex != nil {
		out.ModifyIndex = *j.ModifyIndex
	}
	if j.JobModifyIndex != nil {
		out.JobModifyIndex = *j.JobModifyIndex
	}
	if j.SubmitTime != nil {
		out.SubmitTime = time.Unix(0, *j.SubmitTime)
	}
	out.Namespace = namespace(out.Namespace)
	if out.Managed {
		out.Raw = j
		spec, err := jobspec.Parse(j)
		if err != nil {
			out.SpecErr = err.(*jobspec.FieldError) // Parse returns no other type
		} else {
			out.Spec = &spec
			out.Units, out.UnitsErr = jobform.Units(j, spec)
		}
	}
	return out
}

// convertJobStub summarizes an unmanaged job from the job list.
func convertJobStub(s *api.JobListStub) *Job {
	return &Job{
		Namespace: namespace(s.Namespace), ID: s.ID, Name: s.Name, Type: s.Type, Status: s.Status, Stop: s.Stop,
		ModifyIndex: s.ModifyIndex, JobModifyIndex: s.JobModifyIndex, SubmitTime: time.Unix(0, s.SubmitTime),
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// convertAlloc keeps what the sidecar needs of an allocation, from the
// list stub or the event stream's full allocation (same fields).
func convertAlloc(a *api.AllocationListStub, task string, events int) *Alloc {
	out := &Alloc{
		ID: a.ID, Name: a.Name, Namespace: a.Namespace, JobID: a.JobID, TaskGroup: a.TaskGroup, Task: task,
		NodeID: a.NodeID, NodeName: a.NodeName,
		DesiredStatus: a.DesiredStatus, DesiredDescription: a.DesiredDescription,
		ClientStatus: a.ClientStatus, ClientDescription: a.ClientDescription,
		JobVersion: a.JobVersion, CreateTime: time.Unix(0, a.CreateTime), ModifyTime: time.Unix(0, a.ModifyTime),
		ModifyIndex: a.ModifyIndex, GPUs: gpusOf(a.AllocatedResources), Ports: portsOf(a.AllocatedResources),
	}
	out.Namespace = namespace(out.Namespace)
	if w, ok := groupname.Parse(a.TaskGroup); ok {
		out.Worker = &w
	}
	if len(a.TaskStates) > 0 {
		out.TaskStates = make(map[string]TaskState, len(a.TaskStates))
		for name, ts := range a.TaskStates {
			if ts != nil {
				out.TaskStates[name] = convertTaskState(ts, events)
			}
		}
	}
	return out
}

// allocStub views a full allocation of job version version as its list
// stub, so both sources go through one conversion.
func allocStub(a *api.Allocation, version uint64) *api.AllocationListStub {
	return &api.AllocationListStub{
		ID: a.ID, Name: a.Name, Namespace: a.Namespace, NodeID: a.NodeID, NodeName: a.NodeName,
		JobID: a.JobID, JobVersion: version, TaskGroup: a.TaskGroup,
		DesiredStatus: a.DesiredStatus, DesiredDescription: a.DesiredDescription,
		ClientStatus: a.ClientStatus, ClientDescription: a.ClientDescription, TaskStates: a.TaskStates,
		ModifyIndex: a.ModifyIndex, CreateTime: a.CreateTime, ModifyTime: a.ModifyTime,
		AllocatedResources: a.AllocatedResources,
	}
}

func convertTaskState(ts *api.TaskState, events int) TaskState {
	out := TaskState{State: ts.State, Failed: ts.Failed, Restarts: ts.Restarts, StartedAt: ts.StartedAt, FinishedAt: ts.FinishedAt}
	evs := ts.Events
	if len(evs) > events {
		evs = evs[len(evs)-events:]
	}
	for _, e := range evs {
		if e == nil {
			continue
		}
		msg := e.DisplayMessage
		if msg == "" {
			msg = e.Message
		}
		out.Events = append(out.Events, TaskEvent{Type: e.Type, Time: time.Unix(0, e.Time), Message: msg, Details: maps.Clone(e.Details)})
	}
	return out
}

func convertEval(e *api.Evaluation) *Eval {
	return &Eval{
		ID: e.ID, Namespace: namespace(e.Namespace), JobID: e.JobID, Status: e.Status, StatusDescription: e.StatusDescription,
		TriggeredBy: e.TriggeredBy, FailedTGAllocs: e.FailedTGAllocs,
		CreateTime: time.Unix(0, e.CreateTime), ModifyTime: time.Unix(0, e.ModifyTime), ModifyIndex: e.ModifyIndex,
	}
}
