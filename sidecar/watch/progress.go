package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Progress is the training progress file of docs/training-contract.md, as
// the training process last wrote it.
type Progress struct {
	// StepsDone counts the job's steps (for a HadarE copy: the job's
	// merged total as the copy last saw it).
	StepsDone   int64     `json:"steps_done"`
	TotalSteps  int64     `json:"total_steps"`
	StepsPerSec float64   `json:"steps_per_sec"`
	Loss        float64   `json:"loss"`
	Checkpoint  string    `json:"checkpoint"`
	Updated     time.Time `json:"updated"`
	// Optional fields hadar-trainer adds (zero when absent): its state
	// ("running", "merging", "stopped", "done"), and for HadarE the copy's
	// index, the number of copies and the copy's own steps.
	State      string `json:"state"`
	CopyIndex  int    `json:"copy_index"`
	Copies     int    `json:"copies"`
	LocalSteps int64  `json:"local_steps"`
}

// maxProgressBytes bounds a progress file read: the contract's file is a
// few hundred bytes, and a runaway file must not exhaust the sidecar.
const maxProgressBytes = 1 << 20

// Progress reads the training progress of an allocation through Nomad's
// allocation filesystem API (GET /v1/client/fs/cat/<alloc>), from the path
// Config.ProgressPath names for the allocation's training task.
//
// It asks the agent the watcher talks to, which forwards to the node,
// rather than going through api.AllocFS().Cat: that first reads the node
// (one more request per call) and then dials the node's own HTTP address,
// which a sidecar outside the cluster network may not reach (each call
// then waits api.ClientConnTimeout before falling back to the agent).
func (w *Watcher) Progress(ctx context.Context, a *Alloc) (*Progress, error) {
	p, err := w.progress(ctx, a)
	w.count(func(s *Stats) {
		s.ProgressReads++
		if err != nil {
			s.ProgressErrors++
		}
	})
	return p, err
}

func (w *Watcher) progress(ctx context.Context, a *Alloc) (*Progress, error) {
	task, err := progressTask(a)
	if err != nil {
		return nil, err
	}
	path := strings.ReplaceAll(w.cfg.ProgressPath, "{task}", task)
	q := &api.QueryOptions{Namespace: a.Namespace, Params: map[string]string{"path": path}}
	rc, err := w.client.Raw().Response("/v1/client/fs/cat/"+url.PathEscape(a.ID), q.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("alloc %s task %q: read progress file %s: %w", a.ID, task, path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxProgressBytes+1))
	if err != nil {
		return nil, fmt.Errorf("alloc %s task %q: read progress file %s: %w", a.ID, task, path, err)
	}
	if len(b) > maxProgressBytes {
		return nil, fmt.Errorf("alloc %s task %q: progress file %s is over %d bytes: want the small JSON object of docs/training-contract.md", a.ID, task, path, maxProgressBytes)
	}
	var p Progress
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("alloc %s task %q: progress file %s: %w (want the JSON object of docs/training-contract.md; it starts %q)", a.ID, task, path, err, b[:min(len(b), 64)])
	}
	return &p, nil
}

// progressTask is the allocation's training task: the job spec's GPU task,
// else the allocation's only task.
func progressTask(a *Alloc) (string, error) {
	if a.Task != "" {
		return a.Task, nil
	}
	if len(a.TaskStates) == 1 {
		for name := range a.TaskStates {
			return name, nil
		}
	}
	names := make([]string, 0, len(a.TaskStates))
	for name := range a.TaskStates {
		names = append(names, name)
	}
	sort.Strings(names)
	return "", fmt.Errorf("alloc %s: no training task known (the job's spec is invalid) among tasks %q", a.ID, names)
}
