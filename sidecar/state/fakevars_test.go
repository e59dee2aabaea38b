package state

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/nomad/api"
)

// fakeVars serves Nomad's Variables HTTP API as the store uses it, in
// memory: GET, PUT (with ?cas=) and DELETE of /v1/var/<path>, and GET
// /v1/vars?prefix=. Like Nomad (command/agent/variable_endpoint.go and
// nomad/state/state_store_variables.go), a missing variable is a 404, a
// check-and-set against a stale index is a 409 whose body is the variable
// as it is (a zero one, with only its namespace and path, when there is
// none), a write without items or with an invalid path or over 64 KiB is
// refused, and a delete of nothing succeeds.
//
// Every request names its client (header X-Test-Client, set by client),
// so a test can hold one client's request to interleave two writers step
// by step (hold), fail chosen requests (fail), lose the answer of a
// request served (lose), answer a write as a check-and-set that lost a
// race (conflict), or kill a client right after a request is served, as
// if its process died there (crashAfter).
type fakeVars struct {
	t   testing.TB
	srv *httptest.Server

	mu     sync.Mutex
	index  uint64
	vars   map[string]*api.Variable // by namespace + "\x00" + path
	rules  []*fakeRule
	dead   map[string]bool
	counts map[string]int // requests by client
	log    []string       // "client METHOD path", in order of arrival
}

// fakeRule applies to the requests of one client (empty: any) with a
// method and a path (relative to /v1/var/ or the list's prefix) matching.
type fakeRule struct {
	client, method string
	path           *regexp.Regexp
	// times is how many requests it still applies to.
	times int
	// hold: the request waits for release; reached is closed when it came.
	reached, release chan struct{}
	// status: the request is answered with it and not served.
	status int
	// crash: once the request is served, the client is dead: every later
	// request of it is answered 503 unserved.
	crash bool
	// lose: the request is served, its answer replaced by a 500.
	lose bool
	// conflict: the request is not served but answered as Nomad answers a
	// check-and-set that lost a race: 409 with the variable as it is.
	conflict bool
}

func newFakeVars(t testing.TB) *fakeVars {
	f := &fakeVars{t: t, vars: map[string]*api.Variable{}, dead: map[string]bool{}, counts: map[string]int{}, index: 100}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// client returns a Nomad API client that names itself name.
func (f *fakeVars) client(name string) *api.Client {
	c, err := api.NewClient(&api.Config{Address: f.srv.URL, Headers: http.Header{"X-Test-Client": {name}}})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// store returns a Variables store under prefix "hadar/sidecar" speaking
// as client name.
func (f *fakeVars) store(name string) *Variables {
	v := NewVariables(f.client(name), "", "hadar/sidecar")
	f.t.Cleanup(func() { v.Close() })
	return v
}

func (f *fakeVars) addRule(r *fakeRule) *fakeRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, r)
	return r
}

// hold makes the next request of client matching method and the path
// pattern wait until release is called; reached is closed when it comes.
func (f *fakeVars) hold(client, method, path string) (reached <-chan struct{}, release func()) {
	r := f.addRule(&fakeRule{client: client, method: method, path: regexp.MustCompile(path), times: 1, reached: make(chan struct{}), release: make(chan struct{})})
	var once sync.Once
	release = func() { once.Do(func() { close(r.release) }) }
	f.t.Cleanup(release) // a failed test never leaves a handler waiting
	return r.reached, release
}

// fail answers the next n requests of client matching with status.
func (f *fakeVars) fail(client, method, path string, status, n int) {
	f.addRule(&fakeRule{client: client, method: method, path: regexp.MustCompile(path), times: n, status: status})
}

// conflict answers the next n requests of client matching as lost
// check-and-set races, unserved.
func (f *fakeVars) conflict(client, method, path string, n int) {
	f.addRule(&fakeRule{client: client, method: method, path: regexp.MustCompile(path), times: n, conflict: true})
}

// crashAfter kills client once its next request matching is served.
func (f *fakeVars) crashAfter(client, method, path string) {
	f.addRule(&fakeRule{client: client, method: method, path: regexp.MustCompile(path), times: 1, crash: true})
}

// lose serves the next request of client matching but answers it 500,
// as when the answer of a write that was made is lost.
func (f *fakeVars) lose(client, method, path string) {
	f.addRule(&fakeRule{client: client, method: method, path: regexp.MustCompile(path), times: 1, lose: true})
}

// requests is how many requests client sent so far.
func (f *fakeVars) requests(client string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[client]
}

// paths lists the variables under prefix, sorted.
func (f *fakeVars) paths(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, v := range f.vars {
		if strings.HasPrefix(v.Path, prefix) {
			out = append(out, v.Path)
		}
	}
	sort.Strings(out)
	return out
}

// get returns a copy of the variable at path in the default namespace.
func (f *fakeVars) get(path string) *api.Variable {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.vars[api.DefaultNamespace+"\x00"+path]; v != nil {
		return v.Copy()
	}
	return nil
}

// set writes a variable directly, as an operator (or a bug) would.
func (f *fakeVars) set(path string, items api.VariableItems) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	key := api.DefaultNamespace + "\x00" + path
	v := &api.Variable{Namespace: api.DefaultNamespace, Path: path, Items: items, CreateIndex: f.index, ModifyIndex: f.index}
	if old := f.vars[key]; old != nil {
		v.CreateIndex = old.CreateIndex
	}
	f.vars[key] = v
}

var validVarPath = regexp.MustCompile(`^[a-zA-Z0-9-_~/]{1,128}$`)

func (f *fakeVars) serve(w http.ResponseWriter, r *http.Request) {
	client := r.Header.Get("X-Test-Client")
	var path string
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1/var/"):
		path = strings.TrimPrefix(r.URL.Path, "/v1/var/")
	case r.URL.Path == "/v1/vars":
		path = r.URL.Query().Get("prefix")
	default:
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	f.mu.Lock()
	f.counts[client]++
	f.log = append(f.log, fmt.Sprintf("%s %s %s", client, r.Method, path))
	if f.dead[client] {
		f.mu.Unlock()
		http.Error(w, "the test killed this client", http.StatusServiceUnavailable)
		return
	}
	var applied []*fakeRule
	for _, rule := range f.rules {
		if rule.times > 0 && (rule.client == "" || rule.client == client) && rule.method == r.Method && rule.path.MatchString(path) {
			rule.times--
			applied = append(applied, rule)
		}
	}
	f.mu.Unlock()
	crash, lose := false, false
	for _, rule := range applied {
		switch {
		case rule.release != nil:
			close(rule.reached)
			<-rule.release
		case rule.status != 0:
			http.Error(w, "the test failed this request", rule.status)
			return
		case rule.conflict:
			f.answerConflict(w, r, path)
			return
		case rule.crash:
			crash = true
		case rule.lose:
			lose = true
		}
	}
	out := w
	if lose {
		out = httptest.NewRecorder()
	}
	if r.URL.Path == "/v1/vars" {
		f.list(out, r, path)
	} else {
		f.serveVar(out, r, path)
	}
	if lose {
		http.Error(w, "the test lost this answer", http.StatusInternalServerError)
	}
	if crash {
		f.mu.Lock()
		f.dead[client] = true
		f.mu.Unlock()
	}
}

// answerConflict answers a request for the variable at path as a lost
// check-and-set, unserved.
func (f *fakeVars) answerConflict(w http.ResponseWriter, r *http.Request, path string) {
	ns := namespaceOf(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writeConflict(w, ns, path, f.vars[ns+"\x00"+path])
}

// writeConflict answers 409 as Nomad does a lost check-and-set: the
// variable as it is, or a zero one (namespace and path only) when there
// is none. f.mu is held.
func (f *fakeVars) writeConflict(w http.ResponseWriter, ns, path string, cur *api.Variable) {
	if cur == nil {
		writeJSON(w, f.index, http.StatusConflict, &api.Variable{Namespace: ns, Path: path})
		return
	}
	writeJSON(w, cur.ModifyIndex, http.StatusConflict, cur)
}

// namespaceOf is the request's namespace, Nomad's default when unset.
func namespaceOf(r *http.Request) string {
	if ns := r.URL.Query().Get("namespace"); ns != "" {
		return ns
	}
	return api.DefaultNamespace
}

func (f *fakeVars) list(w http.ResponseWriter, r *http.Request, prefix string) {
	ns := namespaceOf(r)
	f.mu.Lock()
	out := []*api.VariableMetadata{}
	for _, v := range f.vars {
		if v.Namespace == ns && strings.HasPrefix(v.Path, prefix) {
			out = append(out, v.Metadata())
		}
	}
	idx := f.index
	f.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	writeJSON(w, idx, http.StatusOK, out)
}

func (f *fakeVars) serveVar(w http.ResponseWriter, r *http.Request, path string) {
	ns := namespaceOf(r)
	key := ns + "\x00" + path
	cas, isCAS := uint64(0), r.URL.Query().Has("cas")
	if isCAS {
		var err error
		if cas, err = strconv.ParseUint(r.URL.Query().Get("cas"), 10, 64); err != nil {
			http.Error(w, "can not parse cas", http.StatusBadRequest)
			return
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.vars[key]
	conflict := func() bool {
		if !isCAS {
			return false
		}
		if (cur == nil && cas != 0) || (cur != nil && cur.ModifyIndex != cas) {
			f.writeConflict(w, ns, path, cur)
			return true
		}
		return false
	}
	switch r.Method {
	case http.MethodGet:
		if cur == nil {
			http.Error(w, "variable not found", http.StatusNotFound)
			return
		}
		writeJSON(w, cur.ModifyIndex, http.StatusOK, cur)
	case http.MethodPut:
		var in api.Variable
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if len(in.Items) == 0 {
			http.Error(w, "variable missing required Items object", http.StatusBadRequest)
			return
		}
		size := 0
		for k, v := range in.Items {
			size += len(k) + len(v)
		}
		if size > 65536 {
			http.Error(w, "variables are limited to 64KiB in total size", http.StatusBadRequest)
			return
		}
		if !validVarPath.MatchString(path) {
			http.Error(w, fmt.Sprintf("invalid path %q", path), http.StatusBadRequest)
			return
		}
		if conflict() {
			return
		}
		f.index++
		v := &api.Variable{Namespace: ns, Path: path, Items: in.Items, CreateIndex: f.index, ModifyIndex: f.index}
		if cur != nil {
			v.CreateIndex = cur.CreateIndex
		}
		f.vars[key] = v
		writeJSON(w, f.index, http.StatusOK, v)
	case http.MethodDelete:
		if conflict() {
			return
		}
		f.index++
		delete(f.vars, key)
		w.Header().Set("X-Nomad-Index", strconv.FormatUint(f.index, 10))
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func writeJSON(w http.ResponseWriter, index uint64, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Nomad-Index", strconv.FormatUint(index, 10))
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
