package scale

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
)

// Event is one line of nodesim's event log (e2e/tools/nomad/nodesim,
// events.go): the JSON shape is the contract between the two modules.
type Event struct {
	T         float64 `json:"t"`
	Event     string  `json:"event"`
	Job       string  `json:"job"`
	Namespace string  `json:"namespace"`
	Alloc     string  `json:"alloc"`
	Node      string  `json:"node"`
	Group     string  `json:"group"`
	Unit      string  `json:"unit"`
	Model     string  `json:"model"`
	Workers   int     `json:"workers"`
	Rate      float64 `json:"rate"`
	Steps     float64 `json:"steps"`
}

// Time is the event's wall time.
func (e Event) Time() time.Time { return time.Unix(0, int64(e.T*1e9)) }

// JobTimes is what the event log says of one job.
type JobTimes struct {
	// Placed: its first allocation reached a node; Running: its first
	// unit's workers all ran; Complete: its steps were done.
	Placed, Running, Complete time.Time
	// Starts counts units that began running, Stops those stopped before
	// the job completed (preemptions and moves).
	Starts, Stops int
	// Stalled: a unit ran where the job has no throughput.
	Stalled bool
	// Timeouts counts workers that gave up waiting for their unit.
	Timeouts int
	// Generated and Other count the allocations that reached a node in a
	// task group hadar generated (a placement the sidecar wrote) and in
	// any other group (as the job was submitted).
	Generated, Other int
}

// Tail reads an event log as it grows.
type Tail struct {
	path string
	off  int64
	part []byte
	Jobs map[string]*JobTimes
}

// NewTail follows the event log at path (which may not exist yet).
func NewTail(path string) *Tail { return &Tail{path: path, Jobs: map[string]*JobTimes{}} }

// Read applies the lines written since the last call.
func (t *Tail) Read() error {
	f, err := os.Open(t.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(t.off, io.SeekStart); err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	t.off += int64(len(b))
	b = append(t.part, b...)
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		t.part = b
		return nil
	}
	t.part = append([]byte(nil), b[end+1:]...)
	sc := bufio.NewScanner(bytes.NewReader(b[:end+1]))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("event log %s: %w in %q", t.path, err, sc.Text())
		}
		t.apply(e)
	}
	return sc.Err()
}

func (t *Tail) apply(e Event) {
	j := t.Jobs[e.Job]
	if j == nil {
		j = &JobTimes{}
		t.Jobs[e.Job] = j
	}
	at := e.Time()
	switch e.Event {
	case "placed":
		if j.Placed.IsZero() {
			j.Placed = at
		}
		if _, ok := groupname.Parse(e.Group); ok {
			j.Generated++
		} else {
			j.Other++
		}
	case "running":
		if j.Running.IsZero() {
			j.Running = at
		}
		j.Starts++
	case "stopped":
		j.Stops++
	case "stalled":
		j.Stalled = true
	case "timeout":
		j.Timeouts++
	case "complete":
		j.Complete = at
	}
}

// Completed counts the jobs whose steps are done.
func (t *Tail) Completed() int {
	n := 0
	for _, j := range t.Jobs {
		if !j.Complete.IsZero() {
			n++
		}
	}
	return n
}
