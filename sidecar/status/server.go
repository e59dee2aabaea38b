// Package status serves the sidecar's HTTP API, its Prometheus metrics and
// its status page: what the last plan decided and why, per job, where every
// GPU of the cluster goes, and the sidecar's health. docs/status.md lists
// the endpoints, the metrics and the page.
package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Source is what the API reads: the agent.
type Source interface {
	Plan() wire.PlanView
	History() []wire.Event
	Health() wire.Health
	Observe() wire.Observation
}

// Options configure the server.
type Options struct {
	Logger hclog.Logger
	// Telemetry serves /metrics and the utilisation history; nil: neither.
	Telemetry *telemetry.Telemetry
	// Secrets never appear in a response (the Nomad token): a response
	// that would carry one carries "[redacted]" instead.
	Secrets []string
	// Auth authenticates callers; the zero value lets every caller in
	// (Listener keeps such an API on loopback unless told otherwise).
	Auth Auth
}

// Server is the status API.
type Server struct {
	src     Source
	opts    Options
	log     hclog.Logger
	mux     *http.ServeMux
	secrets [][]byte
}

// New returns the API over src.
func New(src Source, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	s := &Server{src: src, opts: opts, log: opts.Logger, mux: http.NewServeMux()}
	for _, sec := range append(opts.Secrets, opts.Auth.Token) {
		// A short "secret" would redact innocent text; tokens are long.
		if len(sec) >= 8 {
			s.secrets = append(s.secrets, []byte(sec))
		}
	}
	s.mux.HandleFunc("GET /v1/health", s.health)
	s.mux.HandleFunc("GET /v1/leader", s.leader)
	s.mux.HandleFunc("GET /v1/status", s.status)
	s.mux.HandleFunc("GET /v1/plan", s.plan)
	s.mux.HandleFunc("GET /v1/jobs", s.jobs)
	s.mux.HandleFunc("GET /v1/jobs/{id...}", s.job)
	s.mux.HandleFunc("GET /v1/decisions", s.decisions)
	s.routeLearned()
	s.routeQueues()
	if opts.Telemetry != nil {
		metrics := opts.Telemetry.Handler()
		// The metrics count the whole cluster's GPUs by rack: what node
		// read shows in Nomad.
		s.mux.Handle("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if sc := scopeFrom(r); !sc.access.All && !sc.access.Nodes {
				s.write(w, http.StatusForbidden, map[string]string{"error": "the metrics describe the whole cluster: they need a token with node read in Nomad (or the status API's token)"})
				return
			}
			metrics.ServeHTTP(w, r)
		}))
	}
	ui, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	s.mux.Handle("GET /ui/", http.StripPrefix("/ui/", http.FileServerFS(ui)))
	s.mux.HandleFunc("GET /{$}", s.page)
	return s
}

// Handler is the API's HTTP handler: every response is scrubbed of the
// secrets and carries headers that keep the page to its own assets.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{header: http.Header{}, code: http.StatusOK}
		if open(r.URL.Path) {
			s.mux.ServeHTTP(rec, r)
		} else if acc, err := s.opts.Auth.authenticate(r); err != nil {
			code := http.StatusUnauthorized
			var ae authError
			if errors.As(err, &ae) {
				code = ae.code
				if ae.retryAfter > 0 {
					// Whole seconds, rounded up: never an invitation to retry at once.
					rec.Header().Set("Retry-After", strconv.Itoa(int((ae.retryAfter+time.Second-1)/time.Second)))
				}
			}
			if code == http.StatusUnauthorized {
				rec.Header().Set("WWW-Authenticate", `Bearer realm="hadar"`)
			}
			s.log.Debug("request refused", "path", r.URL.Path, "remote", r.RemoteAddr, "status", code, "reason", err)
			s.write(rec, code, map[string]string{"error": err.Error()})
		} else {
			rec = s.scoped(r, scopeOf(r, acc))
		}
		body := rec.body.Bytes()
		for _, sec := range s.secrets {
			body = bytes.ReplaceAll(body, sec, []byte("[redacted]"))
		}
		h := w.Header()
		for k, v := range rec.header {
			h[k] = v
		}
		h.Del("Content-Length")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		// The page loads nothing but its own files: no CDN, no inline
		// script, no framing.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		w.WriteHeader(rec.code)
		if _, err := w.Write(body); err != nil {
			s.log.Debug("writing a response", "error", err)
		}
	})
}

// scoped answers an authenticated request within the caller's scope:
// for a caller limited to some namespaces, the names of other
// namespaces' jobs are replaced wherever they appear (reasons name them).
func (s *Server) scoped(r *http.Request, sc scope) *recorder {
	rec := &recorder{header: http.Header{}, code: http.StatusOK}
	s.mux.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), scopeKey{}, sc)))
	if ids := s.hiddenIDs(sc); len(ids) > 0 {
		b := redactIDs(rec.body.Bytes(), ids)
		rec.body.Reset()
		rec.body.Write(b)
	}
	return rec
}

// open reports whether a path is served to everyone: the health checks
// (Nomad's service checks and load balancers carry no token; they hold
// counts, no job) and the page's own files (no data: the page asks for a
// token when the API wants one).
func open(path string) bool {
	return path == "/v1/health" || path == "/v1/leader" || path == "/" || strings.HasPrefix(path, "/ui/")
}

// scopeKey is the request context's key of the caller's scope.
type scopeKey struct{}

// scopeFrom is the scope the request was authenticated with (everything
// when it went through no authentication: tests calling a handler
// directly).
func scopeFrom(r *http.Request) scope {
	if sc, ok := r.Context().Value(scopeKey{}).(scope); ok {
		return sc
	}
	return scope{access: everything()}
}

// recorder buffers a response so that it can be scrubbed whole.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
	wrote  bool
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.code, r.wrote = code, true
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}

// Serve listens on l until ctx ends; the listener's address goes to bound
// (so a test can ask for port 0).
func (s *Server) Serve(ctx context.Context, l Listener, bound func(net.Addr)) error {
	ln, err := l.Listen()
	if err != nil {
		return err
	}
	if bound != nil {
		bound(ln.Addr())
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: s.log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("status API: %w", err)
	}
	return nil
}

func (s *Server) write(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		s.log.Debug("writing a response", "error", err)
	}
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	h := s.src.Health()
	code := http.StatusOK
	if !h.OK {
		code = http.StatusServiceUnavailable
	}
	s.write(w, code, h)
}

// leader is the check only the acting replica passes: 200 on the leader
// (synced or not: it is the one that acts), 503 on a follower. Nomad's
// service API lists every replica whatever its checks, so the hadar-leader
// service's check status is what tells the leader's address
// (docs/deploy.md, "The leader's address").
func (s *Server) leader(w http.ResponseWriter, _ *http.Request) {
	h := s.src.Health()
	code := http.StatusOK
	if !h.Leader {
		code = http.StatusServiceUnavailable
	}
	s.write(w, code, h)
}

func (s *Server) utilisation() []wire.UtilPoint {
	if s.opts.Telemetry == nil {
		return nil
	}
	return s.opts.Telemetry.Utilisation()
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	sc := scopeFrom(r)
	var util []wire.UtilPoint
	if sc.access.Nodes {
		util = s.utilisation()
	}
	st := buildStatus(sc.observation(s.src.Observe()), s.src.Health(), sc.history(s.src.History()), util)
	st.Sidecar.TeamQueues = s.hasQueues()
	s.write(w, http.StatusOK, st)
}

func (s *Server) plan(w http.ResponseWriter, r *http.Request) {
	s.write(w, http.StatusOK, scopeFrom(r).plan(s.src.Plan()))
}

func (s *Server) jobs(w http.ResponseWriter, r *http.Request) {
	s.write(w, http.StatusOK, scopeFrom(r).plan(s.src.Plan()).Jobs)
}

func (s *Server) job(w http.ResponseWriter, r *http.Request) {
	id := strings.Trim(strings.TrimSpace(r.PathValue("id")), "/")
	sc := scopeFrom(r)
	// A job the caller may not see is answered as one that does not
	// exist: the answer must not tell the two apart.
	o := sc.observation(s.src.Observe())
	hist := sc.history(s.src.History())
	d, ok := buildJob(o, buildStatus(o, wire.Health{}, nil, nil), hist, id)
	if !ok {
		s.write(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no managed job %q in the plan or the recent decisions: give namespace/job or the job's name", id)})
		return
	}
	s.write(w, http.StatusOK, d)
}

func (s *Server) decisions(w http.ResponseWriter, r *http.Request) {
	s.write(w, http.StatusOK, scopeFrom(r).history(s.src.History()))
}

func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	b, err := uiFiles.ReadFile("ui/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(b)
}
