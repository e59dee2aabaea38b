// Command hadar-gpu is hadar's Nomad device plugin; install it in the
// agent's plugin_dir (see docs/driver.md).
package main

import (
	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/hadar-sched/hadar/driver/device"
	"github.com/hadar-sched/hadar/driver/lifeline"
)

func main() {
	plugins.Serve(func(logger log.Logger) interface{} {
		// The agent does not always kill its plugins (it leaves them
		// running when it fails after loading them).
		lifeline.ExitWithParent(logger)
		return device.New(logger)
	})
}
