package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/sidecar"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
	"github.com/hadar-sched/hadar/sidecar/wire"
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
	// Nomad's connection, as Nomad's CLI takes it (hadar plan): over the
	// config file's nomad block, which is over NOMAD_* (the environment).
	nomad     nomadclient.Config
	namespace string
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
		fs.StringVar(&f.nomad.Address, "address", "", "Nomad's HTTP API (overrides the config's nomad.address and NOMAD_ADDR)")
		fs.StringVar(&f.nomad.Region, "region", "", "Nomad region (overrides nomad.region and NOMAD_REGION)")
		fs.StringVar(&f.nomad.Token, "token", "", "Nomad ACL token (overrides nomad.token and NOMAD_TOKEN; better in NOMAD_TOKEN: a flag shows in ps)")
		fs.StringVar(&f.nomad.CACert, "ca-cert", "", "CA certificate to verify Nomad's TLS (overrides NOMAD_CACERT)")
		fs.StringVar(&f.nomad.ClientCert, "client-cert", "", "client certificate for Nomad's mutual TLS (overrides NOMAD_CLIENT_CERT)")
		fs.StringVar(&f.nomad.ClientKey, "client-key", "", "client key for -client-cert (overrides NOMAD_CLIENT_KEY)")
		fs.StringVar(&f.namespace, "namespace", "", "show only the jobs of this namespace (default $HADAR_NAMESPACE, else $NOMAD_NAMESPACE, else all; \"*\" for all); the plan is the whole cluster's either way")
	}
}

// settings reads the config file, sets the flags over it, then defaults
// and checks the result (config.Config.Resolve): the dry run comes first
// because the state store's default depends on it.
func (f *sidecarFlags) settings(dryRun bool) (config.Config, error) {
	cfg, err := config.LoadConfig(f.config)
	if err != nil {
		return config.Config{}, err
	}
	if f.policy != "" {
		cfg.Policy = f.policy
	}
	if f.round != 0 {
		cfg.Round = config.Duration(f.round.String())
	}
	if f.http != "" {
		cfg.HTTP = cmp.Or(cfg.HTTP, &config.HTTPConfig{}) // no http block in the file
		cfg.HTTP.Address = f.http
	}
	cfg.DryRun = cfg.DryRun || dryRun
	return cfg.Resolve()
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
	log := hclog.New(&hclog.LoggerOptions{Name: "hadar", Level: hclog.LevelFromString(s.LogLevel), Output: stderr})
	return sidecar.Run(ctx, sidecar.Options{Config: s, Nomad: sidecar.NomadConfig(s, os.Getenv, nomadclient.Config{}),
		Listener: sidecar.StatusListener(s, f.httpCert, f.httpKey, f.httpInsecure), Logger: log})
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
	log := hclog.New(&hclog.LoggerOptions{Name: "hadar", Level: hclog.Warn, Output: stderr})
	p, err := sidecar.Plan(ctx, s, sidecar.NomadConfig(s, os.Getenv, f.nomad), log)
	if err != nil {
		return err
	}
	p = p.InNamespace(namespaceOf(f.namespace))
	if f.json {
		return writeJSON(stdout, p)
	}
	var b strings.Builder
	wire.WriteTable(&b, p)
	_, err = io.WriteString(stdout, b.String())
	return err
}

// namespaceOf is the namespace a CLI shows: the flag, else HADAR_NAMESPACE,
// else NOMAD_NAMESPACE, else every one ("" or "*").
func namespaceOf(flag string) string {
	ns := cmp.Or(flag, os.Getenv("HADAR_NAMESPACE"), os.Getenv("NOMAD_NAMESPACE"))
	if ns == "*" {
		return ""
	}
	return ns
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
