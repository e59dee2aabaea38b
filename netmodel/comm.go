package netmodel

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// JobComm is one data-parallel job's communication and compute profile.
type JobComm struct {
	// Name is for error messages only.
	Name string
	// Bytes is what each iteration all-reduces: the gradient size, i.e.
	// parameter count times bytes per parameter (4 for fp32).
	Bytes float64
	// Compute is one iteration's compute time in seconds on each GPU type,
	// without communication. Types missing here cannot run the job.
	Compute map[string]float64
	// Overlap is the fraction of compute time during which communication
	// can proceed (gradients of late layers are reduced while early layers
	// still run backward); in [0, 1). Zero means no overlap.
	Overlap float64
}

// Validate reports the first field that makes the job unusable.
func (j *JobComm) Validate() error {
	if math.IsNaN(j.Bytes) || math.IsInf(j.Bytes, 0) || j.Bytes < 0 {
		return fmt.Errorf("job %q: bytes: want zero or a positive byte count, got %g", j.Name, j.Bytes)
	}
	if math.IsNaN(j.Overlap) || j.Overlap < 0 || j.Overlap >= 1 {
		return fmt.Errorf("job %q: overlap: want a fraction in [0, 1), got %g", j.Name, j.Overlap)
	}
	if len(j.Compute) == 0 {
		return fmt.Errorf("job %q: compute: want a time per iteration for at least one GPU type", j.Name)
	}
	types := make([]string, 0, len(j.Compute))
	for t := range j.Compute {
		types = append(types, t)
	}
	sort.Strings(types) // the first bad type reported is deterministic
	for _, t := range types {
		if c := j.Compute[t]; math.IsNaN(c) || math.IsInf(c, 0) || c <= 0 {
			return fmt.Errorf("job %q: compute[%q]: want a positive number of seconds, got %g", j.Name, t, c)
		}
	}
	return nil
}

// Worker is one GPU of a placement: a node ID and the GPU's index on it.
type Worker struct {
	Node string
	GPU  int
}

// Placement lists a job's workers, one per GPU.
type Placement []Worker

// Locality is how far apart a placement's workers are.
type Locality int

const (
	// SameNode: every worker on one node.
	SameNode Locality = iota
	// SameRack: several nodes behind one top-of-rack switch.
	SameRack
	// CrossRack: traffic crosses the spine.
	CrossRack
)

func (l Locality) String() string {
	switch l {
	case SameNode:
		return "same-node"
	case SameRack:
		return "same-rack"
	case CrossRack:
		return "cross-rack"
	}
	return fmt.Sprintf("Locality(%d)", int(l))
}

// Price is everything the model says about one placement at one instant.
// Times are seconds per iteration.
type Price struct {
	Locality Locality
	// Compute is the slowest worker's compute time: synchronous training
	// waits for it.
	Compute float64
	// Comm is the ring all-reduce time on this placement.
	Comm float64
	// Iteration = Compute + max(0, Comm - Overlap*Compute).
	Iteration float64
	// Reference is Iteration on the best consolidated placement of the same
	// GPU types with no background congestion.
	Reference float64
	// Slowdown = Iteration / Reference, at least 1.
	Slowdown float64
	// Throughput is the job's aggregate steps/s (workers / Iteration), the
	// unit of Gavel's throughput tables.
	Throughput float64
}

// resolved is a worker after node lookup; sorting by (rack, node, gpu)
// gives the ring order that crosses each node and rack uplink once per
// direction, which is how NCCL builds rings from a host list.
type resolved struct {
	rack, node, gpu int
}

// Price prices placement p for job at time t (which selects the background
// congestion in force), with no other job's traffic on the links.
func (tp *Topology) Price(job *JobComm, p Placement, t time.Duration) (Price, error) {
	return tp.PriceUnder(job, p, t, nil)
}

// PriceUnder is Price with the flows of other running jobs (load, which
// must not include this job) sharing the links; nil means none. It is the
// one entry point the other pricing methods wrap.
func (tp *Topology) PriceUnder(job *JobComm, p Placement, t time.Duration, load *LinkLoad) (Price, error) {
	if math.IsNaN(job.Overlap) || job.Overlap < 0 || job.Overlap >= 1 {
		return Price{}, fmt.Errorf("job %q: overlap: want a fraction in [0, 1), got %g", job.Name, job.Overlap)
	}
	if math.IsNaN(job.Bytes) || job.Bytes < 0 {
		return Price{}, fmt.Errorf("job %q: bytes: want zero or a positive byte count, got %g", job.Name, job.Bytes)
	}
	if load != nil && !load.fits(tp) {
		return Price{}, errors.New("link load: made for another topology; use the one NewLinkLoad returned for this topology")
	}
	// Candidate placements are small; a stack buffer keeps pricing them
	// free of allocations.
	var buf [32]resolved
	ws, nodes, racks, err := tp.resolve(p, buf[:0])
	if err != nil {
		return Price{}, err
	}

	var pr Price
	var ref typeRef
	lastType := ""
	for _, w := range ws {
		gt := tp.nodes[w.node].gpuType
		if gt == lastType {
			continue
		}
		lastType = gt
		c, ok := job.Compute[gt]
		if !ok || c <= 0 || math.IsNaN(c) {
			return Price{}, fmt.Errorf("job %q: compute[%q]: no positive compute time, so it cannot run on node %q; add one or place it elsewhere", job.Name, gt, tp.nodes[w.node].id)
		}
		pr.Compute = max(pr.Compute, c)
		ref = ref.merge(tp.refs[gt])
	}
	switch {
	case racks > 1:
		pr.Locality = CrossRack
	case nodes > 1:
		pr.Locality = SameRack
	default:
		pr.Locality = SameNode
	}

	n := len(ws)
	if n > 1 {
		bw, lat := tp.ringBottleneck(ws, racks, tp.stateAt(t), load)
		pr.Comm = ringTime(n, job.Bytes, bw, lat)
	}
	pr.Iteration = iteration(pr.Compute, pr.Comm, job.Overlap)
	bw, lat := tp.consolidatedLinks(ref, n)
	pr.Reference = iteration(pr.Compute, ringTime(n, job.Bytes, bw, lat), job.Overlap)
	// The reference idealises the best links of these GPU types; a
	// placement on links faster than every consolidated option does not
	// make the job faster than consolidated, so the ratio is floored at 1.
	pr.Slowdown = max(1, pr.Iteration/pr.Reference)
	pr.Throughput = float64(n) / pr.Iteration
	return pr, nil
}

// resolve looks the workers up, sorts them into ring order in buf (grown
// if too small), rejects duplicates, and counts the nodes and racks spanned.
func (tp *Topology) resolve(p Placement, buf []resolved) (ws []resolved, nodes, racks int, err error) {
	if len(p) == 0 {
		return nil, 0, 0, errors.New("placement: want at least one worker")
	}
	ws = buf[:0]
	for i, w := range p {
		ni, ok := tp.byID[w.Node]
		if !ok {
			return nil, 0, 0, fmt.Errorf("placement[%d].node: %q is not in the topology", i, w.Node)
		}
		if w.GPU < 0 || w.GPU >= tp.nodes[ni].gpus {
			return nil, 0, 0, fmt.Errorf("placement[%d].gpu: node %q has GPUs 0..%d, got %d", i, w.Node, tp.nodes[ni].gpus-1, w.GPU)
		}
		ws = append(ws, resolved{rack: tp.nodes[ni].rack, node: ni, gpu: w.GPU})
	}
	slices.SortFunc(ws, func(a, b resolved) int {
		if a.rack != b.rack {
			return a.rack - b.rack
		}
		if a.node != b.node {
			return a.node - b.node
		}
		return a.gpu - b.gpu
	})
	nodes, racks = 1, 1
	for i := 1; i < len(ws); i++ {
		prev, w := ws[i-1], ws[i]
		if prev == w {
			return nil, 0, 0, fmt.Errorf("placement: GPU %d of node %q is listed twice", w.gpu, tp.nodes[w.node].id)
		}
		if prev.node != w.node {
			nodes++
		}
		if prev.rack != w.rack {
			racks++
		}
	}
	return ws, nodes, racks, nil
}

// ringBottleneck walks the ring once and returns the slowest per-flow
// bandwidth and the largest hop latency it meets. Flows on a link share
// what background traffic leaves of it equally.
func (tp *Topology) ringBottleneck(ws []resolved, racks int, st *congestionState, load *LinkLoad) (bw, lat float64) {
	var cSpine, cNode float64
	if st != nil {
		cSpine, cNode = st.spine, st.node
	}
	// Every rack boundary of the ring is one flow through the spine.
	spineFlows := float64(racks)
	if load != nil {
		spineFlows += float64(load.spine)
	}
	spineShare := tp.spineBW * (1 - cSpine) / spineFlows
	// The ring is contiguous per node and rack, so each uplink carries
	// exactly one of this job's flows per direction, plus other jobs'.
	nodeShare := func(i int) float64 {
		s := tp.nodes[i].nicBW * (1 - cNode)
		if load != nil {
			s /= float64(1 + load.node[i])
		}
		return s
	}
	rackShare := func(i int) float64 {
		s := tp.racks[i].uplinkBW
		if st != nil {
			s *= 1 - st.rack[i]
		}
		if load != nil {
			s /= float64(1 + load.rack[i])
		}
		return s
	}
	bw = math.Inf(1)
	for i := range ws {
		a, b := ws[i], ws[(i+1)%len(ws)]
		var hopBW, hopLat float64
		switch {
		case a.node == b.node:
			hopBW, hopLat = tp.nodes[a.node].intraBW, tp.intraLat
		default:
			hopBW = min(nodeShare(a.node), nodeShare(b.node))
			hopLat = 2 * tp.nodeLat
			if a.rack != b.rack {
				hopBW = min(hopBW, rackShare(a.rack), rackShare(b.rack), spineShare)
				hopLat += 2*tp.rackLat + tp.spineLat
			}
		}
		bw = min(bw, hopBW)
		lat = max(lat, hopLat)
	}
	return bw, lat
}

// LinkLoad counts the ring flows of running jobs on each shared link, so
// that jobs placed by the scheduler contend with each other and not only
// with background traffic. Build it with NewLinkLoad, Add each running
// job's placement, and price a candidate with PriceUnder (without adding
// the candidate itself). Not safe for concurrent mutation.
type LinkLoad struct {
	node  []int // flows per direction on each node uplink
	rack  []int // flows per direction on each rack uplink
	spine int   // flows through the spine
}

// NewLinkLoad returns an empty load for tp (and its WithCongestion copies).
func (tp *Topology) NewLinkLoad() *LinkLoad {
	return &LinkLoad{node: make([]int, len(tp.nodes)), rack: make([]int, len(tp.racks))}
}

func (l *LinkLoad) fits(tp *Topology) bool {
	return len(l.node) == len(tp.nodes) && len(l.rack) == len(tp.racks)
}

// Add records the flows of a job running on p.
func (l *LinkLoad) Add(tp *Topology, p Placement) error { return l.apply(tp, p, 1) }

// Remove forgets a placement Add recorded; it fails, changing nothing, if
// the flows are not there.
func (l *LinkLoad) Remove(tp *Topology, p Placement) error { return l.apply(tp, p, -1) }

func (l *LinkLoad) apply(tp *Topology, p Placement, sign int) error {
	if !l.fits(tp) {
		return errors.New("link load: made for another topology; use the one NewLinkLoad returned for this topology")
	}
	var buf [32]resolved
	ws, nodes, racks, err := tp.resolve(p, buf[:0])
	if err != nil {
		return err
	}
	// Two passes: check, then change, so a failed Remove leaves l intact.
	for pass := 0; pass < 2; pass++ {
		for i, w := range ws {
			if nodes > 1 && (i == 0 || ws[i-1].node != w.node) {
				if pass == 0 && l.node[w.node]+sign < 0 {
					return fmt.Errorf("link load: node %q carries no flow to remove; remove only placements that were added", tp.nodes[w.node].id)
				}
				if pass == 1 {
					l.node[w.node] += sign
				}
			}
			if racks > 1 && (i == 0 || ws[i-1].rack != w.rack) {
				if pass == 0 && l.rack[w.rack]+sign < 0 {
					return fmt.Errorf("link load: rack %q carries no flow to remove; remove only placements that were added", tp.racks[w.rack].name)
				}
				if pass == 1 {
					l.rack[w.rack] += sign
				}
			}
		}
		if racks > 1 {
			if pass == 0 && l.spine+sign*racks < 0 {
				return errors.New("link load: the spine carries fewer flows than this placement; remove only placements that were added")
			}
			if pass == 1 {
				l.spine += sign * racks
			}
		}
	}
	return nil
}

// consolidatedLinks is the ring bottleneck and latency of the tightest
// packing of n workers on the best nodes of ref: ceil(n/maxGPUs) nodes in
// one rack, uncongested.
func (tp *Topology) consolidatedLinks(ref typeRef, n int) (bw, lat float64) {
	if n <= 1 {
		return math.Inf(1), 0
	}
	if n <= ref.maxGPUs {
		return ref.intraBW, tp.intraLat
	}
	if ref.maxGPUs == 1 {
		return ref.nicBW, 2 * tp.nodeLat
	}
	return min(ref.intraBW, ref.nicBW), max(tp.intraLat, 2*tp.nodeLat)
}

func (r typeRef) merge(o typeRef) typeRef {
	return typeRef{maxGPUs: max(r.maxGPUs, o.maxGPUs), intraBW: max(r.intraBW, o.intraBW), nicBW: max(r.nicBW, o.nicBW),
		rackBW: max(r.rackBW, o.rackBW), racks: max(r.racks, o.racks)}
}

// ringTime is ring all-reduce: reduce-scatter then all-gather, 2(n-1)
// steps each moving bytes/n over every hop at once, so the slowest hop
// sets the pace.
func ringTime(n int, bytes, bw, lat float64) float64 {
	if n <= 1 {
		return 0
	}
	steps := float64(2 * (n - 1))
	return steps/float64(n)*bytes/bw + steps*lat
}

// iteration overlaps communication with up to overlap*compute seconds of
// the backward pass; what does not fit adds to the iteration.
func iteration(compute, comm, overlap float64) float64 {
	return compute + max(0, comm-overlap*compute)
}

// IterationTime is the seconds per iteration of job on p at time t.
func (tp *Topology) IterationTime(job *JobComm, p Placement, t time.Duration) (float64, error) {
	pr, err := tp.Price(job, p, t)
	return pr.Iteration, err
}

// CommTime is the all-reduce time per iteration of job on p at time t,
// before any overlap with compute.
func (tp *Topology) CommTime(job *JobComm, p Placement, t time.Duration) (float64, error) {
	pr, err := tp.Price(job, p, t)
	return pr.Comm, err
}

// Slowdown is IterationTime on p at t over that on the best consolidated
// placement of the same GPU types, uncongested; 1 means no penalty.
func (tp *Topology) Slowdown(job *JobComm, p Placement, t time.Duration) (float64, error) {
	pr, err := tp.Price(job, p, t)
	return pr.Slowdown, err
}

// Locality classifies p without pricing it.
func (tp *Topology) Locality(p Placement) (Locality, error) {
	if len(p) == 0 {
		return 0, errors.New("placement: want at least one worker")
	}
	loc := SameNode
	first, ok := tp.byID[p[0].Node]
	if !ok {
		return 0, fmt.Errorf("placement[0].node: %q is not in the topology", p[0].Node)
	}
	for i, w := range p[1:] {
		ni, ok := tp.byID[w.Node]
		if !ok {
			return 0, fmt.Errorf("placement[%d].node: %q is not in the topology", i+1, w.Node)
		}
		if tp.nodes[ni].rack != tp.nodes[first].rack {
			return CrossRack, nil
		}
		if ni != first {
			loc = SameRack
		}
	}
	return loc, nil
}

// Sensitivity is how much a job suffers from being spread, uncongested.
type Sensitivity struct {
	// Consolidated, SameRack and CrossRack are seconds per iteration on the
	// tightest packing, on one GPU per node behind one switch, and on one
	// GPU per node spread over as many racks as hold the GPU type (up to
	// the worker count; SameRack if only one rack does).
	Consolidated, SameRack, CrossRack float64
	// RackSlowdown = SameRack/Consolidated; SpineSlowdown = CrossRack/Consolidated.
	RackSlowdown, SpineSlowdown float64
}

// Sensitivity prices job with n workers of gpuType on the type's best links
// at three spreads. Delay-scheduling timers scale with these slowdowns.
func (tp *Topology) Sensitivity(job *JobComm, gpuType string, n int) (Sensitivity, error) {
	if n <= 0 {
		return Sensitivity{}, fmt.Errorf("workers: want a positive count, got %d", n)
	}
	if err := job.Validate(); err != nil {
		return Sensitivity{}, err
	}
	ref, ok := tp.refs[gpuType]
	if !ok {
		return Sensitivity{}, fmt.Errorf("gpu type %q: no node in the topology has it; use one of %v", gpuType, tp.GPUTypes())
	}
	c, ok := job.Compute[gpuType]
	if !ok {
		return Sensitivity{}, fmt.Errorf("job %q: compute[%q]: missing; the job cannot run on this type", job.Name, gpuType)
	}
	bw, lat := tp.consolidatedLinks(ref, n)
	var s Sensitivity
	s.Consolidated = iteration(c, ringTime(n, job.Bytes, bw, lat), job.Overlap)
	s.SameRack = iteration(c, ringTime(n, job.Bytes, ref.nicBW, 2*tp.nodeLat), job.Overlap)
	r := min(n, ref.racks)
	if r < 2 {
		s.CrossRack = s.SameRack
	} else {
		xbw := min(ref.nicBW, ref.rackBW, tp.spineBW/float64(r))
		s.CrossRack = iteration(c, ringTime(n, job.Bytes, xbw, 2*tp.nodeLat+2*tp.rackLat+tp.spineLat), job.Overlap)
	}
	if n == 1 {
		s.SameRack, s.CrossRack = s.Consolidated, s.Consolidated
	}
	s.RackSlowdown = max(1, s.SameRack/s.Consolidated)
	s.SpineSlowdown = max(s.RackSlowdown, s.CrossRack/s.Consolidated)
	return s, nil
}

// GPUTypes lists the GPU types present, sorted.
func (tp *Topology) GPUTypes() []string {
	out := make([]string, 0, len(tp.refs))
	for t := range tp.refs {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// minComputeShare floors derived compute time when a measurement is faster
// than the model's communication alone allows (the measurement wins: the
// model then over-predicts that job's consolidated time by the difference).
const minComputeShare = 0.05

// ComputeTime derives one iteration's compute time on gpuType from a
// consolidated throughput (aggregate steps/s over sf workers, Gavel's
// unit) by removing the communication this topology predicts for the best
// consolidated placement.
func (tp *Topology) ComputeTime(gpuType string, sf int, stepsPerSec, bytes, overlap float64) (float64, error) {
	if sf <= 0 {
		return 0, fmt.Errorf("scale factor: want a positive worker count, got %d", sf)
	}
	if math.IsNaN(stepsPerSec) || math.IsInf(stepsPerSec, 0) || stepsPerSec <= 0 {
		return 0, fmt.Errorf("throughput: want positive steps/s, got %g", stepsPerSec)
	}
	if math.IsNaN(overlap) || overlap < 0 || overlap >= 1 {
		return 0, fmt.Errorf("overlap: want a fraction in [0, 1), got %g", overlap)
	}
	ref, ok := tp.refs[gpuType]
	if !ok {
		return 0, fmt.Errorf("gpu type %q: no node in the topology has it; use one of %v", gpuType, tp.GPUTypes())
	}
	iter := float64(sf) / stepsPerSec
	bw, lat := tp.consolidatedLinks(ref, sf)
	comm := ringTime(sf, bytes, bw, lat)
	return invertIteration(iter, comm, overlap), nil
}

// invertIteration solves iteration(c, comm, h) = iter for c; the function
// is strictly increasing in c for h < 1, so the solution is unique.
func invertIteration(iter, comm, h float64) float64 {
	if h > 0 && iter >= comm/h {
		return iter // communication fully hidden
	}
	c := (iter - comm) / (1 - h)
	return max(c, minComputeShare*iter)
}

// JobFromThroughput builds a JobComm from consolidated throughputs at scale
// factor sf, one per GPU type (steps/s; zero means the job cannot run
// there and leaves the type out).
func (tp *Topology) JobFromThroughput(name string, bytes, overlap float64, sf int, consolidated map[string]float64) (JobComm, error) {
	j := JobComm{Name: name, Bytes: bytes, Overlap: overlap, Compute: make(map[string]float64, len(consolidated))}
	for gt, thr := range consolidated {
		if thr == 0 {
			continue
		}
		c, err := tp.ComputeTime(gt, sf, thr, bytes, overlap)
		if err != nil {
			return JobComm{}, fmt.Errorf("job %q on %s: %w", name, gt, err)
		}
		j.Compute[gt] = c
	}
	if err := j.Validate(); err != nil {
		return JobComm{}, err
	}
	return j, nil
}
