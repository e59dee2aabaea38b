package main

import (
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/sidecar/status"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// exporter is a status source whose learned table is a profile.
type exporter struct {
	body []byte
	refs []planner.GPUType
}

func (e *exporter) Plan() wire.PlanView                  { return wire.PlanView{} }
func (e *exporter) History() []wire.Event                { return nil }
func (e *exporter) Health() wire.Health                  { return wire.Health{OK: true} }
func (e *exporter) Observe() wire.Observation            { return wire.Observation{} }
func (e *exporter) Learned(planner.GPUType) wire.Learned { return wire.Learned{} }
func (e *exporter) ExportProfile(ref planner.GPUType) ([]byte, error) {
	e.refs = append(e.refs, ref)
	return e.body, nil
}

// `hadar profile export` writes what the status API exports, checked to
// load as a profile, to stdout or atomically to -o; the status API's
// token is sent.
func TestProfileExport(t *testing.T) {
	p, err := profile.Build("learned", []profile.Entry{{Model: "my-llm", ScaleFactor: 2, Consolidated: map[planner.GPUType]float64{"h100": 41}}},
		map[planner.GPUType]profile.RelativeSpeed{"h100": {Reference: "v100", Speed: 3.1}})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := p.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	const token = "profile-export-token-42"
	src := &exporter{body: b.Bytes()}
	srv := httptest.NewServer(status.New(src, status.Options{Auth: status.Auth{Token: token}}).Handler())
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")

	code, out, errs := runHadar("profile", "export", "-address", addr, "-token", token, "-reference", "v100")
	if code != 0 || out != b.String() || src.refs[0] != "v100" {
		t.Fatalf("to stdout: exit %d, %q, %s (reference %v)", code, out, errs, src.refs)
	}
	path := filepath.Join(t.TempDir(), "learned.json")
	if code, _, errs := runHadar("profile", "export", "-address", addr, "-token", token, "-o", path); code != 0 {
		t.Fatalf("to a file: exit %d: %s", code, errs)
	}
	got, err := profile.Load(path)
	if err != nil || !got.Equal(p) {
		t.Fatalf("the written file: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".hadar-profile-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// Without the token: refused, nothing written.
	other := filepath.Join(t.TempDir(), "x.json")
	t.Setenv("HADAR_TOKEN", "")
	t.Setenv("NOMAD_TOKEN", "")
	if code, _, errs := runHadar("profile", "export", "-address", addr, "-o", other); code != 1 || !strings.Contains(errs, "token") {
		t.Errorf("without a token: exit %d: %s", code, errs)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("a refused export wrote %s", other)
	}
	// An answer that is not a profile is not written.
	src.body = []byte(`{"format":"something else"}`)
	if code, _, errs := runHadar("profile", "export", "-address", addr, "-token", token, "-o", other); code != 1 || !strings.Contains(errs, "does not load") {
		t.Errorf("a bad answer: exit %d: %s", code, errs)
	}
	if code, _, _ := runHadar("profile"); code != 2 {
		t.Errorf("hadar profile without export: exit %d, want 2", code)
	}
}
