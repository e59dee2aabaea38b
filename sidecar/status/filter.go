package status

import (
	"net/http"
	"strings"

	"github.com/hadar-sched/hadar/sidecar/wire"
)

// scope is what one request may see: the caller's access, narrowed to the
// namespace it asked for (?namespace=, "*" or none for every one).
type scope struct {
	access Access
	only   string
}

func scopeOf(r *http.Request, acc Access) scope {
	ns := strings.TrimSpace(r.URL.Query().Get("namespace"))
	if ns == "*" {
		ns = ""
	}
	return scope{access: acc, only: ns}
}

// whole reports whether nothing is filtered.
func (s scope) whole() bool { return s.access.All && s.only == "" }

// job reports whether the job with engine ID "namespace/job" is shown.
func (s scope) job(id string) bool {
	ns, _, ok := strings.Cut(id, "/")
	if !ok {
		return s.whole()
	}
	if s.only != "" && ns != s.only {
		return false
	}
	return s.access.Namespace(ns)
}

// observation drops what the scope does not show: jobs of other
// namespaces from every list; without node access the nodes themselves;
// with it, the names of jobs of namespaces the caller may not read that
// hold GPUs (their GPUs stay counted as held).
func (s scope) observation(o wire.Observation) wire.Observation {
	if s.whole() {
		return o
	}
	out := o
	out.Plan = s.plan(o.Plan)
	out.Jobs = nil
	for _, j := range o.Jobs {
		if s.job(j.ID) {
			out.Jobs = append(out.Jobs, j)
		}
	}
	out.Nodes = nil
	if !s.access.Nodes {
		return out
	}
	for _, n := range o.Nodes {
		n.GPUs = append([]wire.GPUObservation(nil), n.GPUs...)
		for i, g := range n.GPUs {
			hs := make([]wire.Holder, len(g.Holders))
			for k, h := range g.Holders {
				if !s.access.Namespace(namespaceOf(h.Job)) {
					h.Job = ""
				}
				hs[k] = h
			}
			n.GPUs[i].Holders = hs
		}
		out.Nodes = append(out.Nodes, n)
	}
	return out
}

func (s scope) plan(p wire.PlanView) wire.PlanView {
	if s.whole() {
		return p
	}
	out := p
	out.Jobs = []wire.JobView{}
	for _, j := range p.Jobs {
		if s.job(j.ID) {
			out.Jobs = append(out.Jobs, j)
		}
	}
	out.Refused = []wire.RefusedJob{}
	for _, r := range p.Refused {
		if s.job(r.Job) {
			out.Refused = append(out.Refused, r)
		}
	}
	return out
}

func (s scope) history(evs []wire.Event) []wire.Event {
	if s.whole() {
		return evs
	}
	out := []wire.Event{}
	for _, ev := range evs {
		if s.job(ev.Job) {
			out = append(out, ev)
		}
	}
	return out
}

func namespaceOf(id string) string {
	ns, _, _ := strings.Cut(id, "/")
	return ns
}
