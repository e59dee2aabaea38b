package scale

import (
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/planner/profile"
)

// The full run's cluster is what issue 12 asks for: >= 500 nodes, >= 2,000
// GPUs of 3 types, >= 10 racks each mixing the types, unique addresses.
func TestNewClusterFullSize(t *testing.T) {
	c, err := NewCluster(500, 20)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(c.Spec.Nodes); n != 500 || len(c.Planner.Nodes) != 500 {
		t.Fatalf("%d spec nodes, %d planner nodes, want 500", n, len(c.Planner.Nodes))
	}
	if g := c.Planner.TotalGPUs(); g < 2000 {
		t.Errorf("%d GPUs, want >= 2000", g)
	}
	if ty := c.Planner.Types(); len(ty) != 3 {
		t.Errorf("GPU types %v, want 3", ty)
	}
	addrs, racks := map[string]bool{}, map[string]map[string]bool{}
	for i, n := range c.Spec.Nodes {
		if addrs[n.Address] {
			t.Fatalf("address %s given twice", n.Address)
		}
		addrs[n.Address] = true
		if racks[n.Rack] == nil {
			racks[n.Rack] = map[string]bool{}
		}
		racks[n.Rack][n.GPUs[0].Model] = true
		p := c.Planner.Nodes[i]
		if p.ID != n.Name || p.Rack != n.Rack || p.GPUs[Kinds[i%3].Type] != n.GPUs[0].Count {
			t.Fatalf("node %d: planner %+v, spec %+v: the simulator and the prediction see different clusters", i, p, n)
		}
	}
	if len(racks) != 20 {
		t.Errorf("%d racks, want 20", len(racks))
	}
	for r, models := range racks {
		if len(models) != 3 {
			t.Errorf("rack %s holds %d GPU models, want all 3", r, len(models))
		}
	}
	if _, err := NewCluster(5, 6); err == nil {
		t.Error("more racks than nodes accepted")
	}
}

// Jobs carry their truth (steps and throughputs by device model) to
// nodesim; managed jobs carry the gate, plain ones a device constraint
// that keeps Nomad off models they cannot run on.
func TestJobsForBothArms(t *testing.T) {
	c, err := NewCluster(30, 3)
	if err != nil {
		t.Fatal(err)
	}
	jobs, rate, err := Workload(c, 40, 0.9, 1, Durations(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 40 || !(rate > 0) {
		t.Fatalf("%d jobs at %v/h", len(jobs), rate)
	}
	prof := profile.Default()
	for _, j := range jobs {
		m, p := ManagedJob(prof, j), PlainJob(prof, j)
		if len(m.Constraints) != 1 || !strings.Contains(m.Constraints[0].LTarget, "hadar") {
			t.Fatalf("%s: managed job constraints %+v, want the gate", j.ID, m.Constraints)
		}
		if len(p.Constraints) != 0 || *p.TaskGroups[0].Count != j.ScaleFactor {
			t.Fatalf("%s: plain job: constraints %+v, count %d, want none and %d", j.ID, p.Constraints, *p.TaskGroups[0].Count, j.ScaleFactor)
		}
		cfg := m.TaskGroups[0].Tasks[0].Config
		if cfg["total_steps"] != int64(j.TotalSteps) {
			t.Errorf("%s: total_steps %v, want %v", j.ID, cfg["total_steps"], int64(j.TotalSteps))
		}
		rates := cfg["steps_per_sec"].(map[string]any)
		v100, err := prof.Throughput(j.Model, j.ScaleFactor, "v100", false)
		if err != nil || rates[ModelOf("v100")] != v100 {
			t.Errorf("%s: V100 rate %v, profile %v (%v)", j.ID, rates[ModelOf("v100")], v100, err)
		}
		// Durations on a V100 are within the drawn bounds (10 to 100 min).
		if d := j.TotalSteps / v100; d < 600*0.999 || d > 6000*1.001 {
			t.Errorf("%s: %.0f s on a V100, want 600 to 6000", j.ID, d)
		}
		dc := p.TaskGroups[0].Tasks[0].Resources.Devices[0].Constraints
		if len(dc) != 1 || dc[0].Operand != "set_contains_any" || !strings.Contains(dc[0].RTarget, ModelOf("v100")) {
			t.Errorf("%s: plain job device constraint %+v", j.ID, dc)
		}
	}
	fast, err := Compressed(prof, 20)
	if err != nil {
		t.Fatal(err)
	}
	j := jobs[0]
	a, _ := prof.Throughput(j.Model, j.ScaleFactor, "k80", false)
	b, _ := fast.Throughput(j.Model, j.ScaleFactor, "k80", false)
	if math.Abs(b-20*a) > 1e-9*b {
		t.Errorf("compressed K80 throughput %v, want 20 x %v", b, a)
	}
}

func TestTailFollowsAGrowingLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	tail := NewTail(path)
	if err := tail.Read(); err != nil {
		t.Fatalf("a log not written yet: %v", err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(s string) {
		t.Helper()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"t":100,"event":"placed","job":"a","group":"train-hadar-u0-w0"}` + "\n" +
		`{"t":101,"event":"placed","job":"b","group":"train"}` + "\n" +
		`{"t":102,"event":"running","job":"a"}` + "\n" + `{"t":103,"event":"sto`)
	if err := tail.Read(); err != nil {
		t.Fatal(err)
	}
	a := tail.Jobs["a"]
	if a == nil || a.Generated != 1 || a.Other != 0 || a.Starts != 1 || !a.Placed.Equal(time.Unix(100, 0)) {
		t.Fatalf("job a: %+v", a)
	}
	if b := tail.Jobs["b"]; b == nil || b.Other != 1 || b.Generated != 0 {
		t.Fatalf("job b: %+v", b)
	}
	// The half-written line completes later.
	write(`pped","job":"a","steps":40}` + "\n" + `{"t":110,"event":"complete","job":"a"}` + "\n")
	if err := tail.Read(); err != nil {
		t.Fatal(err)
	}
	if a.Stops != 1 || a.Complete.IsZero() || tail.Completed() != 1 {
		t.Errorf("after the rest: job a %+v, %d complete", a, tail.Completed())
	}
	write("not json\n")
	if err := tail.Read(); err == nil {
		t.Error("a malformed line was accepted")
	}
}

func TestRequestKindsAndQuantiles(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodPost, "/v1/job/j1/plan", "plan"},
		{http.MethodPut, "/v1/job/j1", "register"},
		{http.MethodGet, "/v1/job/j1", "job read"},
		{http.MethodGet, "/v1/client/fs/cat/abc", "progress read"},
		{http.MethodGet, "/v1/event/stream", "event stream"},
		{http.MethodGet, "/v1/nodes", "list /v1/nodes"},
		{http.MethodPut, "/v1/jobs", "register"},
		{http.MethodDelete, "/v1/job/j1", "other write DELETE /v1/job"},
	} {
		if got := RequestKind(tc.method, tc.path); got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
	xs := []float64{5, 1, 4, 2, 3}
	if q := Quantile(xs, 0.5); q != 3 {
		t.Errorf("median %v, want 3", q)
	}
	if q := Quantile(xs, 0.99); q != 5 {
		t.Errorf("p99 %v, want 5", q)
	}
	if !math.IsNaN(Quantile(nil, 0.5)) || !math.IsNaN(Mean(nil)) {
		t.Error("quantile or mean of nothing is a number")
	}
	if u, err := Usage(os.Getpid()); err != nil || u.RSS <= 0 || u.HWM < u.RSS {
		t.Errorf("own usage %+v, %v", u, err)
	}
}
