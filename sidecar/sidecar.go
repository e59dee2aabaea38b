// Package sidecar assembles the daemon from its parts: the agent (the
// rounds), its telemetry and the status API, over one Nomad client. The
// CLI (cmd/hadar) parses flags into Options and calls Run or Plan; the
// parts stay in their own packages (README.md beside this file).
package sidecar

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/agent"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
	"github.com/hadar-sched/hadar/sidecar/status"
	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/wire"
	"github.com/hadar-sched/hadar/version"
)

// Options is one sidecar: its configuration, resolved
// (config.Config.Resolve), the Nomad connection (NomadConfig) and the
// status API's listener (StatusListener).
type Options struct {
	Config   config.Config
	Nomad    nomadclient.Config
	Listener status.Listener
	Logger   hclog.Logger
}

// NomadConfig is the Nomad connection: Nomad's environment variables
// (getenv), the config's nomad block over them, flags over both.
func NomadConfig(s config.Config, getenv func(string) string, flags nomadclient.Config) nomadclient.Config {
	n := s.Nomad
	file := nomadclient.Config{Address: n.Address, Region: n.Region, Token: n.Token, TokenFile: n.TokenFile, AuthMethod: n.AuthMethod,
		CACert: n.CACert, ClientCert: n.ClientCert, ClientKey: n.ClientKey}
	return nomadclient.FromEnv(getenv).Over(file).Over(flags)
}

// StatusListener is the status API's listener from the http block;
// certFile, keyFile and allowInsecure (flags) win over the block's.
func StatusListener(s config.Config, certFile, keyFile string, allowInsecure bool) status.Listener {
	h := s.HTTP
	return status.Listener{Address: h.Address, CertFile: cmp.Or(certFile, h.TLSCert), KeyFile: cmp.Or(keyFile, h.TLSKey),
		AllowInsecure: allowInsecure || h.AllowInsecureHTTP, ClientCA: h.ClientCA,
		// Client certificates are the only credential when no token is.
		RequireClientCert: h.ClientCA != "" && h.AuthToken == "" && !h.NomadAuth}
}

// Run runs the sidecar until ctx ends or a part fails: the status API
// failing to serve stops it (a sidecar nobody can see must not go on
// unseen).
func Run(ctx context.Context, o Options) error {
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	// Before Nomad is contacted: a listener that may not open stops the
	// sidecar at once, with the fix.
	if err := o.Listener.Check(); err != nil {
		return err
	}
	log.Info("hadar sidecar", "version", version.Version())
	client, err := nomadclient.New(o.Nomad)
	if err != nil {
		return err
	}
	auth, err := statusAuth(o.Config, o.Nomad)
	if err != nil {
		return err
	}
	if err := checkNomad(ctx, client, log); err != nil {
		return err
	}
	a, err := agent.New(o.Config, client, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tel, err := telemetry.New(a, telemetry.Options{Policy: o.Config.Policy, Logger: log.Named("telemetry")})
	if err != nil {
		return err
	}
	a.OnCycle(tel.ObserveRound)
	go tel.Run(ctx)
	srv := status.New(a, status.Options{Logger: log.Named("http"), Telemetry: tel, Secrets: secrets(o.Nomad), Auth: auth})
	errc := make(chan error, 1)
	go func() {
		l := o.Listener
		err := srv.Serve(ctx, l, func(addr net.Addr) {
			url := l.Scheme() + "://" + addr.String()
			log.Info("status API listening", "address", url, "page", url+"/", "metrics", "/metrics")
		})
		if err != nil {
			cancel()
		}
		errc <- err
	}()
	runErr := a.Run(ctx)
	cancel()
	if err := <-errc; err != nil && runErr == nil {
		runErr = fmt.Errorf("status API: %w", err)
	}
	return runErr
}

// Plan is one round planned and not acted on (hadar plan): what the
// sidecar would do now. It gives up after a minute.
func Plan(ctx context.Context, s config.Config, nc nomadclient.Config, log hclog.Logger) (wire.PlanView, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s.DryRun = true
	client, err := nomadclient.New(nc)
	if err != nil {
		return wire.PlanView{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := nomadclient.Check(ctx, client); err != nil {
		return wire.PlanView{}, err
	}
	a, err := agent.New(s, client, log)
	if err != nil {
		return wire.PlanView{}, err
	}
	return a.PlanOnce(ctx)
}

// secrets are the strings the status API never shows: the Nomad token,
// from the config or its file.
func secrets(nc nomadclient.Config) []string {
	out := []string{nc.Token}
	if nc.TokenFile != "" {
		if tok, err := (&nomadclient.TokenFile{Path: nc.TokenFile}).Token(); err == nil {
			out = append(out, tok)
		}
	}
	return out
}

// statusAuth is the status API's authentication from the http block.
func statusAuth(s config.Config, nc nomadclient.Config) (status.Auth, error) {
	auth := status.Auth{Token: s.HTTP.AuthToken, ClientCerts: s.HTTP.ClientCA != ""}
	if s.HTTP.NomadAuth {
		anon, err := nomadclient.Anonymous(nc)
		if err != nil {
			return auth, fmt.Errorf("http.nomad_auth: %w", err)
		}
		auth.Nomad = status.NewNomadTokens(anon)
	}
	return auth, nil
}

// checkNomad refuses a Nomad hadar cannot work with (nomadclient.Check),
// and logs a release it is not tested on. Nomad not answering yet (a
// sidecar started beside it) is retried for a minute.
func checkNomad(ctx context.Context, client *api.Client, log hclog.Logger) error {
	var r nomadclient.Report
	err := retryFor(ctx, time.Minute, 2*time.Second, func() error {
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

// retryFor calls f until it returns nil, ctx ends, or within has passed
// (then f's last error), every interval.
func retryFor(ctx context.Context, within, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}
