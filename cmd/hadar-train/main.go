// Command hadar-train is hadar's Nomad task driver; install it in the
// agent's plugin_dir (see docs/driver.md). The driver also runs this
// binary as each task's supervisor ("hadar-train supervise ...").
package main

import (
	"os"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/hadar-sched/hadar/driver/lifeline"
	"github.com/hadar-sched/hadar/driver/train"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == train.SupervisorArg {
		os.Exit(train.Supervise(os.Args[2:]))
	}
	plugins.Serve(func(logger log.Logger) interface{} {
		lifeline.ExitWithParent(logger)
		return train.New(logger)
	})
}
