package agent

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// overlayAgent is testAgent with a profile overlay file.
func overlayAgent(t *testing.T, rec *recordedNomad, overlay string) (*Agent, error) {
	t.Helper()
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	client, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "1h", ProfileOverlay: overlay}, Service: config.Service{State: &config.StateConfig{Store: "none"}}}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(s, client, nil)
	if err == nil {
		t.Cleanup(a.settleWrites)
	}
	return a, err
}

// A job of a model no profile names, at a width no profile has, on a GPU
// type no profile names, is admitted and planned; the type is named as a
// gap (its reason, the learned table) until the operator's overlay gives
// the type's speed, which is reloaded without a restart.
func TestAnUnknownModelOnANewTypeIsPlannedAndTheOverlayReloads(t *testing.T) {
	dir := t.TempDir()
	overlay := filepath.Join(dir, "overlay.json")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(overlay, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// At first the overlay only says how fast a type of another cluster is.
	write(`{"format":"hadar-profile/v1","unit":"steps/s","relative_speeds":{"b200":{"reference":"v100","speed":5}},"entries":[]}`)
	snap, rec := noteState(t, []noteCase{{name: "llm", meta: map[string]string{"hadar.model": "my-new-llm", "hadar.steps": "100000", "hadar.workers": "3"}}})
	snap.Nodes["n1"] = gpuNode("n1", "NVIDIA H100 80GB HBM3", 4)
	snap.Nodes["n2"] = gpuNode("n2", "Tesla V100-SXM2-16GB", 4)
	a, err := overlayAgent(t, rec, overlay)
	if err != nil {
		t.Fatal(err)
	}
	key := watch.JobKey{Namespace: "default", ID: "llm"}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if err := a.sync(snap, now); err != nil {
		t.Fatal(err)
	}
	if iv, bad := a.roster.refusal(key); bad {
		t.Fatalf("the job of an unknown model at 3 workers was refused: %v", iv.err)
	}
	if a.roster.job(key) == nil {
		t.Fatal("the job was not admitted")
	}
	d, err := a.plan(context.Background(), now, engine.Boundary, true)
	if err != nil {
		t.Fatal(err)
	}
	a.warnGaps(true)
	var jd engine.JobDecision
	for _, x := range d.Jobs {
		if x.Job == engineID(key) {
			jd = x
		}
	}
	if len(jd.To.Units) == 0 {
		t.Fatalf("the job is not placed: %+v", jd)
	}
	learned := func(ref planner.GPUType) wire.Learned {
		a.mu.Unlock() // Learned locks, as the status API calls it
		defer a.mu.Lock()
		return a.Learned(ref)
	}
	gaps := learned("").Gaps
	if len(gaps) != 1 || gaps[0].Model != "my-new-llm" || gaps[0].Type != "h100" {
		t.Fatalf("gaps %+v, want my-new-llm on h100", gaps)
	}
	if !a.learning.gapsWarned[engine.Gap{Model: gaps[0].Model, Type: planner.GPUType(gaps[0].Type), Why: gaps[0].Why}] {
		t.Error("the gap was not warned of")
	}
	if jd.To.Units[0].Types()[0] == "h100" {
		// Placed on the unknown type: exploring it is fine, said so.
		if !strings.Contains(jd.Reason.Why, "h100") {
			t.Errorf("placed on h100 without a word: %q", jd.Reason.Why)
		}
	} else if !strings.Contains(jd.Reason.Why, "h100") {
		t.Errorf("the reason does not name the type it cannot be estimated on: %q", jd.Reason.Why)
	}

	// The operator gives h100's speed: reloaded at the next look, no gap.
	write(`{"format":"hadar-profile/v1","unit":"steps/s","relative_speeds":{"h100":{"reference":"v100","speed":3}},"entries":[]}`)
	a.learning.overlayChecked = time.Time{}
	a.reloadOverlay()
	if r := a.prof.RelativeSpeeds()["h100"]; r.Speed != 3 {
		t.Fatalf("the overlay was not reloaded: %+v", a.prof.RelativeSpeeds())
	}
	if _, err := a.plan(context.Background(), now+1, engine.Boundary, true); err != nil {
		t.Fatal(err)
	}
	a.warnGaps(true)
	if l := learned("v100"); len(l.Gaps) != 0 || l.TypeSpeeds["h100"] < 2 {
		t.Fatalf("after the reload: gaps %+v, speeds %v", l.Gaps, l.TypeSpeeds)
	}
	if len(a.learning.gapsWarned) != 0 {
		t.Errorf("a closed gap is still remembered: %v", a.learning.gapsWarned)
	}
	ke, err := a.core.est.Estimate("my-new-llm", 3, "h100")
	if err != nil || ke.Source == "none" || !(ke.Value > 0) {
		t.Errorf("my-new-llm on h100 after the overlay: %+v, %v", ke, err)
	}

	// A file that does not load leaves the overlay in force.
	write(`{"format":"hadar-profile/v1"`)
	a.learning.overlayChecked = time.Time{}
	a.reloadOverlay()
	if r := a.prof.RelativeSpeeds()["h100"]; r.Speed != 3 || a.learning.overlayErr == "" {
		t.Errorf("a broken overlay: speeds %v, error %q", a.prof.RelativeSpeeds(), a.learning.overlayErr)
	}
	// Nothing learned yet: nothing to export, said so.
	a.mu.Unlock()
	_, err = a.ExportProfile("")
	a.mu.Lock()
	if err == nil || !strings.Contains(err.Error(), "nothing learned") {
		t.Errorf("export with nothing learned: %v", err)
	}
}

// An overlay that does not load stops the sidecar at start, naming it.
func TestABrokenOverlayStopsTheStart(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"missing": "", "broken": `{"format":`} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".json")
			if body != "" {
				if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := overlayAgent(t, &recordedNomad{jobs: map[string]*api.Job{}}, path)
			if err == nil || !strings.Contains(err.Error(), "profile_overlay") {
				t.Errorf("%v, want an error naming profile_overlay", err)
			}
		})
	}
}

// What jobs of a model taught survives a restart in the saved state, and
// a resubmitted job of the model starts from it (issue 21). Two jobs
// report: one job alone never plans another (issue 31).
func TestLearnedFiguresSurviveARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sidecar.db")
	snap, rec := noteState(t, []noteCase{{name: "llm", meta: map[string]string{"hadar.model": "my-new-llm", "hadar.steps": "100000000"}},
		{name: "llm2", meta: map[string]string{"hadar.model": "my-new-llm", "hadar.steps": "100000000"}}})
	snap.Nodes["n1"] = gpuNode("n1", "NVIDIA H100 80GB HBM3", 2)
	open := func() *Agent {
		t.Helper()
		srv := httptest.NewServer(rec)
		t.Cleanup(srv.Close)
		client, err := api.NewClient(&api.Config{Address: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		s, err := config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "1h"}, Service: config.Service{State: &config.StateConfig{Store: "file", Path: path}}}.Resolve()
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(s, client, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	a := open()
	key := watch.JobKey{Namespace: "default", ID: "llm"}
	key2 := watch.JobKey{Namespace: "default", ID: "llm2"}
	ids := []string{engineID(key), engineID(key2)}
	a.mu.Lock()
	now := a.now()
	if err := a.sync(snap, now); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := a.core.eng.Adopt(id, planner.Placement{Units: []planner.Unit{{Slots: []planner.Slot{{Node: "n1", Type: "h100", Count: 1}}}}}, now); err != nil {
			t.Fatal(err)
		}
	}
	// Each makes 10 steps/s there, reported every 30 s for 10 minutes.
	for s := 30.0; s <= 600; s += 30 {
		for _, id := range ids {
			if err := a.core.eng.Progress(id, 10*s, now+s); err != nil {
				t.Fatal(err)
			}
		}
	}
	ke, err := a.core.est.Estimate("my-new-llm", 1, "h100")
	if err != nil || ke.Source != "learned" || ke.Value < 9 || ke.Value > 11 {
		a.mu.Unlock()
		t.Fatalf("after 10 minutes at 10 steps/s: %+v, %v", ke, err)
	}
	if err := a.save(context.Background(), snap.Index); err != nil {
		a.mu.Unlock()
		t.Fatal(err)
	}
	a.mu.Unlock()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	// Restarted, and the job gone: its model keeps what it taught.
	delete(snap.Jobs, key)
	delete(snap.Jobs, key2)
	b := open()
	var fig *wire.LearnedFigure
	l := b.Learned("")
	for i, f := range l.Figures {
		if f.Model == "my-new-llm" && f.SF == 1 && f.Type == "h100" {
			fig = &l.Figures[i]
		}
	}
	if fig == nil || !fig.Applied || fig.Rate < 9 || fig.Rate > 11 || fig.Jobs != 2 {
		t.Fatalf("learned after the restart: %+v", l.Figures)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ke, err := b.core.est.Estimate("my-new-llm", 1, "h100"); err != nil || ke.Source != "learned" || ke.Value != fig.Rate {
		t.Errorf("a new job of the model would start from %+v, %v; want the learned %v", ke, err, fig.Rate)
	}
}
