package placement

import (
	"fmt"
	"math"
	"time"

	"github.com/hadar-sched/hadar/netmodel"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/speed"
)

// Network prices units with netmodel. It implements speed.Network (the
// simulator's slowdown of a spread unit) and sim.CommNetwork (the share of
// a step spent communicating). It is read-only after NewNetwork, so the
// simulations of several policies may share one.
type Network struct {
	tp   *netmodel.Topology
	jobs map[jobKey]*jobNet
}

type jobKey struct {
	model string
	gpus  int
}

type jobNet struct {
	comm netmodel.JobComm
	// ref is the measured consolidated seconds per iteration per type
	// (workers / Gavel's consolidated steps/s): the profile's throughput
	// the slowdown divides.
	ref map[planner.GPUType]float64
}

// NewNetwork builds the network model for jobs on topology tp: one
// calibrated netmodel.JobComm per (model, worker count) a unit of these
// jobs can have (1 up to the scale factor, for HadarE's smaller copies)
// whose consolidated throughput prof knows, on each of types.
func NewNetwork(tp *netmodel.Topology, rep *netmodel.CalibrationReport, prof speed.Profile, jobs []planner.Job, types []planner.GPUType) (*Network, error) {
	n := EmptyNetwork(tp)
	for _, jb := range jobs {
		for k := 1; k <= jb.ScaleFactor; k++ {
			if n.Calibrated(jb.Model, k) {
				continue
			}
			if err := n.Calibrate(rep, prof, jb.Model, jb.Model, k, types); err != nil {
				return nil, fmt.Errorf("network model for job %s (%s on %d GPUs): %w", jb.ID, jb.Model, k, err)
			}
		}
	}
	return n, nil
}

// Calibrated reports whether units of k workers of model are priced.
func (n *Network) Calibrated(model string, k int) bool {
	_, ok := n.jobs[jobKey{model, k}]
	return ok
}

// Calibrate prices units of k workers of model from now on: netmodel's
// calibration of family (the model's Gavel family: model itself, or the
// model a job that declares its own figures names) with model's
// consolidated throughputs on types. A model no type of which prof knows
// is left unpriced (nil error: no slowdown there).
func (n *Network) Calibrate(rep *netmodel.CalibrationReport, prof speed.Profile, model, family string, k int, types []planner.GPUType) error {
	cons := map[string]float64{}
	ref := map[planner.GPUType]float64{}
	for _, t := range types {
		thr, err := prof.Throughput(model, k, t, false)
		if err != nil || !(thr > 0) {
			continue // the profile lacks this size or type: no slowdown there
		}
		cons[string(t)] = thr
		ref[t] = float64(k) / thr
	}
	if len(cons) == 0 {
		return nil
	}
	jc, err := rep.Job(family, k, cons)
	if err != nil {
		return err
	}
	n.jobs[jobKey{model, k}] = &jobNet{comm: jc, ref: ref}
	return nil
}

// EmptyNetwork is a network on tp that prices nothing until Calibrate.
func EmptyNetwork(tp *netmodel.Topology) *Network {
	return &Network{tp: tp, jobs: map[jobKey]*jobNet{}}
}

// Topology returns the topology the network prices on.
func (n *Network) Topology() *netmodel.Topology { return n.tp }

// price is netmodel's price of unit u for job at simulated time now and
// the measured consolidated iteration time it compares against; ok is
// false when the model cannot price it (then the profile alone applies).
func (n *Network) price(job planner.Job, u planner.Unit, now float64) (netmodel.Price, float64, bool) {
	jn := n.jobs[jobKey{job.Model, u.GPUs()}]
	if jn == nil {
		return netmodel.Price{}, 0, false
	}
	var buf [64]netmodel.Worker
	p := netmodel.Placement(buf[:0])
	ref := 0.0
	for i, s := range u.Slots {
		r, ok := jn.ref[s.Type]
		if !ok {
			return netmodel.Price{}, 0, false
		}
		ref = math.Max(ref, r)
		// GPU indices only need to be distinct per node: count the GPUs of
		// earlier slots on the same node.
		base := 0
		for _, o := range u.Slots[:i] {
			if o.Node == s.Node {
				base += o.Count
			}
		}
		for g := range s.Count {
			p = append(p, netmodel.Worker{Node: s.Node, GPU: base + g})
		}
	}
	pr, err := n.tp.Price(&jn.comm, p, time.Duration(now*float64(time.Second)))
	if err != nil {
		return netmodel.Price{}, 0, false
	}
	return pr, ref, true
}

// Slowdown implements speed.Network: the unit's predicted seconds per
// iteration over the measured consolidated ones, at least 1.
func (n *Network) Slowdown(job planner.Job, u planner.Unit, now float64) float64 {
	pr, ref, ok := n.price(job, u, now)
	if !ok {
		return 1
	}
	return math.Max(1, pr.Iteration/ref)
}

// CommFraction implements sim.CommNetwork: the share of the unit's step
// time that is communication not overlapped with compute.
func (n *Network) CommFraction(job planner.Job, u planner.Unit, now float64) float64 {
	pr, ref, ok := n.price(job, u, now)
	if !ok {
		return 0
	}
	step := math.Max(pr.Iteration, ref)
	return math.Max(0, pr.Iteration-pr.Compute) / step
}

// ApplyTopology returns the cluster with each node's rack taken from the
// topology, after checking that every node of the cluster is there with
// the same GPU type and count.
func ApplyTopology(c planner.Cluster, tp *netmodel.Topology, file string) (planner.Cluster, error) {
	byID := map[string]netmodel.NodeSummary{}
	for _, ns := range tp.Nodes() {
		byID[ns.ID] = ns
	}
	out := planner.Cluster{Nodes: make([]planner.Node, len(c.Nodes))}
	for i, nd := range c.Nodes {
		ns, ok := byID[nd.ID]
		if !ok {
			return planner.Cluster{}, fmt.Errorf("topology %s lacks node %q of the cluster: add it to nodes (with its rack, gpu_type and gpus) or change --cluster/--gpus-per-node", file, nd.ID)
		}
		for t, k := range nd.GPUs {
			if k > 0 && (string(t) != ns.GPUType || k != ns.GPUs) {
				return planner.Cluster{}, fmt.Errorf("topology %s: node %q has %d %s GPUs, but the cluster gives it %d %s: make them agree", file, nd.ID, ns.GPUs, ns.GPUType, k, t)
			}
		}
		nd.Rack = ns.Rack
		out.Nodes[i] = nd
	}
	return out, nil
}

// Sensitivity is netmodel's SpineSlowdown of job on type t (one GPU per
// node over as many racks as hold the type, uncongested); ok is false
// when the model has no profile for the job.
func (n *Network) Sensitivity(job planner.Job, t planner.GPUType) (float64, bool) {
	jn := n.jobs[jobKey{job.Model, job.ScaleFactor}]
	if jn == nil {
		return 0, false
	}
	s, err := n.tp.Sensitivity(&jn.comm, string(t), job.ScaleFactor)
	if err != nil {
		return 0, false
	}
	return s.SpineSlowdown, true
}
