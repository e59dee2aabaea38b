package contract

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The fixtures are the contract's progress files: every implementation
// (Go here, the Python library, the node simulator) reads and writes them.
func TestProgressFixtures(t *testing.T) {
	want := Progress{Version: 2, StepsDone: 1200, TotalSteps: 5000, StepsPerSec: 41.5, Loss: 0.312, Checkpoint: "/alloc/data/checkpoints/ckpt-1200.json",
		Updated: time.Date(2026, 11, 21, 23, 59, 0, 0, time.UTC), State: StateRunning, CopyIndex: 1, Copies: 2, LocalSteps: 600, Merges: 3, Round: 3,
		WorldSize: 2, Unit: 4, UnitStepsPerSec: 40, Nodes: 2}
	b, err := os.ReadFile("testdata/progress-full.json")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseProgress(b)
	if err != nil || !reflect.DeepEqual(*p, want) {
		t.Fatalf("full fixture: %+v, %v; want %+v", p, err, want)
	}
	// Written back, it is the fixture again (field names and order).
	out, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) != string(out) {
		t.Fatalf("written back:\n%s\nfixture:\n%s", out, b)
	}
	if b, err = os.ReadFile("testdata/progress-minimal.json"); err != nil {
		t.Fatal(err)
	}
	if p, err = ParseProgress(b); err != nil || p.StepsDone != 7 || p.Version != 0 {
		t.Fatalf("minimal fixture: %+v, %v", p, err)
	}
}

func TestParseProgressRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not JSON", `steps`, "progress file"},
		{"negative", `{"steps_done": -1}`, "negative"},
		{"too large", `{"loss": 0, "pad": "` + strings.Repeat("x", MaxProgressBytes) + `"}`, "more than"},
	} {
		if _, err := ParseProgress([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}

// FuzzParseProgress: any bytes give a progress or an error, never a panic,
// and what is accepted has no negative count.
func FuzzParseProgress(f *testing.F) {
	for _, name := range []string{"testdata/progress-full.json", "testdata/progress-minimal.json"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProgress(b)
		if err == nil && (p.StepsDone < 0 || p.TotalSteps < 0 || p.LocalSteps < 0) {
			t.Fatalf("accepted %+v", p)
		}
	})
}
