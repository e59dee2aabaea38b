package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"

	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/sidecar/config"
)

// runProfile is `hadar profile export`: what a running sidecar learned,
// as a profile file (docs/formats.md, "The learned table"), read from its
// status API.
func runProfile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "export" {
		fmt.Fprint(stderr, "usage: hadar profile export [flags]\n\nWrites what a running sidecar learned of throughputs as a profile file: load it as another cluster's profile_overlay.\n")
		return errUsage
	}
	fs := flag.NewFlagSet("hadar profile export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c statusConn
	fs.StringVar(&c.addr, "address", "", "the sidecar's status API: host:port, or an http:// or https:// URL (default $HADAR_ADDR, else "+config.DefaultHTTPAddress+")")
	fs.StringVar(&c.token, "token", "", "token for a status API that asks for one (default $HADAR_TOKEN, else $NOMAD_TOKEN); the table needs node read")
	fs.StringVar(&c.caCert, "ca-cert", "", "CA certificate (PEM) to verify an https status API with (default $HADAR_CACERT)")
	fs.StringVar(&c.clientCert, "client-cert", "", "client certificate (PEM) for a status API that checks them (default $HADAR_CLIENT_CERT)")
	fs.StringVar(&c.clientKey, "client-key", "", "key of -client-cert (default $HADAR_CLIENT_KEY)")
	ref := fs.String("reference", "", "GPU type the exported relative speeds are against (default: the first of the cluster's types with a figure)")
	out := fs.String("o", "", "write the profile to this file (default: standard output)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: hadar profile export takes flags only", fs.Arg(0))
	}
	c = c.withEnv(os.Getenv)
	base, client, err := statusClient(c)
	if err != nil {
		return err
	}
	path := "/v1/profile/export"
	if *ref != "" {
		path += "?reference=" + url.QueryEscape(*ref)
	}
	body, err := fetchStatus(ctx, client, base, path, c.token)
	if err != nil {
		return err
	}
	// What is written must load as a profile: check it before it lands.
	if _, err := profile.Parse(body); err != nil {
		return fmt.Errorf("the sidecar at %s answered a profile that does not load: %w", base, err)
	}
	if *out == "" {
		_, err := stdout.Write(body)
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(*out), ".hadar-profile-*")
	if err != nil {
		return fmt.Errorf("-o %s: %w", *out, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("-o %s: %w", *out, err)
	}
	if _, err := tmp.Write(body); err != nil {
		tmp.Close()
		return fmt.Errorf("-o %s: %w", *out, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("-o %s: %w", *out, err)
	}
	// Renamed into place: a sidecar reloading it as its overlay never
	// reads half a file.
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return fmt.Errorf("-o %s: %w", *out, err)
	}
	return nil
}
