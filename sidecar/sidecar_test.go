package sidecar

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
)

// The Nomad connection: NOMAD_* first, the config file's nomad block over
// it, flags over both; a token file in the file replaces NOMAD_TOKEN.
func TestNomadConfigPrecedence(t *testing.T) {
	env := map[string]string{"NOMAD_ADDR": "http://env:4646", "NOMAD_TOKEN": "env-token", "NOMAD_REGION": "env-region"}
	getenv := func(k string) string { return env[k] }
	s := config.Config{Cluster: config.Cluster{Nomad: &config.NomadConfig{Address: "https://file:4646", TokenFile: "/secrets/nomad_hadar.jwt"}}}
	got := NomadConfig(s, getenv, nomadclient.Config{})
	if got.Address != "https://file:4646" || got.Token != "" || got.TokenFile != "/secrets/nomad_hadar.jwt" || got.Region != "env-region" {
		t.Fatalf("file over env: %+v", got)
	}
	got = NomadConfig(s, getenv, nomadclient.Config{Address: "http://flag:4646", Token: "flag-token"})
	if got.Address != "http://flag:4646" || got.Token != "flag-token" || got.TokenFile != "" {
		t.Fatalf("flags over file: %+v", got)
	}
}

// Flags win over the http block; client certificates are required only
// when nothing else authenticates.
func TestStatusListener(t *testing.T) {
	s := config.Config{Service: config.Service{HTTP: &config.HTTPConfig{}}}
	s.HTTP.Address, s.HTTP.TLSCert, s.HTTP.TLSKey, s.HTTP.ClientCA = "0.0.0.0:4650", "file.pem", "file.key", "ca.pem"
	l := StatusListener(s, "flag.pem", "", false)
	if l.CertFile != "flag.pem" || l.KeyFile != "file.key" || !l.RequireClientCert || l.AllowInsecure {
		t.Fatalf("listener: %+v", l)
	}
	s.HTTP.AuthToken = "tok"
	if l := StatusListener(s, "", "", true); l.RequireClientCert || !l.AllowInsecure || l.CertFile != "file.pem" {
		t.Fatalf("with a token: %+v", l)
	}
}

// A sidecar whose listener may not open stops before contacting Nomad,
// naming the fix.
func TestRunRefusesAnOpenListener(t *testing.T) {
	s := config.Config{Service: config.Service{HTTP: &config.HTTPConfig{Address: "0.0.0.0:4650"}}}
	err := Run(context.Background(), Options{Config: s, Nomad: nomadclient.Config{Address: "http://127.0.0.1:1"}, Listener: StatusListener(s, "", "", false)})
	if err == nil || !strings.Contains(err.Error(), "tls") {
		t.Fatalf("Run with plain HTTP beyond loopback: %v", err)
	}
}

func TestRetryFor(t *testing.T) {
	calls := 0
	err := retryFor(context.Background(), time.Second, time.Millisecond, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("retryFor: %v after %d calls", err, calls)
	}
	calls = 0
	err = retryFor(context.Background(), 20*time.Millisecond, 5*time.Millisecond, func() error { calls++; return errors.New("never") })
	if err == nil || err.Error() != "never" || calls < 2 {
		t.Fatalf("retryFor past its time: %v after %d calls", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := retryFor(ctx, time.Minute, time.Minute, func() error { return errors.New("down") }); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "down") {
		t.Fatalf("retryFor cancelled: %v", err)
	}
}
