package status

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// LearnedSource is a Source that also serves what its estimates learned:
// GET /v1/learned and GET /v1/profile/export (the agent is one).
type LearnedSource interface {
	// Learned is what was learned, with each GPU type's speed against
	// ref ("" lets the source choose).
	Learned(ref planner.GPUType) wire.Learned
	// ExportProfile is what jobs measured as a profile file
	// (docs/formats.md, "The learned table").
	ExportProfile(ref planner.GPUType) ([]byte, error)
}

// routeLearned serves the learned table when src has one. Model names
// are not namespaced and the table spans every namespace: like the
// metrics, it needs the whole cluster's view.
func (s *Server) routeLearned() {
	ls, ok := s.src.(LearnedSource)
	if !ok {
		return
	}
	s.mux.HandleFunc("GET /v1/learned", func(w http.ResponseWriter, r *http.Request) {
		ref, ok := s.learnedAccess(w, r)
		if ok {
			s.write(w, http.StatusOK, ls.Learned(ref))
		}
	})
	s.mux.HandleFunc("GET /v1/profile/export", func(w http.ResponseWriter, r *http.Request) {
		ref, ok := s.learnedAccess(w, r)
		if !ok {
			return
		}
		b, err := ls.ExportProfile(ref)
		if err != nil {
			s.write(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if _, err := w.Write(b); err != nil {
			s.log.Debug("writing a response", "error", err)
		}
	})
}

// learnedAccess checks the caller may read the learned table and returns
// the reference type asked for (?reference=TYPE).
func (s *Server) learnedAccess(w http.ResponseWriter, r *http.Request) (planner.GPUType, bool) {
	if sc := scopeFrom(r); !sc.access.All && !sc.access.Nodes {
		s.write(w, http.StatusForbidden, map[string]string{"error": "the learned throughputs span every namespace's models: they need a token with node read in Nomad (or the status API's token)"})
		return "", false
	}
	ref := planner.GPUType(strings.TrimSpace(r.URL.Query().Get("reference")))
	if ref != "" && !ref.ValidName() {
		s.write(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("reference %q: want a GPU type name such as v100", ref)})
		return "", false
	}
	return ref, true
}
