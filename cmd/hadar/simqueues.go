package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/round"
)

// The ways hadar sim runs a policy against the teams of --queues.
const (
	modeFlat   = "flat"   // no queues: the policy over every job
	modeQueues = "queues" // queues with guarantees, borrowing, reclaim
	modeStatic = "static" // each queue on its guarantee alone
)

// simQueues is what --queues and --queue-modes ask for.
type simQueues struct {
	cfg   queue.Config
	modes []string
}

// loadSimQueues reads --queues and --queue-modes and checks them against
// the cluster and the jobs.
func loadSimQueues(path, modes string, cluster planner.Cluster, jobs []planner.Job, prof *profile.Profile) (simQueues, error) {
	sq := simQueues{modes: splitList(modes)}
	if path == "" {
		if modes != "" {
			return sq, fmt.Errorf("--queue-modes needs --queues FILE")
		}
		sq.modes = []string{modeFlat}
		return sq, nil
	}
	if len(sq.modes) == 0 {
		sq.modes = []string{modeQueues}
	}
	for _, m := range sq.modes {
		if m != modeFlat && m != modeQueues && m != modeStatic {
			return sq, fmt.Errorf("--queue-modes: %q: want any of %s, %s, %s", m, modeFlat, modeQueues, modeStatic)
		}
	}
	var err error
	if sq.cfg, err = queue.Load(path); err != nil {
		return sq, fmt.Errorf("--queues: %w", err)
	}
	capacity := map[planner.GPUType]int{}
	for _, t := range cluster.Types() {
		capacity[t] = cluster.Capacity(t)
	}
	if err := sq.cfg.CheckCapacity(capacity); err != nil {
		return sq, fmt.Errorf("--queues: %w", err)
	}
	if slices.Contains(sq.modes, modeStatic) {
		// A job wider than its queue's guarantee on every type it runs on
		// would wait forever on a static partition.
		for _, j := range jobs {
			name := j.Queue
			if name == "" {
				name = queue.DefaultName
			}
			q, _ := sq.cfg.Find(name)
			fits := false
			for _, t := range cluster.Types() {
				tp, err := prof.Throughput(j.Model, j.ScaleFactor, t, false)
				fits = fits || err == nil && tp > 0 && j.ScaleFactor <= q.Guarantee[t]
			}
			if !fits {
				return sq, fmt.Errorf("--queue-modes static: job %s (%d GPUs of %s) fits on no type of queue %s's guarantee (%v): it would never run on a static partition; give the queue a guarantee it fits in", j.ID, j.ScaleFactor, j.Model, name, q.Guarantee)
			}
		}
	}
	return sq, nil
}

// build makes the scheduler of one run: the policy alone (flat), or
// inside the queues.
func (sq simQueues) build(mode, policy, place string, o registry.Options, pc placement.Config) (round.Scheduler, placement.Placer, error) {
	if mode == modeFlat {
		return registry.Scheduler(policy, place, nil, o, pc)
	}
	cfg := sq.cfg
	cfg.Static = mode == modeStatic
	return registry.Scheduler(policy, place, &cfg, o, pc)
}

// label names a run: the policy (and placement), and the queue mode when
// queues are in play.
func (sq simQueues) label(base, mode string) string {
	if mode == modeFlat && len(sq.cfg.Queues) == 0 {
		return base
	}
	return strings.Join([]string{base, mode}, "+")
}
