package config

import (
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
)

func TestQueueBlocks(t *testing.T) {
	// The sidecar's file holds queue blocks beside its other settings;
	// planner/queue reads the same file for hadar sim --queues.
	src := []byte(`
policy = "gavel-maxmin"
queue "vision" {
  namespaces     = ["cv"]
  guarantee      = { v100 = 8 }
  limit          = { v100 = 16 }
  policy         = "fifo"
  max_job_weight = 10
  reclaim_after  = "5m"
}
queue "shared" {
  namespaces      = ["default"]
  meta_namespaces = ["*"]
}
`)
	c, err := ParseConfig("s.hcl", src)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	qc := s.QueueConfig
	if len(qc.Queues) != 2 {
		t.Fatalf("queues: got %d, want 2", len(qc.Queues))
	}
	v := qc.Queues[0]
	if v.Name != "vision" || v.Guarantee[planner.GPUType("v100")] != 8 || v.Limit["v100"] != 16 || v.Policy != "fifo" || v.MaxJobWeight != 10 || v.ReclaimAfter != 300 || v.Weight != 1 {
		t.Errorf("vision: got %+v", v)
	}
	if q, note := qc.QueueOf("research", "shared"); q != "shared" || note != "" {
		t.Errorf("QueueOf(research, shared) = %q, %q: want shared", q, note)
	}
	// The simulator's parser takes the queues of the same file.
	sim, err := queue.Parse("s.hcl", src)
	if err != nil {
		t.Fatal(err)
	}
	if len(sim.Queues) != 2 || sim.Queues[0].ReclaimAfter != v.ReclaimAfter {
		t.Errorf("queue.Parse of the sidecar's file: got %+v", sim.Queues)
	}

	// No block: queues are off.
	c, err = ParseConfig("s.hcl", []byte(`policy = "fifo"`))
	if err != nil {
		t.Fatal(err)
	}
	if s, err = c.Resolve(); err != nil || len(s.QueueConfig.Queues) != 0 {
		t.Errorf("no queue block: got %+v, %v; want no queues", s.QueueConfig, err)
	}
}

func TestQueueBlockErrorsNameTheQueue(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`queue "a" { policy = "nope" }`, `queue "a": policy "nope"`},
		{`queue "a" {
  guarantee = { v100 = 9 }
  limit     = { v100 = 8 }
}`, `queue "a": guarantee v100 = 9 is above its limit 8`},
		{`queue "a" { reclaim_after = "soon" }`, `queue "a": reclaim_after "soon"`},
		{`queue "a" { namespaces = ["x"] }
queue "b" { namespaces = ["x"] }`, `namespace "x" already belongs to queue "a"`},
		{`queue "a" { weight = 0 }`, `queue "a": weight 0`},
	} {
		c, err := ParseConfig("s.hcl", []byte(tc.src))
		if err == nil {
			_, err = c.Resolve()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.src, err, tc.want)
		}
	}
}
