package nodesim

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// event is one line of the event log: what the simulated cluster did, with
// the wall time it did it. Scale tests read it for the truth of when jobs
// ran and completed, without polling Nomad (which would load the server
// they measure). The events:
//
//	placed    an allocation reached its node and its task started (Alloc, Node, Group, Unit, Model)
//	running   a unit's rendezvous completed: all its workers run (Unit, Workers, Rate: steps per simulated second, Steps: the job's at that moment)
//	stalled   a running unit has a worker on a GPU model the job has no throughput for: it makes no progress
//	stopped   a running unit lost a worker (Nomad stopped it): Steps is the checkpoint
//	timeout   a worker waited at the rendezvous past the timeout and failed (Alloc, Node, Unit, Workers: how many had arrived)
//	complete  the job's steps are done; its workers exit 0
type event struct {
	T         float64 `json:"t"` // Unix seconds
	Event     string  `json:"event"`
	Job       string  `json:"job"`
	Namespace string  `json:"namespace"`
	Alloc     string  `json:"alloc,omitempty"`
	Node      string  `json:"node,omitempty"`
	Group     string  `json:"group,omitempty"`
	Unit      string  `json:"unit,omitempty"`
	Model     string  `json:"model,omitempty"`
	Workers   int     `json:"workers,omitempty"`
	Rate      float64 `json:"rate,omitempty"`
	Steps     float64 `json:"steps,omitempty"`
}

// eventLog writes events as JSON lines. A write error is kept and
// reported once at the end (Err): the simulation goes on without its log
// rather than stop the cluster under test.
type eventLog struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
	err error
}

func newEventLog(w io.Writer) *eventLog {
	if w == nil {
		w = io.Discard
	}
	return &eventLog{w: w, now: time.Now}
}

func (l *eventLog) write(e event) {
	e.T = float64(l.now().UnixNano()) / 1e9
	b, err := json.Marshal(e)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && l.err == nil {
		_, err = l.w.Write(append(b, '\n'))
	}
	if err != nil && l.err == nil {
		l.err = err
	}
}

// Err is the first write error, if any.
func (l *eventLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
