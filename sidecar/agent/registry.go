package agent

import (
	"iter"
	"maps"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

// roster is the agent's book of managed jobs: those admitted to the
// engine, those refused (a jobspec that does not parse, a job the engine
// cannot plan, or one held for failing on every start), and the GPUs each
// job with an operation in flight gives up. It is guarded by the agent's
// mu, as it moves with the engine; the HTTP views read it under that lock.
type roster struct {
	jobs    map[watch.JobKey]*managed
	invalid map[watch.JobKey]invalidJob
	// leaving holds the GPUs each job with an operation in flight gives
	// up: a later decision's start on them waits for its workers to end.
	leaving map[watch.JobKey]map[gpuSlot]int
}

// newRoster returns an empty roster.
func newRoster() roster {
	return roster{jobs: map[watch.JobKey]*managed{}, invalid: map[watch.JobKey]invalidJob{}, leaving: map[watch.JobKey]map[gpuSlot]int{}}
}

// job returns admitted job k, nil when not admitted.
func (r *roster) job(k watch.JobKey) *managed { return r.jobs[k] }

// count is how many jobs are admitted.
func (r *roster) count() int { return len(r.jobs) }

// keys lists the admitted jobs in a stable order (by key), so that what
// is done per job is done in the same order every cycle.
func (r *roster) keys() []watch.JobKey { return sortedKeys(r.jobs) }

// all yields the admitted jobs in no order, for lookups and sums.
func (r *roster) all() iter.Seq[*managed] { return maps.Values(r.jobs) }

// admitted records mj as admitted, ending any refusal of it: an
// admission refusal lasts until an admission succeeds.
func (r *roster) admitted(mj *managed) {
	delete(r.invalid, mj.key)
	r.jobs[mj.key] = mj
}

// drop forgets admitted job k (complete, stopped, gone or planned afresh).
func (r *roster) drop(k watch.JobKey) { delete(r.jobs, k) }

// restore replaces the admitted jobs with those of a saved state (none
// when jobs is nil), as the engine they were admitted to is replaced.
func (r *roster) restore(jobs map[watch.JobKey]*managed) {
	if jobs == nil {
		jobs = map[watch.JobKey]*managed{}
	}
	r.jobs = jobs
}

// refusal returns job k's refusal, ok false when it is not refused.
func (r *roster) refusal(k watch.JobKey) (iv invalidJob, ok bool) {
	iv, ok = r.invalid[k]
	return iv, ok
}

// refuse records (or updates) job k's refusal.
func (r *roster) refuse(k watch.JobKey, iv invalidJob) { r.invalid[k] = iv }

// unrefuse ends job k's refusal.
func (r *roster) unrefuse(k watch.JobKey) { delete(r.invalid, k) }

// refused lists the refused jobs in a stable order (by key).
func (r *roster) refused() []watch.JobKey { return sortedKeys(r.invalid) }

// refusedCount is how many jobs are refused.
func (r *roster) refusedCount() int { return len(r.invalid) }

// keepRefused ends the refusals of jobs not in seen: gone from Nomad.
func (r *roster) keepRefused(seen map[watch.JobKey]bool) {
	for k := range r.invalid {
		if !seen[k] {
			delete(r.invalid, k)
		}
	}
}

// leaves records the GPUs job k gives up until its write returns,
// replacing any it gave up before.
func (r *roster) leaves(k watch.JobKey, gpus map[gpuSlot]int) { r.leaving[k] = gpus }

// left says job k gives up no GPUs any more (its write failed, or a new
// decision replaces the old).
func (r *roster) left(k watch.JobKey) { delete(r.leaving, k) }

// leavingGPUs returns the GPUs job k gives up, nil when none.
func (r *roster) leavingGPUs(k watch.JobKey) map[gpuSlot]int { return r.leaving[k] }

// leavingKeys lists the jobs giving up GPUs in a stable order (by key),
// so that a start waits on them in the same order every time.
func (r *roster) leavingKeys() []watch.JobKey { return sortedKeys(r.leaving) }

// settleLeaving drops the GPUs of each job whose operation ended (done
// says which): its workers are gone.
func (r *roster) settleLeaving(done func(watch.JobKey) bool) {
	for k := range r.leaving {
		if done(k) {
			delete(r.leaving, k)
		}
	}
}
