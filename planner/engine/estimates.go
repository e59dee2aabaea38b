package engine

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"sort"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/estimate"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Estimates is the throughput source a live scheduler plans with: the
// declared profile, corrected by what the jobs' reported progress showed
// (when learning is on), and an estimate wherever the profile has no
// figure. It implements speed.Profile, so schedulers and placement
// policies are built on it and never see a true speed.
//
// Three kinds of (model, workers, GPU type) key:
//
//   - The profile has a figure (the operator's profile, its overlay, or a
//     job's declared hint): the figure times a learned correction. For
//     each key the engine keeps, per job, the steps it reported and the
//     exposure — the steps a 1 steps/s consolidated figure would have
//     made in its placement (its spread, network and mixed-type slowdowns,
//     from the speed model) — summed over the intervals where it ran past
//     its warm-up. Once the key holds MinEvidence seconds of running, its
//     factor is the weighted median, in log space, of the jobs' ratios
//     observed/(exposure x figure), each clamped to [1/MaxFactor,
//     MaxFactor] and weighted by its seconds up to MinEvidence: a job's
//     progress file (written by the job, so untrusted) moves the estimate
//     of other jobs of its model by a bounded amount, and none once most of
//     the evidence disagrees. Consolidated and spread figures share the
//     factor, so the profile's network sensitivity is kept.
//   - The profile has none but jobs ran on it: the weighted median of the
//     jobs' observed/exposure, once the key holds FirstEvidence seconds
//     (a stall, MinEvidence seconds without progress, votes 0 only with
//     another job's, or for the one job of the model planned now). One
//     job's ledger alone moves other jobs only within MaxFactor of the
//     estimate from before the key was measured (prior); a model no
//     profile names has only its own jobs to go by.
//   - Neither: the estimator (planner/estimate) completes the table from
//     every figure known and learned — the model's own figures at other
//     widths and on other types, each type's relative speed across every
//     model (an operator's relative speed until jobs measured the type),
//     the models most like it. A type nothing is known of has no estimate:
//     it is explored (below) or assumed as slow as the model's slowest
//     estimated type, and Gaps names it.
//
// Every placement is learned from — one type or several, one unit or
// HadarE's copies — through the speed model: a unit's share of the
// reported steps is its estimated share of the job's speed, and it counts
// for the key of its width and its slowest type (the one a synchronous
// step waits on).
//
// Exploration (learning on): before each plan the engine marks a key whose
// estimate is uncertain (completed, an operator's speed, or no estimate
// at all) for a job whose best firm estimate (a figure, a learned rate,
// the model's own figures at another width) is r0, when the expected time
// saved if the type is faster outweighs two restarts and the progress lost
// during a round there if it is slower (Explore). A marked key shows the
// optimistic max(estimate x e^sigma, ExploreLead x r0), so every scheduler
// tries it without knowing why; once FirstEvidence seconds ran there, the
// measured rate replaces it.
type Estimates struct {
	base  speed.Profile
	learn LearnConfig
	// corr holds the ledgers per key and job ("" for ledgers folded
	// together once a key holds more than MaxLedgers jobs).
	corr map[estKey]map[string]*correction
	// factor caches each key's factor where the base has a figure (absent:
	// 1); rate each learned figure where it has none.
	factor map[estKey]float64
	rate   map[estKey]float64
	// explore holds the optimistic figure of each key being explored.
	explore map[estKey]float64
	// live holds, per model key, the jobs of the engine now (setLive):
	// one job's ledger alone applies only while no other job of its model
	// is planned with it.
	live map[string]map[string]bool
	// prior holds, per key without a figure, the estimator's answer
	// from before anything was learned there: one job's measurement
	// alone plans other jobs only within MaxFactor of it (not saved: a
	// restored key with one job's ledger has none, and the measurement
	// alone, capped by plausible, plans until a second job reports).
	prior map[estKey]float64
	// gen counts every change of an estimate; learnGen the changes of
	// what was learned (what the estimator is fitted on); seenBase the
	// declared profile's generation the factors were computed against.
	gen, learnGen, seenBase uint64

	// The fitted estimator, for the generation it was fitted at, its
	// answers and the gaps; the declared profile's spread ratios per
	// (width, type), for the generation they were taken at.
	tab       *estimate.Table
	tabGen    uint64
	tabSum    uint64
	cache     map[estKey]keyEstimate
	gaps      map[gapKey]string
	spreadTab *estimate.Table
	spreadBy  map[int]float64
	spreadGen uint64
}

// MaxFactor bounds a learned correction either way; MaxLedgers is how many
// jobs' ledgers a key keeps apart before the oldest are folded together.
const (
	MaxFactor  = 4.0
	MaxLedgers = 32
)

// MaxRatePerGPU bounds, in steps/s per GPU, what a report may claim of a
// job no firm estimate bounds and what is learned where no figure is: far
// beyond any training step, so only a lie (or a broken counter) is cut.
const MaxRatePerGPU = 1e5

// MinJobs is how many jobs' ledgers a key needs before what they measured
// plans other jobs of the model: a job's progress file is written by the
// job, and one job alone (lying, or hung) must not move another's plan.
const MinJobs = 2

// LedgerTTL is how long, in seconds, a job's ledger is kept after its last
// observation; MaxKeys how many (model, width, type) keys are kept at most,
// the least recently observed forgotten first (issue 31, item 11: learned
// entries of every key ever seen were saved and refitted forever).
const (
	LedgerTTL = 30 * 24 * 3600.0
	MaxKeys   = 4096
)

// UnknownSpread is the spread/consolidated ratio assumed of a job on
// several servers when no profile has a spread figure at all: spreading
// a synchronous job is never free (Gavel's profile: median 0.73 at 2, 4
// and 8 GPUs). Assumed free (1, until now), placement spread
// wide jobs where a server had room for them, and what they measured
// there was learned as their consolidated rate: told nothing, hadar's
// average JCT was 6 to 8 % above full knowledge on 1,000 jobs, all of it
// on jobs of 2 to 8 GPUs (docs/results.md, "Learning after issue 31's
// safety changes").
const UnknownSpread = 0.75

// Exploration: ExploreLead is how far ahead of the job's best firm type an
// explored key is shown; unknownSigma the spread assumed of a type nothing
// is known of.
const (
	ExploreLead  = 1.1
	unknownSigma = 1.0
)

// LearnConfig turns online learning of throughputs on and tunes it.
type LearnConfig struct {
	On bool `json:"on"`
	// Warmup is the time after a (re)start whose progress is not learned
	// from: it holds checkpoint restore and warm-up (default 60 s).
	Warmup float64 `json:"warmup_s"`
	// MinEvidence is the seconds of observed running a key with a profile
	// figure needs before its correction applies (default 300 s).
	MinEvidence float64 `json:"min_evidence_s"`
	// FirstEvidence is the seconds of observed running a key without one
	// needs before the measured rate replaces the estimate (default 60 s:
	// any measurement beats a guess).
	FirstEvidence float64 `json:"first_evidence_s,omitempty"`
	// RestartCost is what exploration weighs a restart at, in seconds of
	// progress (default 60 s; hadar sim passes its --restart-cost, the
	// sidecar keeps the default: a saved state restores only into the
	// learning settings it was saved with).
	RestartCost float64 `json:"restart_cost_s,omitempty"`
	// NoExplore turns exploration off (estimates stay as they are until
	// jobs happen to run on an unmeasured type).
	NoExplore bool `json:"no_explore,omitempty"`
	// Estimator is the method that completes the table (planner/estimate;
	// default similar).
	Estimator estimate.Method `json:"estimator,omitempty"`
}

func (c LearnConfig) withDefaults() LearnConfig {
	if c.Warmup <= 0 {
		c.Warmup = 60
	}
	if c.MinEvidence <= 0 {
		c.MinEvidence = 300
	}
	if c.FirstEvidence <= 0 {
		c.FirstEvidence = min(60, c.MinEvidence)
	}
	if c.RestartCost <= 0 {
		c.RestartCost = 60
	}
	if c.Estimator == "" {
		c.Estimator = estimate.Similar
	}
	return c
}

type estKey struct {
	Model string
	SF    int
	Type  planner.GPUType
}

type gapKey struct {
	model string
	t     planner.GPUType
}

// keyEstimate is the estimator's answer for a key the base has no figure
// for: the value (after the no-estimate fallback) and where it came from.
type keyEstimate struct {
	value  float64
	sigma  float64
	source estimate.Source
}

// correction sums one job's observed steps and exposure over qualifying
// intervals; Seq orders ledgers by first observation.
type correction struct {
	Observed float64
	// Exposure is the steps a consolidated figure of 1 steps/s would have
	// made over the same intervals and placements.
	Exposure float64
	Seconds  float64
	Seq      uint64
	// Last is the engine time of the ledger's last observation: a key
	// no job reported on for LedgerTTL is forgotten (prune).
	Last float64
}

// NewEstimates returns estimates over the declared profile. The profile
// may say it has no figure for a key (an error wrapping
// profile.ErrNoFigure): the key is then estimated. When it lists its
// figures (Entries() []profile.Entry), the estimator learns from them; it
// may give relative speeds of types (RelativeSpeeds) and a generation that
// changes when its figures do (Generation() uint64, e.g. an overlay
// reloaded).
func NewEstimates(declared speed.Profile, learn LearnConfig) (*Estimates, error) {
	if declared == nil {
		return nil, fmt.Errorf("estimates: no throughput profile")
	}
	for _, x := range []float64{learn.Warmup, learn.MinEvidence, learn.FirstEvidence, learn.RestartCost} {
		if math.IsNaN(x) || x < 0 || math.IsInf(x, 0) {
			return nil, fmt.Errorf("estimates: warm-up %v s, minimum evidence %v s, first evidence %v s, restart cost %v s: want seconds >= 0",
				learn.Warmup, learn.MinEvidence, learn.FirstEvidence, learn.RestartCost)
		}
	}
	if learn.Estimator != "" {
		if _, err := estimate.ParseMethod(string(learn.Estimator)); err != nil {
			return nil, fmt.Errorf("estimates: %w", err)
		}
	}
	return &Estimates{base: declared, learn: learn.withDefaults(), corr: map[estKey]map[string]*correction{},
		factor: map[estKey]float64{}, rate: map[estKey]float64{}, explore: map[estKey]float64{}}, nil
}

// Declared is the profile the estimates start from.
func (e *Estimates) Declared() speed.Profile { return e.base }

// Learning reports the learning configuration in force (defaults filled).
func (e *Estimates) Learning() LearnConfig { return e.learn }

// Generation changes whenever an estimate may have: something learned,
// an exploration started or ended, or the declared profile changed.
func (e *Estimates) Generation() uint64 { return e.gen + e.baseGen() }

func (e *Estimates) baseGen() uint64 {
	if g, ok := e.base.(interface{ Generation() uint64 }); ok {
		return g.Generation()
	}
	return 0
}

// baseFigure asks the declared profile: ok false when it has no figure
// (err nil then), an error for anything else.
func (e *Estimates) baseFigure(model string, sf int, t planner.GPUType, spread bool) (float64, bool, error) {
	v, err := e.base.Throughput(model, sf, t, spread)
	if err == nil {
		return v, true, nil
	}
	if errors.Is(err, profile.ErrNoFigure) {
		return 0, false, nil
	}
	return 0, false, err
}

// sync recomputes what was learned when the declared profile changed (an
// overlay reloaded): a factor is relative to the figure, and a key may
// have gained or lost one.
func (e *Estimates) sync() {
	if g := e.baseGen(); g != e.seenBase {
		e.seenBase = g
		for _, k := range sortedKeys(e.corr) {
			e.refactor(k)
		}
	}
}

// Throughput implements speed.Profile.
func (e *Estimates) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	e.sync()
	v, ok, err := e.baseFigure(model, sf, t, spread)
	if err != nil {
		return 0, err
	}
	if ok {
		return v * e.Factor(model, sf, t), nil
	}
	if sf <= 0 {
		return 0, fmt.Errorf("estimates: model %q on %d GPUs: want a positive number of GPUs", model, sf)
	}
	model = e.family(model)
	c := e.consolidated(estKey{model, sf, t})
	if spread && sf > 1 {
		c *= e.spreadRatio(model, sf, t)
	}
	return c, nil
}

// Factor is the learned correction of (model, sf, t): 1 until enough has
// been observed, when learning is off, or for a key the declared profile
// has no figure for (Estimate has its figure).
func (e *Estimates) Factor(model string, sf int, t planner.GPUType) float64 {
	if !e.learn.On {
		return 1
	}
	if f, ok := e.factor[estKey{model, sf, t}]; ok {
		return f
	}
	return 1
}

// KeyEstimate is what the estimates hold of one key, for reports and the
// status API.
type KeyEstimate struct {
	// Value is the consolidated steps/s planned with (optimistic while
	// explored).
	Value float64 `json:"value"`
	// Source: "profile" (a declared figure, corrected when learned),
	// "learned" (measured where the profile has none), or the estimator's
	// source ("scaled", "completed", "operator", "prior", "none").
	Source string `json:"source"`
	// Sigma is the typical error of the estimate, in log space (0 for a
	// figure or a learned rate; +Inf, shown as -1 in JSON, for none).
	Sigma float64 `json:"sigma"`
	// Exploring is true while the key is shown optimistic to be tried.
	Exploring bool `json:"exploring,omitempty"`
}

// Estimate returns the consolidated estimate of (model, sf, t) and what it
// rests on.
func (e *Estimates) Estimate(model string, sf int, t planner.GPUType) (KeyEstimate, error) {
	e.sync()
	v, ok, err := e.baseFigure(model, sf, t, false)
	if err != nil {
		return KeyEstimate{}, err
	}
	if ok {
		return KeyEstimate{Value: v * e.Factor(model, sf, t), Source: "profile"}, nil
	}
	k := estKey{e.family(model), sf, t}
	if r, ok := e.learned(k); ok {
		return KeyEstimate{Value: r, Source: "learned"}, nil
	}
	ke := e.tableEstimate(k)
	out := KeyEstimate{Value: ke.value, Source: ke.source.String(), Sigma: ke.sigma}
	if math.IsInf(out.Sigma, 0) {
		out.Sigma = -1 // JSON has no infinity
	}
	if x, ok := e.explore[k]; ok {
		out.Value, out.Exploring = x, true
	}
	return out, nil
}

// firm reports whether an estimate is firm enough not to explore: a
// figure, a learned rate, or the model's own figures on the type.
func (k KeyEstimate) firm() bool {
	return k.Source == "profile" || k.Source == "learned" || k.Source == estimate.Scaled.String()
}

// family is the model a key without a figure of its own is estimated and
// learned under: a job's own key (belief.Profile's "job:<id>") keeps its
// declared figures to itself, and shares what is estimated or measured of
// the types it declared nothing for with its model's other jobs.
func (e *Estimates) family(model string) string {
	if f, ok := e.base.(interface{ Family(string) string }); ok {
		if m := f.Family(model); m != "" {
			return m
		}
	}
	return model
}

// keyOf is the key (model, sf, t) is learned under (family).
func (e *Estimates) keyOf(model string, sf int, t planner.GPUType) estKey {
	if _, ok, err := e.baseFigure(model, sf, t, false); err == nil && !ok {
		return estKey{e.family(model), sf, t}
	}
	return estKey{model, sf, t}
}

// learned is the learned rate of a key the base has no figure for.
func (e *Estimates) learned(k estKey) (float64, bool) {
	if !e.learn.On {
		return 0, false
	}
	r, ok := e.rate[k]
	return r, ok
}

// consolidated is the consolidated figure of a key the base has none for.
func (e *Estimates) consolidated(k estKey) float64 {
	if r, ok := e.learned(k); ok {
		return r
	}
	if x, ok := e.explore[k]; ok {
		return x
	}
	return e.tableEstimate(k).value
}

// tableEstimate is the estimator's answer for k, cached per fit; with no
// estimate, the model's slowest estimated type at that width (a gap,
// noted), or one step/s per GPU when nothing at all is known.
func (e *Estimates) tableEstimate(k estKey) keyEstimate {
	if e.tab == nil {
		e.refit()
	}
	if ke, ok := e.cache[k]; ok {
		return ke
	}
	est := e.tab.Estimate(k.Model, k.SF, k.Type)
	ke := keyEstimate{value: est.Value, sigma: est.Sigma, source: est.Source}
	if est.Source == estimate.NoData {
		slowest, from := math.Inf(1), planner.GPUType("")
		for _, t := range e.tabTypes() {
			if t == k.Type {
				continue
			}
			if o := e.tab.Estimate(k.Model, k.SF, t); o.Source != estimate.NoData && o.Value < slowest {
				slowest, from = o.Value, t
			}
		}
		switch {
		case from != "":
			ke.value = slowest
			e.gaps[gapKey{k.Model, k.Type}] = fmt.Sprintf("no figure of GPU type %s for any model and none learned: assumed as slow as %s, its slowest estimated type", k.Type, from)
		default:
			// Nothing at all is known: every type alike, one step per
			// second per GPU, until the first job reports.
			ke.value = float64(k.SF)
			e.gaps[gapKey{k.Model, k.Type}] = fmt.Sprintf("nothing is known of GPU type %s or of any other: assumed one step/s per GPU until jobs report", k.Type)
		}
	}
	e.cache[k] = ke
	return ke
}

// tabTypes are the types the table has figures or a prior of, sorted.
func (e *Estimates) tabTypes() []planner.GPUType {
	seen := map[planner.GPUType]bool{}
	for _, en := range e.entries() {
		for t := range en.Consolidated {
			seen[t] = true
		}
	}
	for k := range e.rate {
		seen[k.Type] = true
	}
	for t := range e.relativeSpeeds() {
		seen[t] = true
	}
	out := make([]planner.GPUType, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func (e *Estimates) entries() []profile.Entry {
	if l, ok := e.base.(interface{ Entries() []profile.Entry }); ok {
		return l.Entries()
	}
	return nil
}

func (e *Estimates) relativeSpeeds() map[planner.GPUType]profile.RelativeSpeed {
	if l, ok := e.base.(interface {
		RelativeSpeeds() map[planner.GPUType]profile.RelativeSpeed
	}); ok {
		return l.RelativeSpeeds()
	}
	return nil
}

// Refresh refits the estimator when anything it rests on changed since
// its last fit: the declared figures, a factor, a learned rate
// (explorations do not count: it never sees an optimistic figure). The
// engine calls it before each plan; between plans the estimator stays as
// it was fitted, so an estimate changes only at a plan (and a restored
// engine estimates as the one that took the snapshot).
func (e *Estimates) Refresh() {
	e.sync()
	if e.tab == nil || e.tabGen != e.fitGen() {
		e.refit()
	}
}

// quantum is the grid, in log space, learned figures are fitted on: the
// estimator is refitted only when one moves by more than 1 %, and is a
// function of the grid, not of when it was fitted.
const quantum = 0.01

func quantize(v float64) float64 { return math.Exp(math.Round(math.Log(v)/quantum) * quantum) }

// refit rebuilds the estimator from what is known now, unless the cells
// (learned figures on the grid) are those it was fitted on.
func (e *Estimates) refit() {
	var cells []estimate.Cell
	for _, en := range e.entries() {
		for t, v := range en.Consolidated {
			if v > 0 {
				f := e.Factor(en.Model, en.ScaleFactor, t)
				if f != 1 {
					v = quantize(v * f)
				}
				cells = append(cells, estimate.Cell{Model: en.Model, Width: en.ScaleFactor, Type: t, Value: v})
			}
		}
	}
	if e.learn.On {
		for _, k := range sortedKeys(e.rate) {
			if r := e.rate[k]; r > 0 {
				cells = append(cells, estimate.Cell{Model: k.Model, Width: k.SF, Type: k.Type, Value: quantize(r)})
			}
		}
	}
	sort.Slice(cells, func(a, b int) bool {
		x, y := cells[a], cells[b]
		if x.Model != y.Model {
			return x.Model < y.Model
		}
		if x.Width != y.Width {
			return x.Width < y.Width
		}
		if x.Type != y.Type {
			return x.Type < y.Type
		}
		return x.Value < y.Value
	})
	h := fnv.New64a()
	for _, c := range cells {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%x\x00", c.Model, c.Width, c.Type, math.Float64bits(c.Value))
	}
	speeds := e.relativeSpeeds()
	for _, t := range slices.Sorted(maps.Keys(speeds)) {
		r := speeds[t]
		fmt.Fprintf(h, "speed\x00%s\x00%s\x00%x\x00", t, r.Reference, math.Float64bits(r.Speed))
	}
	sum := h.Sum64()
	if e.tab != nil && sum == e.tabSum {
		e.tabGen = e.fitGen()
		return
	}
	priors := map[planner.GPUType]estimate.TypePrior{}
	for t, r := range e.relativeSpeeds() {
		priors[t] = estimate.TypePrior{Reference: r.Reference, Speed: r.Speed}
	}
	tab, err := estimate.Fit(cells, estimate.Config{Method: e.learn.Estimator, Priors: priors})
	if err != nil {
		// The method was checked when the estimates were built.
		tab, _ = estimate.Fit(cells, estimate.Config{Priors: priors})
	}
	e.tab, e.tabGen, e.tabSum = tab, e.fitGen(), sum
	e.cache, e.gaps = map[estKey]keyEstimate{}, map[gapKey]string{}
}

// fitGen is the generation of what the estimator is fitted on.
func (e *Estimates) fitGen() uint64 { return e.learnGen*1_000_003 + e.baseGen() }

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	return (xs[(n-1)/2] + xs[n/2]) / 2
}

// spreadRatio is spread over consolidated throughput for a key the
// profile has no figure for, estimated like a figure: the declared
// profile's spread/consolidated ratios form a table of their own, which
// the estimator completes (a wide job of an unprofiled model pays what
// the models like it pay to spread: Gavel's LMs lose far more on V100
// than on P100); with no estimate, the profile's median at that width
// over every type, else UnknownSpread. (With a network model the speed
// model prices spreading itself and never asks for spread figures.)
func (e *Estimates) spreadRatio(model string, sf int, t planner.GPUType) float64 {
	if g := e.baseGen(); e.spreadTab == nil || e.spreadGen != g {
		var cells []estimate.Cell
		bySF := map[int][]float64{}
		for _, en := range e.entries() {
			for t, v := range en.Consolidated {
				if s, ok := en.Spread[t]; ok && v > 0 && s > 0 && en.ScaleFactor > 1 {
					cells = append(cells, estimate.Cell{Model: en.Model, Width: en.ScaleFactor, Type: t, Value: s / v})
					bySF[en.ScaleFactor] = append(bySF[en.ScaleFactor], s/v)
				}
			}
		}
		tab, err := estimate.Fit(cells, estimate.Config{Method: e.learn.Estimator})
		if err != nil {
			tab, _ = estimate.Fit(cells, estimate.Config{})
		}
		e.spreadTab, e.spreadGen, e.spreadBy = tab, g, map[int]float64{}
		for sf, rs := range bySF {
			e.spreadBy[sf] = median(rs)
		}
	}
	if est := e.spreadTab.Estimate(model, sf, t); est.Source != estimate.NoData && est.Value > 0 {
		// A ratio above 1 (spreading never helps) is noise of the fit.
		return min(est.Value, 1)
	}
	if r, ok := e.spreadBy[sf]; ok {
		return r
	}
	return UnknownSpread
}

// Gap is a GPU type a model has no estimate on: no figure of the type is
// known, no job measured it, and no operator gave its relative speed.
type Gap struct {
	Model string          `json:"model"`
	Type  planner.GPUType `json:"type"`
	Why   string          `json:"why"`
}

// Gaps lists the (model, type) pairs planned without an estimate since
// the estimator last changed, sorted: the sidecar warns of each and the
// engine names them in the reasons of the jobs concerned.
func (e *Estimates) Gaps() []Gap {
	out := make([]Gap, 0, len(e.gaps))
	for k, why := range e.gaps {
		out = append(out, Gap{Model: k.model, Type: k.t, Why: why})
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].Model != out[b].Model {
			return out[a].Model < out[b].Model
		}
		return out[a].Type < out[b].Type
	})
	return out
}

// gap is why model has no estimate on t ("" when it has one).
func (e *Estimates) gap(model string, t planner.GPUType) string { return e.gaps[gapKey{model, t}] }

// observe records that job's unit, whose exposure (steps at a
// consolidated 1 steps/s) was exposure, made observed steps over seconds
// of running.
func (e *Estimates) observe(k estKey, job string, observed, exposure, seconds, now float64) {
	if !e.learn.On || !(exposure > 0) || !(seconds > 0) || observed < 0 || math.IsInf(observed, 0) || math.IsInf(exposure, 0) {
		return
	}
	k = e.keyOf(k.Model, k.SF, k.Type)
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
	c.Exposure += exposure
	c.Seconds += seconds
	c.Last = max(c.Last, now)
	e.refactor(k)
}

// prune forgets the ledgers last observed more than LedgerTTL before now
// and, past MaxKeys keys, the least recently observed keys; what they
// taught goes with them.
func (e *Estimates) prune(now float64) {
	last := map[estKey]float64{}
	var touched []estKey
	for k, ls := range e.corr {
		n := len(ls)
		for id, c := range ls {
			if c.Last < now-LedgerTTL {
				delete(ls, id)
			} else {
				last[k] = max(last[k], c.Last)
			}
		}
		if len(ls) != n {
			touched = append(touched, k)
		}
	}
	if len(last) > MaxKeys {
		keys := sortedKeys(last)
		sort.SliceStable(keys, func(a, b int) bool { return last[keys[a]] > last[keys[b]] })
		for _, k := range keys[MaxKeys:] {
			clear(e.corr[k])
		}
	}
	for _, k := range sortedKeys(e.corr) {
		if len(e.corr[k]) == 0 {
			delete(e.corr, k)
			delete(e.prior, k)
			if _, ok := e.explore[k]; ok {
				delete(e.explore, k)
				e.gen++
			}
			touched = append(touched, k)
		}
	}
	for _, k := range touched {
		e.refactor(k)
	}
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
		agg.Exposure += c.Exposure
		agg.Seconds += c.Seconds
		agg.Last = max(agg.Last, c.Last)
	}
}

// refactor recomputes what k learned from its ledgers: a factor over the
// declared figure where there is one, else a rate.
func (e *Estimates) refactor(k estKey) {
	b, hasBase, err := e.baseFigure(k.Model, k.SF, k.Type, false)
	if err != nil {
		return
	}
	// A key that gained or lost its figure keeps nothing of the other kind.
	if _, had := e.rate[k]; had && hasBase {
		delete(e.rate, k)
		e.gen++
		e.learnGen++
	}
	if _, had := e.factor[k]; had && !hasBase {
		delete(e.factor, k)
		e.gen++
		e.learnGen++
	}
	if hasBase && !(b > 0) {
		return
	}
	type vote struct{ x, weight float64 }
	var votes []vote
	total, seconds := 0.0, 0.0
	jobs, only := 0, ""
	var stalled []string
	for id, c := range e.corr[k] {
		if !(c.Exposure > 0) || !(c.Seconds > 0) || !plausible(k, c) {
			// A stall (or a rate no GPU makes) is a fact about that
			// job, not a speed of the model: it votes only as below.
			if c.Exposure > 0 && c.Observed == 0 && c.Seconds >= e.learn.MinEvidence {
				stalled = append(stalled, id)
			}
			continue
		}
		x := c.Observed / c.Exposure
		if hasBase {
			x = min(max(x/b, 1/MaxFactor), MaxFactor)
		}
		w := min(c.Seconds, e.learn.MinEvidence)
		votes = append(votes, vote{x, w})
		total += w
		seconds += c.Seconds
		jobs, only = jobs+1, id
		if id == "" {
			jobs++ // folded ledgers are several jobs'
		}
	}
	// Stalls vote "cannot run here" only where MinJobs jobs stalled
	// (out of memory, say: a fact of the model), or for the one job of
	// the model planned now (it alone is moved off the type).
	if len(stalled) >= MinJobs || slices.Contains(stalled, "") || (len(stalled) == 1 && e.alone(k.Model, stalled[0])) {
		x := 0.0
		if hasBase {
			x = 1 / MaxFactor
		}
		for _, id := range stalled {
			votes = append(votes, vote{x, e.learn.MinEvidence})
			total += e.learn.MinEvidence
			seconds += e.learn.MinEvidence
			jobs, only = jobs+1, id
		}
	}
	lone := jobs < MinJobs && !e.alone(k.Model, only)
	if lone && hasBase {
		// The figure is a fair guess: one job alone does not move it
		// for others.
		votes, total = nil, 0
	}
	// The weighted median (order is the same in log space); exactly
	// between two votes, their geometric mean.
	med, ok := 0.0, false
	if total > 0 {
		sort.Slice(votes, func(a, b int) bool { return votes[a].x < votes[b].x })
		acc := 0.0
		for i, v := range votes {
			acc += v.weight
			if acc > total/2 {
				med, ok = v.x, true
				break
			}
			if acc == total/2 && i+1 < len(votes) {
				med, ok = math.Sqrt(v.x*votes[i+1].x), true
				break
			}
		}
	}
	changed := false
	if hasBase {
		f := 1.0
		if ok && seconds >= e.learn.MinEvidence {
			f = med
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
		changed = f != old
	} else {
		old, had := e.rate[k]
		if !had && e.learn.On {
			// What the key was planned at before it was measured.
			if ke := e.tableEstimate(k); ke.source != estimate.NoData && ke.value > 0 {
				if e.prior == nil {
					e.prior = map[estKey]float64{}
				}
				if _, seen := e.prior[k]; !seen {
					e.prior[k] = ke.value
				}
			}
		}
		if p, bound := e.prior[k]; ok && lone && bound {
			// No figure, and one job's measurement the only evidence:
			// it plans other jobs of the model (any measurement beats
			// a guess), within MaxFactor of what was estimated.
			med = min(max(med, p/MaxFactor), p*MaxFactor)
		}
		switch {
		case ok && seconds >= e.learn.FirstEvidence:
			e.rate[k] = med
			changed = !had || old != med
			if !had {
				delete(e.explore, k) // measured: no longer explored
			}
		case had:
			// Its evidence lost its weight (a job left, a ledger
			// expired): back to the estimate.
			delete(e.rate, k)
			changed = true
		}
	}
	if changed {
		e.gen++
		e.learnGen++
	}
}

// plausible reports whether a ledger may vote: it made progress, at a
// rate a GPU can make.
func plausible(k estKey, c *correction) bool {
	return c.Observed > 0 && c.Observed/c.Seconds <= MaxRatePerGPU*float64(max(1, k.SF))
}

// alone reports whether job is the only job of model planned now: its
// own measurement may then plan it, and no other job.
func (e *Estimates) alone(model, job string) bool {
	if job == "" {
		return false
	}
	live := e.live[model]
	return len(live) == 1 && live[job]
}

// setLive records the jobs the engine plans now, per model key and the
// model they are learned under, and recomputes what depends on it.
func (e *Estimates) setLive(jobs map[string][]string) {
	live := map[string]map[string]bool{}
	for model, ids := range jobs {
		for _, m := range []string{model, e.family(model)} {
			if live[m] == nil {
				live[m] = map[string]bool{}
			}
			for _, id := range ids {
				live[m][id] = true
			}
		}
	}
	if maps.EqualFunc(live, e.live, maps.Equal) {
		return
	}
	e.live = live
	for _, k := range sortedKeys(e.corr) {
		e.refactor(k)
	}
}

// stalledSince reports whether job's own ledger on k shows a stall seen
// at or after since: MinEvidence seconds running there, past its
// warm-up, without a step. A ledger of an earlier job of the same ID (a
// rerun) is older than the rerun's submission and does not count.
func (e *Estimates) stalledSince(k estKey, job string, since float64) bool {
	c := e.corr[k][job]
	return c != nil && c.Exposure > 0 && c.Observed == 0 && c.Seconds >= e.learn.MinEvidence && c.Last >= since
}

// Stalls counts, per key, the jobs whose ledger shows no progress at all:
// a hung or broken job, which the operator may act on; it is not learned.
func (e *Estimates) Stalls() map[string]int {
	out := map[string]int{}
	for k, ls := range e.corr {
		for _, c := range ls {
			if c.Seconds > 0 && !(c.Observed > 0) {
				out[fmt.Sprintf("%s x%d on %s", k.Model, k.SF, k.Type)]++
			}
		}
	}
	return out
}

// setExplore replaces the keys being explored and their optimistic
// figures; learned keys are never explored.
func (e *Estimates) setExplore(want map[estKey]float64) {
	for k := range want {
		if _, ok := e.rate[k]; ok {
			delete(want, k)
		}
	}
	same := len(want) == len(e.explore)
	for k, v := range want {
		same = same && e.explore[k] == v
	}
	if !same {
		e.explore = want
		e.gen++
	}
}

// Learned lists what was learned, per key with ledgers, for reports and
// the status API.
func (e *Estimates) Learned() []Learned {
	var out []Learned
	for k, ls := range e.corr {
		l := Learned{Model: k.Model, SF: k.SF, Type: k.Type, Jobs: len(ls)}
		for _, c := range ls {
			l.Seconds += c.Seconds
		}
		if b, ok, err := e.baseFigure(k.Model, k.SF, k.Type, false); err == nil && ok {
			l.Profile, l.Factor, l.Rate = b, e.Factor(k.Model, k.SF, k.Type), b*e.Factor(k.Model, k.SF, k.Type)
			l.Applied = l.Factor != 1
		} else if r, ok := e.learned(k); ok {
			l.Rate, l.Applied = r, true
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

// Learned is what one key learned.
type Learned struct {
	Model string          `json:"model"`
	SF    int             `json:"sf"`
	Type  planner.GPUType `json:"type"`
	// Profile is the declared figure (0: none, the key was learned from
	// scratch); Factor the correction over it (1 until applied).
	Profile float64 `json:"profile,omitempty"`
	Factor  float64 `json:"factor,omitempty"`
	// Rate is the consolidated steps/s learned (the profile's figure
	// times the factor, or the measured rate); 0 until applied.
	Rate float64 `json:"rate"`
	// Applied is true once enough was observed for it to count.
	Applied bool    `json:"applied"`
	Seconds float64 `json:"seconds"`
	// Jobs is how many jobs' ledgers it is the median of.
	Jobs int `json:"jobs"`
}

// TypeSpeeds returns each GPU type's speed against ref as learned across
// every model (the estimator's type term): what a new model is first
// estimated with. ok false when ref has no figure.
func (e *Estimates) TypeSpeeds(ref planner.GPUType) (map[planner.GPUType]float64, bool) {
	e.Refresh()
	out := map[planner.GPUType]float64{}
	for _, t := range e.tabTypes() {
		if s, ok := e.tab.TypeSpeed(t, ref); ok {
			out[t] = s
		}
	}
	_, ok := out[ref]
	return out, ok
}

// Export returns what was measured as a profile (docs/formats.md, "The
// learned table"): an entry per (model, workers) with an applied learned
// figure on some type — the declared figure times its factor, or the
// measured rate — and each type's speed against ref learned across every
// model as relative speeds (for types with figures of their own in the
// export those are priors only). Estimates are never exported: loaded as
// an overlay, the file must hold what jobs measured, not guesses.
func (e *Estimates) Export(source string, ref planner.GPUType) (*profile.Profile, error) {
	byPair := map[profile.Pair]*profile.Entry{}
	var pairs []profile.Pair
	for _, l := range e.Learned() {
		if !l.Applied {
			continue
		}
		p := profile.Pair{Model: l.Model, ScaleFactor: l.SF}
		en := byPair[p]
		if en == nil {
			en = &profile.Entry{Model: l.Model, ScaleFactor: l.SF, Consolidated: map[planner.GPUType]float64{}}
			byPair[p] = en
			pairs = append(pairs, p)
		}
		en.Consolidated[l.Type] = l.Rate
		if l.Profile > 0 && l.SF > 1 {
			if s, ok, err := e.baseFigure(l.Model, l.SF, l.Type, true); err == nil && ok && s != l.Profile {
				if en.Spread == nil {
					en.Spread = map[planner.GPUType]float64{}
				}
				en.Spread[l.Type] = s * l.Factor
			}
		}
	}
	entries := make([]profile.Entry, len(pairs))
	for i, p := range pairs {
		entries[i] = *byPair[p]
	}
	speeds := map[planner.GPUType]profile.RelativeSpeed{}
	if ts, ok := e.TypeSpeeds(ref); ok {
		for t, s := range ts {
			if t != ref && e.tab.HasData(t) {
				speeds[t] = profile.RelativeSpeed{Reference: ref, Speed: s}
			}
		}
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("estimates: nothing learned yet: no key holds enough evidence to export")
	}
	p, err := profile.Build(source, entries, speeds)
	if err != nil {
		return nil, fmt.Errorf("estimates: export: %w", err)
	}
	return p, nil
}

func sortedKeys[V any](m map[estKey]V) []estKey {
	out := make([]estKey, 0, len(m))
	for k := range m {
		out = append(out, k)
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

// Explore decides which keys to explore for jobs, each with its remaining
// steps and the types it may run on: a key whose estimate is not firm is
// explored when, for some job, the expected time saved if the type is
// faster than its best firm type outweighs two restarts and the progress
// lost in a trial of trial seconds if slower (the estimate's error taken
// as log-normal with its sigma; a type with no estimate as the best firm
// type's rate with sigma 1).
func (e *Estimates) Explore(jobs []ExploreJob, trial float64) {
	if !e.learn.On || e.learn.NoExplore {
		e.setExplore(map[estKey]float64{})
		return
	}
	want := map[estKey]float64{}
	for _, j := range jobs {
		if !(j.Remaining > 0) {
			continue
		}
		type cand struct {
			t         planner.GPUType
			mu, sigma float64
		}
		r0 := 0.0
		var cands []cand
		for _, t := range j.Types {
			k := e.keyOf(j.Model, j.SF, t)
			ke, err := e.Estimate(j.Model, j.SF, t)
			if err != nil {
				continue
			}
			if ke.firm() {
				r0 = max(r0, ke.Value)
				continue
			}
			if ke.Source == estimate.Prior.String() {
				continue // nothing of the model: it runs first where it looks best
			}
			base := e.tableEstimate(k)
			mu, sigma := base.value, base.sigma
			if base.source == estimate.NoData {
				mu, sigma = -1, unknownSigma
			}
			cands = append(cands, cand{t, mu, sigma})
		}
		if !(r0 > 0) {
			continue
		}
		left := j.Remaining / r0
		for _, c := range cands {
			mu := c.mu
			if mu < 0 {
				mu = r0
			}
			if worthExploring(left, r0, mu, c.sigma, e.learn.RestartCost, trial) {
				k := e.keyOf(j.Model, j.SF, c.t)
				want[k] = max(want[k], mu*math.Exp(c.sigma), ExploreLead*r0)
				want[k] = min(want[k], MaxFactor*r0)
			}
		}
	}
	e.setExplore(want)
}

// ExploreJob is what Explore needs of one job.
type ExploreJob struct {
	Model     string
	SF        int
	Remaining float64
	Types     []planner.GPUType
}

// gaussHermite are nodes and weights of a 12-point rule for the standard
// normal (weights sum to 1).
var gaussHermite = func() (nodes, weights []float64) {
	x := []float64{0.3142403762544, 0.9477883912402, 1.5976826351526, 2.2795070805011, 3.0206370251209, 3.8897248978698}
	w := []float64{0.5701352362625, 0.2604923102642, 0.0516079856158, 0.0039053905846, 0.0000857368704, 0.0000002658552}
	for i := range x {
		nodes = append(nodes, -x[i], x[i])
		weights = append(weights, w[i]/math.Sqrt(math.Pi), w[i]/math.Sqrt(math.Pi))
	}
	return nodes, weights
}

var ghNodes, ghWeights = gaussHermite()

// worthExploring: left seconds of work at r0; a type whose speed is
// log-normal around mu with sigma.
func worthExploring(left, r0, mu, sigma, restart, trial float64) bool {
	gain, loss := 0.0, 0.0
	for i, z := range ghNodes {
		tp := mu * math.Exp(math.Sqrt2*sigma*z)
		w := ghWeights[i]
		gain += w * max(0, 1-r0/tp)
		loss += w * max(0, 1-tp/r0)
	}
	return left*gain > 2*restart+trial*loss
}
