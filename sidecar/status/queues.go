package status

import (
	"net/http"

	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/queues"
)

// QueueSource is a Source that shares the fleet among team queues: GET
// /v1/queues (the agent is one).
type QueueSource interface {
	// Queues is the queues after the last plan and their configuration;
	// ok is false when there are no queues or no plan ran yet.
	Queues() (queue.Status, queue.Config, bool)
}

// routeQueues serves the queues when src has them. A caller limited to
// some namespaces sees the queues that list one of them or hold one of
// its jobs, and only its namespaces' jobs (sidecar/queues.Filter);
// ?namespace= narrows it further, as on the other endpoints.
// hasQueues: the sidecar has queue blocks (the page asks /v1/queues only
// then, so a sidecar without queues logs no 404 in the browser).
func (s *Server) hasQueues() bool {
	qs, ok := s.src.(QueueSource)
	if !ok {
		return false
	}
	_, cfg, _ := qs.Queues()
	return len(cfg.Queues) > 0
}

func (s *Server) routeQueues() {
	qs, ok := s.src.(QueueSource)
	if !ok {
		return
	}
	s.mux.HandleFunc("GET /v1/queues", func(w http.ResponseWriter, r *http.Request) {
		st, cfg, ok := qs.Queues()
		if !ok && len(cfg.Queues) == 0 {
			s.write(w, http.StatusNotFound, map[string]string{"error": "no queues: the sidecar's configuration has no queue block (docs/queues.md)"})
			return
		}
		sc := scopeFrom(r)
		var may func(ns string) bool
		if !sc.whole() {
			may = func(ns string) bool { return (sc.only == "" || ns == sc.only) && sc.access.Namespace(ns) }
		}
		s.write(w, http.StatusOK, queues.Filter(st, cfg, may))
	})
}
