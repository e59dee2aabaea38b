package trainer

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/hadar-sched/hadar/contract"
)

// Result is the outcome of an in-process training run.
type Result struct {
	Params    Params
	Test      Eval  // on the held-out set
	Steps     int   // the job's steps: the sum over its copies
	CopySteps []int // steps each copy did (one entry for a single job)
	Merges    int   // merges performed
}

// RunSingle trains one job for steps steps on all of train.
func RunSingle(ctx context.Context, train, test *Dataset, cfg TrainConfig, steps int) (Result, error) {
	return RunHadarE(ctx, train, test, cfg, steps, HadarEConfig{Copies: 1, Speeds: []float64{1}, MergeEvery: steps})
}

// HadarEConfig describes an in-process HadarE run.
type HadarEConfig struct {
	Copies int
	// Speeds are the copies' relative steps per unit time (heterogeneous
	// GPUs): in each round copy i does a share of the round's steps
	// proportional to Speeds[i].
	Speeds []float64
	// MergeEvery is the mean steps per copy per round; a round's budget is
	// MergeEvery*Copies steps, fewer in the last round.
	MergeEvery int
	// NoMerge skips merging and returns the parameters of the copy that did
	// the most steps. It exists to show that the tolerance tests can fail.
	NoMerge bool
}

// DefaultSpeeds returns k unequal relative speeds 1, 1/2, 1/3, ... (the
// fastest GPU type about k times the slowest, like V100 vs K80).
func DefaultSpeeds(k int) []float64 {
	s := make([]float64, k)
	for i := range s {
		s[i] = 1 / float64(i+1)
	}
	return s
}

// Allocate splits budget steps among copies in proportion to speeds, by
// largest remainder (ties to the lower index) so the shares sum to budget.
func Allocate(budget int, speeds []float64) ([]int, error) {
	var sum float64
	for i, s := range speeds {
		if !(s > 0) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("allocate: speed %d is %g; want a finite value > 0", i, s)
		}
		sum += s
	}
	if len(speeds) == 0 || budget < 0 {
		return nil, fmt.Errorf("allocate: %d steps among %d copies; want budget >= 0 and at least one copy", budget, len(speeds))
	}
	out := make([]int, len(speeds))
	for i, n := range contract.Apportion(int64(budget), speeds) {
		out[i] = int(n)
	}
	return out, nil
}

// RunHadarE trains a job as hc.Copies copies, copy i on shard i of train,
// concurrently (one goroutine per copy), until the copies' steps sum to
// steps. At the end of every round the copies' parameters are replaced by
// their average weighted by the steps each did in the round.
func RunHadarE(ctx context.Context, train, test *Dataset, cfg TrainConfig, steps int, hc HadarEConfig) (Result, error) {
	if hc.Copies < 1 || len(hc.Speeds) != hc.Copies {
		return Result{}, fmt.Errorf("hadare: %d copies with %d speeds; give one speed per copy", hc.Copies, len(hc.Speeds))
	}
	if hc.MergeEvery < 1 {
		return Result{}, fmt.Errorf("hadare: merge every %d steps; want >= 1", hc.MergeEvery)
	}
	if steps < 1 {
		return Result{}, fmt.Errorf("hadare: %d total steps; want >= 1", steps)
	}
	init, err := InitParams(cfg.Model, train.Dim, cfg.Hidden, train.Classes, cfg.Seed)
	if err != nil {
		return Result{}, err
	}
	copies := make([]*SGD, hc.Copies)
	for i := range copies {
		shard, err := train.Shard(i, hc.Copies)
		if err != nil {
			return Result{}, err
		}
		if copies[i], err = NewSGD(cfg, shard, uint64(i), init); err != nil {
			return Result{}, err
		}
	}
	res := Result{CopySteps: make([]int, hc.Copies)}
	params := make([]Params, hc.Copies)
	weights := make([]float64, hc.Copies)
	for res.Steps < steps {
		if err := ctx.Err(); err != nil {
			return Result{}, fmt.Errorf("hadare: stopped after %d of %d steps: %w", res.Steps, steps, err)
		}
		alloc, err := Allocate(min(hc.MergeEvery*hc.Copies, steps-res.Steps), hc.Speeds)
		if err != nil {
			return Result{}, err
		}
		var wg sync.WaitGroup
		for i, c := range copies {
			wg.Go(func() {
				for range alloc[i] {
					c.Step()
				}
			})
		}
		wg.Wait()
		for i, n := range alloc {
			res.CopySteps[i] += n
			res.Steps += n
			weights[i] = float64(n)
		}
		if hc.NoMerge || hc.Copies == 1 {
			continue
		}
		for i, c := range copies {
			params[i] = c.params // read-only here; Merge copies
		}
		merged, err := Merge(params, weights)
		if err != nil {
			return Result{}, err
		}
		for _, c := range copies {
			if err := c.SetParams(merged); err != nil {
				return Result{}, err
			}
		}
		res.Merges++
	}
	best := 0
	for i, n := range res.CopySteps {
		if n > res.CopySteps[best] {
			best = i
		}
	}
	res.Params = copies[best].Params()
	if res.Test, err = Evaluate(res.Params, test); err != nil {
		return Result{}, err
	}
	return res, nil
}
