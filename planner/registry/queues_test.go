package registry

import (
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/speed"
)

func TestBuildQueues(t *testing.T) {
	o := Options{Types: []planner.GPUType{"v100"}, Speed: speed.Model{Profile: profile.Default()}}
	qc := queue.Config{Queues: []queue.Queue{{Name: "a", Weight: 1, Policy: "hadar"}, {Name: "b", Weight: 1}}}
	s, err := BuildQueues(qc, "gavel-maxmin", placement.Delay, o, placement.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "queues(gavel-maxmin)" {
		t.Fatalf("name %q", s.Name())
	}
	qc.Queues[1].Policy = "gavel-fastest"
	if _, err := BuildQueues(qc, "fifo", placement.Pack, o, placement.Config{}); err == nil || !strings.Contains(err.Error(), `queue "b"`) || !strings.Contains(err.Error(), "gavel-fastest") {
		t.Fatalf("an unknown policy in a queue gave %v", err)
	}
	if _, err := BuildQueues(queue.Config{}, "nope", placement.Pack, o, placement.Config{}); err == nil || !strings.Contains(err.Error(), "default policy") {
		t.Fatalf("an unknown default policy gave %v", err)
	}
}
