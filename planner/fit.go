package planner

// BestFit returns the index among n nodes with the fewest free GPUs that
// still has count free (best fit keeps large holes for wide jobs), the
// lowest index on ties, or -1 when no node has room. free(i) is node i's
// free GPUs of the type asked for. The round mechanism, the placement
// policies and Hadar all pick single-node placements with it.
func BestFit(n int, free func(i int) int, count int) int {
	best, bestFree := -1, 0
	for i := range n {
		if f := free(i); f >= count && (best < 0 || f < bestFree) {
			best, bestFree = i, f
		}
	}
	return best
}

// Runnable reports whether a job of sf workers can run on a GPU type where
// its throughput is tp and gpus GPUs exist: a measured zero means it
// cannot (out of memory), and a type with fewer GPUs than workers can never
// hold it.
func Runnable(tp float64, sf int, gpus float64) bool {
	return tp > 0 && float64(sf) <= gpus
}
