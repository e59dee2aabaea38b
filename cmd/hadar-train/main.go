// Command hadar-train is hadar's Nomad task driver; install it in the
// agent's plugin_dir (see docs/driver.md). The driver also runs this
// binary as each task's executor ("hadar-train executor <config>", taken
// over by Nomad's executor package before main runs).
package main

import (
	"os"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/hadar-sched/hadar/driver/lifeline"
	"github.com/hadar-sched/hadar/driver/train"
)

func main() {
	// Before a task's program starts, the driver runs this binary to
	// check it can, and as the shim that switches the task to its user.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case train.DropArg:
			os.Exit(train.DropPrivileges(os.Args[2:]))
		case train.CheckArg:
			os.Exit(train.CheckAccess(os.Args[2:]))
		}
	}
	plugins.Serve(func(logger log.Logger) interface{} {
		// The agent does not always kill its plugins (it leaves them
		// running when it fails after loading them). Executors never get
		// here, so they outlive the plugin as reattaching needs.
		lifeline.ExitWithParent(logger)
		return train.New(logger)
	})
}
