package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/hadar-sched/hadar/sidecar/nomadclient"
)

// runAuthMethod is `hadar auth-method`: checks that the JWT auth method
// the sidecar logs in to trusts this cluster's keys, and with -fix sets
// its JWKS URL to the cluster's. Without it, a sidecar on a cluster whose
// API is not at 127.0.0.1:4646 (the address deploy/hadar-auth-method.json
// ships) never logs in and stays unhealthy, its log repeating a failed
// login every 2 s.
func runAuthMethod(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hadar auth-method", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "hadar-workload", "the auth method (the jobspec's auth_method)")
	fix := fs.Bool("fix", false, "set the auth method's JWKS URL to this cluster's ($NOMAD_ADDR/.well-known/jwks.json) when it is not")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: hadar auth-method [-name hadar-workload] [-fix]\n\nChecks, with Nomad's environment (NOMAD_ADDR, NOMAD_TOKEN: a management token), that the sidecar's JWT auth method fetches this cluster's keys.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	c, err := nomadclient.New(nomadclient.FromEnv(os.Getenv))
	if err != nil {
		return err
	}
	m, err := nomadclient.CheckAuthMethod(ctx, c, *name)
	var problem *nomadclient.AuthMethodProblem
	if err == nil {
		fmt.Fprintf(stdout, "auth method %q: its JWKS URL %s serves this cluster's keys\n", *name, m.Config.JWKSURL)
		return nil
	}
	if !*fix || !errors.As(err, &problem) {
		return err
	}
	if err := nomadclient.FixAuthMethod(ctx, c, m); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "auth method %q: JWKS URL %s, was %s\n", *name, m.Config.JWKSURL, problem.JWKSURL)
	return nil
}
