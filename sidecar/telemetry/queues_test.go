package telemetry

import (
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

type queueFake struct {
	fake
	st queue.Status
}

func (f *queueFake) Queues() (queue.Status, queue.Config, bool) { return f.st, queue.Config{}, true }

// With queues, their families are served with the documented help,
// type and labels; the preemption counter counts what grew after the
// first sample.
func TestQueueMetrics(t *testing.T) {
	a := running("default/a", unit("n1", "v100", 2))
	f := &queueFake{fake: fake{h: wire.Health{Writes: map[string]int{}}, obs: cluster(t0, a)}}
	f.st = queue.Status{Queues: []queue.QueueStatus{{Name: "vision", Guarantee: map[planner.GPUType]int{"v100": 4}, Limit: map[planner.GPUType]int{"v100": 8},
		Share: map[planner.GPUType]int{"v100": 4}, Used: map[planner.GPUType]int{"v100": 6}, Borrowed: map[planner.GPUType]int{"v100": 2}, Admitted: 2, Pending: 1, Reclaimed: 5}},
		Jobs: map[string]queue.JobStatus{"cv/w": {Queue: "vision", Reason: queue.Reason{Code: queue.ReasonAtLimit}}}}
	tel, err := New(f, Options{Policy: "gavel-maxmin"})
	if err != nil {
		t.Fatal(err)
	}
	tel.Sample()
	mfs := gathered(t, tel)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"hadar_queue_pending_jobs", []string{"queue", "vision", "reason", queue.ReasonAtLimit}, 1},
		{"hadar_queue_admitted_jobs", []string{"queue", "vision"}, 2},
		{"hadar_queue_guaranteed_gpus", []string{"queue", "vision", "gpu_type", "v100"}, 4},
		{"hadar_queue_limit_gpus", []string{"queue", "vision", "gpu_type", "v100"}, 8},
		{"hadar_queue_share_gpus", []string{"queue", "vision", "gpu_type", "v100"}, 4},
		{"hadar_queue_used_gpus", []string{"queue", "vision", "gpu_type", "v100"}, 6},
		{"hadar_queue_borrowed_gpus", []string{"queue", "vision", "gpu_type", "v100"}, 2},
		// The first sample is the baseline: the 5 restored are not counted.
		{"hadar_queue_preemptions_total", []string{"queue", "vision", "reason", "reclaim"}, 0},
	} {
		if got := value(mfs, c.name, append(c.labels, "policy", "gavel-maxmin")...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	f.st.Queues[0].Reclaimed = 8
	tel.Sample()
	if got := value(gathered(t, tel), "hadar_queue_preemptions_total", "queue", "vision", "reason", "reclaim"); got != 3 {
		t.Errorf("after 3 more reclaims: %v, want 3", got)
	}

	// Every queue family is served as documented, in QueueDefs and in
	// docs/status.md.
	doc, err := os.ReadFile("../../docs/status.md")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, mf := range gathered(t, tel) {
		served[mf.GetName()] = true
		d, ok := def(mf.GetName())
		if !ok || !strings.HasPrefix(d.Name, "hadar_queue_") {
			continue
		}
		if mf.GetHelp() != d.Help || strings.ToLower(mf.GetType().String()) != d.Type {
			t.Errorf("%s: help %q type %s, documented %q %s", d.Name, mf.GetHelp(), mf.GetType(), d.Help, d.Type)
		}
		for _, m := range mf.GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			sort.Strings(names)
			want := append([]string(nil), d.Labels...)
			sort.Strings(want)
			if strings.Join(names, ",") != strings.Join(want, ",") {
				t.Errorf("%s: labels %v, documented %v", d.Name, names, want)
			}
		}
	}
	for _, d := range QueueDefs {
		if !served[d.Name] {
			t.Errorf("%s is documented but not served", d.Name)
		}
		if !strings.Contains(string(doc), "| `"+d.Name+"` |") {
			t.Errorf("%s is not in docs/status.md's metrics table", d.Name)
		}
	}
}
