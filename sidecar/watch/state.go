package watch

import (
	"maps"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// ChangeKind is a bit set of what changed in the view.
type ChangeKind uint32

const (
	// NodeAdded: a node registered. NodeChanged: a node's status,
	// eligibility, drain, meta, attributes, drivers, class, pool,
	// address, resources or GPUs (their health included) changed.
	// NodeRemoved: a node was garbage-collected.
	NodeAdded ChangeKind = 1 << iota
	NodeChanged
	NodeRemoved
	// JobArrived: a managed job appeared (or an existing job became
	// managed). JobChanged: a managed job's spec (new version), stop flag
	// or status changed. JobRemoved: a managed job was purged or stopped
	// being managed.
	JobArrived
	JobChanged
	JobRemoved
	// AllocPlaced: a managed job got a new allocation. AllocChanged: one
	// changed state (task events included) or was garbage-collected.
	// AllocTerminal: one finished (complete, failed or lost).
	AllocPlaced
	AllocChanged
	AllocTerminal
	// EvalBlocked: a managed job has a new or updated blocked evaluation
	// (Nomad cannot place it). EvalUnblocked: one left the blocked state.
	EvalBlocked
	EvalUnblocked
	// Resynced: the view was replaced by a full re-list; the other bits
	// of the same Change say what the re-list found different.
	Resynced
	// CapacityChanged: GPUs held by jobs hadar does not manage changed.
	CapacityChanged
	// UsageChanged: the CPU, memory or disk live allocations (of any job)
	// hold changed (Snapshot.Usage).
	UsageChanged
)

var kindNames = []string{"node-added", "node-changed", "node-removed", "job-arrived", "job-changed", "job-removed",
	"alloc-placed", "alloc-changed", "alloc-terminal", "eval-blocked", "eval-unblocked", "resynced", "capacity-changed",
	"usage-changed"}

func (k ChangeKind) String() string {
	var parts []string
	for i, name := range kindNames {
		if k&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}

// Change tells the sidecar that the view changed, and how. Read the view
// itself with Watcher.Snapshot.
type Change struct {
	Kinds ChangeKind
	// Index is the view's Nomad index after the change.
	Index uint64
}

// Has reports whether any of kinds happened.
func (c Change) Has(kinds ChangeKind) bool { return c.Kinds&kinds != 0 }

func (c Change) merge(o Change) Change {
	return Change{Kinds: c.Kinds | o.Kinds, Index: max(c.Index, o.Index)}
}

// tableIndex holds, per event topic, the Nomad index its last list
// reflects: stream events at or below it are already in the view.
type tableIndex struct {
	nodes, jobs, allocs, evals uint64
}

func (t tableIndex) min() uint64 { return min(t.nodes, t.jobs, t.allocs, t.evals) }
func (t tableIndex) max() uint64 { return max(t.nodes, t.jobs, t.allocs, t.evals) }

// state is the live, mutable view. Its map values are never changed once
// stored (an update stores a new value), so freezing it is a shallow copy
// of the maps.
type state struct {
	index  uint64
	tables tableIndex
	synced time.Time
	nodes  map[string]*Node
	jobs   map[JobKey]*Job
	allocs map[string]*Alloc
	evals  map[string]*Eval
	// held are the GPUs live allocations of unmanaged jobs hold, by
	// allocation ID.
	held map[string]*Held
	// usage is what every live allocation holds, by allocation ID.
	usage map[string]*Usage
}

func newState() *state {
	return &state{nodes: map[string]*Node{}, jobs: map[JobKey]*Job{}, allocs: map[string]*Alloc{}, evals: map[string]*Eval{},
		held: map[string]*Held{}, usage: map[string]*Usage{}}
}

func (s *state) freeze() *Snapshot {
	snap := &Snapshot{
		Index: s.index, Synced: s.synced,
		Nodes: maps.Clone(s.nodes), Jobs: maps.Clone(s.jobs), Allocs: maps.Clone(s.allocs), BlockedEvals: maps.Clone(s.evals),
		Usage: maps.Clone(s.usage),
	}
	for _, h := range s.held {
		snap.Unmanaged = append(snap.Unmanaged, *h)
	}
	sort.Slice(snap.Unmanaged, func(i, j int) bool { return snap.Unmanaged[i].AllocID < snap.Unmanaged[j].AllocID })
	snap.indexAllocs()
	return snap
}

// hold records (or, for a terminal allocation or one without GPUs,
// forgets) the GPUs an allocation of an unmanaged job holds, and reports
// whether that changed anything.
func (s *state) hold(a *api.Allocation) ChangeKind {
	h := heldBy(a)
	old := s.held[a.ID]
	switch {
	case h == nil && old == nil:
		return 0
	case h == nil:
		delete(s.held, a.ID)
	case old != nil && reflect.DeepEqual(*old, *h):
		return 0
	default:
		s.held[a.ID] = h
	}
	return CapacityChanged
}

// use records (or, for a terminal allocation, forgets) what an
// allocation of any job holds of its node, and reports whether that
// changed anything.
func (s *state) use(a *api.Allocation) ChangeKind {
	u := usageOf(a)
	old := s.usage[a.ID]
	switch {
	case u == nil && old == nil:
		return 0
	case u == nil:
		delete(s.usage, a.ID)
	case old != nil && *old == *u:
		return 0
	default:
		s.usage[a.ID] = u
	}
	return UsageChanged
}

// The *Change functions say what replacing was by now (either may be nil)
// means to the sidecar. Both apply (one event) and a re-list (a whole
// view) use them.

func nodeChange(was, now *Node) ChangeKind {
	switch {
	case was == nil && now == nil:
		return 0
	case was == nil:
		return NodeAdded
	case now == nil:
		return NodeRemoved
	}
	a, b := *was, *now
	a.ModifyIndex, b.ModifyIndex = 0, 0
	if reflect.DeepEqual(a, b) {
		return 0
	}
	return NodeChanged
}

func jobChange(was, now *Job) ChangeKind {
	wasManaged, isManaged := was != nil && was.Managed, now != nil && now.Managed
	switch {
	case !wasManaged && isManaged:
		return JobArrived
	case wasManaged && !isManaged:
		return JobRemoved
	case isManaged && (was.JobModifyIndex != now.JobModifyIndex || was.Stop != now.Stop || was.Status != now.Status):
		return JobChanged
	}
	return 0
}

func allocChange(was, now *Alloc) ChangeKind {
	switch {
	case was == nil && now == nil:
		return 0
	case was == nil:
		k := AllocPlaced
		if now.Terminal() {
			k |= AllocTerminal
		}
		return k
	case now == nil:
		return AllocChanged
	case !was.Terminal() && now.Terminal():
		return AllocTerminal | AllocChanged
	}
	a, b := *was, *now
	a.ModifyIndex, b.ModifyIndex, a.ModifyTime, b.ModifyTime = 0, 0, time.Time{}, time.Time{}
	if reflect.DeepEqual(a, b) {
		return 0
	}
	return AllocChanged
}

func evalChange(was, now *Eval) ChangeKind {
	switch {
	case was == nil && now == nil:
		return 0
	case now == nil:
		return EvalUnblocked
	case was == nil || was.ModifyIndex != now.ModifyIndex:
		return EvalBlocked
	}
	return 0
}

// diffStates says what replacing the view was by now changes.
func diffStates(was, now *state) ChangeKind {
	var k ChangeKind
	k |= diffKinds(was.nodes, now.nodes, nodeChange)
	k |= diffKinds(was.jobs, now.jobs, jobChange)
	k |= diffKinds(was.allocs, now.allocs, allocChange)
	k |= diffKinds(was.evals, now.evals, evalChange)
	if !maps.EqualFunc(was.held, now.held, func(a, b *Held) bool { return reflect.DeepEqual(a, b) }) {
		k |= CapacityChanged
	}
	if !maps.EqualFunc(was.usage, now.usage, func(a, b *Usage) bool { return *a == *b }) {
		k |= UsageChanged
	}
	return k
}

func diffKinds[K comparable, V any](was, now map[K]*V, change func(a, b *V) ChangeKind) ChangeKind {
	var k ChangeKind
	for key, a := range was {
		k |= change(a, now[key])
	}
	for key, b := range now {
		if _, ok := was[key]; !ok {
			k |= change(nil, b)
		}
	}
	return k
}

// removeJobObjects drops a job's allocations, blocked evaluations and
// GPU holds (the job was purged or is no longer managed).
func (s *state) removeJobObjects(k JobKey) ChangeKind {
	ch := s.dropHolds(k)
	for id, a := range s.allocs {
		if a.Job() == k {
			delete(s.allocs, id)
			ch |= AllocChanged
		}
	}
	for id, e := range s.evals {
		if e.Job() == k {
			delete(s.evals, id)
			ch |= EvalUnblocked
		}
	}
	return ch
}

// dropHolds forgets the GPUs and the resources a job's allocations hold.
// A purge deletes a job's allocations from Nomad's state without an
// allocation event, so the job's deletion is the last word on them.
func (s *state) dropHolds(k JobKey) ChangeKind {
	var ch ChangeKind
	for id, h := range s.held {
		if h.Job == k {
			delete(s.held, id)
			ch |= CapacityChanged
		}
	}
	for id, u := range s.usage {
		if u.Job == k {
			delete(s.usage, id)
			ch |= UsageChanged
		}
	}
	return ch
}
