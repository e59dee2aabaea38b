package queue

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/round"
)

// Reason codes: why a job of a queue waits (or was preempted, or
// borrows), for the status API and metrics labels.
const (
	// ReasonAtLimit: the queue's limit leaves no room on any type the job
	// runs on.
	ReasonAtLimit = "at_limit"
	// ReasonReclaim: the job is within its queue's guarantee, whose GPUs
	// other queues' jobs still hold; they come back at a round boundary.
	ReasonReclaim = "waiting_for_reclaim"
	// ReasonFairShare: the queue has its share (its guarantee in use, and
	// what is left goes to queues further below their fair share).
	ReasonFairShare = "fair_share"
	// ReasonPriority: jobs of higher priority fill the queue's share.
	ReasonPriority = "priority"
	// ReasonMinRun: the job's share is held by jobs within their minimum
	// run time.
	ReasonMinRun = "min_run_time"
	// ReasonReclaimed: preempted to give another queue its guarantee
	// back (Kueue: InCohortReclamation).
	ReasonReclaimed = "reclaimed"
	// ReasonFairSharePreempted: preempted because its queue is above its
	// fair share and another is below (Kueue: InCohortFairSharing).
	ReasonFairSharePreempted = "fair_share_preempted"
	// ReasonBorrowing: runs on GPUs beyond its queue's share, lent until
	// their queue wants them.
	ReasonBorrowing = "borrowing"
)

// Reason is a queue's account of one job in the last plan.
type Reason struct {
	// Code is one of the Reason* codes ("" when the queue's own policy
	// decided, within the queue's share).
	Code string `json:"code,omitempty"`
	Why  string `json:"why,omitempty"`
}

// Status is what the last plan decided, per queue and per job.
type Status struct {
	Time   float64       `json:"time"`
	Static bool          `json:"static,omitempty"`
	Queues []QueueStatus `json:"queues"`
	// Jobs is keyed by job ID.
	Jobs map[string]JobStatus `json:"jobs"`
}

// QueueStatus is one queue after a plan. GPU maps are per type; Kueue's
// metric for each is named beside it.
type QueueStatus struct {
	Name   string  `json:"name"`
	Policy string  `json:"policy"`
	Weight float64 `json:"weight"`
	// Guarantee is the guarantee in force (kueue_cluster_queue_nominal_quota),
	// scaled down when the cluster offers fewer GPUs than the guarantees
	// add up to (Scaled).
	Guarantee map[planner.GPUType]int `json:"guarantee"`
	Scaled    bool                    `json:"scaled,omitempty"`
	// Limit is the configured limit (absent types: none).
	Limit map[planner.GPUType]int `json:"limit,omitempty"`
	// Share is the GPUs the queue is counted for this plan: its fair
	// share given what every queue wants.
	Share map[planner.GPUType]int `json:"share"`
	// Used is the GPUs its jobs hold after the plan
	// (kueue_cluster_queue_resource_usage); Borrowed the part beyond the
	// guarantee (kueue_cluster_queue_borrowing).
	Used     map[planner.GPUType]int `json:"used"`
	Borrowed map[planner.GPUType]int `json:"borrowed"`
	// Pending and Admitted count its waiting and running jobs
	// (kueue_pending_workloads, kueue_admitted_active_workloads).
	Pending  int `json:"pending"`
	Admitted int `json:"admitted"`
	// Reclaimed and FairSharePreempted count its jobs preempted in all, to
	// give a guarantee back or for fair sharing
	// (kueue_preempted_workloads_total{reason}).
	Reclaimed          uint64 `json:"reclaimed_total"`
	FairSharePreempted uint64 `json:"fair_share_preempted_total"`
}

// JobStatus is one job as its queue sees it.
type JobStatus struct {
	Queue    string  `json:"queue"`
	Priority int     `json:"priority"`
	Weight   float64 `json:"weight"`
	// Clamped: the job's weight was above the queue's cap (Weight is the
	// cap then).
	Clamped bool `json:"clamped,omitempty"`
	// Running: the job holds GPUs after the plan (else it waits).
	Running bool `json:"running"`
	Reason
}

// Status returns what the last plan decided (empty before the first).
func (s *Scheduler) Status() Status {
	st := s.status
	st.Queues = make([]QueueStatus, len(s.status.Queues))
	for k, q := range s.status.Queues {
		q.Guarantee, q.Limit, q.Share, q.Used, q.Borrowed = maps.Clone(q.Guarantee), maps.Clone(q.Limit), maps.Clone(q.Share), maps.Clone(q.Used), maps.Clone(q.Borrowed)
		st.Queues[k] = q
	}
	st.Jobs = maps.Clone(s.status.Jobs)
	return st
}

// counters are a queue's preemption totals.
type counters struct {
	Reclaimed          uint64 `json:"reclaimed"`
	FairSharePreempted uint64 `json:"fair_share_preempted"`
}

// explain sets the queue's reason of every job the queue, not its policy,
// decided for, counts preemptions and records the status.
func (s *Scheduler) explain(v *round.View, plans []*plan, out []planner.Placement, tidx map[planner.GPUType]int, scaled bool, base []int) {
	nt := len(v.Types)
	st := Status{Time: v.Now, Static: s.cfg.Static, Jobs: map[string]JobStatus{}}
	for _, p := range plans {
		q := p.iq.q
		ent := p.acct.entitled()
		qs := QueueStatus{Name: q.Name, Policy: p.iq.policy, Weight: q.Weight, Guarantee: typeMap(v.Types, p.acct.guar), Scaled: scaled && differs(q.Guarantee, v.Types, p.acct.guar),
			Limit: maps.Clone(q.Limit), Share: typeMap(v.Types, ent)}
		preempted := s.attribute(v, p, out)
		used := make([]int, nt)
		for k, m := range p.members {
			c := p.acct.claims[k]
			pl := out[m.i]
			if v.MidRound && m.held != nil {
				pl = m.jb.Placement
			}
			runs := len(pl.Units) > 0
			addTo(used, held(pl, tidx, nt))
			if runs {
				qs.Admitted++
			} else {
				qs.Pending++
			}
			r, has := p.reason[m.i]
			switch {
			case has:
			case preempted[m.i]:
				cnt := s.reclaims[q.Name]
				if _, reclaim := s.bounds[m.jb.ID]; reclaim {
					r = Reason{Code: ReasonReclaimed, Why: fmt.Sprintf("queue %s: preempted to give GPUs back to another queue's guarantee (its share now: %s); it checkpoints and resumes when there is room", q.Name, gpus(v.Types, ent))}
					cnt.Reclaimed++
				} else {
					r = Reason{Code: ReasonFairSharePreempted, Why: fmt.Sprintf("queue %s: preempted: the queue is above its fair share (%s) while another is below; it checkpoints and resumes when there is room", q.Name, gpus(v.Types, ent))}
					cnt.FairSharePreempted++
				}
				s.reclaims[q.Name] = cnt
			case runs:
			case c.atLimit:
				r = Reason{Code: ReasonAtLimit, Why: fmt.Sprintf("queue %s is at its limit (%s) on every GPU type this job runs on", q.Name, limits(v.Types, q.Limit, ent))}
			case c.counted && !m.carved && c.guaranteed:
				r = Reason{Code: ReasonReclaim, Why: fmt.Sprintf("waiting for reclaim: within queue %s's guarantee (%s), whose GPUs other queues' jobs hold; they are preempted at the next round boundary, after at most %s of run time", q.Name, gpus(v.Types, p.acct.guar), secs(q.ReclaimAfter))}
			case c.counted && !m.carved:
				r = Reason{Code: ReasonMinRun, Why: fmt.Sprintf("queue %s: within its share (%s), whose GPUs jobs within their minimum run time hold", q.Name, gpus(v.Types, ent))}
			case !c.counted:
				r = Reason{Code: ReasonFairShare, Why: fmt.Sprintf("queue %s has its fair share (%s; guarantee %s, weight %g): free GPUs go to queues further below theirs", q.Name, gpus(v.Types, ent), gpus(v.Types, p.acct.guar), q.Weight)}
			}
			js := JobStatus{Queue: q.Name, Priority: m.prio, Weight: m.jb.Weight, Running: runs, Reason: r}
			if q.MaxJobWeight > 0 && m.jb.Weight > q.MaxJobWeight {
				js.Weight, js.Clamped = q.MaxJobWeight, true
			}
			if r.Why != "" || js.Clamped {
				why := r.Why
				if why == "" && v.Reasons != nil {
					why = v.Reasons[m.i].Why
				}
				if js.Clamped {
					why = strings.TrimPrefix(why+fmt.Sprintf("; weight %g clamped to queue %s's cap %g", m.jb.Weight, q.Name, q.MaxJobWeight), "; ")
				}
				if v.Reasons != nil {
					rr := v.Reasons[m.i]
					rr.Why = why
					v.Explain(m.i, rr)
				}
			}
			st.Jobs[m.jb.ID] = js
		}
		qs.Used = typeMap(v.Types, used)
		bo := make([]int, nt)
		for t := range bo {
			bo[t] = max(0, used[t]-p.acct.guar[t])
		}
		qs.Borrowed = typeMap(v.Types, bo)
		cnt := s.reclaims[q.Name]
		qs.Reclaimed, qs.FairSharePreempted = cnt.Reclaimed, cnt.FairSharePreempted
		st.Queues = append(st.Queues, qs)
	}
	// Configured queues with no job now are shown too.
	for _, q := range s.cfg.Queues {
		if containsQueue(st.Queues, q.Name) {
			continue
		}
		policy := q.Policy
		if policy == "" {
			policy = s.opt.Default
		}
		g := make([]int, nt)
		for k, t := range v.Types {
			g[k] = min(q.Guarantee[t], base[k])
		}
		cnt := s.reclaims[q.Name]
		st.Queues = append(st.Queues, QueueStatus{Name: q.Name, Policy: policy, Weight: q.Weight, Guarantee: typeMap(v.Types, g), Limit: maps.Clone(q.Limit),
			Share: map[planner.GPUType]int{}, Used: map[planner.GPUType]int{}, Borrowed: map[planner.GPUType]int{}, Reclaimed: cnt.Reclaimed, FairSharePreempted: cnt.FairSharePreempted})
	}
	s.status = st
}

// attribute finds the jobs of a queue the plan preempts because the queue
// lost GPUs (its victims: running jobs left out of its share), by job
// index. The queue's policy chooses which of its jobs run on its pool, so
// the jobs it stops need not be the victims (a victim may be moved onto
// GPUs another of its jobs held): the running jobs the plan stops, up to
// the number of victims, are the preempted ones, and the bound reclaim
// puts on the victims' minimum run time (MinRunBound) applies to them
// too.
func (s *Scheduler) attribute(v *round.View, p *plan, out []planner.Placement) map[int]bool {
	if v.MidRound {
		return nil
	}
	victims, bound, reclaim := 0, 0.0, false
	for _, m := range p.members {
		if !m.victim {
			continue
		}
		victims++
		if b, ok := s.bounds[m.jb.ID]; ok {
			bound, reclaim = max(bound, b), true
		}
	}
	if victims == 0 {
		return nil
	}
	// A victim the policy moved keeps its bound: the move preempts it
	// too, and without the bound the engine would hold it to its minimum
	// run time on the GPUs the reclaiming queue waits for.
	preempted := map[int]bool{}
	for _, m := range p.members {
		if victims == 0 {
			break
		}
		if _, has := p.reason[m.i]; has || m.held == nil || len(out[m.i].Units) > 0 {
			continue
		}
		preempted[m.i] = true
		victims--
		if reclaim {
			s.bounds[m.jb.ID] = bound
		} else {
			delete(s.bounds, m.jb.ID)
		}
	}
	return preempted
}

func containsQueue(qs []QueueStatus, name string) bool {
	for _, q := range qs {
		if q.Name == name {
			return true
		}
	}
	return false
}

func typeMap(types []planner.GPUType, n []int) map[planner.GPUType]int {
	out := map[planner.GPUType]int{}
	for t, k := range n {
		if k > 0 {
			out[types[t]] = k
		}
	}
	return out
}

func differs(conf map[planner.GPUType]int, types []planner.GPUType, got []int) bool {
	for t, ty := range types {
		if conf[ty] != got[t] {
			return true
		}
	}
	return false
}

func limits(types []planner.GPUType, lim map[planner.GPUType]int, ent []int) string {
	var parts []string
	for t, ty := range types {
		if l, ok := lim[ty]; ok {
			parts = append(parts, fmt.Sprintf("%s %d of %d", ty, ent[t], l))
		}
	}
	return strings.Join(parts, ", ")
}

func secs(s float64) string { return (time.Duration(s) * time.Second).String() }
