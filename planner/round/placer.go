package round

import "github.com/hadar-sched/hadar/planner"

// Placer decides where the jobs Assign chose for one GPU type run
// (planner/placement implements locality-aware ones). Without a Placer,
// Assign keeps each job's previous GPUs when they are free and packs the
// others with Pool.Pack.
type Placer interface {
	Name() string
	// Place returns one unit per entry of jobs (indices into v.Jobs, every
	// one chosen for type t this round, largest scale factor first, then
	// in priority order), taking the GPUs from v.Pool. An empty unit
	// means the job waits this round (delay scheduling). At a round
	// boundary a Placer may also move a job that ran before, or leave it
	// without GPUs (preemption); mid-round every job in jobs is waiting.
	Place(v *View, t planner.GPUType, jobs []int) []planner.Unit
}

// Keep takes the job's previous GPUs from pool if they are all of type t
// and still free (lease extension: no restart), as Assign does.
func Keep(pool *Pool, jb *JobView, t planner.GPUType) (planner.Unit, bool) {
	return keep(pool, jb, t)
}
