package status

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// FuzzRequests sends arbitrary methods, paths and queries to the status
// API: every answer is a known status code, a JSON endpoint answers JSON,
// and the token never comes back, whatever the request echoes.
func FuzzRequests(f *testing.F) {
	for _, p := range []string{"/v1/status", "/v1/jobs/default/a", "/v1/jobs/a", "/v1/jobs/team%2Fc", "/v1/jobs/" + token, "/v1/jobs/../../etc/passwd",
		"/v1/plan?x=1", "/v1/health", "/v1/decisions", "/metrics", "/", "/app.js", "/v1/jobs/%00", "//v1//jobs//", "/v1/jobs/default/a/extra"} {
		f.Add("GET", p)
	}
	f.Add("POST", "/v1/status")
	f.Add("DELETE", "/v1/jobs/default/a")
	h := New(scenario(), Options{Secrets: []string{token}}).Handler()
	f.Fuzz(func(t *testing.T, method, path string) {
		if !validMethod(method) {
			return
		}
		u, err := url.ParseRequestURI(path)
		if err != nil || !strings.HasPrefix(path, "/") {
			return
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Method, req.URL, req.RequestURI = method, u, path
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusBadRequest:
		default:
			t.Fatalf("%s %s: status %d", method, path, rec.Code)
		}
		body := rec.Body.String()
		if strings.Contains(body, token) {
			t.Fatalf("%s %s: the token came back: %s", method, path, body)
		}
		if rec.Code == http.StatusOK && strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %s: invalid JSON: %s", method, path, body)
		}
	})
}

// validMethod: an HTTP token, as a server would accept it.
func validMethod(m string) bool {
	if m == "" || len(m) > 16 {
		return false
	}
	for _, c := range m {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}
