package status

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// learnedFake is a source that learned something.
type learnedFake struct {
	*fake
	refs    []planner.GPUType
	export  []byte
	failure error
}

func (f *learnedFake) Learned(ref planner.GPUType) wire.Learned {
	f.refs = append(f.refs, ref)
	return wire.Learned{Learning: true, Reference: "v100", TypeSpeeds: map[string]float64{"v100": 1, "h100": 3.1},
		Figures: []wire.LearnedFigure{{Model: "my-llm", SF: 2, Type: "h100", Rate: 41, Applied: true, Seconds: 600, Jobs: 1}},
		Gaps:    []wire.Gap{{Model: "my-llm", Type: "b200", Why: "nothing is known of b200"}}}
}

func (f *learnedFake) ExportProfile(ref planner.GPUType) ([]byte, error) {
	f.refs = append(f.refs, ref)
	return f.export, f.failure
}

func TestLearnedEndpoints(t *testing.T) {
	src := &learnedFake{fake: scenario(), export: []byte(`{"format":"hadar-profile/v1"}`)}
	open := New(src, Options{}).Handler()
	code, _, body := get(t, open, "/v1/learned?reference=v100")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/learned: %d %s", code, body)
	}
	var l wire.Learned
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Figures) != 1 || l.Figures[0].Rate != 41 || l.TypeSpeeds["h100"] != 3.1 || len(l.Gaps) != 1 || src.refs[0] != "v100" {
		t.Errorf("learned %+v (asked for %v)", l, src.refs)
	}
	if code, _, body := get(t, open, "/v1/profile/export"); code != http.StatusOK || body != string(src.export) || src.refs[1] != "" {
		t.Errorf("GET /v1/profile/export: %d %q (asked for %v)", code, body, src.refs)
	}
	if code, _, _ := get(t, open, "/v1/learned?reference=Not%20A%20Type"); code != http.StatusBadRequest {
		t.Errorf("a bad reference: %d", code)
	}
	src.failure = errors.New("nothing learned yet")
	if code, _, body := get(t, open, "/v1/profile/export"); code != http.StatusNotFound || !strings.Contains(body, "nothing learned yet") {
		t.Errorf("an export that fails: %d %s", code, body)
	}

	// Behind a token, the table needs it.
	const apiToken = "a-status-api-token-0123"
	locked := New(src, Options{Auth: Auth{Token: apiToken}}).Handler()
	if code, _, _ := get(t, locked, "/v1/learned"); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d", code)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v1/learned", nil)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	locked.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("with the token: %d %s", rec.Code, rec.Body.String())
	}

	// A source that learns nothing has no such endpoints.
	if code, _, _ := get(t, New(scenario(), Options{}).Handler(), "/v1/learned"); code != http.StatusNotFound {
		t.Errorf("a source without a learned table: %d", code)
	}
}

// A caller who may read some namespaces only, not the nodes, is refused.
func TestLearnedNeedsTheWholeClustersView(t *testing.T) {
	s := New(&learnedFake{fake: scenario()}, Options{})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v1/learned", nil)
	sc := scope{access: Access{namespace: func(string) bool { return true }}}
	s.mux.ServeHTTP(rec, req.WithContext(context.WithValue(req.Context(), scopeKey{}, sc)))
	if rec.Code != http.StatusForbidden {
		t.Errorf("a namespace reader: %d %s", rec.Code, rec.Body.String())
	}
}
