package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// TestQueueReclaim: team A borrows every GPU of the cluster; team B,
// guaranteed four V100s, submits; at the next round boundary two of A's jobs
// are preempted (reclaimed) and B's run; A's jobs checkpoint and resume
// once B's are gone, from where they were. A job of a queue at its limit
// waits with that reason; a job weight above its queue's cap is clamped
// and said so. /v1/queues, the metrics and the jobs' reasons show it.
func TestQueueReclaim(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	const policy = "fifo"
	ptr := func(f float64) *float64 { return &f }
	cfg := config.Config{
		Scheduling: config.Scheduling{Policy: policy},
		RunLimits:  config.RunLimits{GangTimeout: "4m"},
		TeamQueues: config.TeamQueues{Queues: []queue.Block{
			{Name: "team-a", MetaNamespaces: []string{"*"}},
			{Name: "team-b", MetaNamespaces: []string{"*"}, Guarantee: map[string]int{"v100": 4}, MaxJobWeight: ptr(2)},
			{Name: "team-c", MetaNamespaces: []string{"*"}, Limit: map[string]int{"v100": 0, "p100": 0, "k80": 0}},
		}},
	}
	a := c.startSidecar(cfg)
	s := c.startStatus(t, a, policy)
	p := func(name string, kv ...string) string {
		return series(name, append([]string{"policy", policy}, kv...)...)
	}
	// Two-worker jobs, long enough never to finish here.
	job := func(id, team string, weight float64) scJob {
		return scJob{id: id, steps: 10_000_000, workers: 2, weight: weight, gated: true, extra: fmt.Sprintf("    \"hadar.queue\" = %q", team)}
	}
	runningJob := func(id string) error {
		if jv := c.planOf(a, id); jv.State != "running" || len(c.running(id)) == 0 {
			return fmt.Errorf("job %s: %s", id, jv.State)
		}
		return nil
	}
	getQueues := func() wire.Queues {
		t.Helper()
		code, body := s.get(t, "/v1/queues")
		var v wire.Queues
		if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
			t.Fatalf("GET /v1/queues: %d %v\n%s", code, err, body)
		}
		return v
	}
	queueOf := func(v wire.Queues, name string) wire.Queue {
		for _, q := range v.Queues {
			if q.Name == name {
				return q
			}
		}
		t.Fatalf("queue %s not in /v1/queues: %+v", name, v)
		return wire.Queue{}
	}

	// Team A takes every GPU (ten V100s, two P100s, four K80s): nothing
	// is guaranteed to it, all borrowed.
	teamA := []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"}
	for _, id := range teamA {
		c.submit(job(id, "team-a", 1))
	}
	for _, id := range teamA {
		c.waitFor("team A's job "+id+" runs", 5*time.Minute, func() error { return runningJob(id) })
	}
	c.waitFor("team A borrows every GPU", time.Minute, func() error {
		return expect(s.metrics(t), map[string]float64{
			p("hadar_queue_used_gpus", "queue", "team-a", "gpu_type", "v100"):     10,
			p("hadar_queue_borrowed_gpus", "queue", "team-a", "gpu_type", "v100"): 10,
			p("hadar_queue_borrowed_gpus", "queue", "team-a", "gpu_type", "p100"): 2,
			p("hadar_queue_borrowed_gpus", "queue", "team-a", "gpu_type", "k80"):  4,
			p("hadar_queue_admitted_jobs", "queue", "team-a"):                     8,
		})
	})
	done := map[string]float64{}
	for _, id := range teamA {
		done[id] = c.planOf(a, id).StepsDone
	}

	// Team B submits its guarantee's worth; one job's weight is above
	// its queue's cap.
	submitted := time.Now()
	c.submit(job("b1", "team-b", 1))
	c.submit(job("b2", "team-b", 5))
	for _, id := range []string{"b1", "b2"} {
		c.waitFor("team B's job "+id+" runs", 3*time.Minute, func() error { return runningJob(id) })
	}
	// The start was decided at the first boundary after B's jobs came
	// (round 8 s; a loaded machine may run a cycle late).
	for _, ev := range a.History() {
		if ev.Job == "default/b1" && ev.Action == wire.ActionStart {
			if took := ev.Time.Sub(submitted); took > 30*time.Second {
				t.Errorf("b1's start was decided %v after it was submitted: want the next boundary (round 8 s)", took)
			} else {
				t.Logf("b1's start decided %v after submission; running %v after", took, time.Since(submitted))
			}
			break
		}
	}
	reclaimed := map[string]bool{}
	for _, ev := range a.History() {
		if ev.Action == wire.ActionStop && strings.Contains(ev.Why, "give GPUs back to another queue's guarantee") {
			reclaimed[strings.TrimPrefix(ev.Job, "default/")] = true
		}
	}
	if len(reclaimed) != 2 {
		t.Fatalf("reclaimed %v: want two of team A's jobs stopped to give team B its guarantee", reclaimed)
	}

	// A job of a queue at its limit waits, saying so.
	c.submit(job("c1", "team-c", 1))
	c.waitFor("c1 waits at its queue's limit", time.Minute, func() error {
		if jv := c.planOf(a, "c1"); !strings.Contains(jv.Reason.Why, "at its limit") || jv.TeamQueue != "team-c" || jv.QueueReason != queue.ReasonAtLimit {
			return fmt.Errorf("c1: reason %q, queue %q, queue reason %q", jv.Reason.Why, jv.TeamQueue, jv.QueueReason)
		}
		return nil
	})
	c.waitFor("the metrics show the queues", time.Minute, func() error {
		return expect(s.metrics(t), map[string]float64{
			p("hadar_queue_used_gpus", "queue", "team-b", "gpu_type", "v100"):       4,
			p("hadar_queue_guaranteed_gpus", "queue", "team-b", "gpu_type", "v100"): 4,
			p("hadar_queue_borrowed_gpus", "queue", "team-a", "gpu_type", "v100"):   6,
			p("hadar_queue_admitted_jobs", "queue", "team-b"):                       2,
			p("hadar_queue_pending_jobs", "queue", "team-c", "reason", "at_limit"):  1,
			p("hadar_queue_limit_gpus", "queue", "team-c", "gpu_type", "k80"):       0,
		})
	})
	if m := s.metrics(t); m[p("hadar_queue_preemptions_total", "queue", "team-a", "reason", "reclaim")] < 2 {
		t.Errorf("hadar_queue_preemptions_total{team-a,reclaim} = %v, want >= 2", m[p("hadar_queue_preemptions_total", "queue", "team-a", "reason", "reclaim")])
	}
	v := getQueues()
	qb := queueOf(v, "team-b")
	var heavy *wire.QueueJob
	for k := range qb.Jobs {
		if qb.Jobs[k].ID == "default/b2" {
			heavy = &qb.Jobs[k]
		}
	}
	if heavy == nil || !heavy.Clamped || heavy.Weight != 2 {
		t.Errorf("b2 in /v1/queues: %+v, want weight clamped to 2", heavy)
	}
	if why := c.planOf(a, "b2").Reason.Why; !strings.Contains(why, "weight 5 clamped to queue team-b's cap 2") {
		t.Errorf("b2's reason %q does not say its weight was clamped", why)
	}
	if qa := queueOf(v, "team-a"); qa.Reclaimed < 2 || qa.Pending != 2 || qa.Admitted != 6 {
		t.Errorf("team-a in /v1/queues: reclaimed %d, pending %d, admitted %d; want >= 2, 2, 6", qa.Reclaimed, qa.Pending, qa.Admitted)
	}

	// B's jobs leave: A's reclaimed jobs resume from their checkpoints.
	for _, id := range []string{"b1", "b2", "c1"} {
		if _, _, err := c.api.Jobs().Deregister(id, true, nil); err != nil {
			t.Fatal(err)
		}
	}
	for id := range reclaimed {
		c.waitFor("reclaimed job "+id+" resumes", 3*time.Minute, func() error {
			if err := runningJob(id); err != nil {
				return err
			}
			if got := c.planOf(a, id).StepsDone; got < done[id] {
				return fmt.Errorf("job %s at %v steps, %v before it was reclaimed", id, got, done[id])
			}
			return nil
		})
	}
}
