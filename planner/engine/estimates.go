package engine

import (
	"fmt"
	"math"
	"sort"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Estimates is the throughput source a live scheduler plans with: the
// declared profile, corrected by what the jobs' reported progress showed
// (when learning is on). It implements speed.Profile, so schedulers and
// placement policies are built on it and never see a true speed.
//
// Learning: for each (model, workers, GPU type) the engine keeps, per job,
// the steps it reported and the steps the declared profile predicted for
// its placement, summed over the intervals where it ran as one unit of one
// type (after a warm-up that covers its restart). Once the key holds
// MinEvidence seconds of running, its factor is the weighted median, in
// log space, of the jobs' ratios observed/predicted, each clamped to
// [1/MaxFactor, MaxFactor] and weighted by its seconds up to MinEvidence:
// a job's progress file (written by the job, so untrusted) moves the
// estimate of other jobs of its model by a bounded amount, and none once
// most of the evidence disagrees. Consolidated and spread figures share
// the factor, so the profile's network sensitivity is kept.
type Estimates struct {
	base  speed.Profile
	learn LearnConfig
	// corr holds the ledgers per key and job ("" for ledgers folded
	// together once a key holds more than MaxLedgers jobs).
	corr map[estKey]map[string]*correction
	// factor caches each key's factor (absent: 1).
	factor map[estKey]float64
	gen    uint64
}

// MaxFactor bounds a learned correction either way; MaxLedgers is how many
// jobs' ledgers a key keeps apart before the oldest are folded together.
const (
	MaxFactor  = 4.0
	MaxLedgers = 32
)

// LearnConfig turns online learning of throughputs on and tunes it.
type LearnConfig struct {
	On bool `json:"on"`
	// Warmup is the time after a (re)start whose progress is not learned
	// from: it holds checkpoint restore and warm-up (default 60 s).
	Warmup float64 `json:"warmup_s"`
	// MinEvidence is the seconds of observed running a key needs before
	// its correction applies (default 300 s).
	MinEvidence float64 `json:"min_evidence_s"`
}

func (c LearnConfig) withDefaults() LearnConfig {
	if c.Warmup <= 0 {
		c.Warmup = 60
	}
	if c.MinEvidence <= 0 {
		c.MinEvidence = 300
	}
	return c
}

type estKey struct {
	Model string
	SF    int
	Type  planner.GPUType
}

// correction sums one job's observed and predicted steps over qualifying
// intervals; Seq orders ledgers by first observation.
type correction struct {
	Observed  float64
	Predicted float64
	Seconds   float64
	Seq       uint64
}

// NewEstimates returns estimates over the declared profile.
func NewEstimates(declared speed.Profile, learn LearnConfig) (*Estimates, error) {
	if declared == nil {
		return nil, fmt.Errorf("estimates: no throughput profile")
	}
	if math.IsNaN(learn.Warmup) || math.IsNaN(learn.MinEvidence) || learn.Warmup < 0 || learn.MinEvidence < 0 {
		return nil, fmt.Errorf("estimates: warm-up %v s and minimum evidence %v s: want seconds >= 0", learn.Warmup, learn.MinEvidence)
	}
	return &Estimates{base: declared, learn: learn.withDefaults(), corr: map[estKey]map[string]*correction{}, factor: map[estKey]float64{}}, nil
}

// Declared is the profile the estimates start from.
func (e *Estimates) Declared() speed.Profile { return e.base }

// Throughput implements speed.Profile.
func (e *Estimates) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	v, err := e.base.Throughput(model, sf, t, spread)
	if err != nil {
		return 0, err
	}
	return v * e.Factor(model, sf, t), nil
}

// Factor is the learned correction of (model, sf, t): 1 until enough has
// been observed, or when learning is off.
func (e *Estimates) Factor(model string, sf int, t planner.GPUType) float64 {
	if !e.learn.On {
		return 1
	}
	if f, ok := e.factor[estKey{model, sf, t}]; ok {
		return f
	}
	return 1
}

// observe records that job's unit, predicted to make predicted steps, made
// observed over seconds of running.
func (e *Estimates) observe(k estKey, job string, observed, predicted, seconds float64) {
	if !e.learn.On || !(predicted > 0) || !(seconds > 0) || observed < 0 || math.IsInf(observed, 0) || math.IsInf(predicted, 0) {
		return
	}
	ls := e.corr[k]
	if ls == nil {
		ls = map[string]*correction{}
		e.corr[k] = ls
	}
	c := ls[job]
	if c == nil {
		c = &correction{Seq: e.nextSeq()}
		ls[job] = c
		e.fold(ls)
	}
	c.Observed += observed
	c.Predicted += predicted
	c.Seconds += seconds
	e.refactor(k)
}

// nextSeq is one past the highest ledger sequence.
func (e *Estimates) nextSeq() uint64 {
	var n uint64
	for _, ls := range e.corr {
		for _, c := range ls {
			n = max(n, c.Seq+1)
		}
	}
	return n
}

// fold merges the oldest ledgers of a key into its "" ledger while it
// keeps more than MaxLedgers.
func (e *Estimates) fold(ls map[string]*correction) {
	for len(ls) > MaxLedgers {
		oldest := ""
		for id, c := range ls {
			if id != "" && (oldest == "" || c.Seq < ls[oldest].Seq) {
				oldest = id
			}
		}
		c := ls[oldest]
		delete(ls, oldest)
		agg := ls[""]
		if agg == nil {
			agg = &correction{Seq: c.Seq}
			ls[""] = agg
		}
		agg.Observed += c.Observed
		agg.Predicted += c.Predicted
		agg.Seconds += c.Seconds
	}
}

// refactor recomputes the factor of k from its ledgers.
func (e *Estimates) refactor(k estKey) {
	type vote struct{ logRatio, weight float64 }
	var votes []vote
	total, seconds := 0.0, 0.0
	for _, c := range e.corr[k] {
		if !(c.Predicted > 0) || !(c.Seconds > 0) {
			continue
		}
		r := min(max(c.Observed/c.Predicted, 1/MaxFactor), MaxFactor)
		w := min(c.Seconds, e.learn.MinEvidence)
		votes = append(votes, vote{math.Log(r), w})
		total += w
		seconds += c.Seconds
	}
	f := 1.0
	if seconds >= e.learn.MinEvidence && total > 0 {
		sort.Slice(votes, func(a, b int) bool { return votes[a].logRatio < votes[b].logRatio })
		// The weighted median; exactly between two votes, their mean.
		acc := 0.0
		for i, v := range votes {
			acc += v.weight
			if acc > total/2 {
				f = math.Exp(v.logRatio)
				break
			}
			if acc == total/2 && i+1 < len(votes) {
				f = math.Exp((v.logRatio + votes[i+1].logRatio) / 2)
				break
			}
		}
	}
	old, had := e.factor[k]
	if !had {
		old = 1
	}
	if f == 1 {
		delete(e.factor, k)
	} else {
		e.factor[k] = f
	}
	if f != old {
		e.gen++
	}
}

// Learned lists the corrections in force, for reports.
func (e *Estimates) Learned() []Learned {
	var out []Learned
	for k, ls := range e.corr {
		l := Learned{Model: k.Model, SF: k.SF, Type: k.Type, Factor: e.Factor(k.Model, k.SF, k.Type), Jobs: len(ls)}
		for _, c := range ls {
			l.Seconds += c.Seconds
		}
		out = append(out, l)
	}
	sort.Slice(out, func(a, b int) bool {
		x, y := out[a], out[b]
		if x.Model != y.Model {
			return x.Model < y.Model
		}
		if x.SF != y.SF {
			return x.SF < y.SF
		}
		return x.Type < y.Type
	})
	return out
}

// Learned is one learned correction.
type Learned struct {
	Model   string          `json:"model"`
	SF      int             `json:"sf"`
	Type    planner.GPUType `json:"type"`
	Factor  float64         `json:"factor"`
	Seconds float64         `json:"seconds"`
	// Jobs is how many jobs' ledgers the factor is the median of.
	Jobs int `json:"jobs"`
}
