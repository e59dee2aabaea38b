package status

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// nomad is a server with ACLs, for the Nomad token tests; it starts on
// first use.
var nomad = harness.NewShared(harness.Options{Name: "status-acl", Mode: harness.ModeServer, ACL: true})

func TestMain(m *testing.M) { os.Exit(harness.Main(m, nomad)) }

const apiToken = "0123456789abcdef-status-token"

// request is a GET with headers.
func request(t *testing.T, h http.Handler, path string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.String()
}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

// The status API's own token: without it only the health check and the
// page's files answer; with it, everything, and the token itself never
// appears in an answer.
func TestBearerToken(t *testing.T) {
	src := scenario()
	src.obs.Plan.Refused[0].Error += " " + apiToken
	tel, err := telemetry.New(src, telemetry.Options{Policy: "hadar"})
	if err != nil {
		t.Fatal(err)
	}
	h := New(src, Options{Telemetry: tel, Auth: Auth{Token: apiToken}}).Handler()
	for _, tc := range []struct {
		path string
		hdr  map[string]string
		code int
	}{
		{"/v1/health", nil, 200},
		{"/", nil, 200},
		{"/ui/app.js", nil, 200},
		{"/v1/status", nil, 401},
		{"/v1/plan", nil, 401},
		{"/v1/jobs", nil, 401},
		{"/v1/jobs/default/a", nil, 401},
		{"/v1/decisions", nil, 401},
		{"/metrics", nil, 401},
		{"/v1/status", bearer("wrong-token-of-some-length"), 401},
		{"/v1/status", map[string]string{"Authorization": "Basic " + apiToken}, 401},
		{"/v1/status", bearer(apiToken), 200},
		{"/v1/status", map[string]string{"X-Nomad-Token": apiToken}, 200},
		{"/v1/jobs/team/c", bearer(apiToken), 200},
		{"/metrics", bearer(apiToken), 200},
	} {
		code, hdr, body := request(t, h, tc.path, tc.hdr)
		if code != tc.code {
			t.Errorf("GET %s with %v: %d, want %d: %.200s", tc.path, tc.hdr, code, tc.code, body)
		}
		if code == 401 && (!strings.Contains(hdr.Get("WWW-Authenticate"), "Bearer") || !strings.Contains(body, `"error"`)) {
			t.Errorf("GET %s: 401 without WWW-Authenticate or error: %v %s", tc.path, hdr, body)
		}
		if strings.Contains(body, apiToken) {
			t.Errorf("GET %s: the API's token in the answer", tc.path)
		}
	}
	// With the token, nothing is filtered.
	_, _, body := request(t, h, "/v1/status", bearer(apiToken))
	var st wire.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Queue) != 3 || len(st.Racks) != 2 || len(st.Decisions) != 4 || len(st.Refused) != 1 {
		t.Fatalf("an operator's view is filtered: %d queued, %d racks, %d decisions, %d refused", len(st.Queue), len(st.Racks), len(st.Decisions), len(st.Refused))
	}
}

// ?namespace= narrows every list to one namespace, for everyone.
func TestNamespaceParameter(t *testing.T) {
	h := New(scenario(), Options{}).Handler()
	_, _, body := get(t, h, "/v1/status?namespace=team")
	var st wire.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Queue) != 1 || st.Queue[0].ID != "team/c" || len(st.Running) != 0 || len(st.Decisions) != 0 || len(st.Refused) != 0 {
		t.Fatalf("?namespace=team: %+v", st)
	}
	if code, _, _ := get(t, h, "/v1/jobs/default/a?namespace=team"); code != 404 {
		t.Fatalf("a job of another namespace than asked: %d", code)
	}
	var jobs []wire.JobView
	_, _, body = get(t, h, "/v1/jobs?namespace=*")
	if err := json.Unmarshal([]byte(body), &jobs); err != nil || len(jobs) != 4 {
		t.Fatalf("?namespace=*: %d jobs, %v", len(jobs), err)
	}
}

// ca is a certificate authority for the mutual TLS test.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &ca{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client issues a client certificate.
func (c *ca) client(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Mutual TLS: a client certificate of the configured CA gets in; none,
// or one of another CA, does not (with a token also accepted, a caller
// without a certificate may still use the token).
func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	good, other := newCA(t, "clients"), newCA(t, "someone else")
	caFile := filepath.Join(dir, "clients.pem")
	if err := os.WriteFile(caFile, good.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		require bool
		auth    Auth
	}{
		{"certificates only", true, Auth{ClientCerts: true}},
		{"certificates or token", false, Auth{ClientCerts: true, Token: apiToken}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			bound := make(chan net.Addr, 1)
			done := make(chan error, 1)
			srv := New(scenario(), Options{Auth: tc.auth})
			go func() {
				done <- srv.Serve(ctx, Listener{Address: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, ClientCA: caFile, RequireClientCert: tc.require},
					func(a net.Addr) { bound <- a })
			}()
			t.Cleanup(func() { cancel(); <-done })
			var addr net.Addr
			select {
			case addr = <-bound:
			case err := <-done:
				t.Fatal(err)
			}
			url := "https://127.0.0.1:" + strconv.Itoa(addr.(*net.TCPAddr).Port) + "/v1/status"
			call := func(certs []tls.Certificate, hdr map[string]string) (int, error) {
				tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}
				defer tr.CloseIdleConnections()
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				for k, v := range hdr {
					req.Header.Set(k, v)
				}
				resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
				if err != nil {
					return 0, err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode, nil
			}
			if code, err := call([]tls.Certificate{good.client(t, "ops")}, nil); err != nil || code != 200 {
				t.Fatalf("a certificate of the CA: %d, %v", code, err)
			}
			if code, err := call([]tls.Certificate{other.client(t, "mallory")}, nil); err == nil && code == 200 {
				t.Fatal("a certificate of another CA got in")
			}
			code, err := call(nil, nil)
			if err == nil && code == 200 {
				t.Fatal("no certificate and no token got in")
			}
			if tc.require && err == nil {
				t.Fatalf("without a certificate the handshake must fail when certificates are required: %d", code)
			}
			if !tc.require {
				if code, err := call(nil, bearer(apiToken)); err != nil || code != 200 {
					t.Fatalf("the token without a certificate: %d, %v", code, err)
				}
			}
		})
	}
	if err := (Listener{Address: "127.0.0.1:0", ClientCA: caFile}).Check(); err == nil || !strings.Contains(err.Error(), "needs TLS") {
		t.Fatalf("client_ca without TLS: %v", err)
	}
}

// Nomad ACL tokens against a real Nomad server: a token sees the jobs of
// the namespaces it may read there, the nodes only with node read, the
// names of other namespaces' jobs on the GPUs never; a management token
// sees everything; an unknown token, and a revoked one once its answer
// expired, nothing.
func TestNomadTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Nomad agent; skipped with -short")
	}
	srv := nomad.Agent(t)
	mgmt := srv.Client
	if _, err := mgmt.Namespaces().Register(&api.Namespace{Name: "team"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mgmt.Namespaces().Delete("team", nil) })
	policies := map[string]string{
		"default-reader":    `namespace "default" { policy = "read" }`,
		"team-nodes-reader": "namespace \"team\" { capabilities = [\"list-jobs\", \"read-job\"] }\nnode { policy = \"read\" }",
		"team-lister":       `namespace "team" { capabilities = ["list-jobs"] }`,
	}
	tokens := map[string]*api.ACLToken{}
	for name, rules := range policies {
		if _, err := mgmt.ACLPolicies().Upsert(&api.ACLPolicy{Name: name, Rules: rules}, nil); err != nil {
			t.Fatal(err)
		}
		tok, _, err := mgmt.ACLTokens().Create(&api.ACLToken{Name: name, Type: "client", Policies: []string{name}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tok
	}
	t.Cleanup(func() {
		for name, tok := range tokens {
			mgmt.ACLTokens().Delete(tok.AccessorID, nil)
			mgmt.ACLPolicies().Delete(name, nil)
		}
	})
	anon, err := nomadclient.Anonymous(nomadclient.Config{Address: srv.Addr, Token: srv.Token})
	if err != nil {
		t.Fatal(err)
	}
	checker := NewNomadTokens(anon)
	src := scenario()
	// A GPU held by the team's job beside default's.
	src.obs.Nodes[1].GPUs[0].Holders = []wire.Holder{{Job: "team/c", Count: 1, Managed: true}}
	tel, err := telemetry.New(src, telemetry.Options{Policy: "hadar"})
	if err != nil {
		t.Fatal(err)
	}
	h := New(src, Options{Telemetry: tel, Auth: Auth{Nomad: checker}}).Handler()
	status := func(tok string) wire.Status {
		t.Helper()
		code, _, body := request(t, h, "/v1/status", bearer(tok))
		if code != 200 {
			t.Fatalf("GET /v1/status: %d %s", code, body)
		}
		var st wire.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	jobsOf := func(st wire.Status) []string {
		var ids []string
		for _, q := range st.Queue {
			ids = append(ids, q.ID)
		}
		for _, r := range st.Running {
			ids = append(ids, r.ID)
		}
		for _, d := range st.Decisions {
			ids = append(ids, d.Job)
		}
		for _, r := range st.Refused {
			ids = append(ids, r.Job)
		}
		slices.Sort(ids)
		return slices.Compact(ids)
	}
	holders := func(st wire.Status) []string {
		var hs []string
		for _, r := range st.Racks {
			for _, n := range r.Nodes {
				for _, g := range n.GPUs {
					for _, h := range g.Holders {
						hs = append(hs, h.Job+"x"+strconv.Itoa(h.Count))
					}
				}
			}
		}
		slices.Sort(hs)
		return hs
	}
	for _, tc := range []struct {
		name          string
		token         string
		jobs, holders string
		racks         int
		metrics       int
		jobCodes      map[string]int
	}{
		{"default reader", tokens["default-reader"].SecretID, "default/a default/b default/bad default/done default/late", "", 0, 403,
			map[string]int{"/v1/jobs/default/a": 200, "/v1/jobs/team/c": 404, "/v1/jobs/c": 404}},
		{"team reader with node read", tokens["team-nodes-reader"].SecretID, "team/c", "team/cx1 x1 x2", 2, 200,
			map[string]int{"/v1/jobs/default/a": 404, "/v1/jobs/team/c": 200, "/v1/jobs/c": 200}},
		{"list-jobs alone reads nothing", tokens["team-lister"].SecretID, "", "", 0, 403, map[string]int{"/v1/jobs/team/c": 404}},
		{"management", srv.Token, "default/a default/b default/bad default/done default/late team/c", "default/ax2 default/plainx1 team/cx1", 2, 200,
			map[string]int{"/v1/jobs/team/c": 200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := status(tc.token)
			if got := strings.Join(jobsOf(st), " "); got != tc.jobs {
				t.Errorf("jobs shown: %q, want %q", got, tc.jobs)
			}
			if got := strings.Join(holders(st), " "); got != tc.holders || len(st.Racks) != tc.racks {
				t.Errorf("%d racks, holders %q; want %d, %q", len(st.Racks), got, tc.racks, tc.holders)
			}
			if tc.racks == 0 && (len(st.GPUs) != 0 || len(st.Utilisation) != 0) {
				t.Errorf("GPU totals without node read: %+v", st.GPUs)
			}
			if code, _, _ := request(t, h, "/metrics", bearer(tc.token)); code != tc.metrics {
				t.Errorf("/metrics: %d, want %d", code, tc.metrics)
			}
			for path, want := range tc.jobCodes {
				if code, _, body := request(t, h, path, bearer(tc.token)); code != want {
					t.Errorf("GET %s: %d, want %d: %.200s", path, code, want, body)
				}
			}
			var plan wire.PlanView
			_, _, body := request(t, h, "/v1/plan", bearer(tc.token))
			if err := json.Unmarshal([]byte(body), &plan); err != nil {
				t.Fatal(err)
			}
			for _, j := range plan.Jobs {
				if !strings.Contains(tc.jobs, j.ID) {
					t.Errorf("/v1/plan shows %s", j.ID)
				}
			}
		})
	}
	if code, _, _ := request(t, h, "/v1/status", bearer("5f1c0e2a-0000-4c1e-8a55-000000000000")); code != 401 {
		t.Errorf("an unknown token: %d", code)
	}
	if code, _, _ := request(t, h, "/v1/status", nil); code != 401 {
		t.Errorf("no token: %d", code)
	}
	// Revoked: refused once the cached answer expired.
	rev := tokens["default-reader"]
	if _, err := mgmt.ACLTokens().Delete(rev.AccessorID, nil); err != nil {
		t.Fatal(err)
	}
	checker.clock = func() time.Time { return time.Now().Add(2 * NomadTokensTTL) }
	if code, _, _ := request(t, h, "/v1/status", bearer(rev.SecretID)); code != 401 {
		t.Errorf("a revoked token: %d", code)
	}
}
