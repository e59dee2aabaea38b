package trace

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
)

// MakeElastic returns jobs with a fraction frac of them made elastic
// (planner.Job.Widths, issue 35): a job is drawn from seed and its ID
// alone (the same jobs whatever the others), and declares every width its
// model is profiled at between 1 and twice its scale factor
// (profiled(model), ascending; its scale factor among them). A job whose
// model has no other width there stays rigid. jobs is not changed.
func MakeElastic(jobs []planner.Job, frac float64, seed int64, profiled func(model string) []int) ([]planner.Job, error) {
	if !(frac >= 0 && frac <= 1) {
		return nil, fmt.Errorf("elastic fraction %v: want a number in [0, 1]", frac)
	}
	out := slices.Clone(jobs)
	if frac == 0 {
		return out, nil
	}
	for i := range out {
		j := &out[i]
		if draw(seed, j.ID) >= frac {
			continue
		}
		var ws []int
		for _, w := range profiled(j.Model) {
			if w >= 1 && w <= 2*j.ScaleFactor {
				ws = append(ws, w)
			}
		}
		slices.Sort(ws)
		ws = slices.Compact(ws)
		if len(ws) < 2 || !slices.Contains(ws, j.ScaleFactor) {
			continue
		}
		j.Widths = ws
	}
	return out, nil
}

// draw is a number in [0, 1) fixed by seed and id.
func draw(seed int64, id string) float64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(seed))
	h.Write(b[:])
	h.Write([]byte(id))
	// FNV's last bytes barely reach its top bits: mix (splitmix64's
	// finalizer) before taking them.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / math.Exp2(53)
}
