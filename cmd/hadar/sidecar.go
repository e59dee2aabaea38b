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

	"github.com/hadar-sched/hadar/internal/version"
	"github.com/hadar-sched/hadar/sidecar/agent"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
	"github.com/hadar-sched/hadar/sidecar/status"
	"github.com/hadar-sched/hadar/sidecar/telemetry"
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

// settings reads the config file and applies the flags over it.
func (f *sidecarFlags) settings(dryRun bool) (config.Settings, error) {
	cfg, err := config.LoadConfig(f.config)
	if err != nil {
		return config.Settings{}, err
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

// nomadConfig is the Nomad connection: Nomad's environment variables,
// the config's nomad block over them, the flags over both.
func nomadConfig(s config.Settings, flags nomadclient.Config) nomadclient.Config {
	n := s.Nomad
	file := nomadclient.Config{Address: n.Address, Region: n.Region, Token: n.Token, TokenFile: n.TokenFile, AuthMethod: n.AuthMethod,
		CACert: n.CACert, ClientCert: n.ClientCert, ClientKey: n.ClientKey}
	return nomadclient.FromEnv(os.Getenv).Over(file).Over(flags)
}

// checkNomad refuses a Nomad hadar cannot work with (nomadclient.Check),
// and logs a release it is not tested on. Nomad not answering yet (a
// sidecar started beside it) is retried for a minute.
func checkNomad(ctx context.Context, client *api.Client, log hclog.Logger) error {
	var r nomadclient.Report
	err := retryFor(ctx, time.Minute, func() error {
		var err error
		r, err = nomadclient.Inspect(ctx, client)
		if err != nil && !strings.Contains(err.Error(), "permission denied") {
			log.Warn("Nomad's version: not read yet, retrying", "error", err)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if r.Refused != "" {
		return errors.New(r.Refused)
	}
	if r.Warning != "" {
		log.Warn(r.Warning)
	}
	log.Info("Nomad", "region", r.Region, "servers", len(r.Servers), "oldest", r.Oldest)
	return nil
}

// retryFor calls f until it returns nil, ctx ends, or within has
// passed (then f's last error), every 2 seconds.
func retryFor(ctx context.Context, within time.Duration, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(2 * time.Second):
		}
	}
}

// statusAuth is the status API's authentication from the http block.
func statusAuth(s config.Settings, nc nomadclient.Config) (status.Auth, error) {
	auth := status.Auth{Token: s.HTTP.AuthToken, ClientCerts: s.HTTP.ClientCA != ""}
	if s.HTTP.NomadAuth {
		anon, err := nomadclient.Anonymous(nc)
		if err != nil {
			return auth, err
		}
		auth.Nomad = status.NewNomadTokens(anon)
	}
	return auth, nil
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
		KeyFile: cmp.Or(f.httpKey, s.HTTP.TLSKey), AllowInsecure: f.httpInsecure || s.HTTP.AllowInsecureHTTP,
		ClientCA: s.HTTP.ClientCA, RequireClientCert: s.HTTP.ClientCA != "" && s.HTTP.AuthToken == "" && !s.HTTP.NomadAuth}
	// Before Nomad is contacted: a listener that may not open stops the
	// sidecar at once, with the fix.
	if err := listener.Check(); err != nil {
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "hadar", Level: hclog.LevelFromString(s.LogLevel), Output: stderr})
	log.Info("hadar sidecar", "version", version.Version())
	nc := nomadConfig(s, nomadclient.Config{})
	client, err := nomadclient.New(nc)
	if err != nil {
		return err
	}
	auth, err := statusAuth(s, nc)
	if err != nil {
		return err
	}
	if err := checkNomad(ctx, client, log); err != nil {
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
	secrets := []string{nc.Token}
	if nc.TokenFile != "" {
		if tok, err := (&nomadclient.TokenFile{Path: nc.TokenFile}).Token(); err == nil {
			secrets = append(secrets, tok)
		}
	}
	srv := status.New(a, status.Options{Logger: log.Named("http"), Telemetry: tel, Secrets: secrets, Auth: auth})
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
	client, err := nomadclient.New(nomadConfig(s, f.nomad))
	if err != nil {
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "hadar", Level: hclog.Warn, Output: stderr})
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := nomadclient.Check(ctx, client); err != nil {
		return err
	}
	a, err := agent.New(s, client, log)
	if err != nil {
		return err
	}
	p, err := a.PlanOnce(ctx)
	if err != nil {
		return err
	}
	p = onlyNamespace(p, namespaceOf(f.namespace))
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

// onlyNamespace keeps the jobs of one namespace ("" keeps every one).
func onlyNamespace(p wire.PlanView, ns string) wire.PlanView {
	if ns == "" {
		return p
	}
	jobs, refused := []wire.JobView{}, []wire.RefusedJob{}
	for _, j := range p.Jobs {
		if strings.HasPrefix(j.ID, ns+"/") {
			jobs = append(jobs, j)
		}
	}
	for _, r := range p.Refused {
		if strings.HasPrefix(r.Job, ns+"/") {
			refused = append(refused, r)
		}
	}
	p.Jobs, p.Refused = jobs, refused
	return p
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
