package train

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/hadar-sched/hadar/driver/supervise"
)

// taskStateVersion is the TaskHandle.Version of the driver state this
// release writes (JSON, driverState). Version 2 was msgpack naming a
// Nomad executor (hadar-train v0.2.x): such tasks cannot be recovered.
const taskStateVersion = 3

// driverState is what Nomad stores with a task (TaskHandle.DriverState)
// and hands back to RecoverTask after the client restarts: enough to
// reattach to the task's supervisor and go on publishing its progress.
type driverState struct {
	Supervise supervise.State `json:"supervise"`
	// TaskDir is the task directory; Progress the progress file in it
	// (relative), copied to progressRel when Mirror is set.
	TaskDir  string `json:"task_dir"`
	Progress string `json:"progress"`
	Mirror   bool   `json:"mirror,omitempty"`
	// Checkpoint is the task's checkpoint directory, CheckpointBase the
	// root it is in (checkpoint_root, or <state_dir>/checkpoints).
	Checkpoint     string    `json:"checkpoint"`
	CheckpointBase string    `json:"checkpoint_base"`
	UID            int       `json:"uid"`
	StartedAt      time.Time `json:"started_at"`
	// Run is the task's contract.EnvJobRun, recorded as finished in the
	// checkpoint directory when the task ends done.
	Run string `json:"run,omitempty"`
}

func (s *driverState) encode() ([]byte, error) { return json.Marshal(s) }

// decodeDriverState reads a handle's driver state, refusing what an
// earlier release wrote.
func decodeDriverState(version int, b []byte) (*driverState, error) {
	if version != taskStateVersion {
		return nil, fmt.Errorf("driver state version %d: the task was started by an earlier %s (before v0.3.0, under Nomad's executor), which this release cannot reattach to; stop such tasks before upgrading the plugin (docs/driver.md, \"Upgrading\")", version, PluginName)
	}
	var s driverState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("driver state version %d: %w", version, err)
	}
	if s.Supervise.StateDir == "" || s.Supervise.Task.PID <= 0 || s.TaskDir == "" || s.Progress == "" {
		return nil, fmt.Errorf("driver state version %d: incomplete (no supervisor, task or task directory)", version)
	}
	return &s, nil
}

// taskStore holds the driver's running and finished tasks by task ID.
type taskStore struct {
	mu    sync.RWMutex
	tasks map[string]*taskHandle
}

func newTaskStore() *taskStore { return &taskStore{tasks: map[string]*taskHandle{}} }

// add stores h unless a task of its ID is there; it tells whether it did.
func (s *taskStore) add(id string, h *taskHandle) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tasks[id]; ok {
		return false
	}
	s.tasks[id] = h
	return true
}

func (s *taskStore) get(id string) (*taskHandle, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, ok := s.tasks[id]
	return h, ok
}

func (s *taskStore) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tasks, id)
}

func (s *taskStore) all() []*taskHandle {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*taskHandle, 0, len(s.tasks))
	for _, h := range s.tasks {
		out = append(out, h)
	}
	return out
}
