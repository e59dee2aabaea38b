package config

import (
	"fmt"

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
		if q.Policy == "" {
			continue // the sidecar's policy
		}
		if err := registry.Check(q.Policy); err != nil {
			return fmt.Errorf("sidecar config: queue %q: policy %q: %w (or none: the sidecar's policy)", q.Name, q.Policy, err)
		}
	}
	c.QueueConfig = qc
	return nil
}
