package watch

import (
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"
)

// scanAllocsOf is AllocsOf as it was before the index: every allocation
// scanned, the job's sorted by creation time then ID.
func scanAllocsOf(s *Snapshot, k JobKey) []*Alloc {
	var out []*Alloc
	for _, a := range s.Allocs {
		if a.Job() == k {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreateTime.Equal(out[j].CreateTime) {
			return out[i].CreateTime.Before(out[j].CreateTime)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// indexedState holds allocations of several jobs: the same job ID in two
// namespaces, ties in creation time, and a job with none.
func indexedState() *state {
	st := newState()
	t0 := time.Unix(1000, 0)
	add := func(id, ns, job string, at time.Duration) {
		st.allocs[id] = &Alloc{ID: id, Namespace: ns, JobID: job, CreateTime: t0.Add(at)}
	}
	add("a3", "default", "train", 2*time.Second)
	add("a1", "default", "train", time.Second)
	add("a2", "default", "train", time.Second) // tie: by ID
	add("b1", "research", "train", 0)          // same job ID, other namespace
	add("b0", "research", "train", 3*time.Second)
	add("c1", "default", "eval", 0)
	return st
}

func TestAllocsOfIndexed(t *testing.T) {
	snap := indexedState().freeze()
	if snap.byJob == nil {
		t.Fatal("freeze built no index")
	}
	keys := []JobKey{{"default", "train"}, {"research", "train"}, {"default", "eval"}, {"default", "none"}, {"other", "train"}}
	for _, k := range keys {
		got, want := snap.AllocsOf(k), scanAllocsOf(snap, k)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("AllocsOf(%v) = %v, want %v", k, ids(got), ids(want))
		}
	}
	if got := ids(snap.AllocsOf(JobKey{"default", "train"})); !reflect.DeepEqual(got, []string{"a1", "a2", "a3"}) {
		t.Errorf("default/train = %v", got)
	}
	if got := ids(snap.AllocsOf(JobKey{"research", "train"})); !reflect.DeepEqual(got, []string{"b1", "b0"}) {
		t.Errorf("research/train = %v", got)
	}

	// An append to the result must not reach the index.
	out := snap.AllocsOf(JobKey{"default", "train"})
	_ = append(out, &Alloc{ID: "zz"})
	if got := ids(snap.AllocsOf(JobKey{"default", "train"})); len(got) != 3 {
		t.Errorf("an append changed the index: %v", got)
	}

	// A copy given other allocations answers from them, not the index.
	next := *snap
	next.Allocs = map[string]*Alloc{"d1": {ID: "d1", Namespace: "default", JobID: "train"}}
	if got := ids(next.AllocsOf(JobKey{"default", "train"})); !reflect.DeepEqual(got, []string{"d1"}) {
		t.Errorf("copy with other Allocs = %v", got)
	}
	// A Snapshot built as a literal (tests do) scans.
	lit := &Snapshot{Allocs: snap.Allocs}
	if got := ids(lit.AllocsOf(JobKey{"default", "train"})); !reflect.DeepEqual(got, []string{"a1", "a2", "a3"}) {
		t.Errorf("literal = %v", got)
	}
}

func ids(as []*Alloc) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.ID)
	}
	return out
}

// BenchmarkAllocsOf asks for every job's allocations once, as an agent
// pass does, on a snapshot of 1000 jobs with 4 allocations each.
func BenchmarkAllocsOf(b *testing.B) {
	st := newState()
	var keys []JobKey
	for j := range 1000 {
		k := JobKey{"default", fmt.Sprintf("job%d", j)}
		keys = append(keys, k)
		for i := range 4 {
			id := fmt.Sprintf("%s/%d", k.ID, i)
			st.allocs[id] = &Alloc{ID: id, Namespace: k.Namespace, JobID: k.ID, CreateTime: time.Unix(int64(i), 0)}
		}
	}
	snap := st.freeze()
	b.ResetTimer()
	for range b.N {
		for _, k := range keys {
			snap.AllocsOf(k)
		}
	}
}
