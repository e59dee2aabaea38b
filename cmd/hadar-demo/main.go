// Command hadar-demo runs hadar on a local Nomad cluster for a person to
// watch (docs/demo.md): `make demo` builds what it needs and runs it.
//
//	hadar-demo [flags]          run the demo
//	hadar-demo stop [-out DIR]  stop a running demo, and remove what any demo left
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hadar-sched/hadar/internal/demo"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if version.IsFlag(args) {
		fmt.Fprintln(stdout, version.String("hadar-demo"))
		return 0
	}
	if len(args) > 0 && args[0] == "stop" {
		if err := stop(args[1:], stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "hadar-demo stop: %v\n", err)
			return 1
		}
		return 0
	}
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "hadar-demo: %v\n", err)
		return 2
	}
	o.Stdout = stdout
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(stderr, "\nhadar-demo: %v: stopping everything (again to kill it all at once)\n", s)
		cancel()
		<-sigs
		// The orderly stop is taking too long for the person: kill what
		// this demo started, now.
		st, err := demo.ReadState(demo.StateFile(o.Out))
		if err == nil {
			left := demo.Clean(demo.Scope{Run: st.Run, Dirs: []string{st.Dir}, Ports: st.Ports})
			_ = os.Remove(demo.StateFile(o.Out))
			if len(left) > 0 {
				fmt.Fprintf(stderr, "hadar-demo: still left: %v\n", left)
			}
		}
		os.Exit(130)
	}()
	if err := demo.Run(ctx, o); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "hadar-demo: interrupted\n")
			if strings.Contains(err.Error(), "left behind") {
				fmt.Fprintf(stderr, "hadar-demo: %v\n", err)
			}
			return 130
		}
		fmt.Fprintf(stderr, "hadar-demo: %v\n", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (demo.Options, error) {
	fs := flag.NewFlagSet("hadar-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: hadar-demo [flags]   (hadar-demo stop [-out DIR] stops a running demo)\n\n")
		fs.PrintDefaults()
	}
	s := demo.DefaultSettings
	var o demo.Options
	var workload, ports string
	fs.StringVar(&o.Out, "out", "out/demo", "directory for the logs, the summary, its plots and the state file")
	fs.StringVar(&o.Repo, "repo", "", "repository root (jobspecs/); default: found from the working directory")
	fs.StringVar(&o.Bin, "bin", "", "directory holding nomad, hadar, hadar-trainer and plugins/; default <repo>/bin")
	fs.StringVar(&workload, "workload", "full", "the jobs: full (a few minutes, forks and preemptions) or short (the tests')")
	fs.StringVar(&s.Policy, "policy", s.Policy, "the sidecar's scheduler (`hadar policies`)")
	fs.StringVar(&s.Placement, "placement", s.Placement, "the sidecar's placement policy")
	fs.DurationVar(&s.Round, "round", s.Round, "the sidecar's round length")
	fs.StringVar(&s.HTTPAddr, "http", "127.0.0.1:4650", "the sidecar's status page and API")
	fs.StringVar(&ports, "nomad-ports", "", "Nomad's ports, comma-separated: the server's http,rpc,serf then 3 per client (default 4646-4648 and 4661-4672)")
	fs.BoolVar(&o.Baseline, "baseline", true, "run the same jobs again under Nomad's own placement")
	fs.DurationVar(&o.BaselineLimit, "baseline-limit", 0, "stop Nomad's own run after this long (0: the larger of 3m and 1.5 times the hadar run's makespan)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (flags only; hadar-demo stop stops a demo)", fs.Arg(0))
	}
	w, ok := demo.Workloads[workload]
	if !ok {
		return o, fmt.Errorf("-workload %q: want full or short", workload)
	}
	o.Workload, o.Settings = w, s
	o.NomadPorts = demo.DefaultNomadPorts()
	if ports != "" {
		o.NomadPorts = nil
		for _, p := range strings.Split(ports, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n <= 0 || n > 65535 {
				return o, fmt.Errorf("-nomad-ports: %q is not a port", p)
			}
			o.NomadPorts = append(o.NomadPorts, n)
		}
	}
	if o.Repo == "" {
		root, err := hostpath.RepoRoot()
		if err != nil {
			return o, fmt.Errorf("%w: run from the checkout, or give -repo", err)
		}
		o.Repo = root
	}
	if o.Bin == "" {
		o.Bin = filepath.Join(o.Repo, "bin")
	}
	return o, nil
}

// stop stops the demo recorded under -out (it tears itself down), then
// removes whatever it, or any demo whose process is gone, left.
func stop(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hadar-demo stop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "out/demo", "the demo's output directory (its state file is there)")
	wait := fs.Duration("wait", 2*time.Minute, "how long a running demo gets to stop by itself")
	if err := fs.Parse(args); err != nil {
		return err
	}
	scope := demo.Scope{Orphans: true}
	st, err := demo.ReadState(demo.StateFile(*out))
	switch {
	case err == nil:
		scope.Run, scope.Dirs, scope.Ports = st.Run, []string{st.Dir}, st.Ports
		if syscall.Kill(st.PID, 0) == nil {
			fmt.Fprintf(stdout, "stopping the demo (pid %d) ...\n", st.PID)
			_ = syscall.Kill(st.PID, syscall.SIGTERM)
			deadline := time.Now().Add(*wait)
			for syscall.Kill(st.PID, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(250 * time.Millisecond)
			}
			if syscall.Kill(st.PID, 0) == nil {
				fmt.Fprintf(stdout, "the demo did not stop within %s: killing it\n", *wait)
				_ = syscall.Kill(st.PID, syscall.SIGKILL)
			}
		}
	case errors.Is(err, os.ErrNotExist):
		fmt.Fprintf(stdout, "no demo state in %s: looking for what demos whose process is gone left\n", *out)
	default:
		return err
	}
	found := demo.Find(scope)
	for _, l := range found {
		fmt.Fprintf(stdout, "  removing %s\n", l)
	}
	left := demo.Clean(scope)
	_ = os.Remove(demo.StateFile(*out))
	if len(left) > 0 {
		return fmt.Errorf("could not remove: %v", left)
	}
	fmt.Fprintf(stdout, "no demo process, mount, cgroup or port left\n")
	return nil
}
