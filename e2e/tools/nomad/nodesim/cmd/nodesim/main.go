// Command nodesim registers simulated Nomad client nodes with GPUs against
// a real Nomad server and runs the allocations placed on them as simulated
// training tasks (package nodesim). It runs until SIGINT or SIGTERM, then
// prints its counters as JSON on stdout.
//
//	nodesim -spec cluster.json -server 127.0.0.1:4647 -compress 60 -restart-cost 20s -events events.jsonl
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/e2e/tools/nomad/nodesim"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "nodesim:", err)
		os.Exit(1)
	}
}

func run() error {
	spec := flag.String("spec", "", "cluster spec: JSON file of nodes with racks, addresses and GPUs (required)")
	servers := flag.String("server", "127.0.0.1:4647", "Nomad server RPC addresses, comma-separated")
	region := flag.String("region", "global", "Nomad region")
	driver := flag.String("driver", "nodesim", "task driver the nodes advertise and run")
	compress := flag.Float64("compress", 1, "simulated seconds per wall second")
	restart := flag.Duration("restart-cost", 20*time.Second, "simulated time a unit restores its checkpoint before making progress")
	rdv := flag.Duration("rendezvous-timeout", 30*time.Minute, "simulated time a worker waits for the rest of its unit before it fails (torch.distributed's default); 0: forever")
	events := flag.String("events", "", "event log file (JSON lines); empty: none")
	ready := flag.String("ready", "", "file written once every node is ready (for scripts and tests)")
	level := flag.String("log-level", "info", "log level: trace, debug, info, warn, error")
	flag.Parse()
	if *spec == "" {
		return fmt.Errorf("-spec is required: a JSON file of nodes (see package nodesim's Spec)")
	}
	s, err := nodesim.LoadSpec(*spec)
	if err != nil {
		return err
	}
	cfg := nodesim.Config{Servers: strings.Split(*servers, ","), Region: *region, Driver: *driver, Compression: *compress, RestartCost: *restart, RendezvousTimeout: *rdv,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "nodesim", Level: hclog.LevelFromString(*level), Output: os.Stderr})}
	if *events != "" {
		f, err := os.OpenFile(*events, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("-events: %w", err)
		}
		defer f.Close()
		cfg.Events = f
	}
	sim, err := nodesim.New(cfg, s)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *ready != "" {
		go func() {
			select {
			case <-sim.Ready():
				if err := os.WriteFile(*ready, []byte("ready\n"), 0o644); err != nil {
					cfg.Logger.Error("writing the ready file failed", "error", err)
				}
			case <-ctx.Done():
			}
		}()
	}
	err = sim.Run(ctx)
	if b, jerr := json.Marshal(sim.Stats()); jerr == nil {
		fmt.Println(string(b))
	}
	if err != nil {
		return err
	}
	return sim.EventErr()
}
