package speed

import (
	"math"
	"testing"

	"github.com/hadar-sched/hadar/planner"
)

// table is a tiny profile: model "m" at 1 and 2 workers.
type table map[string]float64

func (t table) Throughput(model string, sf int, ty planner.GPUType, spread bool) (float64, error) {
	key := string(ty)
	if sf == 2 {
		key += "x2"
	}
	if spread {
		key += "s"
	}
	v, ok := t[key]
	if !ok {
		return 0, errMissing(key)
	}
	return v, nil
}

type errMissing string

func (e errMissing) Error() string { return "missing " + string(e) }

func unit(slots ...planner.Slot) planner.Unit { return planner.Unit{Slots: slots} }

func TestUnitRate(t *testing.T) {
	prof := table{"v": 10, "k": 4, "vx2": 18, "kx2": 7, "vx2s": 12, "kx2s": 5}
	job := planner.Job{ID: "j", Model: "m", ScaleFactor: 2}
	tests := []struct {
		name  string
		model Model
		u     planner.Unit
		want  float64
	}{
		{"one node", Model{Profile: prof}, unit(planner.Slot{Node: "a", Type: "v", Count: 2}), 18},
		{"spread", Model{Profile: prof}, unit(planner.Slot{Node: "a", Type: "v", Count: 1}, planner.Slot{Node: "b", Type: "v", Count: 1}), 12},
		{"spread ignored (Gavel)", Model{Profile: prof, IgnoreSpread: true}, unit(planner.Slot{Node: "a", Type: "v", Count: 1}, planner.Slot{Node: "b", Type: "v", Count: 1}), 18},
		// Mixed: the slowest type's spread figure sets the pace.
		{"mixed", Model{Profile: prof}, unit(planner.Slot{Node: "a", Type: "v", Count: 1}, planner.Slot{Node: "b", Type: "k", Count: 1}), 5},
		{"mixed efficiency", Model{Profile: prof, MixedEfficiency: 0.5}, unit(planner.Slot{Node: "a", Type: "v", Count: 1}, planner.Slot{Node: "b", Type: "k", Count: 1}), 2.5},
		{"mixed on one node", Model{Profile: prof}, unit(planner.Slot{Node: "a", Type: "v", Count: 1}, planner.Slot{Node: "a", Type: "k", Count: 1}), 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.model.UnitRate(job, tc.u, 0)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("rate %v, want %v", got, tc.want)
			}
		})
	}
	// Copies add up.
	p := planner.Placement{Units: []planner.Unit{
		unit(planner.Slot{Node: "a", Type: "v", Count: 2}),
		unit(planner.Slot{Node: "b", Type: "k", Count: 1}),
	}}
	if got, _ := (Model{Profile: prof}).Rate(job, p, 0); got != 18+4 {
		t.Fatalf("two copies run at %v, want 22", got)
	}
	if _, err := (Model{Profile: prof}).UnitRate(job, unit(planner.Slot{Node: "a", Type: "x", Count: 2}), 0); err == nil {
		t.Fatal("want an error for a type missing from the profile")
	}
}

type slow float64

func (s slow) Slowdown(planner.Job, planner.Unit, float64) float64 { return float64(s) }

func TestNetworkReplacesSpreadFigure(t *testing.T) {
	prof := table{"vx2": 18, "vx2s": 12}
	job := planner.Job{ID: "j", Model: "m", ScaleFactor: 2}
	u := unit(planner.Slot{Node: "a", Type: "v", Count: 1}, planner.Slot{Node: "b", Type: "v", Count: 1})
	got, err := Model{Profile: prof, Network: slow(3)}.UnitRate(job, u, 0)
	if err != nil || math.Abs(got-6) > 1e-12 {
		t.Fatalf("rate %v (%v), want the consolidated 18 slowed 3x = 6", got, err)
	}
}

// An elastic job runs at the profiled figure of each width (the package
// comment, "Elastic jobs"): the figures count steps of one worker's batch,
// the units of its steps, whatever its width. A rigid job's narrower unit
// (a HadarE copy) likewise.
func TestElasticRateIsTheProfiledFigure(t *testing.T) {
	prof := table{"v": 10, "vx2": 18}
	m := Model{Profile: prof}
	elastic := planner.Job{ID: "e", Model: "m", ScaleFactor: 2, Widths: []int{1, 2}}
	for _, tc := range []struct {
		n    int
		want float64
	}{{1, 10}, {2, 18}} {
		r, err := m.UnitRate(elastic, unit(planner.Slot{Node: "a", Type: "v", Count: tc.n}), 0)
		if err != nil || r != tc.want {
			t.Errorf("elastic job on %d GPUs: %v, %v; want %v steps/s", tc.n, r, err, tc.want)
		}
	}
	rigid := planner.Job{ID: "r", Model: "m", ScaleFactor: 2}
	r, err := m.UnitRate(rigid, unit(planner.Slot{Node: "a", Type: "v", Count: 1}), 0)
	if err != nil || r != 10 {
		t.Errorf("rigid job's 1-GPU copy: %v, %v; want 10 steps/s", r, err)
	}
}
