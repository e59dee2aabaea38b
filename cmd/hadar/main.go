// Command hadar is hadar's command-line tool: the trace-driven simulator,
// the sidecar, and a dry-run planner against a live cluster.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hadar-sched/hadar/version"
)

const usage = `usage: hadar <command> [flags]

commands:
  sim      replay a trace (or synthetic jobs) through several policies and compare them
  sidecar  run the daemon that makes Nomad run the planner's decisions (docs/sidecar.md)
  plan     dry run against a live Nomad cluster: what the next round would do, and why
  status   what a running sidecar shows: GPUs, running jobs, the queue and why (docs/status.md)
  policies list the policies hadar sim knows
  auth-method check (-fix: set) the sidecar's auth method's JWKS URL against this cluster (docs/deploy.md)
  profile  export what a running sidecar learned of throughputs as a profile file (docs/formats.md)
  netmodel calibrate: print the network model's fit to Gavel's throughputs
  version  print hadar's release (also -version)

Run 'hadar <command> -h' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "sim":
		err = runSim(ctx, args[1:], stdout, stderr)
	case "sidecar":
		err = runSidecar(ctx, args[1:], stdout, stderr)
	case "plan":
		err = runPlan(ctx, args[1:], stdout, stderr)
	case "status":
		err = runStatus(ctx, args[1:], stdout, stderr)
	case "auth-method":
		err = runAuthMethod(ctx, args[1:], stdout, stderr)
	case "profile":
		err = runProfile(ctx, args[1:], stdout, stderr)
	case "policies":
		err = runPolicies(stdout)
	case "netmodel":
		err = runNetmodel(args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version.String("hadar"))
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "hadar: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		if err == errUsage {
			return 2
		}
		fmt.Fprintf(stderr, "hadar %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
