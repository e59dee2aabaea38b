package engine

// MinRunBounder is a scheduler that bounds, for some jobs of the plan it
// has just answered, the minimum run time the engine holds them to:
// planner/queue takes a queue's guarantee back from jobs of other queues
// borrowing it sooner than their minimum run time (the queue's
// reclaim_after). It is the one hook the queues need in the engine.
type MinRunBounder interface {
	// MinRunBound is the most seconds of minimum run time job id is held
	// to in the last plan; ok is false for no bound.
	MinRunBound(id string) (seconds float64, ok bool)
}

// planMinRunTime is job j's minimum run time in the plan being repaired:
// its own or the configured one, within the scheduler's bound.
func (e *Engine) planMinRunTime(j *job) float64 {
	m := e.minRunTime(j)
	if b, ok := e.sched.(MinRunBounder); ok {
		if c, ok := b.MinRunBound(j.view.ID); ok && c < m {
			m = max(c, 0)
		}
	}
	return m
}
