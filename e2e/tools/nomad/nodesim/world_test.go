package nodesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

// fakeClock drives a world's clock and timers by hand.
type fakeClock struct {
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func (t *fakeTimer) Stop() bool { t.stopped = true; return true }

func (c *fakeClock) after(d time.Duration, f func()) timer {
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// advance moves the clock, firing due timers in order.
func (c *fakeClock) advance(d time.Duration) {
	end := c.now.Add(d)
	for {
		sort.Slice(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.stopped && !t.at.After(end) {
				next = t
				break
			}
		}
		if next == nil {
			break
		}
		next.stopped = true
		c.now = next.at
		next.f()
	}
	c.now = end
}

type reports map[string][]string

func testWorld(t *testing.T, compress float64, restart time.Duration) (*world, *fakeClock, reports, *bytes.Buffer) {
	t.Helper()
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	var buf bytes.Buffer
	w := newWorld(compress, restart, 30*time.Minute, newEventLog(&buf))
	w.now, w.after = func() time.Time { return clk.now }, clk.after
	w.log.now = w.now
	return w, clk, reports{}, &buf
}

var rates = map[string]float64{"V100": 40, "K80": 10}

func worker(r reports, alloc, node, unit string, size int, model string) taskInfo {
	return taskInfo{Alloc: alloc, Node: node, Group: "g-" + alloc, Job: jobKey{Namespace: "default", ID: "j", Create: 1}, Unit: unit, Size: size,
		Model: model, TotalSteps: 12000, Rates: rates, Spread: map[string]float64{"V100": 20, "K80": 5},
		Report: func(status, desc string) { r[alloc] = append(r[alloc], status) }}
}

func TestWorldUnitWaitsForRendezvousThenRunsAtSlowestWorker(t *testing.T) {
	w, clk, r, _ := testWorld(t, 10, 20*time.Second)
	w.start(worker(r, "a0", "n1", "u0", 2, "V100"))
	clk.advance(time.Minute)
	if p := progressOf(t, w, "a0"); p.StepsDone != 0 || p.State != "waiting" {
		t.Fatalf("one of two workers: progress %+v, want 0 steps waiting at the rendezvous", p)
	}
	w.start(worker(r, "a1", "n1", "u0", 2, "K80"))
	// Restart delay: 20 s simulated / 10 = 2 s of wall time.
	clk.advance(2 * time.Second)
	if p := progressOf(t, w, "a1"); p.StepsDone != 0 {
		t.Fatalf("during the restart delay: %d steps, want 0", p.StepsDone)
	}
	// K80 sets the pace: 10 steps/s simulated, 100 per wall second.
	clk.advance(10 * time.Second)
	if p := progressOf(t, w, "a0"); p.StepsDone != 1000 || p.State != "running" || p.StepsPerSec != 100 {
		t.Fatalf("after 10 s: %+v, want 1000 steps at 100/s", p)
	}
	clk.advance(110*time.Second - time.Millisecond)
	if got := r["a0"]; len(got) != 1 {
		t.Fatalf("before the last step: reports %v, want running only", got)
	}
	clk.advance(time.Millisecond + time.Millisecond)
	for _, a := range []string{"a0", "a1"} {
		if got := strings.Join(r[a], ","); got != "running,complete" {
			t.Errorf("%s reported %s, want running,complete", a, got)
		}
	}
	if p := progressOf(t, w, "a0"); p.StepsDone != 12000 || p.State != "done" {
		t.Errorf("finished: %+v, want 12000 steps done", p)
	}
}

func TestWorldStopCheckpointsAndResumes(t *testing.T) {
	w, clk, r, log := testWorld(t, 1, 0)
	w.start(worker(r, "a0", "n1", "u0", 1, "V100"))
	clk.advance(100 * time.Second) // 4000 steps
	w.stop("a0")
	if got := strings.Join(r["a0"], ","); got != "running,complete" {
		t.Fatalf("stopped worker reported %s, want running,complete", got)
	}
	clk.advance(time.Hour)
	w.start(worker(r, "b0", "n2", "u1", 1, "K80"))
	clk.advance(100 * time.Second) // 1000 more
	if p := progressOf(t, w, "b0"); p.StepsDone != 5000 {
		t.Fatalf("resumed: %d steps, want 5000 (4000 kept + 1000)", p.StepsDone)
	}
	clk.advance(701 * time.Second)
	if got := strings.Join(r["b0"], ","); got != "running,complete" {
		t.Fatalf("resumed worker reported %s, want running,complete", got)
	}
	var kinds []string
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, e.Event)
		if e.Event == "stopped" && e.Steps != 4000 {
			t.Errorf("stopped event: steps %v, want the checkpoint 4000", e.Steps)
		}
	}
	if got := strings.Join(kinds, ","); got != "placed,running,stopped,placed,running,complete" {
		t.Errorf("events %s", got)
	}
}

func TestWorldSpreadUnitUsesSpreadFigures(t *testing.T) {
	w, clk, r, _ := testWorld(t, 1, 0)
	w.start(worker(r, "a0", "n1", "u0", 2, "V100"))
	w.start(worker(r, "a1", "n2", "u0", 2, "V100"))
	clk.advance(10 * time.Second)
	if p := progressOf(t, w, "a0"); p.StepsDone != 200 {
		t.Fatalf("two nodes: %d steps in 10 s, want 200 (spread 20/s)", p.StepsDone)
	}
}

func TestWorldUnknownModelStalls(t *testing.T) {
	w, clk, r, log := testWorld(t, 1, 0)
	w.start(worker(r, "a0", "n1", "u0", 1, "P100"))
	clk.advance(time.Hour)
	if p := progressOf(t, w, "a0"); p.StepsDone != 0 {
		t.Fatalf("a model without a throughput made %d steps", p.StepsDone)
	}
	if !strings.Contains(log.String(), `"event":"stalled"`) {
		t.Errorf("no stalled event in %s", log)
	}
}

func TestWorldForgetAndLateAllocOfFinishedJob(t *testing.T) {
	w, clk, r, _ := testWorld(t, 1, 0)
	w.start(worker(r, "a0", "n1", "u0", 1, "V100"))
	clk.advance(301 * time.Second)
	w.forget("a0")
	if _, err := w.progress("a0"); err == nil {
		t.Error("a forgotten allocation still has progress")
	}
	w.start(worker(r, "a1", "n1", "u1", 1, "V100"))
	if got := strings.Join(r["a1"], ","); got != "complete" {
		t.Errorf("a worker of a finished job reported %s, want complete at once", got)
	}
}

func TestWorldRendezvousTimeout(t *testing.T) {
	w, clk, r, log := testWorld(t, 10, 0)
	w.start(worker(r, "a0", "n1", "u0", 3, "V100"))
	clk.advance(2 * time.Minute)
	w.start(worker(r, "a1", "n2", "u0", 3, "V100"))
	// 30 simulated minutes are 3 wall minutes: a0 gives up first.
	clk.advance(time.Minute + time.Second)
	if got := strings.Join(r["a0"], ","); got != "running,failed" {
		t.Fatalf("a0 reported %s, want running,failed after the rendezvous timeout", got)
	}
	if got := strings.Join(r["a1"], ","); got != "running" {
		t.Fatalf("a1 reported %s, want still running (its own timeout is later)", got)
	}
	// A replacement and the third worker arrive: the unit trains.
	w.start(worker(r, "a2", "n3", "u0", 3, "V100"))
	w.start(worker(r, "a3", "n3", "u0", 3, "V100"))
	clk.advance(10 * time.Minute)
	if got := strings.Join(r["a1"], ","); got != "running,complete" {
		t.Errorf("a1 reported %s, want running,complete once the unit filled", got)
	}
	if !strings.Contains(log.String(), `"event":"timeout"`) {
		t.Errorf("no timeout event in %s", log)
	}
}

func progressOf(t *testing.T, w *world, alloc string) progressFile {
	t.Helper()
	b, err := w.progress(alloc)
	if err != nil {
		t.Fatal(err)
	}
	var p progressFile
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	p.StepsPerSec = math.Round(p.StepsPerSec*1000) / 1000
	return p
}

func TestFiguresAndNumbers(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want map[string]float64
		err  bool
	}{
		{map[string]any{"V100": 40.0, "K80": int64(10)}, map[string]float64{"V100": 40, "K80": 10}, false},
		{[]any{map[string]any{"V100": uint64(3)}}, map[string]float64{"V100": 3}, false},
		{map[any]any{"V100": "2.5"}, map[string]float64{"V100": 2.5}, false},
		{nil, nil, false},
		{map[string]any{"V100": -1.0}, nil, true},
		{"V100=4", nil, true},
	} {
		got, err := figures(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("figures(%v): error %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("figures(%v) = %v, want %v", tc.in, got, tc.want)
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("figures(%v)[%s] = %v, want %v", tc.in, k, got[k], v)
			}
		}
	}
}

func TestSpecValidate(t *testing.T) {
	good := NodeSpec{Name: "n1", Rack: "r1", Address: "10.0.0.1", GPUs: []GPUSpec{{Model: "Tesla K80", Count: 8, MemoryMiB: 12288}}}
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"ok", Spec{Nodes: []NodeSpec{good}}, ""},
		{"empty", Spec{}, "no nodes"},
		{"dup name", Spec{Nodes: []NodeSpec{good, {Name: "n1", Address: "10.0.0.2"}}}, "name given twice"},
		{"dup addr", Spec{Nodes: []NodeSpec{good, {Name: "n2", Address: "10.0.0.1"}}}, "given twice"},
		{"bad addr", Spec{Nodes: []NodeSpec{{Name: "n2", Address: "::1"}}}, "want an IPv4"},
		{"bad count", Spec{Nodes: []NodeSpec{{Name: "n2", Address: "10.0.0.3", GPUs: []GPUSpec{{Model: "x", Count: 0}}}}}, "count 0"},
	} {
		err := tc.spec.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestBuildNodeShape(t *testing.T) {
	n := buildNode(NodeSpec{Name: "n1", Rack: "r3", Address: "10.0.0.7", GPUs: []GPUSpec{{Model: "Tesla V100-SXM2-16GB", Count: 4, MemoryMiB: 16384}}}, "dc1", "nodesim")
	if n.Meta["rack"] != "r3" || n.Attributes["unique.network.ip-address"] != "10.0.0.7" || !n.Drivers["nodesim"].Healthy {
		t.Errorf("node meta %v, attributes %v, drivers %v", n.Meta, n.Attributes, n.Drivers)
	}
	d := n.NodeResources.Devices
	if len(d) != 1 || d[0].Vendor != "nvidia" || d[0].Type != "gpu" || d[0].Name != "Tesla V100-SXM2-16GB" || len(d[0].Instances) != 4 || !d[0].Instances[3].Healthy {
		t.Fatalf("devices %+v", d)
	}
	if n.NodeResources.Processors.Topology == nil || n.ComputedClass == "" {
		t.Errorf("no processor topology or computed class: the scheduler needs both")
	}
}

// The simulated progress file is the training contract's (contract/ in the
// main module, which this test-tool module does not import): every field
// it writes is one the contract's fixture has, with a value of the same
// JSON kind, and the state is one of the contract's or "waiting" and
// "restoring", which only the simulator shows.
func TestProgressFileFollowsTheContract(t *testing.T) {
	b, err := os.ReadFile("../../../../contract/testdata/progress-full.json")
	if err != nil {
		t.Fatal(err)
	}
	var fixture map[string]any
	if err := json.Unmarshal(b, &fixture); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(progressFile{StepsDone: 3, TotalSteps: 10, StepsPerSec: 1.5, Updated: time.Now(), State: "running"})
	if err != nil {
		t.Fatal(err)
	}
	var ours map[string]any
	if err := json.Unmarshal(out, &ours); err != nil {
		t.Fatal(err)
	}
	for k, v := range ours {
		fv, ok := fixture[k]
		if !ok {
			t.Errorf("field %q is not in the contract's progress file", k)
			continue
		}
		if fmt.Sprintf("%T", fv) != fmt.Sprintf("%T", v) {
			t.Errorf("field %q: %T here, %T in the contract", k, v, fv)
		}
	}
}
