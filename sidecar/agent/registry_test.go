package agent

import (
	"errors"
	"slices"
	"testing"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

// TestRegistryJobs: admitting a job ends its refusal; keys come in a
// stable order; dropping and restoring forget what was admitted.
func TestRegistryJobs(t *testing.T) {
	r := newRoster()
	b, a := watch.JobKey{Namespace: "default", ID: "b"}, watch.JobKey{Namespace: "default", ID: "a"}
	r.refuse(a, invalidJob{err: errors.New("no profile"), admission: true})
	r.admitted(&managed{key: b, id: "default/b"})
	r.admitted(&managed{key: a, id: "default/a"})
	if _, ok := r.refusal(a); ok {
		t.Fatal("an admitted job is still refused")
	}
	if got := r.keys(); !slices.Equal(got, []watch.JobKey{a, b}) || r.count() != 2 {
		t.Fatalf("keys %v, count %d; want [a b], 2", got, r.count())
	}
	ids := 0
	for mj := range r.all() {
		if r.job(mj.key) != mj {
			t.Fatalf("all yields %s, which job does not return", mj.key)
		}
		ids++
	}
	if ids != 2 {
		t.Fatalf("all yields %d jobs, want 2", ids)
	}
	r.drop(b)
	if r.job(b) != nil || r.count() != 1 {
		t.Fatal("a dropped job is still admitted")
	}
	r.restore(nil)
	if r.count() != 0 || r.job(a) != nil {
		t.Fatal("restoring nothing kept a job")
	}
	r.restore(map[watch.JobKey]*managed{b: {key: b}})
	if r.job(b) == nil {
		t.Fatal("a restored job is not admitted")
	}
}

// TestRegistryRefused: refusals update, end, list in order, and end when
// their job is no longer seen.
func TestRegistryRefused(t *testing.T) {
	r := newRoster()
	x, y := watch.JobKey{Namespace: "b", ID: "x"}, watch.JobKey{Namespace: "a", ID: "y"}
	r.refuse(x, invalidJob{err: errors.New("bad"), index: 1})
	r.refuse(y, invalidJob{err: errors.New("bad"), index: 2})
	iv, _ := r.refusal(x)
	iv.noted = 5
	r.refuse(x, iv)
	if got, _ := r.refusal(x); got.noted != 5 {
		t.Fatalf("refusal not updated: noted %d", got.noted)
	}
	if got := r.refused(); !slices.Equal(got, []watch.JobKey{y, x}) || r.refusedCount() != 2 {
		t.Fatalf("refused %v, want [a/y b/x]", got)
	}
	r.keepRefused(map[watch.JobKey]bool{x: true})
	if _, ok := r.refusal(y); ok || r.refusedCount() != 1 {
		t.Fatal("a job no longer seen is still refused")
	}
	r.unrefuse(x)
	if r.refusedCount() != 0 {
		t.Fatal("unrefuse left a refusal")
	}
}

// TestRegistryLeaving: GPUs leaving are set, replaced, listed in order,
// and dropped when the job's operation ends.
func TestRegistryLeaving(t *testing.T) {
	r := newRoster()
	x, y := watch.JobKey{Namespace: "default", ID: "x"}, watch.JobKey{Namespace: "default", ID: "y"}
	r.leaves(y, map[gpuSlot]int{{node: "n1", typ: "a100"}: 2})
	r.leaves(x, map[gpuSlot]int{{node: "n2", typ: "a100"}: 1})
	if got := r.leavingKeys(); !slices.Equal(got, []watch.JobKey{x, y}) {
		t.Fatalf("leaving %v, want [x y]", got)
	}
	if r.leavingGPUs(y)[gpuSlot{"n1", "a100"}] != 2 {
		t.Fatal("y's leaving GPUs lost")
	}
	r.leaves(y, map[gpuSlot]int{{node: "n3", typ: "h100"}: 1})
	if g := r.leavingGPUs(y); len(g) != 1 || g[gpuSlot{"n3", "h100"}] != 1 {
		t.Fatalf("a new leaving set did not replace the old: %v", g)
	}
	r.settleLeaving(func(k watch.JobKey) bool { return k == x })
	if r.leavingGPUs(x) != nil || r.leavingGPUs(y) == nil {
		t.Fatal("settleLeaving dropped the wrong job")
	}
	r.left(y)
	if len(r.leavingKeys()) != 0 {
		t.Fatal("left kept y's GPUs leaving")
	}
}
