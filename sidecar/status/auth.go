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

	"github.com/hadar-sched/hadar/sidecar/nomadclient"
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
		return Access{}, authError{code: http.StatusUnauthorized, err: errUnauthenticated}
	}
	if a.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(a.Token)) == 1 {
		return everything(), nil
	}
	if a.Nomad != nil {
		return a.Nomad.access(r.Context(), tok)
	}
	return Access{}, authError{code: http.StatusUnauthorized, err: errors.New("the token is not the status API's token")}
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
	code       int
	err        error
	retryAfter time.Duration // with 429: when to try again
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
//
// Anyone who reaches the listener can send tokens, so what they cost is
// bounded: lookups of tokens without a grant here share a token bucket
// (over it: 429), refusals are kept apart from grants for a short while,
// and a grant is evicted only for another grant, never for a refusal,
// callers seen again before newer ones.
type NomadTokens struct {
	client *api.Client
	ttl    time.Duration
	clock  func() time.Time

	mu      sync.Mutex
	grants  map[[32]byte]*grant
	refused map[[32]byte]time.Time // until when a refusal is answered from here
	bucket  bucket
}

// NomadTokensTTL is how long an answer about a token is kept: a revoked
// token or policy takes effect within it.
const NomadTokensTTL = 30 * time.Second

// refusedTTL is how long a refusal is kept: long enough that a caller
// retrying a bad token costs Nomad little, short enough that a token made
// just after a first try soon works.
const refusedTTL = 10 * time.Second

// maxGrants bounds the caches: callers sending random tokens must not grow
// them without end.
const maxGrants = 1024

// lookupRate and lookupBurst bound the lookups of unseen tokens (each one
// a few requests to Nomad): a page opened by many people at once passes,
// a flood of made-up tokens costs Nomad at most lookupRate a second.
const (
	lookupRate  = 10
	lookupBurst = 50
)

// probeJob is the job read to ask Nomad whether a token may read jobs in
// a namespace; its existence does not matter (see NomadTokens).
const probeJob = "hadar-status-acl-probe"

// NewNomadTokens checks tokens through client, which must carry no token
// of its own (nomadclient.Anonymous): a caller's missing or refused
// token must never fall back on the sidecar's.
func NewNomadTokens(client *api.Client) *NomadTokens {
	return &NomadTokens{
		client:  client,
		ttl:     NomadTokensTTL,
		clock:   time.Now,
		grants:  map[[32]byte]*grant{},
		refused: map[[32]byte]time.Time{},
		bucket:  bucket{rate: lookupRate, burst: lookupBurst, tokens: lookupBurst},
	}
}

// grant is what Nomad said about one token it accepted.
type grant struct {
	expires time.Time
	all     bool // a management token
	nodes   bool
	mu      sync.Mutex
	ns      map[string]bool
	token   string
	owner   *NomadTokens

	// Under owner.mu: when the grant was last used, and whether it was
	// used again after the lookup that made it (a caller that came back:
	// evicted only once no newcomer is left).
	used     time.Time
	returned bool
}

// errTokenRefused is Nomad's refusal of a token.
var errTokenRefused = errors.New("the token is not one Nomad accepts (unknown, expired or revoked)")

func (n *NomadTokens) access(ctx context.Context, tok string) (Access, error) {
	g, err := n.grant(ctx, tok)
	if err != nil {
		return Access{}, err
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
	if g != nil {
		g.used = now
		if now.Before(g.expires) {
			g.returned = true
			n.mu.Unlock()
			return g, nil
		}
		// An expired grant is a caller seen before: its refresh is not
		// held to the limit on unseen tokens, so a flood cannot lock out
		// the callers already here.
	} else if until, ok := n.refused[key]; ok && now.Before(until) {
		n.mu.Unlock()
		return nil, authError{code: http.StatusUnauthorized, err: errTokenRefused}
	} else if wait, ok := n.bucket.take(now); !ok {
		n.mu.Unlock()
		return nil, authError{code: http.StatusTooManyRequests, retryAfter: wait,
			err: errors.New("too many unknown tokens to check with Nomad at the moment: retry later")}
	}
	n.mu.Unlock()

	fresh := &grant{expires: now.Add(n.ttl), ns: map[string]bool{}, token: tok, owner: n, used: now}
	q := (&api.QueryOptions{AuthToken: tok}).WithContext(ctx)
	self, _, err := n.client.ACLTokens().Self(q)
	switch code := statusOf(err); {
	case err == nil:
		if self.ExpirationTime != nil && self.ExpirationTime.Before(fresh.expires) {
			fresh.expires = *self.ExpirationTime
		}
		fresh.all = self.Type == "management"
		if !fresh.all {
			_, _, nerr := n.client.Nodes().List((&api.QueryOptions{AuthToken: tok, PerPage: 1}).WithContext(ctx))
			switch c := statusOf(nerr); {
			case nerr == nil:
				fresh.nodes = true
			case c == http.StatusForbidden:
			default:
				return nil, authError{code: http.StatusServiceUnavailable, err: fmt.Errorf("checking the token's node read with Nomad: %w", nerr)}
			}
		}
	case code == http.StatusForbidden || code == http.StatusNotFound || code == http.StatusUnauthorized:
		// A refusal is cached briefly too, apart from the grants: a caller
		// retrying a bad token must not turn into as many requests to
		// Nomad, nor push out a grant.
		n.mu.Lock()
		delete(n.grants, key)
		n.refuse(key, now)
		n.mu.Unlock()
		return nil, authError{code: http.StatusUnauthorized, err: errTokenRefused}
	case code == http.StatusBadRequest && strings.Contains(strings.ToLower(err.Error()), "acl support disabled"):
		return nil, authError{code: http.StatusServiceUnavailable, err: errors.New("nomad_auth: Nomad has ACLs disabled, so it cannot vouch for any token: turn http.nomad_auth off and use http.auth_token or client certificates")}
	default:
		return nil, authError{code: http.StatusServiceUnavailable, err: fmt.Errorf("checking the token with Nomad: %w", err)}
	}
	n.mu.Lock()
	if g != nil {
		// A refresh keeps the caller's standing.
		fresh.returned = g.returned
	}
	if _, ok := n.grants[key]; !ok && len(n.grants) >= maxGrants {
		n.evict(now)
	}
	n.grants[key] = fresh
	n.mu.Unlock()
	return fresh, nil
}

// evict drops one grant, under n.mu: an expired one if any, else the
// least recently used of the callers seen only once, else the least
// recently used of all. A caller that keeps polling is the last to go.
func (n *NomadTokens) evict(now time.Time) {
	var victim [32]byte
	var worst *grant
	rank := func(g *grant) int {
		switch {
		case !now.Before(g.expires):
			return 0
		case !g.returned:
			return 1
		}
		return 2
	}
	for k, g := range n.grants {
		if worst == nil || rank(g) < rank(worst) || rank(g) == rank(worst) && g.used.Before(worst.used) {
			victim, worst = k, g
		}
	}
	if worst != nil {
		delete(n.grants, victim)
	}
}

// refuse records a refusal, under n.mu, within maxGrants entries: the
// expired ones go first, then any (a refusal forgotten costs one more
// lookup, still under the limit).
func (n *NomadTokens) refuse(key [32]byte, now time.Time) {
	if len(n.refused) >= maxGrants {
		for k, until := range n.refused {
			if !now.Before(until) {
				delete(n.refused, k)
			}
		}
		for k := range n.refused {
			if len(n.refused) < maxGrants {
				break
			}
			delete(n.refused, k)
		}
	}
	n.refused[key] = now.Add(refusedTTL)
}

// bucket is a token bucket: rate a second, at most burst at once.
type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

// take spends one token at now, or says how long until one is there.
func (b *bucket) take(now time.Time) (time.Duration, bool) {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second)), false
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
func statusOf(err error) int { return nomadclient.StatusCode(err) }
