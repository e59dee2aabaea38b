package nomadclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// JWKSPath is where every Nomad agent serves the public keys of the
// workload identities it signs.
const JWKSPath = "/.well-known/jwks.json"

// ClusterJWKSURL is the JWKS URL of the Nomad whose HTTP API is at
// address: what the sidecar's auth method must trust. The servers fetch
// it themselves, so it is the cluster's address as the operator reaches
// it, not the 127.0.0.1:4646 of a default agent.
func ClusterJWKSURL(address string) string {
	return strings.TrimRight(address, "/") + JWKSPath
}

// AuthMethodProblem is why the auth method cannot turn the sidecar's
// workload identity into a token, in one line that says the fix.
type AuthMethodProblem struct {
	Method, JWKSURL, Want string
	// Why the JWKS URL is not the cluster's: unreachable from here, or
	// serving keys that are not the cluster's.
	Why string
}

func (p *AuthMethodProblem) Error() string {
	return fmt.Sprintf("the auth method %q's JWKS URL %s is not this cluster's (%s): set it to %s (hadar auth-method -fix, or \"JWKSURL\" in deploy/hadar-auth-method.json and nomad acl auth-method update -config @deploy/hadar-auth-method.json %s)",
		p.Method, p.JWKSURL, p.Why, p.Want, p.Method)
}

// CheckAuthMethod reads the JWT auth method the sidecar logs in to (an
// operator's token: reading an auth method's configuration takes a
// management token) and checks that its JWKS URL serves the keys of the
// cluster c talks to. A URL other than the cluster's own address passes
// when it serves the same keys (a load balancer, another server), seen
// from here: the servers fetch it from where they run. It answers an
// *AuthMethodProblem when the URL is not the cluster's.
func CheckAuthMethod(ctx context.Context, c *api.Client, method string) (*api.ACLAuthMethod, error) {
	m, _, err := c.ACLAuthMethods().Get(method, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("reading auth method %q (docs/deploy.md, step 4; reading it takes a management token): %w", method, err)
	}
	if m == nil || m.Config == nil {
		return m, fmt.Errorf("auth method %q has no configuration", method)
	}
	want := ClusterJWKSURL(c.Address())
	if m.Config.JWKSURL == want {
		return m, nil
	}
	var cluster jwks
	if _, err := c.Raw().Query(JWKSPath, &cluster, (&api.QueryOptions{}).WithContext(ctx)); err != nil {
		return m, fmt.Errorf("reading the cluster's JWKS at %s: %w", want, err)
	}
	if m.Config.JWKSURL == "" {
		return m, &AuthMethodProblem{Method: method, Want: want, Why: "none set"}
	}
	got, err := fetchJWKS(ctx, m.Config.JWKSURL, m.Config.JWKSCACert)
	if err != nil {
		return m, &AuthMethodProblem{Method: method, JWKSURL: m.Config.JWKSURL, Want: want, Why: "unreachable from here: " + err.Error()}
	}
	if k := cluster.kids(); len(k) == 0 || strings.Join(k, ",") != strings.Join(got.kids(), ",") {
		return m, &AuthMethodProblem{Method: method, JWKSURL: m.Config.JWKSURL, Want: want, Why: "its keys are not the cluster's"}
	}
	return m, nil
}

// FixAuthMethod sets the auth method's JWKS URL to the cluster's (what
// CheckAuthMethod wants), keeping the rest of its configuration.
func FixAuthMethod(ctx context.Context, c *api.Client, m *api.ACLAuthMethod) error {
	m.Config.JWKSURL = ClusterJWKSURL(c.Address())
	if _, _, err := c.ACLAuthMethods().Update(m, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("updating auth method %q: %w", m.Name, err)
	}
	return nil
}

// jwks is the part of a JSON Web Key Set compared: the keys' IDs.
type jwks struct {
	Keys []struct {
		KeyID string `json:"kid"`
	} `json:"keys"`
}

func (j jwks) kids() []string {
	var out []string
	for _, k := range j.Keys {
		out = append(out, k.KeyID)
	}
	sort.Strings(out)
	return out
}

func fetchJWKS(ctx context.Context, url, caPEM string) (jwks, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caPEM != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(caPEM)) {
			return jwks{}, errors.New("its JWKSCACert holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return jwks{}, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return jwks{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return jwks{}, fmt.Errorf("HTTP %s", resp.Status)
	}
	var out jwks
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return jwks{}, fmt.Errorf("not a JWKS: %w", err)
	}
	return out, nil
}

// loginHint is what a failed login adds to its error when Nomad could not
// validate the identity: the usual cause is an auth method whose JWKS URL
// is not the cluster's (deploy/hadar-auth-method.json ships
// 127.0.0.1:4646), which only an operator's token can read and fix.
func loginHint(err error) string {
	if err == nil || !strings.Contains(err.Error(), "unable to validate provided token") {
		return ""
	}
	return "; if the auth method's JWKS URL is not this cluster's, run `hadar auth-method` with an operator's NOMAD_TOKEN to check it and `hadar auth-method -fix` to set it"
}
