package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/agent"
	"github.com/hadar-sched/hadar/sidecar/status"
	"github.com/hadar-sched/hadar/sidecar/telemetry"
)

// sidecarFlags are the flags shared by `hadar sidecar` and `hadar plan`.
type sidecarFlags struct {
	config string
	dryRun bool
	policy string
	round  time.Duration
	http   string
	json   bool
	// The status listener beyond loopback: TLS, or the explicit opt-in to
	// plain HTTP.
	httpCert, httpKey string
	httpInsecure      bool
}

func (f *sidecarFlags) register(fs *flag.FlagSet, daemon bool) {
	fs.StringVar(&f.config, "config", "", "sidecar config file (HCL, docs/sidecar.md); Nomad's NOMAD_* environment variables apply too")
	fs.StringVar(&f.policy, "policy", "", "scheduler (overrides the config; `hadar policies` lists them)")
	fs.DurationVar(&f.round, "round", 0, "round length (overrides the config; default 6m)")
	if daemon {
		fs.BoolVar(&f.dryRun, "dry-run", false, "plan and serve the plan without writing anything to Nomad")
		fs.StringVar(&f.http, "http", "", "status API address (overrides the config; default 127.0.0.1:4650)")
		fs.StringVar(&f.httpCert, "http-tls-cert", "", "TLS certificate (PEM) for the status API: needed to listen beyond loopback")
		fs.StringVar(&f.httpKey, "http-tls-key", "", "TLS key (PEM) for -http-tls-cert")
		fs.BoolVar(&f.httpInsecure, "http-allow-insecure", false, "serve the status API as plain HTTP on an address beyond loopback")
	} else {
		fs.BoolVar(&f.json, "json", false, "print the plan as JSON")
	}
}

// settings reads the config file and applies the flags over it.
func (f *sidecarFlags) settings(dryRun bool) (agent.Settings, error) {
	cfg, err := agent.LoadConfig(f.config)
	if err != nil {
		return agent.Settings{}, err
	}
	if f.policy != "" {
		cfg.Policy = f.policy
	}
	if f.round != 0 {
		cfg.Round = f.round.String()
	}
	if f.http != "" {
		cfg.HTTP.Address = f.http
	}
	cfg.DryRun = cfg.DryRun || dryRun
	return cfg.Resolve()
}

// nomadClient builds the Nomad API client: Nomad's environment variables,
// then the config's nomad block over them.
func nomadClient(s agent.Settings) (*api.Client, error) {
	c := api.DefaultConfig()
	n := s.Nomad
	if n.Address != "" {
		c.Address = n.Address
	}
	if n.Region != "" {
		c.Region = n.Region
	}
	if n.Token != "" {
		c.SecretID = n.Token
	}
	if n.CACert != "" {
		c.TLSConfig.CACert = n.CACert
	}
	if n.ClientCert != "" {
		c.TLSConfig.ClientCert = n.ClientCert
	}
	if n.ClientKey != "" {
		c.TLSConfig.ClientKey = n.ClientKey
	}
	client, err := api.NewClient(c)
	if err != nil {
		return nil, fmt.Errorf("nomad client for %s: %w", c.Address, err)
	}
	return client, nil
}

func runSidecar(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f sidecarFlags
	fs := flag.NewFlagSet("hadar sidecar", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, true)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	s, err := f.settings(f.dryRun)
	if err != nil {
		return err
	}
	listener := status.Listener{Address: s.HTTP.Address, CertFile: cmp.Or(f.httpCert, s.HTTP.TLSCert),
		KeyFile: cmp.Or(f.httpKey, s.HTTP.TLSKey), AllowInsecure: f.httpInsecure || s.HTTP.AllowInsecureHTTP}
	// Before Nomad is contacted: a listener that may not open stops the
	// sidecar at once, with the fix.
	if err := listener.Check(); err != nil {
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "hadar", Level: hclog.LevelFromString(s.LogLevel), Output: stderr})
	client, err := nomadClient(s)
	if err != nil {
		return err
	}
	a, err := agent.New(s, client, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tel, err := telemetry.New(a, telemetry.Options{Policy: s.Policy, Logger: log.Named("telemetry")})
	if err != nil {
		return err
	}
	a.OnCycle(tel.ObserveRound)
	go tel.Run(ctx)
	token := s.Nomad.Token
	if token == "" {
		token = os.Getenv("NOMAD_TOKEN")
	}
	srv := status.New(a, status.Options{Logger: log.Named("http"), Telemetry: tel, Secrets: []string{token}})
	errc := make(chan error, 1)
	go func() {
		err := srv.Serve(ctx, listener, func(addr net.Addr) {
			log.Info("status API listening", "address", listener.Scheme()+"://"+addr.String(), "page", listener.Scheme()+"://"+addr.String()+"/", "metrics", "/metrics")
		})
		if err != nil {
			// A sidecar nobody can see must not go on unseen.
			cancel()
		}
		errc <- err
	}()
	runErr := a.Run(ctx)
	cancel()
	if err := <-errc; err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f sidecarFlags
	fs := flag.NewFlagSet("hadar plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, false)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	s, err := f.settings(true)
	if err != nil {
		return err
	}
	client, err := nomadClient(s)
	if err != nil {
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "hadar", Level: hclog.Warn, Output: stderr})
	a, err := agent.New(s, client, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	p, err := a.PlanOnce(ctx)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(stdout, p)
	}
	var b strings.Builder
	agent.WriteTable(&b, p)
	_, err = io.WriteString(stdout, b.String())
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
