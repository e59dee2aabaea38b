package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/round"
)

// Simulation snapshot identifiers: the engine's snapshot plus the
// simulator's truth, taken at the start of a round.
const (
	snapshotFormat  = "hadar-sim-snapshot"
	snapshotVersion = 1
)

type simStateV1 struct {
	Engine      json.RawMessage             `json:"engine"`
	Scheduler   string                      `json:"scheduler"`
	Now         float64                     `json:"now"`
	NextArrival int                         `json:"next_arrival"`
	NextEvent   int                         `json:"next_event"`
	Done        int                         `json:"done"`
	Active      []string                    `json:"active"`
	Jobs        []simJobV1                  `json:"jobs"`
	Rounds      int                         `json:"rounds"`
	Samples     []Sample                    `json:"samples"`
	Capacity    map[planner.GPUType]float64 `json:"capacity"`
	// Queues is the queue meter's sums (absent without queues).
	Queues []queueAcc `json:"queues,omitempty"`
	Busy   *busyAcc   `json:"busy_while_waiting,omitempty"`
}

type simJobV1 struct {
	ID         string            `json:"id"`
	TotalSteps float64           `json:"total_steps"`
	Rem        float64           `json:"remaining"`
	CkptRem    float64           `json:"checkpoint_remaining"`
	Placement  planner.Placement `json:"placement"`
	Running    bool              `json:"running"`
	Rates      []float64         `json:"rates"`
	Delays     []float64         `json:"delays"`
	Comm       []float64         `json:"comm"`
	CommTime   float64           `json:"comm_time"`
	Admitted   bool              `json:"admitted"`
	Started    bool              `json:"started"`
	Done       bool              `json:"done"`
	Start      float64           `json:"start"`
	Finish     float64           `json:"finish"`
	Restarts   int               `json:"restarts"`
	GPUSeconds float64           `json:"gpu_seconds"`
}

func (s *simulation) snapshot() ([]byte, error) {
	eng, err := s.eng.Snapshot()
	if err != nil {
		return nil, err
	}
	st := simStateV1{Engine: eng, Scheduler: s.sched.Name(), Now: s.now, NextArrival: s.nextArrival, NextEvent: s.nextEvent, Done: s.done,
		Rounds: s.res.Rounds, Samples: s.res.Samples, Capacity: s.capacity, Active: []string{}}
	for _, js := range s.active {
		st.Active = append(st.Active, js.job.ID)
	}
	if s.meter != nil {
		st.Queues, st.Busy = s.meter.acc, &s.meter.busy
	}
	for _, js := range s.jobs {
		st.Jobs = append(st.Jobs, simJobV1{ID: js.job.ID, TotalSteps: js.job.TotalSteps, Rem: js.rem, CkptRem: js.ckptRem, Placement: js.placement,
			Running: js.running, Rates: js.rates, Delays: js.delays, Comm: js.comm, CommTime: js.commTime, Admitted: js.admitted,
			Started: js.started, Done: js.done, Start: js.start, Finish: js.finish, Restarts: js.restarts, GPUSeconds: js.gpuSeconds})
	}
	return engine.Seal(snapshotFormat, snapshotVersion, st)
}

// restore overlays a snapshot on a simulation freshly built from the same
// configuration and a freshly built scheduler: all or nothing.
func (s *simulation) restore(data []byte) error {
	raw, err := engine.Open(data, snapshotFormat, snapshotVersion)
	if err != nil {
		return err
	}
	var st simStateV1
	if err := round.StrictUnmarshal(raw, &st); err != nil {
		return fmt.Errorf("simulation snapshot: %w", err)
	}
	if st.Scheduler != s.sched.Name() {
		return fmt.Errorf("simulation snapshot: taken with scheduler %q, resuming with %q", st.Scheduler, s.sched.Name())
	}
	if len(st.Jobs) != len(s.jobs) || st.NextArrival < 0 || st.NextArrival > len(s.order) || st.NextEvent < 0 || st.NextEvent > len(s.events) ||
		st.Done < 0 || st.Done > len(s.jobs) {
		return fmt.Errorf("simulation snapshot: it does not fit this run's %d jobs and %d cluster events: resume with the same trace and options", len(s.jobs), len(s.events))
	}
	jobs := make([]jobState, len(s.jobs))
	for i, sj := range st.Jobs {
		js := s.jobs[i]
		if sj.ID != js.job.ID || sj.TotalSteps != js.job.TotalSteps {
			return fmt.Errorf("simulation snapshot: job %d is %s with %v steps, this run has %s with %v: resume with the same trace", i, sj.ID, sj.TotalSteps, js.job.ID, js.job.TotalSteps)
		}
		n := len(sj.Placement.Units)
		if len(sj.Rates) != n || len(sj.Delays) != n || len(sj.Comm) != n || sj.Running && n == 0 {
			return fmt.Errorf("simulation snapshot: job %s: %d units with %d rates, %d delays, %d comm shares, running=%v", sj.ID, n, len(sj.Rates), len(sj.Delays), len(sj.Comm), sj.Running)
		}
		for _, x := range slices.Concat(sj.Rates, sj.Delays, sj.Comm, []float64{sj.Rem, sj.CkptRem, sj.CommTime, sj.Start, sj.Finish, sj.GPUSeconds}) {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return fmt.Errorf("simulation snapshot: job %s: %v is not a finite number", sj.ID, x)
			}
		}
		jobs[i] = jobState{job: js.job, idx: js.idx, rem: sj.Rem, ckptRem: sj.CkptRem, placement: sj.Placement, running: sj.Running,
			rates: sj.Rates, delays: sj.Delays, comm: sj.Comm, commTime: sj.CommTime, admitted: sj.Admitted, started: sj.Started,
			done: sj.Done, start: sj.Start, finish: sj.Finish, restarts: sj.Restarts, gpuSeconds: sj.GPUSeconds}
		if n == 0 {
			jobs[i].rates, jobs[i].delays, jobs[i].comm = nil, nil, nil
		}
	}
	var active []*jobState
	for _, id := range st.Active {
		js := s.byID[id]
		if js == nil {
			return fmt.Errorf("simulation snapshot: active job %s is not in the trace", id)
		}
		active = append(active, js)
	}
	var acc []queueAcc
	var busy busyAcc
	if s.meter != nil {
		if len(st.Queues) != len(s.meter.acc) {
			return fmt.Errorf("simulation snapshot: %d queues measured, this run has %d: resume with the same trace and queues", len(st.Queues), len(s.meter.acc))
		}
		for q, a := range st.Queues {
			if a.Queue != s.meter.acc[q].Queue {
				return fmt.Errorf("simulation snapshot: queue %d is %q, this run's is %q: resume with the same trace and queues", q, a.Queue, s.meter.acc[q].Queue)
			}
			for _, x := range []float64{a.Below, a.Stretch, a.Longest, a.Fair, a.Reclaim, a.ReclaimStretch, a.ReclaimLongest} {
				if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
					return fmt.Errorf("simulation snapshot: queue %s: %v is not a finite number >= 0", a.Queue, x)
				}
			}
		}
		acc = slices.Clone(st.Queues)
		if st.Busy == nil || math.IsNaN(st.Busy.Held+st.Busy.Capacity) || math.IsInf(st.Busy.Held+st.Busy.Capacity, 0) {
			return fmt.Errorf("simulation snapshot: the queue meter's busy time is missing or not finite")
		}
		busy = *st.Busy
	} else if len(st.Queues) > 0 {
		return fmt.Errorf("simulation snapshot: it measured queues, this run has none: resume with the same trace and queues")
	}
	eng, err := engine.Restore(st.Engine, s.engineConfig(), s.sched)
	if err != nil {
		return fmt.Errorf("simulation snapshot: %w", err)
	}
	// Nothing can fail from here on.
	for i := range jobs {
		*s.jobs[i] = jobs[i]
	}
	s.eng, s.active = eng, active
	s.now, s.nextArrival, s.nextEvent, s.done = st.Now, st.NextArrival, st.NextEvent, st.Done
	s.res.Rounds, s.res.Samples = st.Rounds, st.Samples
	s.capacity = st.Capacity
	if s.meter != nil {
		s.meter.acc, s.meter.busy = acc, busy
	}
	return nil
}
