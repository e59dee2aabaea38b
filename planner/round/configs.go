package round

import (
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
)

// Configs is a round posed as a configuration program (planner/assign,
// as Sia and hadar's elastic rounds solve it): job i's widths Widths[i],
// with one throughput row per width in Rows[i], are slots wi*K + type, M
// per job; Cur[i] is the slot it runs in (-1: none, or mid-round); Fixed[i]
// says it keeps its GPUs (pinned at a boundary, running mid-round);
// Capacity is the GPUs of each type left to the others.
type Configs struct {
	K, M     int
	Widths   [][]int
	Rows     [][][]float64
	Cur      []int
	Fixed    []bool
	Capacity []float64
}

// PoseConfigs poses round v: widths gives a job's widths and rows,
// current the slot it runs in at those widths.
func PoseConfigs(v *View, widths func(*JobView) ([]int, [][]float64), current func([]int, *JobView) int) *Configs {
	n, k := len(v.Jobs), len(v.Types)
	c := &Configs{K: k, M: k, Widths: make([][]int, n), Rows: make([][][]float64, n), Cur: make([]int, n), Fixed: make([]bool, n), Capacity: make([]float64, k)}
	for j, t := range v.Types {
		c.Capacity[j] = float64(v.Pool.FreeOfType(t))
	}
	for i, jb := range v.Jobs {
		c.Widths[i], c.Rows[i] = widths(jb)
		c.M = max(c.M, len(c.Widths[i])*k)
		c.Cur[i] = -1
		if v.MidRound {
			// Running jobs keep their GPUs mid-round; the pool holds
			// only the idle ones, and the jobs placed on them wait now:
			// no configuration of theirs is a restart more than another.
			c.Fixed[i] = jb.Running
			continue
		}
		c.Cur[i] = current(c.Widths[i], jb)
		if cur := c.Cur[i]; jb.Pinned && cur >= 0 {
			// Held by its minimum run time: its GPUs are capacity taken.
			c.Fixed[i] = true
			c.Capacity[cur%k] = math.Max(0, c.Capacity[cur%k]-float64(c.Widths[i][cur/k]))
		}
	}
	return c
}

// Assign places the program's choice with Assign: job i runs at slot
// choice[i], or not at all (-1); a fixed job keeps what it runs: slot
// Cur[i] when it is one, else (mid-round) the width it runs at. It returns
// the placements and the shares Assign was given (one type per job, as
// Reason.Share).
func (cf *Configs) Assign(v *View, choice []int, opt AssignOptions) ([]planner.Placement, [][]float64) {
	ws, rows, fixed, cur := cf.Widths, cf.Rows, cf.Fixed, cf.Cur
	k := len(v.Types)
	x := make([][]float64, len(v.Jobs))
	// The placer sees each job at the width chosen for it: a copy of the
	// view whose jobs have that scale factor and its throughputs.
	view := v
	var shadow []JobView
	at := func(i, c int) {
		if len(ws[i]) == 1 {
			return
		}
		if shadow == nil {
			cp := *v
			view = &cp
			view.Jobs = slices.Clone(v.Jobs)
			shadow = make([]JobView, len(v.Jobs))
		}
		shadow[i] = *v.Jobs[i]
		shadow[i].ScaleFactor = ws[i][c/k]
		shadow[i].Throughput = rows[i][c/k]
		view.Jobs[i] = &shadow[i]
	}
	for i := range v.Jobs {
		x[i] = make([]float64, k)
		switch {
		case fixed[i] && cur[i] >= 0:
			x[i][cur[i]%k] = 1
			at(i, cur[i])
		case fixed[i] && len(v.Jobs[i].Placement.Units) == 1:
			// Running mid-round at a width: the placer keeps it there.
			if wi := slices.Index(ws[i], v.Jobs[i].Placement.Units[0].GPUs()); wi >= 0 {
				at(i, wi*k)
			}
		}
	}
	for i, c := range choice {
		if !fixed[i] && c >= 0 {
			x[i][c%k] = 1
			at(i, c)
		}
	}
	return Assign(view, x, opt), x
}
