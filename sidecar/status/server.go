// Package status serves the sidecar's HTTP API: what the last plan
// decided and why, per job, and the sidecar's health. Every answer is JSON;
// docs/sidecar.md lists the endpoints.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/sidecar/agent"
)

// Source is what the API reads: the agent.
type Source interface {
	Plan() agent.PlanView
	Job(id string) (agent.JobView, []agent.Event, bool)
	History() []agent.Event
	Health() agent.Health
}

// Server is the status API.
type Server struct {
	src Source
	log hclog.Logger
	mux *http.ServeMux
}

// New returns the API over src.
func New(src Source, logger hclog.Logger) *Server {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &Server{src: src, log: logger, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /v1/health", s.health)
	s.mux.HandleFunc("GET /v1/plan", s.plan)
	s.mux.HandleFunc("GET /v1/jobs", s.jobs)
	s.mux.HandleFunc("GET /v1/jobs/{id...}", s.job)
	s.mux.HandleFunc("GET /v1/decisions", s.decisions)
	return s
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve listens on addr until ctx ends; the listener's address goes to
// bound (so a test can ask for port 0).
func (s *Server) Serve(ctx context.Context, addr string, bound func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("status API: %w", err)
	}
	if bound != nil {
		bound(ln.Addr())
	}
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
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

func (s *Server) plan(w http.ResponseWriter, _ *http.Request) {
	s.write(w, http.StatusOK, s.src.Plan())
}

func (s *Server) jobs(w http.ResponseWriter, _ *http.Request) {
	s.write(w, http.StatusOK, s.src.Plan().Jobs)
}

func (s *Server) job(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.PathValue("id"))
	jv, evs, ok := s.src.Job(id)
	if !ok {
		s.write(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no managed job %q: give namespace/job or the job ID", id)})
		return
	}
	s.write(w, http.StatusOK, map[string]any{"job": jv, "decisions": evs})
}

func (s *Server) decisions(w http.ResponseWriter, _ *http.Request) {
	s.write(w, http.StatusOK, s.src.History())
}
