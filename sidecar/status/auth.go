package status

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Auth is how the status API authenticates its callers beyond the
// listener (docs/status.md, "Authentication"). The zero Auth
// authenticates nobody and lets everyone in: the API's default, on a
// loopback listener. With any method set, every endpoint but /v1/health
// and the page's own files needs a caller one of them accepts.
type Auth struct {
	// Token is a bearer token whose holder sees everything.
	Token string
	// ClientCerts: a caller whose TLS client certificate the listener
	// verified (Listener.ClientCA) sees everything.
	ClientCerts bool
	// Nomad checks Nomad ACL tokens; nil: not accepted.
	Nomad *NomadTokens
}

// enabled reports whether any caller must authenticate.
func (a Auth) enabled() bool { return a.Token != "" || a.ClientCerts || a.Nomad != nil }

// Access is what one caller may see.
type Access struct {
	// All: everything, unfiltered.
	All bool
	// Nodes: the cluster's nodes, racks, GPUs and their use, and the
	// metrics (Nomad's node read).
	Nodes bool
	// namespace says whether the caller may read a namespace's jobs.
	namespace func(ns string) bool
}

// everything is the access of an operator.
func everything() Access { return Access{All: true, Nodes: true} }

// Namespace reports whether the caller may see the jobs of ns.
func (a Access) Namespace(ns string) bool {
	if a.All {
		return true
	}
	return a.namespace != nil && a.namespace(ns)
}

// errUnauthenticated is a request without credentials any method accepts.
var errUnauthenticated = errors.New("authentication required: send Authorization: Bearer <token> (the status API's token, or a Nomad ACL token where the sidecar accepts them), or a client certificate")

// authenticate returns the caller's access, or why it has none: an
// authError with the status code to answer.
func (a Auth) authenticate(r *http.Request) (Access, error) {
	if !a.enabled() {
		return everything(), nil
	}
	if a.ClientCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return everything(), nil
	}
	tok := callerToken(r)
	if tok == "" {
		return Access{}, authError{http.StatusUnauthorized, errUnauthenticated}
	}
	if a.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(a.Token)) == 1 {
		return everything(), nil
	}
	if a.Nomad != nil {
		return a.Nomad.access(r.Context(), tok)
	}
	return Access{}, authError{http.StatusUnauthorized, errors.New("the token is not the status API's token")}
}

// callerToken is the bearer token of Authorization, else X-Nomad-Token
// (what Nomad's own tools send).
func callerToken(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	return strings.TrimSpace(r.Header.Get("X-Nomad-Token"))
}

// authError carries the status code of a refusal.
type authError struct {
	code int
	err  error
}

func (e authError) Error() string { return e.err.Error() }
func (e authError) Unwrap() error { return e.err }

// NomadTokens checks callers' Nomad ACL tokens against Nomad: a token
// must resolve (GET /v1/acl/token/self); its holder sees the jobs of the
// namespaces where the token may read jobs, and the nodes only with node
// read, as Nomad itself decides (each asked with the caller's token: a
// read of a job that does not exist answers 404 where read-job is granted
// and 403 where it is not; a one-node list answers 403 without node
// read). Answers are cached per token for TTL, so a page polling every 2 s
// costs Nomad a few requests a minute.
type NomadTokens struct {
	client *api.Client
	ttl    time.Duration
	clock  func() time.Time

	mu     sync.Mutex
	grants map[[32]byte]*grant
}

// NomadTokensTTL is how long an answer about a token is kept: a revoked
// token or policy takes effect within it.
const NomadTokensTTL = 30 * time.Second

// maxGrants bounds the cache: callers sending random tokens must not grow
// it without end.
const maxGrants = 1024

// probeJob is the job read to ask Nomad whether a token may read jobs in
// a namespace; its existence does not matter (see NomadTokens).
const probeJob = "hadar-status-acl-probe"

// NewNomadTokens checks tokens through client, which must carry no token
// of its own (nomadclient.Anonymous): a caller's missing or refused
// token must never fall back on the sidecar's.
func NewNomadTokens(client *api.Client) *NomadTokens {
	return &NomadTokens{client: client, ttl: NomadTokensTTL, clock: time.Now, grants: map[[32]byte]*grant{}}
}

// grant is what Nomad said about one token.
type grant struct {
	expires time.Time
	err     error // the token is refused
	all     bool  // a management token
	nodes   bool
	mu      sync.Mutex
	ns      map[string]bool
	token   string
	owner   *NomadTokens
}

func (n *NomadTokens) access(ctx context.Context, tok string) (Access, error) {
	g, err := n.grant(ctx, tok)
	if err != nil {
		return Access{}, err
	}
	if g.err != nil {
		return Access{}, authError{http.StatusUnauthorized, g.err}
	}
	if g.all {
		return everything(), nil
	}
	return Access{Nodes: g.nodes, namespace: func(ns string) bool { return g.readable(ctx, ns) }}, nil
}

// grant resolves a token, from the cache while its answer is fresh.
func (n *NomadTokens) grant(ctx context.Context, tok string) (*grant, error) {
	key := sha256.Sum256([]byte(tok))
	now := n.clock()
	n.mu.Lock()
	g := n.grants[key]
	n.mu.Unlock()
	if g != nil && now.Before(g.expires) {
		return g, nil
	}
	g = &grant{expires: now.Add(n.ttl), ns: map[string]bool{}, token: tok, owner: n}
	q := (&api.QueryOptions{AuthToken: tok}).WithContext(ctx)
	self, _, err := n.client.ACLTokens().Self(q)
	switch code := statusOf(err); {
	case err == nil:
		if self.ExpirationTime != nil && self.ExpirationTime.Before(g.expires) {
			g.expires = *self.ExpirationTime
		}
		g.all = self.Type == "management"
		if !g.all {
			_, _, nerr := n.client.Nodes().List((&api.QueryOptions{AuthToken: tok, PerPage: 1}).WithContext(ctx))
			switch c := statusOf(nerr); {
			case nerr == nil:
				g.nodes = true
			case c == http.StatusForbidden:
			default:
				return nil, authError{http.StatusServiceUnavailable, fmt.Errorf("checking the token's node read with Nomad: %v", nerr)}
			}
		}
	case code == http.StatusForbidden || code == http.StatusNotFound || code == http.StatusUnauthorized:
		// A refusal is cached briefly too: a caller retrying a bad token
		// must not turn into as many requests to Nomad.
		g.err = errors.New("the token is not one Nomad accepts (unknown, expired or revoked)")
	case code == http.StatusBadRequest && strings.Contains(strings.ToLower(err.Error()), "acl support disabled"):
		return nil, authError{http.StatusServiceUnavailable, errors.New("nomad_auth: Nomad has ACLs disabled, so it cannot vouch for any token: turn http.nomad_auth off and use http.auth_token or client certificates")}
	default:
		return nil, authError{http.StatusServiceUnavailable, fmt.Errorf("checking the token with Nomad: %v", err)}
	}
	n.mu.Lock()
	if len(n.grants) >= maxGrants {
		for k, old := range n.grants {
			if !now.Before(old.expires) || len(n.grants) >= maxGrants {
				delete(n.grants, k)
			}
		}
	}
	n.grants[key] = g
	n.mu.Unlock()
	return g, nil
}

// readable asks Nomad (once per namespace while the grant is fresh)
// whether the token may read jobs in ns. An error asking counts as no,
// uncached.
func (g *grant) readable(ctx context.Context, ns string) bool {
	g.mu.Lock()
	ok, known := g.ns[ns]
	g.mu.Unlock()
	if known {
		return ok
	}
	q := (&api.QueryOptions{AuthToken: g.token, Namespace: ns}).WithContext(ctx)
	_, _, err := g.owner.client.Jobs().Info(probeJob, q)
	switch code := statusOf(err); {
	case err == nil || code == http.StatusNotFound:
		ok = true
	case code == http.StatusForbidden:
		ok = false
	default:
		return false
	}
	g.mu.Lock()
	g.ns[ns] = ok
	g.mu.Unlock()
	return ok
}

// statusOf is the HTTP status of a Nomad API error (0 when it has none).
func statusOf(err error) int {
	var ue api.UnexpectedResponseError
	if errors.As(err, &ue) && ue.HasStatusCode() {
		return ue.StatusCode()
	}
	var uep *api.UnexpectedResponseError
	if errors.As(err, &uep) && uep.HasStatusCode() {
		return uep.StatusCode()
	}
	return 0
}
