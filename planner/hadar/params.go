package hadar

import "math"

// bounds are the price function's parameters, derived from the workload
// as the OASiS template prescribes (docs/policies.md, "Prices"):
//
//   - U is the largest value per GPU-round of any job seen: a GPU whose
//     price reached U is worth more than any job would pay for it, so the
//     prices alone keep every resource within its capacity;
//   - L is the smallest value per GPU-round of any job seen, divided by
//     FloorRatio: on an idle resource every job can pay, and the duals of
//     the idle capacity (C * L summed) stay a small part of the optimum,
//     which is where the factor 2 of the competitive ratio comes from;
//   - the competitive ratio of the template is then 2*alpha with
//     alpha = max(1, ln(U/L)).
//
// They only widen as jobs arrive (the workload seen so far), and are saved
// with the scheduler's state.
type bounds struct {
	Lo, Hi float64
	// LogDur and Jobs are the sum of ln(best-speed duration in rounds) and
	// the number of jobs seen: their geometric mean sets the horizon.
	LogDur float64
	Jobs   int64
}

// see widens the bounds with a job of value density d (per GPU-round) and
// best-speed duration dur (in rounds).
func (b *bounds) see(d, dur float64) {
	if !(d > 0) || math.IsInf(d, 0) {
		return
	}
	if b.Jobs == 0 || d < b.Lo {
		b.Lo = d
	}
	if d > b.Hi {
		b.Hi = d
	}
	b.LogDur += math.Log(math.Max(dur, 1))
	b.Jobs++
}

// priceRange is (L, U) for cfg. Flat prices (the ablation) charge L
// whatever the load: the dual subroutine then admits every job whose value
// beats the floor, in value order, as a greedy scheduler would.
func (b bounds) priceRange(cfg Config) (lo, hi float64) {
	lo = b.Lo / cfg.FloorRatio
	hi = math.Max(b.Hi, lo*(1+1e-9))
	if cfg.FlatPrices {
		hi = lo * (1 + 1e-12)
	}
	return lo, hi
}

// Alpha is the template's alpha = max(1, ln(U/L)): the competitive ratio is
// 2*Alpha.
func (b bounds) Alpha(cfg Config) float64 {
	lo, hi := b.priceRange(cfg)
	if !(lo > 0) {
		return 1
	}
	return math.Max(1, math.Log(hi/lo))
}

// horizon is the number of slots the calendar spans. A commitment holds
// its GPUs for up to that many rounds, so a job arriving behind it may wait
// that long: with the completion utility w*D/(completion-now), a wait of
// H rounds costs a job of duration D the share H*Round/(D + H*Round) of
// it. The horizon is the largest that costs a typical job (the geometric
// mean of the best-speed durations seen) at most Blocking of its utility,
// within [MinHorizon, MaxHorizon]; MinHorizon (2) keeps the choice of
// starting now or next round. Config.Horizon fixes it.
func (b bounds) horizon(cfg Config) int {
	if cfg.Horizon > 0 {
		return cfg.Horizon
	}
	h := cfg.MinHorizon
	if b.Jobs > 0 {
		typical := math.Exp(b.LogDur / float64(b.Jobs)) // rounds
		h = int(math.Floor(cfg.Blocking * typical / (1 - cfg.Blocking)))
	}
	return min(max(h, cfg.MinHorizon), cfg.MaxHorizon)
}

// restartCharge is what a preemption made for a rigid job that is not
// critical is charged per restart it causes (each victim's, and the job's
// own when it moves), on top of the victims' losses: the 20 s restart is
// not the whole price of a swap. Each moved job is pinned for its minimum
// run time where it lands, a victim moved onto other GPUs is the
// cheapest victim of the next arrival there, and a victim sent to slower
// GPUs moves back when faster ones free: on the 300-job continuous
// traces most of hadar's restarts were such swaps, each "gaining" hours
// that later rounds undid (docs/results.md, "Hadar's own restarts").
const restartCharge = 1800.0

// upgradeSpeedup is the least speedup for which a running rigid job moves
// to idle GPUs (upgrade): a move to GPUs only a little faster is undone as
// soon as a job of more value per GPU-round wants them.
const upgradeSpeedup = 1.3
