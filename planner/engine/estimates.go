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
// Learning: for each (model, workers, GPU type) the engine sums, over the
// intervals where a job of that kind ran as one unit of one type (after a
// warm-up that covers its restart), the steps it reported and the steps
// the declared profile predicted for that placement; once the predicted
// side holds MinEvidence seconds of running, throughputs of that key are
// the profile's times observed/predicted. Consolidated and spread figures
// share the factor, so the profile's network sensitivity is kept.
type Estimates struct {
	base  speed.Profile
	learn LearnConfig
	corr  map[estKey]*correction
	gen   uint64
}

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

// correction sums observed and predicted steps over qualifying intervals.
type correction struct {
	Observed  float64
	Predicted float64
	Seconds   float64
}

// NewEstimates returns estimates over the declared profile.
func NewEstimates(declared speed.Profile, learn LearnConfig) (*Estimates, error) {
	if declared == nil {
		return nil, fmt.Errorf("estimates: no throughput profile")
	}
	if math.IsNaN(learn.Warmup) || math.IsNaN(learn.MinEvidence) || learn.Warmup < 0 || learn.MinEvidence < 0 {
		return nil, fmt.Errorf("estimates: warm-up %v s and minimum evidence %v s: want seconds >= 0", learn.Warmup, learn.MinEvidence)
	}
	return &Estimates{base: declared, learn: learn.withDefaults(), corr: map[estKey]*correction{}}, nil
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
	c := e.corr[estKey{model, sf, t}]
	if c == nil || c.Seconds < e.learn.MinEvidence || !(c.Predicted > 0) {
		return 1
	}
	return c.Observed / c.Predicted
}

// observe records that a unit predicted to make predicted steps made
// observed over seconds of running.
func (e *Estimates) observe(k estKey, observed, predicted, seconds float64) {
	if !e.learn.On || !(predicted > 0) || observed < 0 || math.IsInf(observed, 0) {
		return
	}
	c := e.corr[k]
	if c == nil {
		c = &correction{}
		e.corr[k] = c
	}
	before := e.Factor(k.Model, k.SF, k.Type)
	c.Observed += observed
	c.Predicted += predicted
	c.Seconds += seconds
	if e.Factor(k.Model, k.SF, k.Type) != before {
		e.gen++
	}
}

// Learned lists the corrections in force, for reports.
func (e *Estimates) Learned() []Learned {
	var out []Learned
	for k, c := range e.corr {
		out = append(out, Learned{Model: k.Model, SF: k.SF, Type: k.Type, Factor: e.Factor(k.Model, k.SF, k.Type), Seconds: c.Seconds})
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
}
