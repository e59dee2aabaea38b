// Package lifeline ends a plugin process once the Nomad agent that started
// it is gone. go-plugin servers do not watch their parent: an agent that
// exits without killing its plugins (it fails after loading them, e.g. on
// another plugin's bad config, or it is killed) leaves them running under
// init for good.
package lifeline

import (
	"os"
	"time"

	log "github.com/hashicorp/go-hclog"
)

// Period is how often ExitWithParent looks at the parent.
const Period = time.Second

// Watch calls gone, once, when this process's parent changes (the parent
// exited and the process was reparented), checking every period. It
// returns a function that stops watching.
func Watch(period time.Duration, gone func(oldParent, newParent int)) (stop func()) {
	parent := os.Getppid()
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if now := os.Getppid(); now != parent {
				gone(parent, now)
				return
			}
		}
	}()
	return func() { close(done) }
}

// ExitWithParent exits the process when its parent, the Nomad agent, is
// gone. Call it from a plugin's main before serving; never from a process
// meant to outlive the agent (an executor).
func ExitWithParent(logger log.Logger) {
	Watch(Period, func(oldParent, newParent int) {
		logger.Info("Nomad agent gone; plugin exiting", "agent_pid", oldParent, "new_parent_pid", newParent)
		os.Exit(0)
	})
}
