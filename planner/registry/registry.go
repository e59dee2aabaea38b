// Package registry maps scheduler names (as given to `hadar sim
// --policies` and the sidecar's config) to round.Schedulers.
package registry

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/hadar"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/policy"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sia"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Options shared by every scheduler built here.
type Options struct {
	// Types is the cluster's GPU types in the order the round.View uses.
	Types []planner.GPUType
	// PricePerHour of one GPU of each type, for cost-aware policies; nil
	// means the defaults of DefaultPrices where known.
	PricePerHour map[planner.GPUType]float64
	// GavelFidelity reproduces Gavel's simulator: allocation recomputed at
	// most every ResetInterval seconds and no work-conserving backfill.
	GavelFidelity bool
	// ResetInterval for Gavel fidelity (default 1920 s).
	ResetInterval float64
	// Speed is the placement speed model (Hadar plans with it).
	Speed speed.Model
	// RestartCost and MergeCost (seconds) as the simulator charges them.
	RestartCost, MergeCost float64
	// MinRunTime is the engine's minimum run time (seconds) that Hadar
	// plans with: 0 is the default of the sidecar and hadar sim (30
	// minutes), negative none. Gavel's fidelity has none.
	MinRunTime float64
	// HadarUtility is "makespan" (default) or "jct".
	HadarUtility string
	// Placer is the placement policy (planner/placement); nil keeps each
	// scheduler's own placement. It is stateful: one per scheduler built.
	Placer placement.Placer
}

// DefaultPrices returns the on-demand GCP prices per GPU-hour Gavel used.
func DefaultPrices() map[planner.GPUType]float64 {
	return map[planner.GPUType]float64{"v100": 0.74, "p100": 0.43, "k80": 0.135}
}

type constructor func(o Options, ablations []string) (round.Scheduler, error)

// HadarAblations are the switches a Hadar or HadarE name may carry after a
// colon, e.g. hadar:flat:nobackfill (docs/results.md, the ablation): flat
// prices (U = L), no backfill, no fluid guide, prices per node, eager
// (preemptions and moves without the test of gain against restart),
// pricedplace (a guided job's GPUs by value minus price, not the fastest),
// noprogram (rounds with elastic jobs planned by the primal-dual, not the
// configuration program), nodrain (a backlog planned by the
// primal-dual, not Sia's program), hN (a horizon fixed at N rounds) and critX (the makespan utility's
// Critical share, 0 < X <= 1).
var HadarAblations = []string{"flat", "nobackfill", "noguide", "nodeprices", "eager", "pricedplace", "noprogram", "nodrain", "hN", "critX"}

// extra lists the schedulers beside Gavel's policies: hadar and hadare
// with the utility of Options.HadarUtility, and the -jct variants with the
// average-JCT utility, so both can run in one comparison.
func extra() map[string]constructor {
	build := func(fork bool, utility string) constructor {
		return func(o Options, ablations []string) (round.Scheduler, error) {
			u := utility
			if u == "" {
				u = o.HadarUtility
			}
			cfg := hadar.Config{
				Speed: o.Speed, Utility: hadar.Utility(u), RestartCost: o.RestartCost,
				Fork: fork, MergeCost: o.MergeCost, Filter: filter(o.Placer), MinRunTime: o.MinRunTime,
			}
			if o.GavelFidelity {
				cfg.MinRunTime = -1
			}
			if err := hadarSwitches(&cfg, ablations); err != nil {
				return nil, err
			}
			return hadar.New(cfg)
		}
	}
	return map[string]constructor{
		"hadar": build(false, ""), "hadare": build(true, ""),
		"hadar-jct": build(false, string(hadar.AvgJCT)), "hadare-jct": build(true, string(hadar.AvgJCT)),
		"sia": buildSia,
	}
}

// hadarSwitches applies a Hadar or HadarE name's switches to cfg.
func hadarSwitches(cfg *hadar.Config, ablations []string) error {
	for _, a := range ablations {
		switch a {
		case "flat":
			cfg.FlatPrices = true
		case "nobackfill":
			cfg.NoBackfill = true
		case "noguide":
			cfg.NoFluidGuide = true
		case "nodeprices":
			cfg.NodePrices = true
		case "eager":
			cfg.Eager = true
		case "pricedplace":
			cfg.PricedPlacement = true
		case "noprogram":
			cfg.NoProgram = true
		case "nodrain":
			cfg.NoDrain = true
		default:
			if n, err := strconv.Atoi(strings.TrimPrefix(a, "h")); err == nil && strings.HasPrefix(a, "h") && n > 0 {
				cfg.Horizon = n
				continue
			}
			if x, err := strconv.ParseFloat(strings.TrimPrefix(a, "crit"), 64); err == nil && strings.HasPrefix(a, "crit") && x > 0 && x <= 1 {
				cfg.Critical = x
				continue
			}
			return fmt.Errorf("unknown Hadar switch %q: want any of %s, e.g. hadar:flat:nobackfill", a, strings.Join(HadarAblations, ", "))
		}
	}
	return nil
}

// buildSia is Sia (SOSP'23, planner/sia): the restart cost the simulator
// charges is the paper's R, backfill as the other policies outside
// Gavel's fidelity, placement by o.Placer. Elastic jobs (planner.Job.Widths)
// run at any of their widths; the switch rigid keeps every job at its
// scale factor (Sia's rigid mode). A switch pX sets the fairness exponent,
// e.g. sia:p1 (sum of normalized goodputs) or sia:rigid:p-1.
func buildSia(o Options, switches []string) (round.Scheduler, error) {
	cfg := sia.Config{RestartCost: o.RestartCost, Backfill: !o.GavelFidelity}
	if o.Placer != nil {
		cfg.Placer = o.Placer
	}
	if err := siaSwitches(&cfg, switches); err != nil {
		return nil, err
	}
	s, err := sia.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("policy sia: %w", err)
	}
	return s, nil
}

// siaSwitches applies a Sia name's switches to cfg.
func siaSwitches(cfg *sia.Config, switches []string) error {
	for _, a := range switches {
		switch a {
		case "rigid":
			cfg.Rigid = true
			continue
		case "free":
			cfg.FreeGrowth = true
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimPrefix(a, "p"), 64)
		if !strings.HasPrefix(a, "p") || err != nil || x == 0 {
			return fmt.Errorf("unknown Sia switch %q: want rigid, free (no growth limit), or pX, the fairness exponent (not 0), e.g. sia:p-0.5", a)
		}
		cfg.P = x
	}
	return nil
}

// filter keeps a nil placer a nil interface for Hadar.
func filter(p placement.Placer) hadar.Filter {
	if p == nil {
		return nil
	}
	return p
}

// Names lists every scheduler name.
func Names() []string {
	names := policy.Names()
	for n := range extra() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Check tells whether New knows name, its switches included (sia:rigid,
// hadar:h8), without the profile and cluster a build needs: what a
// configuration is checked with before anything runs.
func Check(name string) error {
	name = strings.ToLower(strings.TrimSpace(name))
	base, switches, _ := strings.Cut(name, ":")
	var list []string
	if switches != "" {
		list = strings.Split(switches, ":")
	}
	switch base {
	case "hadar", "hadare", "hadar-jct", "hadare-jct":
		return hadarSwitches(&hadar.Config{}, list)
	case "sia":
		return siaSwitches(&sia.Config{}, list)
	}
	if _, err := policy.New(name); err != nil {
		return fmt.Errorf("unknown policy %q: want one of %s", name, strings.Join(Names(), ", "))
	}
	return nil
}

// New builds the scheduler of the given name.
func New(name string, o Options) (round.Scheduler, error) {
	name = strings.ToLower(strings.TrimSpace(name))
	base, switches, _ := strings.Cut(name, ":")
	if c, ok := extra()[base]; ok {
		var ablations []string
		if switches != "" {
			ablations = strings.Split(switches, ":")
		}
		return c(o, ablations)
	}
	p, err := policy.New(name)
	if err != nil {
		return nil, fmt.Errorf("unknown policy %q: want one of %s", name, strings.Join(Names(), ", "))
	}
	s := &round.PolicyScheduler{Policy: p, Backfill: !o.GavelFidelity}
	if o.Placer != nil {
		s.Placer = o.Placer
	}
	if o.GavelFidelity {
		s.Gavel = true
		s.ResetInterval = o.ResetInterval
		if s.ResetInterval <= 0 {
			s.ResetInterval = 1920
		}
	}
	if name == "gavel-cost" {
		prices, err := Prices(o)
		if err != nil {
			return nil, err
		}
		s.PricePerHour = prices
	}
	return s, nil
}

// Build is the one way a scheduler is made from settings: the policy, and
// the placement policy by name with its configuration (pc.Speed defaults
// to o.Speed). "pack" means no placer: each policy keeps its own
// placement (lease extension, then packing), exactly as without one. The
// placer is returned too, for its reports (nil with pack).
func Build(policy, placementName string, o Options, pc placement.Config) (round.Scheduler, placement.Placer, error) {
	if o.MinRunTime == 0 && pc.MinRunTime > 0 {
		// The engine's minimum run time, as the callers (the sidecar, the
		// demo's prediction) give it to the placer: Hadar plans every
		// start as held that long, so a default that differs from the
		// engine's misplans every start.
		o.MinRunTime = pc.MinRunTime
	}
	var pl placement.Placer
	if placementName != placement.Pack {
		if pc.Speed.Profile == nil {
			pc.Speed = o.Speed
		}
		var err error
		if pl, err = placement.New(placementName, pc); err != nil {
			return nil, nil, err
		}
		o.Placer = pl
	}
	sched, err := New(policy, o)
	if err != nil {
		return nil, nil, err
	}
	return sched, pl, nil
}

// Prices orders o.PricePerHour (or the defaults) by o.Types.
func Prices(o Options) ([]float64, error) {
	src := o.PricePerHour
	if src == nil {
		src = DefaultPrices()
	}
	out := make([]float64, len(o.Types))
	for j, t := range o.Types {
		p, ok := src[t]
		if !ok || !(p > 0) {
			return nil, fmt.Errorf("no price per GPU-hour for GPU type %q: give one with --prices %s=DOLLARS", t, t)
		}
		out[j] = p
	}
	return out, nil
}
