package nomadclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Login authenticates requests with an ACL token obtained by logging in
// to a Nomad JWT auth method with the workload identity of a token file
// (POST /v1/acl/login), instead of sending the identity itself. Nomad up
// to 1.11.3 refuses a workload identity on some endpoints hadar needs
// (planning a job: "acl token lookup failed: index error: UUID must be 36
// characters", hashicorp/nomad#28139), while an auth method that trusts
// Nomad's own identities (its JWKS) turns the identity into a regular,
// short-lived ACL token (docs/deploy.md, "The auth method").
//
// It logs in again when Nomad renewed the identity, when two thirds of
// the ACL token's life have passed, or when Nomad answers that the token
// expired or is gone.
type Login struct {
	File   *TokenFile
	Method string
	// Base is the transport to Nomad, Address Nomad's address (for the
	// login request itself).
	Base    http.RoundTripper
	Address string

	clock func() time.Time

	mu      sync.Mutex
	jwt     string // the identity the token was obtained with
	secret  string
	renewAt time.Time
	expires time.Time
	logins  int
}

func (l *Login) now() time.Time {
	if l.clock != nil {
		return l.clock()
	}
	return time.Now()
}

// Token returns the current ACL token, logging in when it must.
func (l *Login) Token(ctx context.Context) (string, error) {
	jwt, err := l.File.Token()
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.secret != "" && jwt == l.jwt && now.Before(l.renewAt) {
		return l.secret, nil
	}
	tok, err := l.login(ctx, jwt)
	if err != nil {
		// The token in hand still works until it expires: a login that
		// fails (Nomad restarting) does not stop the sidecar at once.
		if l.secret != "" && now.Before(l.expires) {
			return l.secret, nil
		}
		return "", err
	}
	l.jwt, l.secret, l.logins = jwt, tok.SecretID, l.logins+1
	l.expires = now.Add(time.Hour)
	if tok.ExpirationTime != nil {
		l.expires = *tok.ExpirationTime
	}
	l.renewAt = now.Add(l.expires.Sub(now) * 2 / 3)
	return l.secret, nil
}

func (l *Login) login(ctx context.Context, jwt string) (*api.ACLToken, error) {
	c, err := api.NewClient(&api.Config{Address: l.Address, HttpClient: &http.Client{Transport: l.Base}})
	if err != nil {
		return nil, err
	}
	// The identity goes along as the request's token too: the Task API's
	// socket lets no request through without one.
	tok, _, err := c.ACLAuth().Login(&api.ACLLoginRequest{AuthMethodName: l.Method, LoginToken: jwt}, (&api.WriteOptions{AuthToken: jwt}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("nomad: logging in to auth method %q with the workload identity of %s: %w (the auth method and its binding rule: docs/deploy.md%s)", l.Method, l.File.Path, err, loginHint(err))
	}
	if tok == nil || tok.SecretID == "" {
		return nil, fmt.Errorf("nomad: auth method %q answered the login without a token", l.Method)
	}
	return tok, nil
}

// known asks Nomad whether it still knows the token (GET
// /v1/acl/token/self answers it).
func (l *Login) known(ctx context.Context, secret string) bool {
	c, err := api.NewClient(&api.Config{Address: l.Address, HttpClient: &http.Client{Transport: l.Base}})
	if err != nil {
		return true
	}
	_, _, err = c.ACLTokens().Self((&api.QueryOptions{AuthToken: secret}).WithContext(ctx))
	var ue api.UnexpectedResponseError
	if errors.As(err, &ue) && (ue.StatusCode() == http.StatusForbidden || ue.StatusCode() == http.StatusNotFound) {
		return false
	}
	return true
}

// forget drops the token if it is still secret (Nomad refused it).
func (l *Login) forget(secret string) {
	l.mu.Lock()
	if l.secret == secret {
		l.secret = ""
	}
	l.mu.Unlock()
}

// Logins counts the logins made (tests, logs).
func (l *Login) Logins() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.logins
}

// RoundTrip implements http.RoundTripper.
func (l *Login) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get(tokenHeader) != "" {
		return l.Base.RoundTrip(req)
	}
	secret, err := l.Token(req.Context())
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Header.Set(tokenHeader, secret)
	resp, err := l.Base.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		return resp, err
	}
	// A refused token (expired, or deleted: Nomad says only "Permission
	// denied" then) is dropped, so the next request logs in again; a
	// refusal of the operation to a token Nomad still knows keeps it.
	if !l.known(req.Context(), secret) {
		l.forget(secret)
	}
	return resp, nil
}
