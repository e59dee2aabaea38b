package planner

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// GPUType names a GPU generation ("v100", "a100", ...). Types are data: the
// planner never compares against a fixed list.
type GPUType string

// ValidName reports whether t is a GPU type name every part of hadar
// accepts (a job's hadar.throughput, the sidecar's gpu_types, profiles
// written by hand): lowercase letters, digits, '-' and '_'.
func (t GPUType) ValidName() bool {
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return t != ""
}

// Node is one server: GPUs of one or more types, and where it sits.
type Node struct {
	ID   string
	Rack string
	GPUs map[GPUType]int
}

// Cluster is the set of nodes a policy allocates.
type Cluster struct {
	Nodes []Node
}

// Types returns the GPU types present in the cluster, sorted by name so that
// every consumer indexes them the same way.
func (c Cluster) Types() []GPUType {
	seen := map[GPUType]bool{}
	for _, n := range c.Nodes {
		for t, k := range n.GPUs {
			if k > 0 {
				seen[t] = true
			}
		}
	}
	out := make([]GPUType, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Capacity returns the number of GPUs of type t in the cluster.
func (c Cluster) Capacity(t GPUType) int {
	total := 0
	for _, n := range c.Nodes {
		total += n.GPUs[t]
	}
	return total
}

// TotalGPUs returns the number of GPUs of every type.
func (c Cluster) TotalGPUs() int {
	total := 0
	for _, n := range c.Nodes {
		for _, k := range n.GPUs {
			total += k
		}
	}
	return total
}

// ParseClusterSpec builds a homogeneous-node cluster from a spec such as
// "v100=36,p100=36,k80=36": each type is split into nodes of gpusPerNode
// GPUs (the last node takes the remainder), racksPerType racks per type are
// filled round-robin. Node IDs are "<type>-<index>".
func ParseClusterSpec(spec string, gpusPerNode int) (Cluster, error) {
	if gpusPerNode <= 0 {
		return Cluster{}, fmt.Errorf("gpus per node %d: want a positive integer", gpusPerNode)
	}
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return Cluster{}, fmt.Errorf("cluster spec is empty: want TYPE=COUNT[,TYPE=COUNT...], e.g. v100=36,p100=36")
	}
	var c Cluster
	seen := map[string]bool{}
	for _, part := range strings.Split(spec, ",") {
		name, count, ok := strings.Cut(strings.TrimSpace(part), "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok || name == "" {
			return Cluster{}, fmt.Errorf("cluster spec %q: entry %q: want TYPE=COUNT", spec, part)
		}
		if seen[name] {
			return Cluster{}, fmt.Errorf("cluster spec %q: type %q given twice", spec, name)
		}
		seen[name] = true
		k, err := strconv.Atoi(strings.TrimSpace(count))
		if err != nil || k <= 0 {
			return Cluster{}, fmt.Errorf("cluster spec %q: count %q for %s: want a positive integer", spec, count, name)
		}
		for i := 0; k > 0; i++ {
			n := min(k, gpusPerNode)
			c.Nodes = append(c.Nodes, Node{
				ID:   fmt.Sprintf("%s-%d", name, i),
				Rack: fmt.Sprintf("rack-%s-%d", name, i/4),
				GPUs: map[GPUType]int{GPUType(name): n},
			})
			k -= n
		}
	}
	return c, nil
}

// Job is one training job as submitted.
type Job struct {
	ID string
	// Model is the job type key of the throughput profile, e.g.
	// "ResNet-18 (batch size 16)".
	Model string
	// ScaleFactor is the number of GPUs (workers) the job trains on.
	ScaleFactor int
	// TotalSteps is the work to do, in training steps (iterations).
	TotalSteps float64
	// Weight is the priority weight (1 = normal).
	Weight float64
	// Arrival is the submission time in seconds from the trace start.
	Arrival float64
	// SLO is the deadline in seconds after arrival; 0 means none.
	SLO float64
	// MaxCopies bounds the units a forking scheduler (HadarE) may run the
	// job as: 0 leaves it to the scheduler, 1 never forks it.
	MaxCopies int `json:",omitempty"`
	// MinRunTime is the least time in seconds the job runs on its GPUs
	// before it may be preempted (stopped, moved, or lose copies); 0
	// leaves it to the engine's configured default.
	MinRunTime float64 `json:",omitempty"`
	// Queue names the team queue the job belongs to (planner/queue): ""
	// is the default queue. Only a queue-aware scheduler reads it.
	Queue string `json:",omitempty"`
	// Priority orders jobs inside their queue, higher first (Nomad's job
	// priority); 0 means Nomad's default, 50.
	Priority int `json:",omitempty"`
	// Widths, when set, makes the job elastic: the numbers of GPUs it may
	// run at, ascending, ScaleFactor (the width it asks for first) among
	// them, with a fixed global batch (its speed at each width:
	// planner/speed, "Elastic jobs"). Empty: rigid at
	// ScaleFactor. A policy that does not choose widths runs an elastic
	// job at ScaleFactor.
	Widths []int `json:",omitempty"`
}

// WeightOr1 is the job's priority weight, 1 where it is not a positive
// number: a view built by hand has none, and Validate refuses such a job
// anyway, so the policies need not each default it.
func (j Job) WeightOr1() float64 {
	if j.Weight > 0 {
		return j.Weight
	}
	return 1
}

// Elastic reports whether the job may run at more than one width.
func (j Job) Elastic() bool { return len(j.Widths) > 1 }

// AllowsWidth reports whether the job may run on one unit of w GPUs: w is
// ScaleFactor, or one of Widths.
func (j Job) AllowsWidth(w int) bool {
	return w == j.ScaleFactor || slices.Contains(j.Widths, w)
}

// Validate reports the first field of j that cannot be scheduled.
func (j Job) Validate() error {
	switch {
	case j.ID == "":
		return fmt.Errorf("job has an empty ID")
	case j.Model == "":
		return fmt.Errorf("job %s: model is empty: want a job type of the throughput profile", j.ID)
	case j.ScaleFactor <= 0:
		return fmt.Errorf("job %s: scale factor %d: want a positive number of GPUs", j.ID, j.ScaleFactor)
	case !(j.TotalSteps > 0):
		return fmt.Errorf("job %s: total steps %v: want a positive number", j.ID, j.TotalSteps)
	case !(j.Weight > 0):
		return fmt.Errorf("job %s: priority weight %v: want a positive number", j.ID, j.Weight)
	case !(j.Arrival >= 0):
		return fmt.Errorf("job %s: arrival %v: want seconds >= 0", j.ID, j.Arrival)
	case j.SLO < 0:
		return fmt.Errorf("job %s: SLO %v: want seconds >= 0 (0 = none)", j.ID, j.SLO)
	case !(j.MinRunTime >= 0) || math.IsInf(j.MinRunTime, 0):
		return fmt.Errorf("job %s: min run time %v s: want seconds >= 0 (0 = the default)", j.ID, j.MinRunTime)
	case j.Priority < 0:
		return fmt.Errorf("job %s: priority %d: want >= 0 (Nomad's job priority; 0 = its default 50)", j.ID, j.Priority)
	case j.MaxCopies < 0:
		return fmt.Errorf("job %s: max copies %d: want >= 0 (0 = the scheduler's default, 1 = never forked)", j.ID, j.MaxCopies)
	}
	if len(j.Widths) > 0 {
		has := false
		for i, w := range j.Widths {
			if w <= 0 || i > 0 && w <= j.Widths[i-1] {
				return fmt.Errorf("job %s: widths %v: want positive numbers of GPUs in increasing order", j.ID, j.Widths)
			}
			has = has || w == j.ScaleFactor
		}
		if !has {
			return fmt.Errorf("job %s: widths %v: want its scale factor %d among them (the width it asks for first)", j.ID, j.Widths, j.ScaleFactor)
		}
	}
	return nil
}

// Slot is Count GPUs of one type on one node.
type Slot struct {
	Node  string
	Type  GPUType
	Count int
}

// Unit is one running instance of a job: its workers and where they sit.
// A job normally runs as one unit of ScaleFactor GPUs; HadarE forks a job
// into several units (copies) whose progress adds up.
type Unit struct {
	Slots []Slot
}

// GPUs is the number of GPUs the unit holds.
func (u Unit) GPUs() int {
	n := 0
	for _, s := range u.Slots {
		n += s.Count
	}
	return n
}

// Nodes is the number of distinct nodes the unit spans.
func (u Unit) Nodes() int {
	seen := map[string]bool{}
	for _, s := range u.Slots {
		seen[s.Node] = true
	}
	return len(seen)
}

// Types lists the distinct GPU types of the unit, in slot order.
func (u Unit) Types() []GPUType {
	var out []GPUType
	for _, s := range u.Slots {
		dup := false
		for _, t := range out {
			dup = dup || t == s.Type
		}
		if !dup {
			out = append(out, s.Type)
		}
	}
	return out
}

// Equal reports whether two units hold the same GPUs (slot order aside).
func (u Unit) Equal(v Unit) bool {
	if len(u.Slots) != len(v.Slots) {
		return false
	}
	count := map[Slot]int{}
	for _, s := range u.Slots {
		count[s]++
	}
	for _, s := range v.Slots {
		count[s]--
		if count[s] < 0 {
			return false
		}
	}
	return true
}

// Placement is where a job runs for one round: no units means it waits.
type Placement struct {
	Units []Unit
}

// GPUs is the number of GPUs the placement holds.
func (p Placement) GPUs() int {
	n := 0
	for _, u := range p.Units {
		n += u.GPUs()
	}
	return n
}
