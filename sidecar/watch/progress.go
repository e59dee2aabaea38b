package watch

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
)

// Progress reads the training progress of an allocation through Nomad's
// allocation filesystem API (GET /v1/client/fs/cat/<alloc>), from the path
// Config.ProgressPath names for the allocation's training task.
//
// It asks the agent the watcher talks to, which forwards to the node,
// rather than going through api.AllocFS().Cat: that first reads the node
// (one more request per call) and then dials the node's own HTTP address,
// which a sidecar outside the cluster network may not reach (each call
// then waits api.ClientConnTimeout before falling back to the agent).
func (w *Watcher) Progress(ctx context.Context, a *Alloc) (*contract.Progress, error) {
	p, err := w.progress(ctx, a)
	w.count(func(s *Stats) {
		s.ProgressReads++
		if err != nil {
			s.ProgressErrors++
		}
	})
	return p, err
}

func (w *Watcher) progress(ctx context.Context, a *Alloc) (*contract.Progress, error) {
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
	b, err := io.ReadAll(io.LimitReader(rc, contract.MaxProgressBytes+1))
	if err != nil {
		return nil, fmt.Errorf("alloc %s task %q: read progress file %s: %w", a.ID, task, path, err)
	}
	p, err := contract.ParseProgress(b)
	if err != nil {
		return nil, fmt.Errorf("alloc %s task %q: %s: %w (want the JSON object of docs/training-contract.md; it starts %q)", a.ID, task, path, err, b[:min(len(b), 64)])
	}
	return p, nil
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
