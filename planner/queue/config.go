// Package queue shares one GPU fleet among teams: queues with guaranteed
// GPUs per type, an optional limit, a weight for sharing what the
// guarantees leave, a policy of their own inside, and reclaim of lent
// guarantees. Scheduler is the round.Scheduler that does it around one
// inner scheduler per queue; Config is the queue blocks the sidecar's
// configuration and `hadar sim --queues` both read (docs/queues.md).
package queue

import (
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsimple"

	"github.com/hadar-sched/hadar/planner"
)

// DefaultName is the queue of a job that names none (planner.Job.Queue
// empty).
const DefaultName = "default"

// MetaKey is the job meta a job may name its queue with, where the queue
// accepts its namespace (Queue.MetaNamespaces).
const MetaKey = "hadar.queue"

// DefaultPriority is Nomad's default job priority: a planner.Job with
// Priority 0 is ranked as this.
const DefaultPriority = 50

// Queue is one team's share of the fleet.
type Queue struct {
	Name string
	// Namespaces are the Nomad namespaces whose jobs belong to the queue
	// (the sidecar); a namespace belongs to one queue at most. A namespace
	// no queue lists is a queue of its own, with no guarantee, named
	// NamespaceQueue(ns) so that it is never a configured queue.
	Namespaces []string
	// MetaNamespaces are the namespaces whose jobs may choose the queue
	// with the job meta hadar.queue ("*": any namespace).
	MetaNamespaces []string
	// Guarantee is the GPUs of each type the queue gets back whenever its
	// jobs want them; lent to other queues meanwhile.
	Guarantee map[planner.GPUType]int
	// Limit is the most GPUs of each type the queue's jobs hold, borrowed
	// ones included; a type absent has no limit.
	Limit map[planner.GPUType]int
	// Weight divides what the guarantees leave among queues that want
	// more (default 1).
	Weight float64
	// Policy schedules the queue's jobs inside its share ("": the
	// scheduler's default policy).
	Policy string
	// MaxJobWeight caps the hadar.weight of the queue's jobs (0: no cap):
	// a job's author sets its weight, the operator bounds it.
	MaxJobWeight float64
	// ReclaimAfter bounds the minimum run time a job borrowing this
	// queue's guarantee is held to once the queue wants it back, in
	// seconds (0: reclaimed at the next round boundary).
	ReclaimAfter float64
	// MaxMinRunTime caps the minimum run time the queue's jobs ask for
	// themselves (hadar.min_run_time), in seconds (0: no cap beyond the
	// sidecar's max_min_run_time): a job's author sets it, the operator
	// bounds it, or one job could opt out of time-slicing and fair-share
	// preemption.
	MaxMinRunTime float64
}

// Config is the set of queues.
type Config struct {
	Queues []Queue
	// Static gives every queue its guarantee and nothing else, even when
	// other queues leave theirs idle: static partitioning of the fleet,
	// the baseline queues are measured against.
	Static bool
}

// Block is one queue block as HCL (and HCL's JSON syntax) writes it:
//
//	queue "team-a" {
//	  namespaces      = ["team-a"]
//	  meta_namespaces = ["*"]
//	  guarantee       = { v100 = 8, k80 = 4 }
//	  limit           = { v100 = 24 }
//	  weight          = 2
//	  policy          = "gavel-maxmin"
//	  max_job_weight  = 10
//	  reclaim_after   = "5m"
//	  max_min_run_time = "2h"
//	}
//
// The sidecar's configuration holds these blocks beside its other
// settings; FromBlocks resolves them.
type Block struct {
	Name           string         `hcl:"name,label"`
	Namespaces     []string       `hcl:"namespaces,optional"`
	MetaNamespaces []string       `hcl:"meta_namespaces,optional"`
	Guarantee      map[string]int `hcl:"guarantee,optional"`
	Limit          map[string]int `hcl:"limit,optional"`
	Weight         *float64       `hcl:"weight,optional"`
	Policy         string         `hcl:"policy,optional"`
	MaxJobWeight   *float64       `hcl:"max_job_weight,optional"`
	ReclaimAfter   string         `hcl:"reclaim_after,optional"`
	MaxMinRunTime  string         `hcl:"max_min_run_time,optional"`
}

// file is a configuration file as Load reads it: the queue blocks, and
// anything else (a whole sidecar configuration) left alone.
type file struct {
	Queues []Block  `hcl:"queue,block"`
	Rest   hcl.Body `hcl:",remain"`
}

// Load reads the queue blocks of an HCL file (or HCL's JSON syntax, a
// name ending in .json): a file of queue blocks only, or the sidecar's
// own configuration file, whose other settings are ignored here.
func Load(path string) (Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("queues: %w", err)
	}
	return Parse(path, src)
}

// Parse is Load on a file's contents; path names it in errors and tells
// HCL from JSON by its extension.
func Parse(path string, src []byte) (Config, error) {
	var f file
	if err := hclsimple.Decode(path, src, nil, &f); err != nil {
		return Config{}, fmt.Errorf("queues: %w", err)
	}
	if len(f.Queues) == 0 {
		return Config{}, fmt.Errorf("queues: %s has no queue block: want at least one, e.g. queue \"team-a\" { guarantee = { v100 = 8 } }", path)
	}
	return FromBlocks(f.Queues)
}

// FromBlocks resolves queue blocks: defaults applied, every field
// checked, errors naming the queue and the field.
func FromBlocks(blocks []Block) (Config, error) {
	var c Config
	for _, b := range blocks {
		q := Queue{Name: b.Name, Namespaces: b.Namespaces, MetaNamespaces: b.MetaNamespaces, Policy: strings.TrimSpace(b.Policy), Weight: 1}
		var err error
		if q.Guarantee, err = gpuMap(b.Name, "guarantee", b.Guarantee); err != nil {
			return Config{}, err
		}
		if q.Limit, err = gpuMap(b.Name, "limit", b.Limit); err != nil {
			return Config{}, err
		}
		if b.Weight != nil {
			q.Weight = *b.Weight
		}
		if b.MaxJobWeight != nil {
			q.MaxJobWeight = *b.MaxJobWeight
		}
		if b.ReclaimAfter != "" {
			d, err := time.ParseDuration(b.ReclaimAfter)
			if err != nil || d < 0 {
				return Config{}, fmt.Errorf("queue %q: reclaim_after %q: want a duration >= 0 such as \"5m\"", b.Name, b.ReclaimAfter)
			}
			q.ReclaimAfter = d.Seconds()
		}
		if b.MaxMinRunTime != "" {
			d, err := time.ParseDuration(b.MaxMinRunTime)
			if err != nil || d < 0 {
				return Config{}, fmt.Errorf("queue %q: max_min_run_time %q: want a duration >= 0 such as \"2h\" (0: no cap of the queue's own)", b.Name, b.MaxMinRunTime)
			}
			q.MaxMinRunTime = d.Seconds()
		}
		c.Queues = append(c.Queues, q)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func gpuMap(queue, field string, m map[string]int) (map[planner.GPUType]int, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[planner.GPUType]int, len(m))
	for name, k := range m {
		t := planner.GPUType(name)
		if !t.ValidName() {
			return nil, fmt.Errorf("queue %q: %s: GPU type %q: want a lowercase type name as the cluster's (v100, a100, ...)", queue, field, name)
		}
		out[t] = k
	}
	return out, nil
}

// ValidName reports whether s can name a queue: what a Nomad namespace
// may be called (letters, digits, '-'), plus '_' and '.', at most 128
// characters. Names appear in metrics labels and the status API.
func ValidName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// Validate checks every queue: names unique and valid, GPU counts >= 0, a
// guarantee within the limit, a positive finite weight, a job weight cap
// >= 0, a namespace in one queue's namespaces at most.
func (c Config) Validate() error {
	names := map[string]bool{}
	owner := map[string]string{}
	for _, q := range c.Queues {
		if !ValidName(q.Name) {
			return fmt.Errorf("queue %q: want a name of letters, digits, '-', '_' or '.', at most 128 characters", q.Name)
		}
		if names[q.Name] {
			return fmt.Errorf("queue %q is defined twice: want one block per queue", q.Name)
		}
		names[q.Name] = true
		for t, k := range q.Guarantee {
			if k < 0 {
				return fmt.Errorf("queue %q: guarantee %s = %d: want a number of GPUs >= 0", q.Name, t, k)
			}
			if lim, ok := q.Limit[t]; ok && k > lim {
				return fmt.Errorf("queue %q: guarantee %s = %d is above its limit %d: raise the limit or lower the guarantee", q.Name, t, k, lim)
			}
		}
		for t, k := range q.Limit {
			if k < 0 {
				return fmt.Errorf("queue %q: limit %s = %d: want a number of GPUs >= 0", q.Name, t, k)
			}
		}
		if !(q.Weight > 0) || math.IsInf(q.Weight, 0) {
			return fmt.Errorf("queue %q: weight %v: want a positive number (1 = an equal share of what guarantees leave)", q.Name, q.Weight)
		}
		if !(q.MaxJobWeight >= 0) || math.IsInf(q.MaxJobWeight, 0) {
			return fmt.Errorf("queue %q: max_job_weight %v: want a number > 0, or 0 for no cap", q.Name, q.MaxJobWeight)
		}
		if !(q.ReclaimAfter >= 0) || math.IsInf(q.ReclaimAfter, 0) {
			return fmt.Errorf("queue %q: reclaim_after %v s: want seconds >= 0", q.Name, q.ReclaimAfter)
		}
		if !(q.MaxMinRunTime >= 0) || math.IsInf(q.MaxMinRunTime, 0) {
			return fmt.Errorf("queue %q: max_min_run_time %v s: want seconds >= 0", q.Name, q.MaxMinRunTime)
		}
		for _, ns := range q.Namespaces {
			if ns == "" || ns == "*" {
				return fmt.Errorf("queue %q: namespaces: %q: want namespace names (a namespace no queue lists is a queue of its own)", q.Name, ns)
			}
			if o, dup := owner[ns]; dup {
				return fmt.Errorf("queue %q: namespace %q already belongs to queue %q: list it in one queue, and let others accept it with meta_namespaces", q.Name, ns, o)
			}
			owner[ns] = q.Name
		}
		for _, ns := range q.MetaNamespaces {
			if ns == "" {
				return fmt.Errorf("queue %q: meta_namespaces: an empty name: want namespace names or \"*\"", q.Name)
			}
		}
	}
	return nil
}

// Find returns the queue of that name.
func (c Config) Find(name string) (Queue, bool) {
	for _, q := range c.Queues {
		if q.Name == name {
			return q, true
		}
	}
	return Queue{}, false
}

// NamespaceQueuePrefix starts the name of the queue of its own that a
// namespace no queue lists gets. ':' is not allowed in a configured
// queue's name (ValidName), so such a queue can never be taken for a
// configured one and get its guarantee, whatever the namespace is called
// and whatever queues are configured later (a job keeps its queue across
// restarts).
const NamespaceQueuePrefix = "ns:"

// NamespaceQueue is the queue of its own of namespace ns ("" is Nomad's
// default namespace): no guarantee, weight 1, the default policy.
func NamespaceQueue(ns string) string {
	if ns == "" {
		ns = "default"
	}
	return NamespaceQueuePrefix + ns
}

// QueueOf is the queue of a job of Nomad namespace ns ("" is Nomad's
// default namespace) whose meta hadar.queue is meta ("" when absent): the
// queue meta names when that queue accepts the namespace, else the queue
// listing the namespace, else the namespace's queue of its own
// (NamespaceQueue), never a configured queue that merely shares its name.
// note says why a meta was not followed ("" when it was, or there was
// none).
func (c Config) QueueOf(ns, meta string) (name, note string) {
	if ns == "" {
		ns = "default"
	}
	if meta != "" {
		q, ok := c.Find(meta)
		switch {
		case !ok:
			note = fmt.Sprintf("%s = %q ignored: no such queue", MetaKey, meta)
		case slices.Contains(q.Namespaces, ns) || slices.Contains(q.MetaNamespaces, ns) || slices.Contains(q.MetaNamespaces, "*"):
			return q.Name, ""
		default:
			note = fmt.Sprintf("%s = %q ignored: queue %s does not accept jobs of namespace %s (its meta_namespaces)", MetaKey, meta, q.Name, ns)
		}
	}
	for _, q := range c.Queues {
		if slices.Contains(q.Namespaces, ns) {
			return q.Name, note
		}
	}
	return NamespaceQueue(ns), note
}

// CheckCapacity reports guarantees that add up to more GPUs of a type
// than capacity holds: the queues could not all get them back. The
// scheduler scales oversubscribed guarantees down at run time (a node
// lost); a configuration checked against the cluster it is meant for
// should not need it.
func (c Config) CheckCapacity(capacity map[planner.GPUType]int) error {
	sum := map[planner.GPUType]int{}
	for _, q := range c.Queues {
		for t, k := range q.Guarantee {
			sum[t] += k
		}
	}
	var bad []string
	for t, k := range sum {
		if k > capacity[t] {
			bad = append(bad, fmt.Sprintf("%s: %d guaranteed, %d in the cluster", t, k, capacity[t]))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("queues guarantee more GPUs than the cluster has (%s): lower the guarantees", strings.Join(bad, "; "))
}
