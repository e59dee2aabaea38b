// Command hadar-train is hadar's Nomad task driver; install it in the
// agent's plugin_dir (see docs/driver.md). The driver also runs this
// binary as each task's supervisor ("hadar-train supervise <spec>"), a
// process that outlives the plugin so a restarted client reattaches.
package main

import (
	"fmt"
	"os"

	"github.com/hadar-sched/hadar/driver/lifeline"
	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/supervise"
	"github.com/hadar-sched/hadar/driver/train"
	"github.com/hadar-sched/hadar/version"
)

func main() {
	// A supervisor, first of all: it must not serve the plugin protocol
	// nor exit with the agent.
	if len(os.Args) > 1 && os.Args[1] == supervise.Command {
		os.Exit(supervise.Main(os.Args[2:]))
	}
	if version.IsFlag(os.Args[1:]) {
		fmt.Println(version.String(train.PluginName))
		return
	}
	logger := plugin.NewLogger()
	// The agent does not always kill its plugins (it leaves them running
	// when it fails after loading them). Supervisors never get here, so
	// they outlive the plugin as reattaching needs.
	lifeline.ExitWithParent(logger)
	plugin.Serve(train.New(logger), logger)
}
