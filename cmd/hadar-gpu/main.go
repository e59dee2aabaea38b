// Command hadar-gpu is hadar's Nomad device plugin; install it in the
// agent's plugin_dir (see docs/driver.md).
package main

import (
	"github.com/hadar-sched/hadar/driver/device"
	"github.com/hadar-sched/hadar/driver/lifeline"
	"github.com/hadar-sched/hadar/driver/plugin"
)

func main() {
	logger := plugin.NewLogger()
	// The agent does not always kill its plugins (it leaves them
	// running when it fails after loading them).
	lifeline.ExitWithParent(logger)
	plugin.Serve(device.New(logger), logger)
}
