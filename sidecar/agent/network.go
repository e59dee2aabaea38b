package agent

import (
	"math"
	"sync"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/speed"
)

// rackNetwork prices where a unit's workers sit from what the sidecar
// knows: each node's rack (node meta) and each job's declared network
// sensitivity (hadar.sensitivity). It is the planner's speed.Network, so
// placement policies (delay scheduling) and Hadar see that a
// network-sensitive job runs slower across racks:
//
//   - one node: no slowdown;
//   - several nodes of one rack: the profile's spread penalty (its
//     consolidated over spread throughput), the worst over the unit's types;
//   - several racks: the job's sensitivity when it declared one and it is
//     larger, else the same as within a rack (nothing says racks matter).
type rackNetwork struct {
	prof speed.Profile
	mu   sync.RWMutex
	rack map[string]string  // node ID -> rack
	sens map[string]float64 // engine job ID -> cross-rack slowdown
}

func newRackNetwork(prof speed.Profile) *rackNetwork {
	return &rackNetwork{prof: prof, rack: map[string]string{}, sens: map[string]float64{}}
}

func (n *rackNetwork) setRack(node, rack string) {
	n.mu.Lock()
	n.rack[node] = rack
	n.mu.Unlock()
}

func (n *rackNetwork) setSensitivity(job string, s float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s > 1 {
		n.sens[job] = s
	} else {
		delete(n.sens, job)
	}
}

// Slowdown implements speed.Network.
func (n *rackNetwork) Slowdown(job planner.Job, u planner.Unit, _ float64) float64 {
	if u.Nodes() <= 1 {
		return 1
	}
	slow := 1.0
	for _, t := range u.Types() {
		c, err1 := n.prof.Throughput(job.Model, u.GPUs(), t, false)
		s, err2 := n.prof.Throughput(job.Model, u.GPUs(), t, true)
		if err1 == nil && err2 == nil && c > 0 && s > 0 {
			slow = math.Max(slow, c/s)
		}
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	racks := map[string]bool{}
	for _, sl := range u.Slots {
		racks[n.rack[sl.Node]] = true
	}
	if len(racks) > 1 {
		slow = math.Max(slow, n.sens[job.ID])
	}
	return slow
}
