package nomadclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/nomad/api"
)

// fakeNomad serves an auth method and the cluster's JWKS, and records
// the auth method's updates.
type fakeNomad struct {
	mu      sync.Mutex
	jwksURL string
	kids    []string
	updated string
}

func (f *fakeNomad) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.URL.Path == JWKSPath:
		fmt.Fprint(w, keySet(f.kids...))
	case r.URL.Path == "/v1/acl/auth-method/hadar-workload" && r.Method == http.MethodGet:
		fmt.Fprintf(w, `{"Name":"hadar-workload","Type":"JWT","MaxTokenTTL":"1h0m0s","Config":{"JWKSURL":%q}}`, f.jwksURL)
	case r.URL.Path == "/v1/acl/auth-method/hadar-workload":
		var m struct{ Config struct{ JWKSURL string } }
		json.NewDecoder(r.Body).Decode(&m)
		f.updated = m.Config.JWKSURL
		fmt.Fprintf(w, `{"Name":"hadar-workload","Type":"JWT","MaxTokenTTL":"1h0m0s","Config":{"JWKSURL":%q}}`, f.updated)
	default:
		http.NotFound(w, r)
	}
}

func keySet(kids ...string) string {
	var ks []string
	for _, k := range kids {
		ks = append(ks, fmt.Sprintf(`{"kid":%q,"kty":"OKP"}`, k))
	}
	return `{"keys":[` + strings.Join(ks, ",") + `]}`
}

// The auth method as shipped (127.0.0.1:4646) on a cluster elsewhere is
// refused in one line that names the URL to set; the cluster's own URL,
// or another that serves its keys, passes; -fix sets the cluster's.
func TestCheckAuthMethod(t *testing.T) {
	f := &fakeNomad{kids: []string{"k1", "k2"}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	same := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, keySet("k2", "k1")) }))
	defer same.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, keySet("k9")) }))
	defer other.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + JWKSPath
	dead.Close()
	c, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	want := srv.URL + JWKSPath
	for name, tc := range map[string]struct {
		url, why string
	}{
		"the cluster's":      {want, ""},
		"the same keys":      {same.URL + JWKSPath, ""},
		"unreachable":        {deadURL, "unreachable from here"},
		"another cluster's":  {other.URL + JWKSPath, "its keys are not the cluster's"},
		"none":               {"", "none set"},
		"shipped, elsewhere": {"http://127.0.0.1:4646/.well-known/jwks.json", ""},
	} {
		t.Run(name, func(t *testing.T) {
			f.mu.Lock()
			f.jwksURL = tc.url
			f.mu.Unlock()
			m, err := CheckAuthMethod(context.Background(), c, "hadar-workload")
			if name == "shipped, elsewhere" {
				// Something may listen on 4646 here: whatever it is, it
				// does not serve this fake's keys.
				tc.why = "is not this cluster's"
			}
			if tc.why == "" {
				if err != nil {
					t.Fatalf("CheckAuthMethod: %v", err)
				}
				return
			}
			var p *AuthMethodProblem
			if !errors.As(err, &p) {
				t.Fatalf("CheckAuthMethod = %v, want an AuthMethodProblem", err)
			}
			line := err.Error()
			if strings.Contains(line, "\n") || !strings.Contains(line, tc.why) || !strings.Contains(line, "is not this cluster's") || !strings.Contains(line, "set it to "+want) {
				t.Fatalf("the problem says %q", line)
			}
			if err := FixAuthMethod(context.Background(), c, m); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.updated != want {
				t.Fatalf("-fix set %q, want %q", f.updated, want)
			}
		})
	}
}

// A login Nomad refuses because it cannot validate the identity (its
// JWKS URL unreachable) says how to check the auth method.
func TestLoginHint(t *testing.T) {
	if h := loginHint(errors.New(`Unexpected response code: 401 (rpc error: unable to validate provided token: failed to fetch keys)`)); !strings.Contains(h, "hadar auth-method -fix") {
		t.Fatalf("hint %q", h)
	}
	if h := loginHint(errors.New("Permission denied")); h != "" {
		t.Fatalf("hint %q for another error", h)
	}
}
