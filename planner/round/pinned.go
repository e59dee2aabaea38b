package round

import (
	"math"
	"strconv"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/policy"
)

// A job within its minimum run time (JobView.Pinned) keeps its GPUs this
// round whatever a policy answers. A policy that allocated as if it could
// move would hand those GPUs to others, the engine would refuse the moves
// and the receivers would wait: so the allocation is solved for the other
// jobs on the capacity the pinned ones leave, and Assign places pinned
// jobs first, where they are.

// pinnedType is the index in v.Types of the one type job jb's placement
// runs on, or -1 (no placement, several types, a type not in v).
func pinnedType(v *View, jb *JobView) int {
	j := -1
	for _, u := range jb.Placement.Units {
		for _, sl := range u.Slots {
			k := typeIndex(v.Types, sl.Type)
			if k < 0 || j >= 0 && k != j {
				return -1
			}
			j = k
		}
	}
	return j
}

func typeIndex(ts []planner.GPUType, t planner.GPUType) int {
	for j, u := range ts {
		if u == t {
			return j
		}
	}
	return -1
}

// pins reports, per job of v, whether it is pinned this round: a boundary
// plan, JobView.Pinned, on one type of the view.
func pins(v *View) []bool {
	out := make([]bool, len(v.Jobs))
	if v.MidRound {
		return out
	}
	for i, jb := range v.Jobs {
		out[i] = jb.Pinned && pinnedType(v, jb) >= 0
	}
	return out
}

// pinKey identifies the pinned jobs of v and their types, so that an
// allocation solved around them is solved again when they change.
func pinKey(v *View, pinned []bool) string {
	b := []byte{}
	for i, p := range pinned {
		if p {
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, ':')
			b = strconv.AppendInt(b, int64(pinnedType(v, v.Jobs[i])), 10)
			b = append(b, ',')
		}
	}
	return string(b)
}

// withoutPinned is the allocation problem of in (one job per v.Jobs)
// without the pinned jobs, on the capacity they leave; keep lists, for
// each job of the result, its index in in.Jobs.
func withoutPinned(v *View, in policy.Input, pinned []bool) (out policy.Input, keep []int) {
	out = in
	out.Capacity = append([]float64(nil), in.Capacity...)
	out.Jobs = make([]policy.JobState, 0, len(in.Jobs))
	for i, jb := range in.Jobs {
		if !pinned[i] {
			out.Jobs = append(out.Jobs, jb)
			keep = append(keep, i)
			continue
		}
		for _, u := range v.Jobs[i].Placement.Units {
			for _, sl := range u.Slots {
				if k := typeIndex(v.Types, sl.Type); k >= 0 {
					out.Capacity[k] = math.Max(0, out.Capacity[k]-float64(sl.Count))
				}
			}
		}
	}
	return out, keep
}

// settlePinned takes the GPUs of each pinned job from v.Pool and places
// it there (out), before any other job is chosen; it reports the jobs it
// placed, which the choice passes then leave alone. A pinned placement the
// pool no longer offers (a drained node) is not kept: the job is planned
// as any other.
func settlePinned(v *View, pinned []bool, out []planner.Placement) []bool {
	fixed := make([]bool, len(v.Jobs))
	for i, jb := range v.Jobs {
		if v.MidRound {
			fixed[i] = jb.Running
			continue
		}
		if !pinned[i] || !offered(v, jb) {
			continue
		}
		for _, u := range jb.Placement.Units {
			v.Pool.Take(u)
		}
		out[i] = clonePlacement(jb.Placement)
		fixed[i] = true
	}
	return fixed
}

// offered reports whether every unit of the job's placement is free in
// v.Pool (taken together) and allowed to it.
func offered(v *View, jb *JobView) bool {
	check := v.Pool.Clone()
	for _, u := range jb.Placement.Units {
		if !jb.Eligible.AllowsUnit(u) || !check.Fits(u) {
			return false
		}
		check.Take(u)
	}
	return true
}

func clonePlacement(p planner.Placement) planner.Placement {
	out := planner.Placement{Units: make([]planner.Unit, len(p.Units))}
	for k, u := range p.Units {
		out.Units[k] = planner.Unit{Slots: append([]planner.Slot(nil), u.Slots...)}
	}
	return out
}

// typeClasses groups the types of v that are identical for every job
// (the same throughput everywhere, say one GPU model in two node pools):
// class[j] is the first type of j's group. Moving a job between two types
// of a group gains nothing and costs a restart, so the choice passes treat
// a group as one type and keep a job on the type it runs on.
func typeClasses(v *View) []int {
	class := make([]int, len(v.Types))
	for j := range v.Types {
		class[j] = j
		for k := 0; k < j; k++ {
			if class[k] == k && sameForAll(v, j, k) {
				class[j] = k
				break
			}
		}
	}
	return class
}

func sameForAll(v *View, j, k int) bool {
	for _, jb := range v.Jobs {
		if j >= len(jb.Throughput) || k >= len(jb.Throughput) {
			return false
		}
		a, b := jb.Throughput[j], jb.Throughput[k]
		if math.Abs(a-b) > 1e-9*math.Max(math.Abs(a), math.Abs(b)) {
			return false
		}
	}
	return true
}
