package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// `hadar auth-method` on a cluster whose API is not at 127.0.0.1:4646,
// with the auth method as deploy/ ships it: one line on stderr that says
// the JWKS URL is not this cluster's and which to set; -fix sets it, and
// the check then passes.
func TestAuthMethodCommand(t *testing.T) {
	var mu sync.Mutex
	jwksURL := "http://127.0.0.1:1/.well-known/jwks.json" // nothing listens on port 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.URL.Path == "/.well-known/jwks.json":
			fmt.Fprint(w, `{"keys":[{"kid":"k1","kty":"OKP"}]}`)
		case r.URL.Path == "/v1/acl/auth-method/hadar-workload" && r.Method == http.MethodGet:
			fmt.Fprintf(w, `{"Name":"hadar-workload","Type":"JWT","MaxTokenTTL":"1h0m0s","Config":{"JWKSURL":%q}}`, jwksURL)
		case r.URL.Path == "/v1/acl/auth-method/hadar-workload":
			var m struct{ Config struct{ JWKSURL string } }
			json.NewDecoder(r.Body).Decode(&m)
			jwksURL = m.Config.JWKSURL
			fmt.Fprint(w, `{}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	t.Setenv("NOMAD_ADDR", srv.URL)
	t.Setenv("NOMAD_TOKEN", "")
	want := srv.URL + "/.well-known/jwks.json"

	code, out, errOut := runHadar("auth-method")
	if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 ||
		!strings.Contains(errOut, "JWKS URL http://127.0.0.1:1/.well-known/jwks.json is not this cluster's") || !strings.Contains(errOut, "set it to "+want) {
		t.Fatalf("hadar auth-method: %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, errOut := runHadar("auth-method", "-fix"); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("hadar auth-method -fix: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runHadar("auth-method"); code != 0 || !strings.Contains(out, "serves this cluster's keys") {
		t.Fatalf("hadar auth-method after -fix: %d %q %q", code, out, errOut)
	}
}
