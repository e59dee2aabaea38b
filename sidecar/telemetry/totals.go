package telemetry

import (
	"github.com/hashicorp/go-metrics"

	"github.com/hadar-sched/hadar/sidecar/queues"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// totals are the agent's and the watcher's running totals as the previous
// sample saw them: a counter adds only what grew since, so it counts this
// process's events, not a restored history's. Guarded by Telemetry.mu.
type totals struct {
	rounds  int
	watch   watch.Stats
	writes  map[string]int
	repairs map[string]int
	// gained and lost are Health.LeaderGained and LeaderLost.
	gained, lost int
	// queues are the queues' preemption totals (nil before the first
	// sample with queues).
	queues map[queues.CounterKey]uint64
}

// newTotals starts from h, the agent's health when telemetry starts.
func newTotals(h wire.Health) totals {
	t := totals{rounds: h.Rounds, writes: map[string]int{}, repairs: map[string]int{}, gained: h.LeaderGained, lost: h.LeaderLost}
	for _, k := range []string{wire.RepairPlacement, wire.RepairFallback} {
		t.repairs[k] = h.Repairs[k]
	}
	return t
}

// advance hands inc what grew since the previous sample, counter by
// counter, and keeps h and ws as the totals seen. A total that went back
// (the agent restarted its count) adds nothing.
func (t *totals) advance(h wire.Health, ws watch.Stats, inc func(name string, n int, labels ...metrics.Label)) {
	if h.Rounds >= t.rounds {
		inc("hadar_rounds_total", h.Rounds-t.rounds)
	}
	t.rounds = h.Rounds
	inc("hadar_nomad_api_errors_total", int(ws.APIErrors-t.watch.APIErrors), lbl("source", "watch"))
	inc("hadar_nomad_api_errors_total", int(ws.ProgressErrors-t.watch.ProgressErrors), lbl("source", "progress"))
	inc("hadar_nomad_reconnects_total", int(ws.Reconnects-t.watch.Reconnects))
	inc("hadar_nomad_relists_total", int(ws.Relists-t.watch.Relists))
	t.watch = ws
	for kind, n := range h.Writes {
		d := n - t.writes[kind]
		inc("hadar_nomad_writes_total", d, lbl("kind", kind))
		if kind == "rollback" {
			// Each rollback write removes a gang's started workers.
			inc("hadar_evictions_total", d, lbl("reason", ReasonRolledBack))
		}
		t.writes[kind] = n
	}
	for kind, n := range h.Repairs {
		inc("hadar_plan_repairs_total", n-t.repairs[kind], lbl("kind", kind))
		t.repairs[kind] = n
	}
	inc("hadar_leader_changes_total", h.LeaderGained-t.gained, lbl("to", "leader"))
	inc("hadar_leader_changes_total", h.LeaderLost-t.lost, lbl("to", "follower"))
	t.gained, t.lost = h.LeaderGained, h.LeaderLost
}

// queuesGrew returns how much each of the queues' preemption totals cur
// grew since the previous sample (nil at the first), and keeps cur.
func (t *totals) queuesGrew(cur map[queues.CounterKey]uint64) map[queues.CounterKey]uint64 {
	var grew map[queues.CounterKey]uint64
	if t.queues != nil {
		grew = queues.Increments(t.queues, cur)
	}
	t.queues = cur
	return grew
}
