package demo

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
)

// SidecarSettings are the sidecar's settings the demo runs with; the
// simulator's prediction of the hadar run uses the same.
type SidecarSettings struct {
	Policy, Placement                  string
	Round, MinRunTime                  time.Duration
	RestartCost, MergeCost             time.Duration
	GangTimeout, StopTimeout, HTTPAddr string
}

// DefaultSettings: rounds of 20 s, so a few minutes of jobs see several
// rounds; restarts and merges cost what they cost here (a new allocation
// starts in about 5 s, a merge of the small model takes well under 2 s).
var DefaultSettings = SidecarSettings{
	Policy: "hadare", Placement: "delay", Round: 20 * time.Second, MinRunTime: 15 * time.Second,
	RestartCost: 5 * time.Second, MergeCost: 2 * time.Second, GangTimeout: "60s", StopTimeout: "30s",
}

// truthFigures is what a job of the workload really does: its emulated
// paces per type at its width, and over several nodes.
type truthFigures struct {
	paces, spread map[planner.GPUType]float64
	workers       int
}

// truthProfile is a speed.Profile of what the emulation makes the demo's
// jobs do, by the model key plannerJobs gives them ("job:<id>").
type truthProfile map[string]truthFigures

func (p truthProfile) Throughput(model string, sf int, t planner.GPUType, spread bool) (float64, error) {
	f, ok := p[model]
	if !ok {
		return 0, fmt.Errorf("no job of model %q in the workload", model)
	}
	v := f.paces[t]
	if spread && f.spread[t] > 0 {
		v = f.spread[t]
	}
	// At the job's width; a narrower HadarE copy scales down.
	return v * float64(sf) / float64(f.workers), nil
}

// plannerJobs turns the workload into planner jobs, each of its own model
// key "job:<id>" (arrival = submit offset), and what each really does.
// A managed job is converted as the sidecar converts it (jobspec.Spec.Job).
func plannerJobs(jobs []JobInfo, managedOnly bool) ([]planner.Job, truthProfile) {
	truth := truthProfile{}
	var out []planner.Job
	for _, ji := range jobs {
		if managedOnly && !ji.Managed {
			continue
		}
		pj := planner.Job{ID: ji.ID, ScaleFactor: ji.GPUs, TotalSteps: ji.Steps, Weight: 1, MaxCopies: 1}
		if ji.Managed {
			pj = ji.Spec.Job(ji.ID, 0)
			pj.TotalSteps = ji.Steps
		}
		pj.Model, pj.Arrival = "job:"+ji.ID, ji.At.Seconds()
		f := truthFigures{paces: ji.Paces, spread: ji.Spread, workers: ji.GPUs}
		if !ji.Managed && ji.Pinned != "" {
			f.paces = map[planner.GPUType]float64{ji.Pinned: ji.Paces[ji.Pinned]}
		}
		truth[pj.Model] = f
		out = append(out, pj)
	}
	return out, truth
}

// beliefOf is what the sidecar believes of the workload's managed jobs on
// cluster (planner/belief, as sidecar/agent builds it): their declared
// figures or hadar.model's profile, their sensitivities, the racks.
func beliefOf(cluster planner.Cluster, jobs []JobInfo) (speed.Model, error) {
	bel := belief.NewProfile(profile.Default())
	net, err := belief.NewNetwork(bel, nil)
	if err != nil {
		return speed.Model{}, err
	}
	for _, n := range cluster.Nodes {
		net.SetNode(belief.Node{ID: n.ID, Rack: n.Rack, GPUs: n.GPUs})
	}
	for _, ji := range jobs {
		if !ji.Managed {
			continue
		}
		d, ok := ji.Spec.Declared()
		if !ok {
			d = belief.Declared{Model: ji.Spec.Model, Workers: ji.Spec.Workers, Sensitivity: ji.Spec.Sensitivity}
		}
		bel.Declare("job:"+ji.ID, d)
		net.SetSensitivity(ji.ID, ji.Spec.Sensitivity)
	}
	return speed.Model{Profile: bel, Network: net}, nil
}

// Prediction is the simulator's completion time of each job, in seconds
// after the run's start.
type Prediction struct {
	Policy string
	JCT    map[string]float64
	// Finish is each job's completion, seconds after the first submit.
	Finish   map[string]float64
	Makespan float64
	// Preemptions and Forks count the placements the scheduler took away
	// from a running job (or some of its copies) and the copies it added.
	Preemptions, Forks int
}

// PredictHadar simulates the workload under the sidecar's policy with the
// sidecar's settings on the planner engine (planner/sim: the engine the
// sidecar runs), faster than real time. Jobs without hadar meta are not
// the planner's: each runs at once on the type it pins, and the cluster
// the planner sees lacks that GPU for the whole run.
func PredictHadar(ctx context.Context, nodes []NodeSpec, jobs []JobInfo, s SidecarSettings) (Prediction, error) {
	cluster := PlannerCluster(nodes)
	pred := Prediction{Policy: s.Policy + " (" + s.Placement + ")", JCT: map[string]float64{}, Finish: map[string]float64{}}
	for _, ji := range jobs {
		if ji.Managed {
			continue
		}
		t := ji.Pinned
		if !holdOne(&cluster, t) {
			return pred, fmt.Errorf("job %s: no %s GPU in the cluster to run on", ji.ID, t)
		}
		d := ji.Steps / ji.Paces[t]
		pred.JCT[ji.ID], pred.Finish[ji.ID] = d, ji.At.Seconds()+d
	}
	pjobs, truthProf := plannerJobs(jobs, true)
	truth := speed.Model{Profile: truthProf}
	plan, err := beliefOf(cluster, jobs)
	if err != nil {
		return pred, err
	}
	// The scheduler as sidecar/agent builds it (the demo runs no queues).
	o, pc := registry.Live(plan, s.MinRunTime.Seconds(), s.RestartCost.Seconds(), s.MergeCost.Seconds())
	sched, _, err := registry.Scheduler(s.Policy, s.Placement, nil, o, pc)
	if err != nil {
		return pred, err
	}
	rec := &recorder{Scheduler: sched, prev: map[string]int{}}
	res, err := sim.Run(ctx, sim.Config{Cluster: cluster, Jobs: pjobs, Speed: truth, Plan: plan,
		Round: s.Round.Seconds(), RestartCost: s.RestartCost.Seconds(), MergeCost: s.MergeCost.Seconds(), MinRunTime: s.MinRunTime.Seconds()}, rec)
	if err != nil {
		return pred, fmt.Errorf("simulating %s: %w", s.Policy, err)
	}
	collect(&pred, res)
	pred.Preemptions, pred.Forks = rec.preempted, rec.forked
	return pred, nil
}

// recorder counts, from the placements a scheduler returns, how often a
// running job loses units (preempted whole, or copies stopped) and gains
// copies. The engine applies exactly what the scheduler returns (or
// fails the run), so the counts are the simulated run's.
type recorder struct {
	round.Scheduler
	prev              map[string]int // job -> units held
	preempted, forked int
}

func (r *recorder) Schedule(v *round.View) ([]planner.Placement, error) {
	out, err := r.Scheduler.Schedule(v)
	if err != nil {
		return out, err
	}
	for i, j := range v.Jobs {
		had, now := r.prev[j.ID], len(out[i].Units)
		if v.MidRound && j.Running {
			now = had // running jobs keep theirs mid-round
		}
		switch {
		case now < had:
			r.preempted++
		case now > had && had > 0:
			r.forked++
		case now > 1 && had == 0:
			r.forked++
		}
		r.prev[j.ID] = now
	}
	return out, nil
}

// PredictNomad simulates the workload under a model of Nomad's own
// placement (NomadModel: first fit in arrival order, blind to GPU types,
// never preempting) on the same engine and the same truth.
func PredictNomad(ctx context.Context, nodes []NodeSpec, jobs []JobInfo, round time.Duration) (Prediction, error) {
	cluster := PlannerCluster(nodes)
	pred := Prediction{Policy: "nomad-fifo (model)", JCT: map[string]float64{}, Finish: map[string]float64{}}
	pjobs, truthProf := plannerJobs(jobs, false)
	truth := speed.Model{Profile: truthProf}
	res, err := sim.Run(ctx, sim.Config{Cluster: cluster, Jobs: pjobs, Speed: truth, Round: round.Seconds()}, NomadModel{})
	if err != nil {
		return pred, fmt.Errorf("simulating Nomad's placement: %w", err)
	}
	collect(&pred, res)
	return pred, nil
}

func collect(p *Prediction, res sim.Result) {
	for _, j := range res.Jobs {
		p.JCT[j.ID], p.Finish[j.ID] = j.JCT, j.Finish
	}
	for _, f := range p.Finish {
		p.Makespan = math.Max(p.Makespan, f)
	}
}

// holdOne takes one GPU of type t off the cluster: the one a job the
// planner does not manage holds (the last node with one, as Nomad's
// bin packing fills nodes in no particular order).
func holdOne(c *planner.Cluster, t planner.GPUType) bool {
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		if c.Nodes[i].GPUs[t] > 0 {
			g := map[planner.GPUType]int{}
			for k, v := range c.Nodes[i].GPUs {
				g[k] = v
			}
			g[t]--
			c.Nodes[i].GPUs = g
			return true
		}
	}
	return false
}

// NomadModel is a round.Scheduler modelling Nomad's own placement of the
// same jobs without the gate: jobs in arrival order, each worker on the
// first node (in cluster order) with a free GPU of any type the job can
// run on, blind to how fast; a job starts once all its workers fit (a
// worker Nomad starts before its peers only waits at the rendezvous), and
// a started job keeps its GPUs to the end (Nomad does not preempt batch
// jobs by default). Later jobs may start before an earlier one that does
// not fit.
type NomadModel struct{}

// Name implements round.Scheduler.
func (NomadModel) Name() string { return "nomad-fifo" }

// Schedule implements round.Scheduler.
func (NomadModel) Schedule(v *round.View) ([]planner.Placement, error) {
	out := make([]planner.Placement, len(v.Jobs))
	pool := v.Pool
	// At a round boundary the pool holds every GPU: running jobs take
	// theirs back first.
	for i, j := range v.Jobs {
		if len(j.Placement.Units) == 0 {
			continue
		}
		if !v.MidRound {
			for _, u := range j.Placement.Units {
				if !pool.Fits(u) {
					return nil, fmt.Errorf("nomad model: job %s's GPUs are gone", j.ID)
				}
				pool.Take(u)
			}
		}
		out[i] = j.Placement
	}
	typeIndex := map[planner.GPUType]int{}
	for k, t := range v.Types {
		typeIndex[t] = k
	}
	for i, j := range v.Jobs {
		if len(j.Placement.Units) > 0 {
			continue
		}
		trial := pool.Clone()
		var u planner.Unit
		for range j.ScaleFactor {
			placed := false
			for _, n := range trial.Nodes() {
				for _, t := range v.Types {
					if trial.Free(n, t) == 0 || j.Throughput[typeIndex[t]] <= 0 {
						continue
					}
					one := planner.Unit{Slots: []planner.Slot{{Node: n, Type: t, Count: 1}}}
					trial.Take(one)
					u = addSlot(u, n, t)
					placed = true
					break
				}
				if placed {
					break
				}
			}
			if !placed {
				u = planner.Unit{}
				break
			}
		}
		if u.GPUs() == j.ScaleFactor {
			pool.Take(u)
			out[i] = planner.Placement{Units: []planner.Unit{u}}
			v.Explain(i, round.Reason{Why: "first fit, blind to GPU types (a model of Nomad's own placement)"})
		}
	}
	return out, nil
}

func addSlot(u planner.Unit, node string, t planner.GPUType) planner.Unit {
	for k, s := range u.Slots {
		if s.Node == node && s.Type == t {
			u.Slots[k].Count++
			return u
		}
	}
	u.Slots = append(u.Slots, planner.Slot{Node: node, Type: t, Count: 1})
	return u
}
