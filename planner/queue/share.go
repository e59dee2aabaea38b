package queue

import (
	"math"
)

// demand is one job as the share computation sees it.
type demand struct {
	// held is the GPUs per type a running job holds (nil: waiting).
	held []int
	sf   int
	// tp is the job's throughput per type (0: it cannot run there).
	tp []float64
	// fixed: a running job mid-round, which keeps its GPUs whatever the
	// shares say; it is counted first and without a check.
	fixed bool
}

// claim is what the share computation decided for one job.
type claim struct {
	counted bool
	// guaranteed: counted within the queue's guarantee (else borrowed).
	guaranteed bool
	// typ is the type a waiting job is counted on (-1 for a running job).
	typ int
	// atLimit: not counted because the queue's limit leaves no room on
	// any type it runs on.
	atLimit bool
}

// account is one queue in the share computation: its guarantee, limit
// and weight, its jobs in the order they are counted, and the outcome.
type account struct {
	guar   []int
	limit  []int // -1: no limit
	weight float64
	jobs   []demand
	// gu and bo are the GPUs per type counted within the guarantee and
	// borrowed beyond it; claims has one entry per job.
	gu, bo []int
	// extra is GPUs no queue's jobs are counted for, added to the share
	// so that its policy may use them (a faster type, a wider job).
	extra  []int
	claims []claim
}

func newAccount(types int, guar, limit []int, weight float64, jobs []demand) *account {
	a := &account{guar: guar, limit: limit, weight: weight, jobs: jobs, gu: make([]int, types), bo: make([]int, types), extra: make([]int, types), claims: make([]claim, len(jobs))}
	for k := range a.claims {
		a.claims[k].typ = -1
	}
	return a
}

// entitled is the GPUs per type the queue is counted for.
func (a *account) entitled() []int {
	out := make([]int, len(a.gu))
	for t := range out {
		out[t] = a.gu[t] + a.bo[t] + a.extra[t]
	}
	return out
}

// borrowedShare is the queue's borrowed GPUs, each type counted as a
// fraction of that type's GPUs, over its weight: the order in which
// queues borrow (least first), as Kueue's fair sharing orders them.
func (a *account) borrowedShare(base []int) float64 {
	s := 0.0
	for t, b := range a.bo {
		if base[t] > 0 {
			s += float64(b) / float64(base[t])
		}
	}
	return s / a.weight
}

// share decides which jobs each queue is counted for, on base GPUs per
// type: first each queue's jobs within its guarantee (running jobs first,
// on the GPUs they hold; waiting ones on their fastest type with
// guarantee left), then, with what the guarantees leave (including
// guarantees their owners do not use now), one job at a time to the
// queue that borrows least for its weight, within its limit. static
// stops after the guarantees. Jobs marked fixed are counted whatever the
// room. The accounts' jobs must already be in counting order.
func share(accts []*account, base []int, static bool) {
	nt := len(base)
	// Fixed jobs first: they hold their GPUs whatever the shares say.
	for _, a := range accts {
		for k, d := range a.jobs {
			if !d.fixed {
				continue
			}
			a.claims[k].counted = true
			within := true
			for t := range nt {
				within = within && a.gu[t]+d.held[t] <= a.guar[t]
			}
			a.claims[k].guaranteed = within
			for t := range nt {
				if within {
					a.gu[t] += d.held[t]
				} else {
					a.bo[t] += d.held[t]
				}
			}
		}
	}
	// The guarantees.
	for _, a := range accts {
		for k, d := range a.jobs {
			if a.claims[k].counted {
				continue
			}
			if d.held != nil {
				if fitsAll(d.held, func(t int) int { return a.guar[t] - a.gu[t] }) {
					addTo(a.gu, d.held)
					a.claims[k] = claim{counted: true, guaranteed: true, typ: -1}
				}
				continue
			}
			if t := bestType(d, func(t int) int { return a.guar[t] - a.gu[t] }); t >= 0 {
				a.gu[t] += d.sf
				a.claims[k] = claim{counted: true, guaranteed: true, typ: t}
			}
		}
	}
	if static {
		markLimits(accts)
		return
	}
	// What the guarantees leave, by borrowed share.
	spare := make([]int, nt)
	for t := range nt {
		spare[t] = base[t]
		for _, a := range accts {
			spare[t] -= a.gu[t] + a.bo[t]
		}
	}
	room := func(a *account, t int) int {
		r := max(0, spare[t])
		if a.limit[t] >= 0 {
			r = min(r, a.limit[t]-a.gu[t]-a.bo[t])
		}
		return r
	}
	cursor := make([]int, len(accts))
	for {
		best, bestJob, bestT := -1, -1, -1
		bestShare := math.Inf(1)
		for q, a := range accts {
			// Advance past the jobs that cannot fit: spare GPUs only
			// shrink, so a job that does not fit now never will.
			for cursor[q] < len(a.jobs) {
				k := cursor[q]
				d := a.jobs[k]
				if a.claims[k].counted {
					cursor[q]++
					continue
				}
				var t int
				if d.held != nil {
					t = -1
					if !fitsAll(d.held, func(t int) int { return room(a, t) }) {
						cursor[q]++
						continue
					}
				} else if t = bestType(d, func(t int) int { return room(a, t) }); t < 0 {
					cursor[q]++
					continue
				}
				if s := a.borrowedShare(base); s < bestShare {
					best, bestJob, bestT, bestShare = q, k, t, s
				}
				break
			}
		}
		if best < 0 {
			break
		}
		a := accts[best]
		d := a.jobs[bestJob]
		if d.held != nil {
			addTo(a.bo, d.held)
			for t := range nt {
				spare[t] -= d.held[t]
			}
		} else {
			a.bo[bestT] += d.sf
			spare[bestT] -= d.sf
		}
		a.claims[bestJob] = claim{counted: true, typ: bestT}
		cursor[best]++
	}
	markLimits(accts)
}

// spread adds the GPUs of each type no queue is counted for to the share
// of the queue that borrows least among those with a job that runs on
// the type, within its limit: a policy may then move a job to a faster
// type, or fit a job the counting left out, as it would on an idle
// cluster. Only what no one is counted for is spread, so no queue's share
// shrinks for it.
func spread(accts []*account, base []int) {
	for t := range base {
		spare := base[t]
		for _, a := range accts {
			spare -= a.gu[t] + a.bo[t]
		}
		for spare > 0 {
			best := -1
			bestShare := math.Inf(1)
			for q, a := range accts {
				room := spare
				if a.limit[t] >= 0 {
					room = min(room, a.limit[t]-a.gu[t]-a.bo[t]-a.extra[t])
				}
				if room <= 0 || !runsOn(a, t) {
					continue
				}
				if s := a.borrowedShare(base); s < bestShare {
					best, bestShare = q, s
				}
			}
			if best < 0 {
				break
			}
			a := accts[best]
			n := spare
			if a.limit[t] >= 0 {
				n = min(n, a.limit[t]-a.gu[t]-a.bo[t]-a.extra[t])
			}
			a.extra[t] += n
			spare -= n
		}
	}
}

func runsOn(a *account, t int) bool {
	for _, d := range a.jobs {
		if d.tp[t] > 0 {
			return true
		}
	}
	return false
}

// markLimits flags the waiting jobs left out that the queue's limit alone
// keeps out: on every type they run on, the limit leaves too few GPUs.
func markLimits(accts []*account) {
	for _, a := range accts {
		for k, d := range a.jobs {
			if a.claims[k].counted || d.held != nil {
				continue
			}
			limited, runs := true, false
			for t, tp := range d.tp {
				if tp <= 0 {
					continue
				}
				runs = true
				limited = limited && a.limit[t] >= 0 && a.gu[t]+a.bo[t]+d.sf > a.limit[t]
			}
			a.claims[k].atLimit = runs && limited
		}
	}
}

// bestType is the type d runs fastest on among those where room leaves
// its scale factor, -1 when none.
func bestType(d demand, room func(t int) int) int {
	best := -1
	for t, tp := range d.tp {
		if tp > 0 && d.sf <= room(t) && (best < 0 || tp > d.tp[best]) {
			best = t
		}
	}
	return best
}

func fitsAll(held []int, room func(t int) int) bool {
	for t, k := range held {
		if k > 0 && k > room(t) {
			return false
		}
	}
	return true
}

func addTo(dst, src []int) {
	for t, k := range src {
		dst[t] += k
	}
}

// scaleGuarantees fits guarantees that add up to more than base GPUs of a
// type (nodes lost, GPUs held by work hadar does not plan) to what there
// is: each in proportion, the GPUs left by rounding down going to the
// largest remainders (ties: queue order). It reports whether any was cut.
func scaleGuarantees(guar [][]int, base []int) bool {
	cut := false
	for t := range base {
		sum := 0
		for _, g := range guar {
			sum += g[t]
		}
		if sum <= base[t] {
			continue
		}
		cut = true
		rem := make([]float64, len(guar))
		left := base[t]
		for q, g := range guar {
			exact := float64(g[t]) * float64(base[t]) / float64(sum)
			g[t] = int(math.Floor(exact))
			rem[q] = exact - float64(g[t])
			left -= g[t]
		}
		for ; left > 0; left-- {
			best := -1
			for q := range guar {
				if best < 0 || rem[q] > rem[best] {
					best = q
				}
			}
			guar[best][t]++
			rem[best] = -1
		}
	}
	return cut
}
