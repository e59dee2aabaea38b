package telemetry

import (
	"testing"

	"github.com/hashicorp/go-metrics"

	"github.com/hadar-sched/hadar/sidecar/queues"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Each sample counts only what grew since the one before, from the totals
// telemetry started with (a restored history is not counted again); a
// total that went back adds nothing.
func TestTotalsCountWhatGrew(t *testing.T) {
	start := wire.Health{Rounds: 7, Repairs: map[string]int{wire.RepairPlacement: 2}, LeaderGained: 1}
	tot := newTotals(start)
	got := map[string]int{}
	inc := func(name string, n int, labels ...metrics.Label) {
		key := name
		for _, l := range labels {
			key += "," + l.Name + "=" + l.Value
		}
		got[key] += n
	}
	h := wire.Health{Rounds: 9, Writes: map[string]int{"start": 3, "rollback": 1}, Repairs: map[string]int{wire.RepairPlacement: 3}, LeaderGained: 2, LeaderLost: 1}
	tot.advance(h, watch.Stats{APIErrors: 4, Relists: 1}, inc)
	want := map[string]int{
		"hadar_rounds_total": 2, "hadar_nomad_api_errors_total,source=watch": 4, "hadar_nomad_api_errors_total,source=progress": 0,
		"hadar_nomad_reconnects_total": 0, "hadar_nomad_relists_total": 1,
		"hadar_nomad_writes_total,kind=start": 3, "hadar_nomad_writes_total,kind=rollback": 1, "hadar_evictions_total,reason=" + ReasonRolledBack: 1,
		"hadar_plan_repairs_total,kind=" + wire.RepairPlacement: 1, "hadar_leader_changes_total,to=leader": 1, "hadar_leader_changes_total,to=follower": 1,
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d, want %d", k, got[k], n)
		}
	}
	got = map[string]int{}
	h.Rounds = 3 // the agent's count went back
	tot.advance(h, watch.Stats{APIErrors: 4, Relists: 1}, inc)
	for k, n := range got {
		if n != 0 {
			t.Errorf("%s grew by %d with nothing new", k, n)
		}
	}
	if tot.rounds != 3 {
		t.Fatalf("rounds kept %d, want 3", tot.rounds)
	}
}

// The queues' preemption totals grow from the first sample with queues.
func TestTotalsQueuesGrew(t *testing.T) {
	var tot totals
	k := queues.CounterKey{Queue: "a", Reason: "reclaim"}
	if grew := tot.queuesGrew(map[queues.CounterKey]uint64{k: 2}); grew != nil {
		t.Fatalf("the first sample grew %v", grew)
	}
	if grew := tot.queuesGrew(map[queues.CounterKey]uint64{k: 5}); grew[k] != 3 {
		t.Fatalf("grew %v, want 3", grew)
	}
}
