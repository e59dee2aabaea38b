package telemetry

import (
	metrics "github.com/hashicorp/go-metrics"

	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/queues"
)

// QueueSource is a Source whose plans share the fleet among team queues
// (the agent, when its configuration has queue blocks).
type QueueSource interface {
	// Queues is the queues after the last plan; ok is false when there
	// are no queues or no plan ran yet.
	Queues() (queue.Status, queue.Config, bool)
}

// QueueDefs are the queues' families (sidecar/queues.Defs): served when
// the source has queues, documented in docs/status.md with the others.
var QueueDefs = func() []Def {
	out := make([]Def, len(queues.Defs))
	for k, d := range queues.Defs {
		out[k] = Def{Name: d.Name, Type: d.Type, Labels: d.Labels, Help: d.Help}
	}
	return out
}()

// sampleQueues sets the queues' gauges and adds to their preemption
// counter what the totals grew by since the previous sample (the first
// sample with queues is the baseline: a restored total is not counted
// again). Called under t.mu.
func (t *Telemetry) sampleQueues() {
	qs, ok := t.src.(QueueSource)
	if !ok {
		return
	}
	st, _, ok := qs.Queues()
	if !ok {
		return
	}
	for _, s := range queues.Gauges(st) {
		t.gauge(s.Name, s.Value, queueLabels(s.Labels)...)
	}
	cur := queues.Counters(st)
	grew := t.seen.queuesGrew(cur)
	for k := range cur {
		t.inc("hadar_queue_preemptions_total", int(grew[k]), lbl("queue", k.Queue), lbl("reason", k.Reason))
	}
}

func queueLabels(ls [][2]string) []metrics.Label {
	out := make([]metrics.Label, len(ls))
	for k, l := range ls {
		out[k] = lbl(l[0], l[1])
	}
	return out
}
