package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
)

// validateQueues checks the queue blocks with planner/queue's own rules
// (the simulator reads the same blocks) and each queue's policy against
// the schedulers there are: a bad block stops the sidecar at start.
func (c *Config) validateQueues() error {
	c.QueueConfig = queue.Config{}
	if len(c.Queues) == 0 {
		return nil
	}
	qc, err := queue.FromBlocks(c.Queues)
	if err != nil {
		return fmt.Errorf("sidecar config: %w", err)
	}
	for _, q := range qc.Queues {
		if q.Policy != "" && !slices.Contains(registry.Names(), q.Policy) {
			return fmt.Errorf("sidecar config: queue %q: policy %q: want one of %s (or none: the sidecar's policy)", q.Name, q.Policy, strings.Join(registry.Names(), ", "))
		}
	}
	c.QueueConfig = qc
	return nil
}
