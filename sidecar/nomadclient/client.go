// Package nomadclient builds the Nomad API client every hadar command
// uses, from Nomad's own environment variables and hadar's settings over
// them, and checks that the Nomad it reaches is one hadar can work with.
//
// A token can come from a file, read again for every request: that is how
// a sidecar deployed as a Nomad job authenticates with its workload
// identity, whose token Nomad writes into the task's secrets directory and
// rewrites when it renews it (deploy/, docs/deploy.md). The address may be
// the Task API's unix socket (unix://${NOMAD_SECRETS_DIR}/api.sock).
package nomadclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/nomad/api"
)

// Config is where Nomad is and how to authenticate to it.
type Config struct {
	// Address is Nomad's HTTP API: http(s)://host:port, or
	// unix:///path/to/api.sock (the Task API of a task's secrets dir).
	Address   string
	Region    string
	Namespace string
	// Token is an ACL token's secret (NOMAD_TOKEN). TokenFile names a
	// file holding the token instead, read again on every request so a
	// renewed workload identity is used as soon as Nomad writes it.
	Token     string
	TokenFile string
	// AuthMethod, with TokenFile, logs in to this Nomad JWT auth method
	// with the file's workload identity and uses the ACL token it gives
	// (Login).
	AuthMethod string
	// TLS: CA bundle, client certificate and key (mTLS with Nomad), the
	// server name to verify, and verification off (tests only).
	CACert, ClientCert, ClientKey string
	TLSServerName                 string
	SkipVerify                    bool
}

// FromEnv is Nomad's environment variables as a Config, as Nomad's CLI
// reads them: NOMAD_ADDR, NOMAD_REGION, NOMAD_NAMESPACE, NOMAD_TOKEN,
// NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY, NOMAD_TLS_SERVER_NAME,
// NOMAD_SKIP_VERIFY.
func FromEnv(getenv func(string) string) Config {
	skip, _ := strconv.ParseBool(getenv("NOMAD_SKIP_VERIFY"))
	return Config{Address: getenv("NOMAD_ADDR"), Region: getenv("NOMAD_REGION"), Namespace: getenv("NOMAD_NAMESPACE"),
		Token: getenv("NOMAD_TOKEN"), CACert: getenv("NOMAD_CACERT"), ClientCert: getenv("NOMAD_CLIENT_CERT"),
		ClientKey: getenv("NOMAD_CLIENT_KEY"), TLSServerName: getenv("NOMAD_TLS_SERVER_NAME"), SkipVerify: skip}
}

// Over returns c with every field over sets taking its place (a flag or
// the config file over the environment). A token file given over a token
// replaces it, and a token over a token file too: the later source names
// the one way to authenticate.
func (c Config) Over(over Config) Config {
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&c.Address, over.Address)
	set(&c.Region, over.Region)
	set(&c.Namespace, over.Namespace)
	if over.Token != "" || over.TokenFile != "" {
		c.Token, c.TokenFile, c.AuthMethod = over.Token, over.TokenFile, over.AuthMethod
	}
	set(&c.CACert, over.CACert)
	set(&c.ClientCert, over.ClientCert)
	set(&c.ClientKey, over.ClientKey)
	set(&c.TLSServerName, over.TLSServerName)
	c.SkipVerify = c.SkipVerify || over.SkipVerify
	return c
}

// DefaultAddress is Nomad's own default.
const DefaultAddress = "http://127.0.0.1:4646"

// New builds the API client. It does not contact Nomad; a token file is
// checked to be readable now, so a wrong path stops a command at once.
func New(c Config) (*api.Client, error) {
	client, _, err := build(c, ownConns)
	return client, err
}

// How many connections a client opens to its Nomad agent at most, and
// keeps idle between uses. Nomad refuses (429) what one client address
// opens beyond its http_max_conns_per_client, 100 by default, and the
// sidecar's own peaks pass it: 48 writes, 32 progress reads, 8 re-list
// reads and the event stream on its client, up to 50 status-page token
// checks on the anonymous one. So the two share 80, leaving the rest to
// other clients on the address; past its share a request waits for a
// connection under its own context. Kept idle, the connections of one
// progress sweep serve the next instead of being opened again (with TLS,
// a handshake each): the pooled default keeps GOMAXPROCS+1.
const (
	ownConns    = 64
	callerConns = 16
)

// Transport is the HTTP transport New's clients are built on, before
// TLS and authentication: for a test that builds its own client around
// the sidecar (to count its requests) and must connect as it does.
func Transport() *http.Transport { return transport(ownConns) }

// transport is pooled, at most conns connections to a host, all kept
// between uses, and as Nomad's own client: HTTP/1 (its streaming
// endpoints want it), a bounded TLS handshake.
func transport(conns int) *http.Transport {
	tr := cleanhttp.DefaultPooledTransport()
	tr.ForceAttemptHTTP2 = false
	tr.TLSHandshakeTimeout = 10 * time.Second
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = conns, conns
	return tr
}

// build is New, returning the transport that authenticates too.
func build(c Config, conns int) (*api.Client, http.RoundTripper, error) {
	if c.Token != "" && c.TokenFile != "" {
		return nil, nil, errors.New("nomad: both a token and a token file given: keep one (token_file for a workload identity Nomad renews, NOMAD_TOKEN for a fixed token)")
	}
	if c.AuthMethod != "" && c.TokenFile == "" {
		return nil, nil, fmt.Errorf("nomad: auth_method %q needs token_file, the workload identity to log in with", c.AuthMethod)
	}
	if c.Address == "" {
		c.Address = DefaultAddress
	}
	u, err := url.Parse(c.Address)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix") {
		return nil, nil, fmt.Errorf("nomad address %q: want http://host:port, https://host:port or unix:///path/to/api.sock, e.g. %q", c.Address, DefaultAddress)
	}
	tr := transport(conns)
	hc := &http.Client{Transport: tr}
	if u.Scheme == "unix" {
		if u.Path == "" {
			return nil, nil, fmt.Errorf("nomad address %q: a unix socket needs its path, e.g. unix:///alloc/secrets/api.sock", c.Address)
		}
		sock := u.Path
		dialer := &net.Dialer{}
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", sock)
		}
	} else {
		tc := &api.TLSConfig{CACert: c.CACert, ClientCert: c.ClientCert, ClientKey: c.ClientKey, TLSServerName: c.TLSServerName, Insecure: c.SkipVerify}
		if err := api.ConfigureTLS(hc, tc); err != nil {
			return nil, nil, fmt.Errorf("nomad TLS (ca_cert %q, client_cert %q, client_key %q): %w", c.CACert, c.ClientCert, c.ClientKey, err)
		}
	}
	if c.TokenFile != "" {
		tf := &TokenFile{Path: c.TokenFile, Base: tr}
		if _, err := tf.Token(); err != nil {
			return nil, nil, err
		}
		hc.Transport = tf
		if c.AuthMethod != "" {
			hc.Transport = &Login{File: tf, Method: c.AuthMethod, Base: tr, Address: c.Address}
		}
	}
	client, err := api.NewClient(&api.Config{Address: c.Address, Region: c.Region, Namespace: c.Namespace, SecretID: c.Token, HttpClient: hc})
	if err != nil {
		return nil, nil, fmt.Errorf("nomad client for %s: %w", c.Address, err)
	}
	return client, hc.Transport, nil
}

// Anonymous is New without any token: for checking someone else's token
// against Nomad (the status API's callers) with no risk of this process's
// own identity standing in for a caller that sent none.
func Anonymous(c Config) (*api.Client, error) {
	c.Token, c.TokenFile, c.AuthMethod = "", "", ""
	client, _, err := build(c, callerConns)
	return client, err
}

// TokenFile is an http.RoundTripper that authenticates each request with
// the token the file holds at that moment. A request that already carries
// a token (a caller's, set per request) keeps it.
type TokenFile struct {
	Path string
	Base http.RoundTripper

	mu   sync.Mutex
	last string // the last token read whole
}

// tokenHeader is Nomad's authentication header.
const tokenHeader = "X-Nomad-Token"

// Token reads the file. Nomad rewrites it in place (truncate, then
// write), so an empty read is a rewrite in progress: the token read last
// stands in for it.
func (t *TokenFile) Token() (string, error) {
	b, err := os.ReadFile(t.Path)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.last != "" && errors.Is(err, os.ErrNotExist) {
			return t.last, nil
		}
		return "", fmt.Errorf("nomad token_file %s: %w (for a workload identity the task's identity block needs file = true; docs/deploy.md)", t.Path, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		if t.last != "" {
			return t.last, nil
		}
		return "", fmt.Errorf("nomad token_file %s is empty: want the token (an ACL token's secret or a workload identity's JWT)", t.Path)
	}
	for _, r := range tok {
		if r <= ' ' || r > '~' {
			return "", fmt.Errorf("nomad token_file %s: not a token (it holds a space or a control or non-ASCII character; want one ACL secret or JWT)", t.Path)
		}
	}
	t.last = tok
	return tok, nil
}

// RoundTrip implements http.RoundTripper.
func (t *TokenFile) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get(tokenHeader) != "" {
		return t.Base.RoundTrip(req)
	}
	tok, err := t.Token()
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	// A RoundTripper must not change the caller's request.
	r := req.Clone(req.Context())
	r.Header.Set(tokenHeader, tok)
	return t.Base.RoundTrip(r)
}
