package status

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
)

// hiddenJob replaces, in an answer to a caller limited to some
// namespaces, the name of a job of a namespace it may not read.
const hiddenJob = "(a job of another namespace)"

// hiddenIDs are the engine IDs ("namespace/job") of every job the source
// knows (planned, refused, holding GPUs, in the recent decisions) whose
// namespace sc may not read, longest first. Reasons name other jobs
// ("preempts b/x", "preempted for a/y"): the lists are filtered by
// namespace, but free text is not, so these names are replaced in the
// whole answer (redactIDs).
func (s *Server) hiddenIDs(sc scope) []string {
	if sc.access.All {
		return nil
	}
	set := map[string]bool{}
	add := func(id string) {
		ns, job, ok := strings.Cut(id, "/")
		if ok && ns != "" && job != "" && !sc.access.Namespace(ns) {
			set[id] = true
		}
	}
	o := s.src.Observe()
	for _, j := range o.Plan.Jobs {
		add(j.ID)
	}
	for _, r := range o.Plan.Refused {
		add(r.Job)
	}
	for _, j := range o.Jobs {
		add(j.ID)
	}
	for _, n := range o.Nodes {
		for _, g := range n.GPUs {
			for _, h := range g.Holders {
				add(h.Job)
			}
		}
	}
	for _, ev := range s.src.History() {
		add(ev.Job)
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	// Longest first: "b/x-2" before "b/x", so that the longer name goes
	// whole.
	sort.Slice(ids, func(i, k int) bool {
		if len(ids[i]) != len(ids[k]) {
			return len(ids[i]) > len(ids[k])
		}
		return ids[i] < ids[k]
	})
	return ids
}

// redactIDs replaces each of ids in body, as written raw (metrics, text)
// and inside a JSON string, with hiddenJob. A match preceded by a
// character a namespace's name may hold is part of another name
// ("ab/x" holds "b/x") and is left alone.
func redactIDs(body []byte, ids []string) []byte {
	for _, id := range ids {
		forms := [][]byte{[]byte(id)}
		if enc, err := json.Marshal(id); err == nil {
			if e := enc[1 : len(enc)-1]; !bytes.Equal(e, forms[0]) {
				forms = append(forms, e)
			}
		}
		for _, f := range forms {
			body = replaceAtBoundary(body, f, []byte(hiddenJob))
		}
	}
	return body
}

func replaceAtBoundary(body, old, with []byte) []byte {
	if !bytes.Contains(body, old) {
		return body
	}
	var out bytes.Buffer
	for {
		i := bytes.Index(body, old)
		if i < 0 {
			out.Write(body)
			return out.Bytes()
		}
		if i > 0 && nameByte(body[i-1]) {
			out.Write(body[:i+1])
			body = body[i+1:]
			continue
		}
		out.Write(body[:i])
		out.Write(with)
		body = body[i+len(old):]
	}
}

// nameByte reports whether c may be part of a Nomad namespace's name.
func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}
