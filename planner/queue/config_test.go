package queue_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
)

func TestParseEveryField(t *testing.T) {
	src := `
queue "team-a" {
  namespaces      = ["ml-a", "ml-a-dev"]
  meta_namespaces = ["*"]
  guarantee       = { v100 = 8, k80 = 4 }
  limit           = { v100 = 24 }
  weight          = 2.5
  policy          = "gavel-maxmin"
  max_job_weight  = 10
  reclaim_after   = "5m"
  max_min_run_time = "2h"
}

queue "team-b" {
}
`
	c, err := queue.Parse("queues.hcl", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	a, ok := c.Find("team-a")
	if !ok || len(c.Queues) != 2 {
		t.Fatalf("queues %+v", c.Queues)
	}
	if a.Guarantee["v100"] != 8 || a.Guarantee["k80"] != 4 || a.Limit["v100"] != 24 || len(a.Limit) != 1 || a.Weight != 2.5 ||
		a.Policy != "gavel-maxmin" || a.MaxJobWeight != 10 || a.ReclaimAfter != 300 || a.MaxMinRunTime != 7200 || len(a.Namespaces) != 2 || a.MetaNamespaces[0] != "*" {
		t.Fatalf("team-a read as %+v", a)
	}
	b, _ := c.Find("team-b")
	if b.Weight != 1 || b.Guarantee != nil || b.ReclaimAfter != 0 || b.MaxJobWeight != 0 {
		t.Fatalf("team-b's defaults: %+v", b)
	}
}

// The simulator reads the sidecar's own configuration file: the queue
// blocks, whatever else it holds.
func TestLoadTakesTheQueuesOfASidecarConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sidecar.hcl")
	src := `
policy = "hadar"
nomad {
  address = "http://127.0.0.1:4646"
}
queue "research" {
  guarantee = { a100 = 16 }
}
`
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := queue.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if q, ok := c.Find("research"); !ok || q.Guarantee["a100"] != 16 {
		t.Fatalf("read %+v", c)
	}
	// HCL's JSON syntax too, by the file's name.
	js := filepath.Join(dir, "queues.json")
	if err := os.WriteFile(js, []byte(`{"queue": {"research": {"guarantee": {"a100": 16}, "weight": 3}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err = queue.Load(js); err != nil {
		t.Fatal(err)
	}
	if q, _ := c.Find("research"); q.Guarantee["a100"] != 16 || q.Weight != 3 {
		t.Fatalf("read from JSON %+v", c)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{``, "no queue block"},
		{`queue "a" {}` + "\n" + `queue "a" {}`, "defined twice"},
		{`queue "a b" {}`, "want a name"},
		{"queue \"a\" {\n guarantee = { v100 = 8 }\n limit = { v100 = 4 }\n}", "above its limit 4"},
		{`queue "a" { guarantee = { v100 = -1 } }`, "want a number of GPUs >= 0"},
		{`queue "a" { limit = { k80 = -2 } }`, "limit k80 = -2"},
		{`queue "a" { guarantee = { V100 = 8 } }`, `GPU type "V100"`},
		{`queue "a" { weight = 0 }`, "weight 0"},
		{`queue "a" { weight = -1 }`, "weight -1"},
		{`queue "a" { max_job_weight = -3 }`, "max_job_weight -3"},
		{`queue "a" { reclaim_after = "soon" }`, `reclaim_after "soon"`},
		{`queue "a" { reclaim_after = "-5m" }`, `reclaim_after "-5m"`},
		{`queue "a" { namespaces = ["x"] }` + "\n" + `queue "b" { namespaces = ["x"] }`, `namespace "x" already belongs to queue "a"`},
		{`queue "a" { namespaces = ["*"] }`, "want namespace names"},
		{`queue "a" { guarantee_gpus = 3 }`, "Unsupported argument"},
	} {
		_, err := queue.Parse("q.hcl", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.src, err, c.want)
		}
	}
}

func TestQueueOf(t *testing.T) {
	c, err := queue.Parse("q.hcl", []byte(`
queue "shared" {
  namespaces      = ["default"]
  meta_namespaces = ["*"]
}
queue "vision" {
  namespaces      = ["cv"]
  meta_namespaces = ["cv-dev"]
}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns, meta, want, note string
	}{
		{"cv", "", "vision", ""},
		{"default", "", "shared", ""},
		{"cv-dev", "vision", "vision", ""},             // allowed by meta_namespaces
		{"cv", "shared", "shared", ""},                 // shared accepts any namespace
		{"nlp", "vision", "ns:nlp", "does not accept"}, // refused: its own queue
		{"cv", "nope", "vision", "no such queue"},
		{"nlp", "", "ns:nlp", ""}, // a namespace no queue lists is a queue of its own
		{"", "", "shared", ""},    // Nomad's default namespace
	} {
		got, note := c.QueueOf(tc.ns, tc.meta)
		if got != tc.want || (tc.note == "") != (note == "") || !strings.Contains(note, tc.note) {
			t.Errorf("namespace %q meta %q: queue %q note %q; want %q, a note containing %q", tc.ns, tc.meta, got, note, tc.want, tc.note)
		}
	}
}

// A namespace no queue lists is a queue of its own with no guarantee,
// even when a configured queue has its name: namespace "vision" must not
// land in queue "vision" (which lists "cv") and reclaim its guarantee, nor
// Nomad's "default" namespace in a queue named "default" that does not
// list it. Its queue's name can name no configured queue.
func TestQueueOfNamespaceNamedLikeAQueue(t *testing.T) {
	c, err := queue.Parse("q.hcl", []byte(`
queue "vision" {
  namespaces = ["cv"]
  guarantee  = { v100 = 16 }
}
queue "default" {
  namespaces = ["ops"]
  guarantee  = { v100 = 4 }
}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"vision", "default", ""} {
		got, _ := c.QueueOf(ns, "")
		if _, configured := c.Find(got); configured || queue.ValidName(got) {
			t.Errorf("namespace %q lands in queue %q: a configured queue's name, or one a queue could be given", ns, got)
		}
	}
	// The meta still works where the queue accepts the namespace.
	if got, note := c.QueueOf("cv", "default"); got != "vision" || note == "" {
		t.Errorf("cv with hadar.queue=default: %q %q", got, note)
	}
}

func TestCheckCapacity(t *testing.T) {
	c := queue.Config{Queues: []queue.Queue{
		{Name: "a", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 6, "a100": 1}},
		{Name: "b", Weight: 1, Guarantee: map[planner.GPUType]int{"v100": 4}},
	}}
	if err := c.CheckCapacity(map[planner.GPUType]int{"v100": 10, "a100": 1}); err != nil {
		t.Fatal(err)
	}
	err := c.CheckCapacity(map[planner.GPUType]int{"v100": 8})
	if err == nil || !strings.Contains(err.Error(), "v100: 10 guaranteed, 8 in the cluster") || !strings.Contains(err.Error(), "a100: 1 guaranteed, 0 in the cluster") {
		t.Fatalf("got %v", err)
	}
}
