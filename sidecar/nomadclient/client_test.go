package nomadclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// tokenEcho serves Nomad's /v1/status/leader, recording the token of
// every request.
type tokenEcho struct {
	mu     sync.Mutex
	tokens []string
}

func (e *tokenEcho) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.tokens = append(e.tokens, r.Header.Get("X-Nomad-Token"))
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode("127.0.0.1:4647")
}

func (e *tokenEcho) last() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.tokens) == 0 {
		return "<none>"
	}
	return e.tokens[len(e.tokens)-1]
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The token file is read on every request: a token Nomad renews (it
// rewrites the file in place) is used from the next request on; a file
// caught empty mid-rewrite, or removed, leaves the last token in use; a
// request carrying its own token keeps it.
func TestTokenFileFollowsRenewals(t *testing.T) {
	echo := &tokenEcho{}
	srv := httptest.NewServer(echo)
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "nomad_hadar.jwt")
	writeFile(t, path, "aaa.bbb.ccc\n")
	c, err := New(Config{Address: srv.URL, TokenFile: path})
	if err != nil {
		t.Fatal(err)
	}
	leader := func(q *api.QueryOptions) {
		t.Helper()
		if _, err := c.Status().Leader(); q == nil && err != nil {
			t.Fatal(err)
		}
		if q != nil {
			var out string
			if _, err := c.Raw().Query("/v1/status/leader", &out, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	steps := []struct {
		name  string
		write func()
		q     *api.QueryOptions
		want  string
	}{
		{"first token", func() {}, nil, "aaa.bbb.ccc"},
		{"renewed", func() { writeFile(t, path, "ddd.eee.fff") }, nil, "ddd.eee.fff"},
		{"mid-rewrite (empty)", func() { writeFile(t, path, "") }, nil, "ddd.eee.fff"},
		{"rewritten", func() { writeFile(t, path, "ggg.hhh.iii") }, nil, "ggg.hhh.iii"},
		{"a caller's own token", func() {}, &api.QueryOptions{AuthToken: "caller-secret"}, "caller-secret"},
		{"removed", func() { os.Remove(path) }, nil, "ggg.hhh.iii"},
	}
	for _, s := range steps {
		s.write()
		leader(s.q)
		if got := echo.last(); got != s.want {
			t.Fatalf("%s: request carried token %q, want %q", s.name, got, s.want)
		}
	}
}

func TestTokenFileRefusals(t *testing.T) {
	dir := t.TempDir()
	empty, spaced := filepath.Join(dir, "empty"), filepath.Join(dir, "spaced")
	writeFile(t, empty, "  \n")
	writeFile(t, spaced, "two words")
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"missing file":      {Config{TokenFile: filepath.Join(dir, "nope")}, "no such file"},
		"empty file":        {Config{TokenFile: empty}, "is empty"},
		"not a token":       {Config{TokenFile: spaced}, "not a token"},
		"token and file":    {Config{Token: "x", TokenFile: empty}, "both a token and a token file"},
		"bad scheme":        {Config{Address: "ftp://nomad:4646"}, "want http://host:port"},
		"socket, no path":   {Config{Address: "unix://"}, "needs its path"},
		"missing CA bundle": {Config{Address: "https://nomad:4646", CACert: filepath.Join(dir, "ca.pem")}, "nomad TLS"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New(%+v) = %v, want an error with %q", tc.cfg, err, tc.want)
			}
		})
	}
}

// The Task API's unix socket (unix://${NOMAD_SECRETS_DIR}/api.sock) with
// the token from the file.
func TestUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "nc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	echo := &tokenEcho{}
	srv := &http.Server{Handler: echo}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	tok := filepath.Join(dir, "nomad_token")
	writeFile(t, tok, "wi.jwt.sig")
	c, err := New(Config{Address: "unix://" + sock, TokenFile: tok})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := c.Status().Leader(); err != nil || l != "127.0.0.1:4647" {
		t.Fatalf("leader over the socket: %q, %v", l, err)
	}
	if got := echo.last(); got != "wi.jwt.sig" {
		t.Fatalf("token %q over the socket", got)
	}
}

// Anonymous never sends this process's token, whatever the config says.
func TestAnonymousSendsNoToken(t *testing.T) {
	echo := &tokenEcho{}
	srv := httptest.NewServer(echo)
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "tok")
	writeFile(t, path, "mine")
	for _, cfg := range []Config{{Address: srv.URL, Token: "mine"}, {Address: srv.URL, TokenFile: path}} {
		c, err := Anonymous(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Status().Leader(); err != nil {
			t.Fatal(err)
		}
		if got := echo.last(); got != "" {
			t.Fatalf("anonymous client sent token %q", got)
		}
	}
}

func TestEnvAndOver(t *testing.T) {
	env := map[string]string{"NOMAD_ADDR": "https://n:4646", "NOMAD_TOKEN": "env-token", "NOMAD_REGION": "eu", "NOMAD_NAMESPACE": "ml",
		"NOMAD_CACERT": "/ca", "NOMAD_CLIENT_CERT": "/c", "NOMAD_CLIENT_KEY": "/k", "NOMAD_TLS_SERVER_NAME": "server.eu.nomad", "NOMAD_SKIP_VERIFY": "true"}
	base := FromEnv(func(k string) string { return env[k] })
	want := Config{Address: "https://n:4646", Region: "eu", Namespace: "ml", Token: "env-token", CACert: "/ca", ClientCert: "/c", ClientKey: "/k", TLSServerName: "server.eu.nomad", SkipVerify: true}
	if base != want {
		t.Fatalf("FromEnv = %+v, want %+v", base, want)
	}
	for name, tc := range map[string]struct {
		over Config
		want func(Config) Config
	}{
		"nothing over":            {Config{}, func(c Config) Config { return c }},
		"address over":            {Config{Address: "http://x:1"}, func(c Config) Config { c.Address = "http://x:1"; return c }},
		"token file replaces env": {Config{TokenFile: "/s/t"}, func(c Config) Config { c.Token, c.TokenFile = "", "/s/t"; return c }},
		"token replaces env":      {Config{Token: "flag"}, func(c Config) Config { c.Token = "flag"; return c }},
	} {
		t.Run(name, func(t *testing.T) {
			if got, w := base.Over(tc.over), tc.want(base); got != w {
				t.Fatalf("Over = %+v, want %+v", got, w)
			}
		})
	}
}

func members(builds map[string]string, status ...string) *api.ServerMembers {
	m := &api.ServerMembers{ServerRegion: "global"}
	i := 0
	for name, b := range builds {
		st := "alive"
		if i < len(status) {
			st = status[i]
		}
		m.Members = append(m.Members, &api.AgentMember{Name: name, Status: st, Tags: map[string]string{"build": b, "region": "global"}})
		i++
	}
	return m
}

func TestAssess(t *testing.T) {
	for name, tc := range map[string]struct {
		m                *api.ServerMembers
		refused, warning string
		oldest           string
	}{
		"1.11":                {m: members(map[string]string{"s1": "1.11.3"}), oldest: "1.11.3"},
		"1.10 LTS":            {m: members(map[string]string{"s1": "1.10.5"}), oldest: "1.10.5"},
		"enterprise build":    {m: members(map[string]string{"s1": "1.11.3+ent"}), oldest: "1.11.3+ent"},
		"untested but recent": {m: members(map[string]string{"s1": "1.9.7"}), warning: "not a release line hadar is tested on", oldest: "1.9.7"},
		"newer, prerelease":   {m: members(map[string]string{"s1": "1.12.0-dev"}), warning: "not a release line", oldest: "1.12.0-dev"},
		"too old":             {m: members(map[string]string{"s1": "1.6.3"}), refused: "older than 1.7.0"},
		"rolling upgrade":     {m: members(map[string]string{"s1": "1.11.3", "s2": "1.6.1"}), refused: "Nomad 1.6.1 (server s2) is older"},
		"unreadable build":    {m: members(map[string]string{"s1": "banana"}), refused: "cannot read"},
		"no live server":      {m: members(map[string]string{"s1": "1.11.3"}, "failed"), refused: "no live server"},
	} {
		t.Run(name, func(t *testing.T) {
			r := assess(tc.m)
			if tc.refused == "" && r.Refused != "" || tc.refused != "" && !strings.Contains(r.Refused, tc.refused) {
				t.Fatalf("refused %q, want %q", r.Refused, tc.refused)
			}
			if tc.warning == "" && r.Warning != "" || tc.warning != "" && !strings.Contains(r.Warning, tc.warning) {
				t.Fatalf("warning %q, want %q", r.Warning, tc.warning)
			}
			if tc.oldest != "" && r.Oldest != tc.oldest {
				t.Fatalf("oldest %q, want %q", r.Oldest, tc.oldest)
			}
		})
	}
	// A server of another region (WAN federation) does not count.
	m := members(map[string]string{"s1": "1.11.3"})
	m.Members = append(m.Members, &api.AgentMember{Name: "far", Status: "alive", Tags: map[string]string{"build": "1.5.0", "region": "asia"}})
	if r := assess(m); r.Refused != "" || len(r.Servers) != 1 {
		t.Fatalf("another region's server counted: %+v", r)
	}
}

// Check answers a token without node read with the capability it lacks.
func TestCheckPermissionDenied(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, "Permission denied")
	}))
	t.Cleanup(srv.Close)
	c, err := New(Config{Address: srv.URL, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	err = Check(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "node read") {
		t.Fatalf("Check = %v, want the missing node read named", err)
	}
}

// connCounter counts a server's connections: open now, the most open at
// once, and opened in all.
type connCounter struct {
	mu               sync.Mutex
	open, most, made int
}

func (c *connCounter) state(_ net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s {
	case http.StateNew:
		c.open++
		c.made++
		c.most = max(c.most, c.open)
	case http.StateClosed, http.StateHijacked:
		c.open--
	}
}

func (c *connCounter) get() (open, most, made int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open, c.most, c.made
}

// A client opens at most its share of connections to Nomad, whatever
// the requests at once (Nomad refuses a client address's connections
// past 100), and keeps them for the next burst instead of opening new
// ones: a progress sweep of 32 reads at once reuses the last sweep's.
func TestConnectionsBoundedAndKept(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(addr string) (*api.Client, error)
		conns int
	}{
		{"own", func(addr string) (*api.Client, error) { return New(Config{Address: addr}) }, ownConns},
		{"anonymous", func(addr string) (*api.Client, error) { return Anonymous(Config{Address: addr, Token: "t"}) }, callerConns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every request is held until the test has seen as many at
			// once as it wants, so the client cannot serve a burst on a
			// few connections in turn.
			var mu sync.Mutex
			inFlight := 0
			release := make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				inFlight++
				ch := release
				mu.Unlock()
				<-ch
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode("127.0.0.1:4647")
			}))
			cc := &connCounter{}
			srv.Config.ConnState = cc.state
			srv.Start()
			defer srv.Close()
			client, err := tc.build(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			burst := func(n, atOnce int) {
				mu.Lock()
				inFlight = 0
				release = make(chan struct{})
				ch := release
				mu.Unlock()
				defer func() {
					select {
					case <-ch:
					default:
						close(ch)
					}
				}()
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for range n {
					wg.Go(func() {
						var leader string
						if _, err := client.Raw().Query("/v1/status/leader", &leader, nil); err != nil {
							errs <- err
						}
					})
				}
				deadline := time.Now().Add(30 * time.Second)
				for {
					mu.Lock()
					got := inFlight
					mu.Unlock()
					if got >= atOnce {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%d requests at once: the server saw %d in 30 s, want %d", n, got, atOnce)
					}
					time.Sleep(10 * time.Millisecond)
				}
				close(ch)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
			}
			burst(100, tc.conns)
			_, most, made := cc.get()
			if most != tc.conns {
				t.Fatalf("100 requests at once: %d connections open at most, want the client's share %d", most, tc.conns)
			}
			burst(32, min(32, tc.conns))
			burst(32, min(32, tc.conns))
			if _, _, again := cc.get(); again != made {
				t.Fatalf("two bursts of 32 requests at once after the first opened %d new connections, want none (the first burst's %d kept idle)", again-made, made)
			}
		})
	}
}
