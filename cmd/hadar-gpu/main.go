// Command hadar-gpu is hadar's Nomad device plugin; install it in the
// agent's plugin_dir (see docs/driver.md).
package main

import (
	"fmt"
	"os"

	"github.com/hadar-sched/hadar/driver/device"
	"github.com/hadar-sched/hadar/driver/lifeline"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/version"
)

func main() {
	// Nomad starts a plugin without arguments; an operator checking the
	// installed release runs it with -version.
	if version.IsFlag(os.Args[1:]) {
		fmt.Println(version.String(device.PluginName))
		return
	}
	logger := plugin.NewLogger()
	// The agent does not always kill its plugins (it leaves them
	// running when it fails after loading them).
	lifeline.ExitWithParent(logger)
	plugin.Serve(device.New(logger), logger)
}
