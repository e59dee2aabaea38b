package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	for _, arg := range []string{"version", "-version", "--version"} {
		code, out, _ := runHadar(arg)
		if code != 0 || !strings.HasPrefix(out, "hadar v") || !strings.Contains(out, "linux/") {
			t.Errorf("hadar %s: %d %q", arg, code, out)
		}
	}
}

// `hadar status` as Nomad users expect: the token from -token, else
// HADAR_TOKEN, else NOMAD_TOKEN, sent as a bearer token; the address from
// -address (or -addr), else HADAR_ADDR; the namespace from -namespace,
// else HADAR_NAMESPACE, else NOMAD_NAMESPACE, sent as ?namespace=.
func TestStatusFlagsAndEnvironment(t *testing.T) {
	var mu sync.Mutex
	var auth, query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth, query = r.Header.Get("Authorization"), r.URL.RawQuery
		mu.Unlock()
		if r.Header.Get("Authorization") == "" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error": "authentication required"}`))
			return
		}
		w.Write([]byte(`{"sidecar": {"ok": true}, "gpus": [], "racks": [], "queue": [], "running": [], "refused": [], "decisions": []}`))
	}))
	t.Cleanup(srv.Close)
	for _, k := range []string{"HADAR_ADDR", "HADAR_TOKEN", "NOMAD_TOKEN", "HADAR_NAMESPACE", "NOMAD_NAMESPACE"} {
		t.Setenv(k, "")
	}
	for _, tc := range []struct {
		name        string
		env         map[string]string
		args        []string
		auth, query string
		code        int
	}{
		{"no token", nil, []string{"-address", srv.URL}, "", "", 1},
		{"-token", nil, []string{"-addr", srv.URL, "-token", "flag-tok"}, "Bearer flag-tok", "", 0},
		{"HADAR_TOKEN over NOMAD_TOKEN", map[string]string{"HADAR_TOKEN": "h", "NOMAD_TOKEN": "n"}, []string{"-address", srv.URL}, "Bearer h", "", 0},
		{"NOMAD_TOKEN", map[string]string{"NOMAD_TOKEN": "n"}, []string{"-address", srv.URL}, "Bearer n", "", 0},
		{"HADAR_ADDR", map[string]string{"HADAR_ADDR": srv.URL, "NOMAD_TOKEN": "n"}, nil, "Bearer n", "", 0},
		{"-namespace", map[string]string{"NOMAD_TOKEN": "n", "NOMAD_NAMESPACE": "env"}, []string{"-address", srv.URL, "-namespace", "team"}, "Bearer n", "namespace=team", 0},
		{"HADAR_NAMESPACE over NOMAD_NAMESPACE", map[string]string{"NOMAD_TOKEN": "n", "HADAR_NAMESPACE": "ml", "NOMAD_NAMESPACE": "env"}, []string{"-address", srv.URL}, "Bearer n", "namespace=ml", 0},
		{"* is every namespace", map[string]string{"NOMAD_TOKEN": "n", "NOMAD_NAMESPACE": "*"}, []string{"-address", srv.URL}, "Bearer n", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, out, errs := runHadar(append([]string{"status"}, tc.args...)...)
			mu.Lock()
			gotAuth, gotQuery := auth, query
			mu.Unlock()
			if code != tc.code || gotAuth != tc.auth || gotQuery != tc.query {
				t.Fatalf("exit %d (want %d), Authorization %q (want %q), query %q (want %q)\n%s%s", code, tc.code, gotAuth, tc.auth, gotQuery, tc.query, out, errs)
			}
			if code == 1 && !strings.Contains(errs, "give -token, HADAR_TOKEN or NOMAD_TOKEN") {
				t.Fatalf("a refusal without the fix: %s", errs)
			}
		})
	}
	if code, _, errs := runHadar("status", "-address", srv.URL, "-client-cert", "/x.pem"); code != 1 || !strings.Contains(errs, "go together") {
		t.Errorf("-client-cert without -client-key: %d %s", code, errs)
	}
}

// The new fields of the config are checked before anything starts.
func TestSidecarConfigRefusals(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ body, want string }{
		"token and token file": {"nomad {\n  token = \"abc\"\n  token_file = \"/s/t\"\n}\n", "nomad.token and nomad.token_file both set"},
		"client CA, no TLS":    {"http {\n  client_ca = \"/ca.pem\"\n}\n", "needs TLS on the listener"},
		"short auth token":     {"http {\n  auth_token = \"short\"\n}\n", "want at least 16"},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".hcl")
			if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errs := runHadar("sidecar", "-config", p)
			if code != 1 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, want 1 with %q:\n%s%s", code, tc.want, out, errs)
			}
		})
	}
}
