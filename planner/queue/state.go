package queue

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// stateV1 is the Scheduler's saved state: each queue's inner scheduler
// state and share epoch, when each running job started, and the
// preemption counters.
type stateV1 struct {
	Version int            `json:"version"`
	Queues  []queueStateV1 `json:"queues"`
	Since   []sinceV1      `json:"since"`
	// Counters is keyed by queue name.
	Counters map[string]counters `json:"counters,omitempty"`
}

type queueStateV1 struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
	Epoch  uint64 `json:"epoch"`
	// Key is bytes: it holds no job ID today, but state keys are kept
	// as bytes throughout the planner.
	Key   []byte          `json:"key"`
	State json.RawMessage `json:"state,omitempty"`
}

type sinceV1 struct {
	// Job is bytes: job IDs need not be valid UTF-8.
	Job       []byte            `json:"job"`
	Placement planner.Placement `json:"placement"`
	At        float64           `json:"at"`
}

// SaveState implements round.Stateful.
func (s *Scheduler) SaveState() ([]byte, error) {
	st := stateV1{Version: 1, Queues: []queueStateV1{}, Since: []sinceV1{}, Counters: s.reclaims}
	for _, name := range s.names() {
		iq := s.inner[name]
		qs := queueStateV1{Name: name, Policy: iq.policy, Epoch: iq.epoch, Key: []byte(iq.key)}
		if sf, ok := iq.sched.(round.Stateful); ok {
			b, err := sf.SaveState()
			if err != nil {
				return nil, fmt.Errorf("queue %s: %s: %w", name, iq.sched.Name(), err)
			}
			qs.State = b
		}
		st.Queues = append(st.Queues, qs)
	}
	for _, id := range sortedKeys(s.since) {
		rec := s.since[id]
		st.Since = append(st.Since, sinceV1{Job: []byte(id), Placement: rec.p, At: rec.at})
	}
	return json.Marshal(st)
}

// LoadState implements round.Stateful, all or nothing. A queue saved with
// the policy it has now gets its scheduler's state back; a queue whose
// policy changed, or that is no longer configured and has no job, starts
// afresh (a changed queue configuration must not stop a restart).
func (s *Scheduler) LoadState(data []byte) error {
	var st stateV1
	if err := round.StrictUnmarshal(data, &st); err != nil {
		return fmt.Errorf("queues state: %w", err)
	}
	if st.Version != 1 {
		return fmt.Errorf("queues state: version %d: want 1", st.Version)
	}
	inner := map[string]*innerQueue{}
	for _, qs := range st.Queues {
		if inner[qs.Name] != nil {
			return fmt.Errorf("queues state: queue %q saved twice", qs.Name)
		}
		q, ok := s.cfg.Find(qs.Name)
		if !ok {
			q = Queue{Name: qs.Name, Weight: 1}
		}
		policy := q.Policy
		if policy == "" {
			policy = s.opt.Default
		}
		if policy != qs.Policy {
			continue // its policy changed: a fresh scheduler
		}
		sched, err := s.opt.Factory(policy)
		if err != nil {
			return fmt.Errorf("queues state: queue %q: %w", qs.Name, err)
		}
		sf, stateful := sched.(round.Stateful)
		switch {
		case qs.State != nil && !stateful:
			return fmt.Errorf("queues state: queue %q carries state but its scheduler %s keeps none", qs.Name, sched.Name())
		case qs.State == nil && stateful:
			return fmt.Errorf("queues state: queue %q lacks the state of its scheduler %s", qs.Name, sched.Name())
		case stateful:
			if err := sf.LoadState(qs.State); err != nil {
				return fmt.Errorf("queues state: queue %q: %w", qs.Name, err)
			}
		}
		inner[qs.Name] = &innerQueue{q: q, policy: policy, sched: sched, epoch: qs.Epoch, key: string(qs.Key)}
	}
	since := make(map[string]placedAt, len(st.Since))
	for _, rec := range st.Since {
		if math.IsNaN(rec.At) || math.IsInf(rec.At, 0) {
			return fmt.Errorf("queues state: job %q started at %v: want a finite time", rec.Job, rec.At)
		}
		if len(rec.Placement.Units) == 0 {
			return fmt.Errorf("queues state: job %q has a start time but no placement", rec.Job)
		}
		since[string(rec.Job)] = placedAt{p: rec.Placement, at: rec.At}
	}
	// Configured queues the state did not restore get fresh schedulers.
	for _, q := range s.cfg.Queues {
		if inner[q.Name] != nil {
			continue
		}
		policy := q.Policy
		if policy == "" {
			policy = s.opt.Default
		}
		sched, err := s.opt.Factory(policy)
		if err != nil {
			return fmt.Errorf("queues state: queue %q: %w", q.Name, err)
		}
		inner[q.Name] = &innerQueue{q: q, policy: policy, sched: sched}
	}
	cnt := st.Counters
	if cnt == nil {
		cnt = map[string]counters{}
	}
	s.inner, s.since, s.reclaims = inner, since, cnt
	return nil
}

// names lists the inner queues in a stable order.
func (s *Scheduler) names() []string {
	return sortedKeys(s.inner)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
