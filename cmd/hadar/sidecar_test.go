package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/sidecar/status"
)

// The http block's TLS fields reach the listener check, which runs before
// Nomad is contacted: a config file that listens beyond loopback without
// TLS, or with half of it, stops the sidecar with the fix.
func TestSidecarHTTPBlockFromTheConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(args ...string) error {
		var out, errb bytes.Buffer
		// An address nobody answers, and a sidecar that gives up at once:
		// what passes the check goes on to wait for Nomad.
		t.Setenv("NOMAD_ADDR", "http://127.0.0.1:1")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		args = append(args, "-dry-run")
		return runSidecar(ctx, args, &out, &errb)
	}
	open := write("open.hcl", "http {\n  address = \"0.0.0.0:0\"\n}\n")
	if err := run("-config", open); !errors.Is(err, status.ErrInsecure) {
		t.Fatalf("0.0.0.0 without TLS: %v, want ErrInsecure", err)
	}
	half := write("half.hcl", "http {\n  address = \"0.0.0.0:0\"\n  tls_cert = \"/nonexistent/tls.crt\"\n}\n")
	if err := run("-config", half); err == nil || !strings.Contains(err.Error(), "needs both http.tls_cert and http.tls_key") {
		t.Fatalf("cert without key: %v", err)
	}
	// The flag wins over the file: the key named on the command line
	// completes the pair, and the check passes on to contacting Nomad.
	if err := run("-config", half, "-http-tls-key", "/nonexistent/tls.key"); err == nil || strings.Contains(err.Error(), "status API: TLS needs") || errors.Is(err, status.ErrInsecure) {
		t.Fatalf("cert from the file, key from the flag: %v", err)
	}
	optIn := write("optin.hcl", "http {\n  address = \"0.0.0.0:0\"\n  allow_insecure_http = true\n}\n")
	if err := run("-config", optIn); errors.Is(err, status.ErrInsecure) {
		t.Fatalf("allow_insecure_http in the file ignored: %v", err)
	}
}
