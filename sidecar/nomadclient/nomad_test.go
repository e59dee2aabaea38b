package nomadclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// Against real servers of each release line hadar supports, with ACLs: the
// version check accepts them and reads their release; a token without
// node read is refused with the capability named; a token file whose
// token is replaced (the old token deleted from Nomad) authenticates with
// the new one from the next request on.
func TestAgainstNomad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Nomad agents; skipped with -short")
	}
	for _, v := range harness.NomadVersions() {
		t.Run("nomad-"+v, func(t *testing.T) {
			srv := harness.StartAgent(t, harness.Options{Mode: harness.ModeServer, NomadVersion: v, ACL: true})
			mgmt := srv.Client
			for name, rules := range map[string]string{"nodes": `node { policy = "read" }`, "jobs": `namespace "default" { policy = "read" }`} {
				if _, err := mgmt.ACLPolicies().Upsert(&api.ACLPolicy{Name: name, Rules: rules}, nil); err != nil {
					t.Fatal(err)
				}
			}
			token := func(policies ...string) *api.ACLToken {
				t.Helper()
				tok, _, err := mgmt.ACLTokens().Create(&api.ACLToken{Type: "client", Policies: policies}, nil)
				if err != nil {
					t.Fatal(err)
				}
				return tok
			}
			path := filepath.Join(t.TempDir(), "token")
			a := token("nodes")
			writeFile(t, path, a.SecretID)
			c, err := New(Config{Address: srv.Addr, TokenFile: path})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			r, err := Inspect(ctx, c)
			if err != nil || r.Refused != "" || r.Warning != "" || !strings.HasPrefix(r.Oldest, v) {
				t.Fatalf("Inspect = %+v, %v: want Nomad %s accepted without a warning", r, err, v)
			}
			// Renewal: a new token in the file, the old one gone from Nomad.
			b := token("nodes")
			writeFile(t, path, b.SecretID)
			if _, err := mgmt.ACLTokens().Delete(a.AccessorID, nil); err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.Nodes().List(nil); err != nil {
				t.Fatalf("with the renewed token: %v", err)
			}
			// No node read.
			writeFile(t, path, token("jobs").SecretID)
			if err := Check(ctx, c); err == nil || !strings.Contains(err.Error(), "node read") {
				t.Fatalf("Check without node read = %v", err)
			}
		})
	}
}

// signJWT signs claims with key as ES256, the way an identity provider
// (Nomad's own keyring, for workload identities) does.
func signJWT(t *testing.T, key *ecdsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(map[string]string{"alg": "ES256", "typ": "JWT", "kid": "test"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// Login against a real Nomad server's JWT auth method: the identity in the
// file is exchanged for an ACL token, used until the identity is renewed
// (then a new login), and a token Nomad no longer knows is dropped and
// replaced by a new login.
func TestLoginAgainstNomad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Nomad agent; skipped with -short")
	}
	srv := harness.StartAgent(t, harness.Options{Mode: harness.ModeServer, ACL: true})
	mgmt := srv.Client
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pub := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	if _, err := mgmt.ACLPolicies().Upsert(&api.ACLPolicy{Name: "nodes", Rules: `node { policy = "read" }`}, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := mgmt.ACLAuthMethods().Create(&api.ACLAuthMethod{Name: "hadar-workload", Type: "JWT", TokenLocality: "local", MaxTokenTTL: time.Hour,
		Config: &api.ACLAuthMethodConfig{JWTValidationPubKeys: []string{pub}, SigningAlgs: []string{"ES256"}, BoundAudiences: []string{"nomadproject.io"},
			ClaimMappings: map[string]string{"nomad_job_id": "nomad_job_id"}}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := mgmt.ACLBindingRules().Create(&api.ACLBindingRule{AuthMethod: "hadar-workload", BindType: "policy", BindName: "nodes",
		Selector: `value.nomad_job_id == "hadar-sidecar"`}, nil); err != nil {
		t.Fatal(err)
	}
	identity := func(job string) string {
		return signJWT(t, key, map[string]any{"aud": "nomadproject.io", "sub": "global:default:" + job, "nomad_job_id": job,
			"iat": time.Now().Unix(), "nbf": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
	}
	path := filepath.Join(t.TempDir(), "nomad_hadar.jwt")
	writeFile(t, path, identity("hadar-sidecar"))
	c, tr, err := build(Config{Address: srv.Addr, TokenFile: path, AuthMethod: "hadar-workload"}, ownConns)
	if err != nil {
		t.Fatal(err)
	}
	login := tr.(*Login)
	list := func(when string) {
		t.Helper()
		if _, _, err := c.Nodes().List(nil); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	list("first request")
	list("second request")
	if n := login.Logins(); n != 1 {
		t.Fatalf("%d logins for two requests with one identity", n)
	}
	first := login.secret
	if len(first) != 36 {
		t.Fatalf("the login gave %q, not an ACL token's secret", first)
	}
	// Renewed identity: a new login.
	writeFile(t, path, identity("hadar-sidecar"))
	list("after the identity's renewal")
	if n := login.Logins(); n != 2 {
		t.Fatalf("%d logins after a renewal, want 2", n)
	}
	// The token deleted in Nomad: refused once, then a new login.
	self, _, err := mgmt.ACLTokens().Info(accessorOf(t, mgmt, login.secret), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mgmt.ACLTokens().Delete(self.AccessorID, nil); err != nil {
		t.Fatal(err)
	}
	c.Nodes().List(nil)
	list("after the token was deleted")
	if n := login.Logins(); n != 3 {
		t.Fatalf("%d logins after the token was deleted, want 3", n)
	}
	// An identity the binding rule does not match logs in to nothing.
	other := filepath.Join(t.TempDir(), "other.jwt")
	writeFile(t, other, identity("someone-else"))
	c2, err := New(Config{Address: srv.Addr, TokenFile: other, AuthMethod: "hadar-workload"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c2.Nodes().List(nil); err == nil || !strings.Contains(err.Error(), "no role or policy bindings matched") {
		t.Fatalf("another job's identity: %v", err)
	}
}

// accessorOf finds the accessor of a token by its secret.
func accessorOf(t *testing.T, mgmt *api.Client, secret string) string {
	t.Helper()
	toks, _, err := mgmt.ACLTokens().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range toks {
		tok, _, err := mgmt.ACLTokens().Info(s.AccessorID, nil)
		if err == nil && tok.SecretID == secret {
			return s.AccessorID
		}
	}
	t.Fatal("the login's token is not in Nomad's list")
	return ""
}
