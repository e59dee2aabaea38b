package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// visibleWithin is how soon a change in Nomad must show in the watcher's
// snapshot ("within a few seconds"); the tests log the latency measured.
const visibleWithin = 5 * time.Second

// watchGPUs declares n GPUs of one model for hadar-gpu, the first
// `unhealthy` of them unhealthy.
func watchGPUs(prefix, model, mem string, n, unhealthy int) string {
	var b strings.Builder
	b.WriteString("fingerprint_period = \"1s\"\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "gpu {\n  id = \"%s-%d\"\n  model = %q\n  memory = %q\n  healthy = %t\n}\n", prefix, i, model, mem, i >= unhealthy)
	}
	return b.String()
}

// watchTrainPlugin configures hadar-train with a checkpoint root its tasks
// (run as nobody) can reach.
func watchTrainPlugin(t *testing.T) string {
	return fmt.Sprintf("checkpoint_root = %q\nprogress_poll_interval = \"500ms\"", harness.SharedDir(t))
}

// watchJobHCL is a hadar-train job of one worker on one GPU, with meta
// and constraint blocks as given (HCL text).
func watchJobHCL(id, meta, constraints, trainer string) string {
	return fmt.Sprintf(`job %q {
  type = "batch"
  meta = {
%s
  }
%s
  group "train" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "trainer" {
      driver       = "hadar-train"
      kill_timeout = "10s"
      config {
        command     = %q
        args        = ["--model", "mlp", "--progress-interval", "500ms"]
        total_steps = 100000
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 40
            "Tesla K80"            = 12
          }
        }
      }
      resources {
        cpu    = 100
        memory = 128
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
`, id, meta, constraints, trainer)
}

const watchGateHCL = `  constraint {
    attribute = "${meta.hadar.gate}"
    value     = "waiting-for-hadar"
  }
`

func watchParse(t *testing.T, c *api.Client, src string) *api.Job {
	t.Helper()
	job, err := c.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: src, Canonicalize: true})
	if err != nil {
		t.Fatalf("parse job: %v\n%s", err, src)
	}
	return job
}

func watchRegister(t *testing.T, c *api.Client, job *api.Job) time.Time {
	t.Helper()
	if _, _, err := c.Jobs().Register(job, nil); err != nil {
		t.Fatalf("register job %s: %v", *job.ID, err)
	}
	return time.Now()
}

// startWatcher runs a watcher until the test ends and waits for its first
// snapshot.
func startWatcher(t *testing.T, c *api.Client, cfg watch.Config) *watch.Watcher {
	t.Helper()
	w, err := watch.New(c, cfg, hclog.New(&hclog.LoggerOptions{Name: "hadar", Level: hclog.Debug, Output: testLogWriter{t}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watcher Run: %v", err)
		}
	})
	select {
	case <-w.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("watcher not ready after 30s")
	}
	return w
}

// testLogWriter sends the watcher's log to the test log, so a failure
// shows what the watcher did; writes after the test ended are dropped.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // t.Log after the test's end panics
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitView polls the watcher's snapshot until cond holds and returns the
// snapshot and how long it took since `since`.
func waitView(t *testing.T, w *watch.Watcher, within time.Duration, since time.Time, what string, cond func(*watch.Snapshot) error) (*watch.Snapshot, time.Duration) {
	t.Helper()
	var s *watch.Snapshot
	err := harness.Eventually(context.Background(), within, 50*time.Millisecond, func() error {
		s = w.Snapshot()
		return cond(s)
	})
	if err != nil {
		t.Fatalf("%s: %v (stats %+v)", what, err, w.Stats())
	}
	d := time.Since(since)
	t.Logf("%s: in the snapshot after %v", what, d.Round(time.Millisecond))
	return s, d
}

// recorder collects the kinds of changes the watcher announces.
type recorder struct {
	mu    sync.Mutex
	kinds watch.ChangeKind
}

func recordChanges(t *testing.T, w *watch.Watcher) *recorder {
	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case c := <-w.Changes():
				r.mu.Lock()
				r.kinds |= c.Kinds
				r.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// expect waits until every kind in want was announced since the last
// expect, then forgets what was seen.
func (r *recorder) expect(t *testing.T, want watch.ChangeKind) {
	t.Helper()
	err := harness.Eventually(context.Background(), visibleWithin, 20*time.Millisecond, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.kinds&want != want {
			return fmt.Errorf("changes announced: %v; want %v", r.kinds, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.kinds = 0
	r.mu.Unlock()
}

// watchFresh waits until the watcher's snapshot equals a fresh list of the
// cluster, the proof that events and re-lists kept it complete.
func watchFresh(t *testing.T, w *watch.Watcher, c *api.Client, cfg watch.Config) *watch.Snapshot {
	t.Helper()
	var s *watch.Snapshot
	var diff string
	err := harness.Eventually(context.Background(), 20*time.Second, 200*time.Millisecond, func() error {
		fresh, err := watch.List(context.Background(), c, cfg)
		if err != nil {
			return err
		}
		s = w.Snapshot()
		if !s.Equal(fresh) {
			diff = s.Diff(fresh)
			return fmt.Errorf("watched snapshot (index %d) differs from a fresh list (index %d): %s", s.Index, fresh.Index, diff)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func managedJob(s *watch.Snapshot, id string) (*watch.Job, error) {
	j := s.Jobs[watch.JobKey{Namespace: "default", ID: id}]
	if j == nil {
		return nil, fmt.Errorf("job %s not in the snapshot", id)
	}
	return j, nil
}

// TestWatchCluster shows every part of the view against a real cluster:
// one server and two clients with declared GPUs in two racks. Nodes with
// their GPU groups and racks; managed, invalid and human jobs; the gate's
// blocked evaluation; a spec change; a placement with its allocation and
// training progress; a node change; stop and purge; and in the end a
// snapshot equal to a fresh list.
func TestWatchCluster(t *testing.T) {
	skipShort(t)
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	srv := harness.StartAgent(t, harness.Options{Name: "srv", Mode: harness.ModeServer})
	train := watchTrainPlugin(t)
	c1 := harness.StartAgent(t, harness.Options{Name: "w-v100", Mode: harness.ModeClient, Servers: []string{srv.RPCAddr},
		Meta:    map[string]string{"rack": "r1", "hadar.nic_gbps": "25"},
		Plugins: map[string]string{"hadar-gpu": watchGPUs("v100", "Tesla V100-SXM2-16GB", "16GiB", 2, 0), "hadar-train": train}})
	c2 := harness.StartAgent(t, harness.Options{Name: "w-k80", Mode: harness.ModeClient, Servers: []string{srv.RPCAddr},
		Meta:    map[string]string{"rack": "r2"},
		Plugins: map[string]string{"hadar-gpu": watchGPUs("k80", "Tesla K80", "12GiB", 3, 1), "hadar-train": train}})
	client := srv.Client
	cfg := watch.Config{}
	w := startWatcher(t, client, cfg)
	rec := recordChanges(t, w)

	// Nodes, their GPU groups, racks and addresses.
	waitView(t, w, visibleWithin, time.Now(), "two nodes with their GPUs", func(s *watch.Snapshot) error {
		want := map[string]string{
			c1.NodeID: "w-v100 rack=r1 ready eligible addr=127.0.0.1 [Tesla V100-SXM2-16GB 2/2 memory=16384 MiB source=declared]",
			c2.NodeID: "w-k80 rack=r2 ready eligible addr=127.0.0.1 [Tesla K80 2/3 memory=12288 MiB source=declared]",
		}
		if len(s.Nodes) != len(want) {
			return fmt.Errorf("%d nodes, want %d", len(s.Nodes), len(want))
		}
		for id, w := range want {
			n := s.Nodes[id]
			if n == nil {
				return fmt.Errorf("node %s missing", id)
			}
			var gs []string
			for _, g := range n.GPUs {
				gs = append(gs, fmt.Sprintf("%s %d/%d memory=%s source=%s", g.Model, g.Healthy, len(g.Instances), g.Attributes["memory"], g.Attributes["source"]))
			}
			got := fmt.Sprintf("%s rack=%s %s %s addr=%s %v", n.Name, n.Rack, n.Status, n.SchedulingEligibility, n.Address, gs)
			if got != w {
				return fmt.Errorf("node %s: %s, want %s", id, got, w)
			}
		}
		if s.Nodes[c1.NodeID].Meta["hadar.nic_gbps"] != "25" || !s.Nodes[c1.NodeID].Schedulable() || s.Nodes[c2.NodeID].HealthyGPUs() != 2 {
			return fmt.Errorf("node meta or helpers wrong: %+v", s.Nodes[c1.NodeID])
		}
		return nil
	})

	// A managed job arrives, gated: parsed spec, pending, and a blocked
	// evaluation saying the gate filtered every node.
	meta := `    "hadar.model" = "ResNet-18 (batch size 16)"
    "hadar.steps" = "5000"
    "hadar.workers" = "1"`
	at := watchRegister(t, client, watchParse(t, client, watchJobHCL("wa", meta, watchGateHCL, trainer)))
	gateReason := fmt.Sprintf("%s = %s", jobspec.GateAttribute, jobspec.GateValue)
	waitView(t, w, visibleWithin, at, "managed job wa with its blocked evaluation", func(s *watch.Snapshot) error {
		j, err := managedJob(s, "wa")
		if err != nil {
			return err
		}
		if !j.Managed || j.Spec == nil || j.Spec.Steps != 5000 || j.Spec.Task != "trainer" || j.Raw == nil || j.Status != "pending" {
			return fmt.Errorf("job wa: %+v", j)
		}
		evs := s.BlockedEvalsOf(j.Key())
		if len(evs) != 1 || evs[0].FailedTGAllocs["train"] == nil || evs[0].FailedTGAllocs["train"].ConstraintFiltered[gateReason] != 2 {
			return fmt.Errorf("blocked evals of wa: %d, want one whose FailedTGAllocs says the gate filtered 2 nodes", len(evs))
		}
		return nil
	})
	rec.expect(t, watch.JobArrived|watch.EvalBlocked)

	// What a person sees: nomad job status names the gate.
	out, err := exec.Command(harness.NomadBinary(t), "job", "status", "-address", srv.Addr, "wa").CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("Constraint %q: 2 nodes excluded by filter", gateReason)) {
		t.Fatalf("nomad job status wa (%v) does not show the gate:\n%s", err, out)
	}
	t.Logf("nomad job status wa:\n%s", out)

	// A managed job with bad meta, and a human job.
	at = watchRegister(t, client, watchParse(t, client, watchJobHCL("wbad", `    "hadar.steps" = "1e"
    "hadar.model" = "x"`, watchGateHCL, trainer)))
	human := watchParse(t, client, watchJobHCL("human", `    owner = "ana"`, `  constraint {
    attribute = "${meta.nobody}"
    value     = "x"
  }
`, trainer))
	watchRegister(t, client, human)
	waitView(t, w, visibleWithin, at, "invalid job wbad with its error, human job unmanaged", func(s *watch.Snapshot) error {
		bad, err := managedJob(s, "wbad")
		if err != nil {
			return err
		}
		if bad.Spec != nil || bad.SpecErr == nil || bad.SpecErr.Field != jobspec.KeySteps || bad.SpecErr.Value != "1e" {
			return fmt.Errorf("wbad: spec %v error %v", bad.Spec, bad.SpecErr)
		}
		h, err := managedJob(s, "human")
		if err != nil {
			return err
		}
		if h.Managed || h.Raw != nil || len(s.BlockedEvalsOf(h.Key())) != 0 {
			return fmt.Errorf("human job treated as managed: %+v", h)
		}
		return nil
	})

	// A spec change: new version, JobChanged.
	j := watchParse(t, client, watchJobHCL("wa", meta+"\n    \"hadar.weight\" = \"3\"", watchGateHCL, trainer))
	at = watchRegister(t, client, j)
	waitView(t, w, visibleWithin, at, "spec change of wa", func(s *watch.Snapshot) error {
		j, err := managedJob(s, "wa")
		if err != nil {
			return err
		}
		if j.Version != 1 || j.Spec == nil || j.Spec.Weight != 3 {
			return fmt.Errorf("wa version %d spec %+v", j.Version, j.Spec)
		}
		return nil
	})
	rec.expect(t, watch.JobChanged)

	// Placement in the sidecar's placed form: the template group at count
	// 0 keeps the gate, and a generated group runs the worker pinned to
	// its node; written check-and-set on the job modify index.
	s := w.Snapshot()
	wa := s.Jobs[watch.JobKey{Namespace: "default", ID: "wa"}]
	placed := watchPlaced(t, watchParse(t, client, watchJobHCL("wa", meta+"\n    \"hadar.weight\" = \"3\"", watchGateHCL, trainer)), c1.NodeID)
	if _, _, err := client.Jobs().RegisterOpts(placed, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: wa.JobModifyIndex}, nil); err != nil {
		t.Fatalf("place wa: %v", err)
	}
	at = time.Now()
	s, _ = waitView(t, w, 30*time.Second, at, "wa's allocation running on w-v100, its blocked eval gone", func(s *watch.Snapshot) error {
		as := s.AllocsOf(watch.JobKey{Namespace: "default", ID: "wa"})
		if len(as) != 1 {
			return fmt.Errorf("%d allocations of wa", len(as))
		}
		a := as[0]
		if a.NodeID != c1.NodeID || a.TaskGroup != "train-hadar-u0-w0" || a.ClientStatus != "running" || a.Task != "trainer" || a.JobVersion != 2 || a.TaskStates["trainer"].State != "running" {
			return fmt.Errorf("alloc %+v", a)
		}
		if n := len(s.BlockedEvalsOf(watch.JobKey{Namespace: "default", ID: "wa"})); n != 0 {
			return fmt.Errorf("%d blocked evals left", n)
		}
		if j := s.Jobs[watch.JobKey{Namespace: "default", ID: "wa"}]; j.Spec == nil || j.Spec.Group != "train" || j.Status != "running" {
			return fmt.Errorf("placed wa: spec %+v error %v status %s", j.Spec, j.SpecErr, j.Status)
		}
		return nil
	})
	rec.expect(t, watch.AllocPlaced|watch.EvalUnblocked|watch.JobChanged)
	alloc := s.AllocsOf(watch.JobKey{Namespace: "default", ID: "wa"})[0]

	// Training progress through the allocation filesystem.
	var p *contract.Progress
	err = harness.Eventually(context.Background(), 30*time.Second, 250*time.Millisecond, func() error {
		var err error
		p, err = w.Progress(context.Background(), alloc)
		if err != nil {
			return err
		}
		if p.StepsDone < 20 || p.TotalSteps != 100000 || p.StepsPerSec <= 0 {
			return fmt.Errorf("progress %+v", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("progress of %s: %+v", alloc.ID, *p)

	// A job hadar does not manage, running on w-k80: its GPU is held.
	at = watchRegister(t, client, watchParse(t, client, watchJobHCL("human-run", `    owner = "ana"`, fmt.Sprintf(`  constraint {
    attribute = "${node.unique.id}"
    value     = %q
  }
`, c2.NodeID), trainer)))
	waitView(t, w, 30*time.Second, at, "the GPU human-run holds on w-k80", func(s *watch.Snapshot) error {
		if len(s.Unmanaged) != 1 || s.Unmanaged[0].NodeID != c2.NodeID || s.Unmanaged[0].GPUs["Tesla K80"] != 1 ||
			s.Unmanaged[0].Job != (watch.JobKey{Namespace: "default", ID: "human-run"}) {
			return fmt.Errorf("unmanaged holds %+v", s.Unmanaged)
		}
		if len(s.AllocsOf(watch.JobKey{Namespace: "default", ID: "human-run"})) != 0 {
			return errors.New("the human job's allocation is among managed allocations")
		}
		return nil
	})
	rec.expect(t, watch.CapacityChanged)

	// A node change: w-k80 made ineligible.
	if _, err := client.Nodes().ToggleEligibility(c2.NodeID, false, nil); err != nil {
		t.Fatal(err)
	}
	waitView(t, w, visibleWithin, time.Now(), "w-k80 ineligible", func(s *watch.Snapshot) error {
		if n := s.Nodes[c2.NodeID]; n.SchedulingEligibility != "ineligible" || n.Schedulable() {
			return fmt.Errorf("w-k80 is %s", n.SchedulingEligibility)
		}
		return nil
	})
	rec.expect(t, watch.NodeChanged)

	// Stop: the allocation completes (the trainer checkpoints), the job is
	// stopped.
	if _, _, err := client.Jobs().Deregister("wa", false, nil); err != nil {
		t.Fatal(err)
	}
	waitView(t, w, 30*time.Second, time.Now(), "wa stopped, its allocation complete", func(s *watch.Snapshot) error {
		j, err := managedJob(s, "wa")
		if err != nil {
			return err
		}
		a := s.Allocs[alloc.ID]
		if !j.Stop || a == nil || !a.Terminal() || a.DesiredStatus != "stop" {
			return fmt.Errorf("wa stop=%v status=%s alloc %+v", j.Stop, j.Status, a)
		}
		return nil
	})
	rec.expect(t, watch.JobChanged|watch.AllocTerminal)

	// Purge: gone from the view with its allocations and evaluations.
	for _, id := range []string{"wa", "wbad", "human", "human-run"} {
		if _, _, err := client.Jobs().Deregister(id, true, nil); err != nil {
			t.Fatal(err)
		}
	}
	// (human-run's GPU is free once its task has stopped.)
	waitView(t, w, 30*time.Second, time.Now(), "purged jobs gone, human-run's GPU free", func(s *watch.Snapshot) error {
		if len(s.Jobs) != 0 || len(s.Allocs) != 0 || len(s.BlockedEvals) != 0 || len(s.Unmanaged) != 0 {
			return fmt.Errorf("%d jobs, %d allocs, %d blocked evals, %d unmanaged holds left", len(s.Jobs), len(s.Allocs), len(s.BlockedEvals), len(s.Unmanaged))
		}
		return nil
	})
	rec.expect(t, watch.JobRemoved)

	watchFresh(t, w, client, cfg)
	st := w.Stats()
	if st.Relists != 1+st.GapChecks || st.Reconnects != 0 || st.EventsApplied == 0 {
		t.Errorf("stats %+v: want one re-list (plus gap checks), no reconnect, events applied", st)
	}
	t.Logf("stats: %+v", st)
}

// watchPlaced returns the placed form of a held job with one worker on
// node: the template group at count 0, keeping the gate, and the generated
// group "<template>-hadar-u0-w0" pinned to node.
func watchPlaced(t *testing.T, held *api.Job, node string) *api.Job {
	t.Helper()
	tmpl := held.TaskGroups[0]
	b, err := json.Marshal(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var g api.TaskGroup
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	name, one, zero := *tmpl.Name+"-hadar-u0-w0", 1, 0
	g.Name, g.Count = &name, &one
	var cs []*api.Constraint
	for _, c := range held.Constraints {
		if !jobspec.IsGate(c) {
			cs = append(cs, c)
		}
	}
	held.Constraints = cs
	g.Constraints = []*api.Constraint{api.NewConstraint("${node.unique.id}", "=", node)}
	tmpl.Count = &zero
	tmpl.Constrain(jobspec.GateConstraint())
	held.AddTaskGroup(&g)
	return held
}

// TestWatchNamespaces: a watcher of one namespace sees only its jobs; the
// default watcher sees all.
func TestWatchNamespaces(t *testing.T) {
	skipShort(t)
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	a := harness.StartAgent(t, harness.Options{Plugins: map[string]string{"hadar-gpu": watchGPUs("g", "Tesla K80", "12GiB", 1, 0)}})
	if _, err := a.Client.Namespaces().Register(&api.Namespace{Name: "ml"}, nil); err != nil {
		t.Fatal(err)
	}
	all := startWatcher(t, a.Client, watch.Config{})
	ml := startWatcher(t, a.Client, watch.Config{Namespaces: []string{"ml"}})
	meta := `    "hadar.throughput" = "k80=12"
    "hadar.steps" = "100"`
	for _, ns := range []string{"default", "ml"} {
		job := watchParse(t, a.Client, watchJobHCL("j-"+ns, meta, watchGateHCL, trainer))
		job.Namespace = &ns
		watchRegister(t, a.Client, job)
	}
	keys := func(s *watch.Snapshot) string {
		var ks []string
		for k := range s.Jobs {
			ks = append(ks, k.String())
		}
		return strings.Join(sorted(ks), ",")
	}
	waitView(t, all, visibleWithin, time.Now(), "all namespaces", func(s *watch.Snapshot) error {
		if got := keys(s); got != "default/j-default,ml/j-ml" || len(s.BlockedEvals) != 2 {
			return fmt.Errorf("jobs %s, %d blocked evals", got, len(s.BlockedEvals))
		}
		return nil
	})
	waitView(t, ml, visibleWithin, time.Now(), "namespace ml only", func(s *watch.Snapshot) error {
		if got := keys(s); got != "ml/j-ml" || len(s.BlockedEvals) != 1 {
			return fmt.Errorf("jobs %s, %d blocked evals", got, len(s.BlockedEvals))
		}
		return nil
	})
	watchFresh(t, ml, a.Client, watch.Config{Namespaces: []string{"ml"}})
	for _, ns := range []string{"default", "ml"} {
		if _, _, err := a.Client.Jobs().Deregister("j-"+ns, true, &api.WriteOptions{Namespace: ns}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWatchServerRestart restarts a persistent server (state kept on
// disk) under the watcher: it reconnects, re-lists, and goes on
// following events.
func TestWatchServerRestart(t *testing.T) {
	skipShort(t)
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	a := harness.StartAgent(t, harness.Options{Mode: harness.ModePersistent,
		Meta:    map[string]string{"rack": "r1"},
		Plugins: map[string]string{"hadar-gpu": watchGPUs("g", "Tesla K80", "12GiB", 2, 0), "hadar-train": watchTrainPlugin(t)}})
	cfg := watch.Config{BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	w := startWatcher(t, a.Client, cfg)
	meta := `    "hadar.model" = "A3C"
    "hadar.steps" = "100"`
	at := watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL("before", meta, watchGateHCL, trainer)))
	waitView(t, w, visibleWithin, at, "job before", func(s *watch.Snapshot) error {
		_, err := managedJob(s, "before")
		return err
	})
	before := w.Stats()

	a.Restart(t)
	at = watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL("after", meta, watchGateHCL, trainer)))
	waitView(t, w, 30*time.Second, at, "job after, registered after the restart", func(s *watch.Snapshot) error {
		for _, id := range []string{"before", "after"} {
			if j, err := managedJob(s, id); err != nil || len(s.BlockedEvalsOf(j.Key())) != 1 {
				return fmt.Errorf("job %s: %v, or not blocked", id, err)
			}
		}
		return nil
	})
	watchFresh(t, w, a.Client, cfg)
	st := w.Stats()
	if st.Reconnects <= before.Reconnects || st.Relists <= before.Relists || st.IndexResets != 0 {
		t.Fatalf("stats before the restart %+v, after %+v: want a reconnect and a re-list, no index reset (state was kept)", before, st)
	}
	t.Logf("stats after the restart: %+v", st)
}

// TestWatchServerLostState restarts a dev agent, whose state lives in
// memory: the new server starts from an empty state at a lower index. The
// watcher must notice the index going back and drop everything it knew.
func TestWatchServerLostState(t *testing.T) {
	skipShort(t)
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	a := harness.StartAgent(t, harness.Options{Plugins: map[string]string{"hadar-gpu": watchGPUs("g", "Tesla K80", "12GiB", 1, 0)}})
	cfg := watch.Config{BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	w := startWatcher(t, a.Client, cfg)
	// Push the index well above where a fresh server will be.
	for i := 0; i < 15; i++ {
		meta := fmt.Sprintf("    \"hadar.model\" = \"A3C\"\n    \"hadar.steps\" = \"%d\"", 100+i)
		watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL("old", meta, watchGateHCL, trainer)))
	}
	s, _ := waitView(t, w, visibleWithin, time.Now(), "job old at version 14", func(s *watch.Snapshot) error {
		if j, err := managedJob(s, "old"); err != nil || j.Version != 14 {
			return fmt.Errorf("job old: %v %v", j, err)
		}
		return nil
	})
	oldIndex, oldNode := s.Index, a.NodeID

	a.Restart(t)
	at := watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL("new", "    \"hadar.model\" = \"A3C\"\n    \"hadar.steps\" = \"5\"", watchGateHCL, trainer)))
	s, _ = waitView(t, w, 30*time.Second, at, "the new server's state only", func(s *watch.Snapshot) error {
		if _, err := managedJob(s, "new"); err != nil {
			return err
		}
		if _, err := managedJob(s, "old"); err == nil {
			return errors.New("job old of the lost state is still in the view")
		}
		if len(s.Nodes) != 1 || s.Nodes[a.NodeID] == nil {
			return fmt.Errorf("nodes %d, want only the new node %s", len(s.Nodes), a.NodeID)
		}
		return nil
	})
	watchFresh(t, w, a.Client, cfg)
	st := w.Stats()
	t.Logf("index before %d (node %s), after %d (node %s); stats %+v", oldIndex, oldNode, s.Index, a.NodeID, st)
	if st.IndexResets == 0 || st.Reconnects == 0 {
		t.Fatalf("stats %+v: want an index reset and a reconnect", st)
	}
}

// watchProxy forwards TCP connections to target until cut, so a test can
// take the watcher off the network and bring it back.
type watchProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *watchProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &watchProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *watchProxy) addr() string { return "http://" + p.ln.Addr().String() }

func (p *watchProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *watchProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// setCut closes every open connection and refuses new ones while cut.
func (p *watchProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// TestWatchEventBufferOverflow runs Nomad with an event buffer of 4, cuts
// the watcher off, makes many more than 4 changes, and reconnects it:
// Nomad would resume a stream past the lost events without saying so, so
// the view is right only because the watcher re-lists. Events after the
// reconnect flow again.
func TestWatchEventBufferOverflow(t *testing.T) {
	skipShort(t)
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	a := harness.StartAgent(t, harness.Options{
		Plugins:     map[string]string{"hadar-gpu": watchGPUs("g", "Tesla K80", "12GiB", 1, 0)},
		ExtraConfig: "server {\n  event_buffer_size = 4\n}\n",
	})
	proxy := startProxy(t, strings.TrimPrefix(a.Addr, "http://"))
	viaProxy, err := api.NewClient(&api.Config{Address: proxy.addr()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := watch.Config{BackoffMin: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond}
	w := startWatcher(t, viaProxy, cfg)
	meta := func(steps int) string {
		return fmt.Sprintf("    \"hadar.model\" = \"A3C\"\n    \"hadar.steps\" = \"%d\"", steps)
	}
	at := watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL("j0", meta(1), watchGateHCL, trainer)))
	s, _ := waitView(t, w, visibleWithin, at, "j0", func(s *watch.Snapshot) error {
		_, err := managedJob(s, "j0")
		return err
	})
	cutAt := s.Index

	before := w.Stats()
	proxy.setCut(true)
	// Many more changes than the buffer holds: new jobs, a spec change
	// and a purge.
	for i := 1; i <= 6; i++ {
		watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL(fmt.Sprintf("j%d", i), meta(i), watchGateHCL, trainer)))
	}
	watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL("j1", meta(99), watchGateHCL, trainer)))
	if _, _, err := a.Client.Jobs().Deregister("j0", true, nil); err != nil {
		t.Fatal(err)
	}
	// The server's buffer no longer reaches back to where the watcher was:
	// a subscription from there silently starts after j1's registration.
	j1, _, err := a.Client.Jobs().Info("j1", nil)
	if err != nil {
		t.Fatal(err)
	}
	first := firstStreamIndex(t, a.Client, cutAt+1)
	t.Logf("watcher cut at index %d; j1 registered at %d; a stream asked for %d starts at %d", cutAt, *j1.CreateIndex, cutAt+1, first)
	if first <= *j1.CreateIndex {
		t.Fatalf("the tiny event buffer still holds j1's registration at %d: the test makes too few changes", *j1.CreateIndex)
	}
	if w.Snapshot().Jobs[watch.JobKey{Namespace: "default", ID: "j6"}] != nil {
		t.Fatal("the cut-off watcher saw j6")
	}

	proxy.setCut(false)
	waitView(t, w, 30*time.Second, time.Now(), "every change made while cut off", func(s *watch.Snapshot) error {
		if _, err := managedJob(s, "j0"); err == nil {
			return errors.New("purged j0 still there")
		}
		for i := 1; i <= 6; i++ {
			if _, err := managedJob(s, fmt.Sprintf("j%d", i)); err != nil {
				return err
			}
		}
		if j, _ := managedJob(s, "j1"); j.Spec.Steps != 99 {
			return fmt.Errorf("j1 steps %d, want 99", j.Spec.Steps)
		}
		return nil
	})
	at = watchRegister(t, a.Client, watchParse(t, a.Client, watchJobHCL("j7", meta(7), watchGateHCL, trainer)))
	waitView(t, w, visibleWithin, at, "j7, registered after the reconnect", func(s *watch.Snapshot) error {
		_, err := managedJob(s, "j7")
		return err
	})
	watchFresh(t, w, a.Client, cfg)
	if st := w.Stats(); st.Reconnects <= before.Reconnects || st.Relists <= before.Relists {
		t.Fatalf("stats before the cut %+v, after %+v: want a reconnect and a re-list", before, st)
	}
}

// firstStreamIndex opens Nomad's event stream at index, on the topics the
// watcher follows, and returns the index of the first batch it delivers.
func firstStreamIndex(t *testing.T, c *api.Client, index uint64) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topics := map[api.Topic][]string{api.TopicJob: {"*"}, api.TopicEvaluation: {"*"}, api.TopicAllocation: {"*"}, api.TopicNode: {"*"}}
	ch, err := c.EventStream().Stream(ctx, topics, index, &api.QueryOptions{Namespace: "*"})
	if err != nil {
		t.Fatal(err)
	}
	evs, ok := <-ch
	if !ok || evs.Err != nil {
		t.Fatalf("no event from the stream at index %d: %v", index, evs)
	}
	return evs.Index
}

// TestWatchDocExample registers the example of docs/jobspec.md: it parses
// as a valid managed job and waits at the gate.
func TestWatchDocExample(t *testing.T) {
	skipShort(t)
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "jobspec.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```hcl\n")
	src, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("no hcl block in docs/jobspec.md")
	}
	a := harness.StartAgent(t, harness.Options{Plugins: map[string]string{"hadar-gpu": watchGPUs("g", "Tesla K80", "12GiB", 1, 0)}})
	w := startWatcher(t, a.Client, watch.Config{})
	job := watchParse(t, a.Client, src)
	spec, err := jobspec.Parse(job)
	if err != nil {
		t.Fatalf("the documented example is refused: %v", err)
	}
	at := watchRegister(t, a.Client, job)
	waitView(t, w, visibleWithin, at, "the example, pending at the gate", func(s *watch.Snapshot) error {
		j, err := managedJob(s, *job.ID)
		if err != nil {
			return err
		}
		if j.Spec == nil || j.Spec.Workers != spec.Workers || j.Status != "pending" || len(s.BlockedEvalsOf(j.Key())) != 1 {
			return fmt.Errorf("job %+v", j)
		}
		return nil
	})
}

// BenchmarkWatchNodes measures, against a real Nomad server holding 500
// registered nodes of 8 GPUs each, what reading them costs: the node
// list with resources (it has no node meta, so no rack), the plain list
// (all a re-list reads when no node changed), the list plus one read per
// node sequentially, and watch.List's whole view (reads on 8 workers),
// with the view's heap size.
// Run: go test -run '^$' -bench BenchmarkWatchNodes -benchtime 5x ./e2e/
func BenchmarkWatchNodes(b *testing.B) {
	const nodes = 500
	srv := harness.StartAgent(b, harness.Options{Name: "bench-srv", Mode: harness.ModeServer, ExtraConfig: harness.NodesimServerConfig})
	harness.StartNodesim(b, srv, fakeNodes(nodes))
	c := srv.Client
	ctx := context.Background()
	b.Run(fmt.Sprintf("nodes=%d/list-resources", nodes), func(b *testing.B) {
		var size int64
		for i := 0; i < b.N; i++ {
			body, err := c.Raw().Response("/v1/nodes?resources=true", nil)
			if err != nil {
				b.Fatal(err)
			}
			size, _ = io.Copy(io.Discard, body)
			body.Close()
			list, _, err := c.Nodes().List(&api.QueryOptions{Params: map[string]string{"resources": "true"}})
			if err != nil || len(list) != nodes {
				b.Fatalf("%d nodes, %v", len(list), err)
			}
		}
		b.ReportMetric(float64(size), "resp-bytes")
	})
	b.Run(fmt.Sprintf("nodes=%d/list", nodes), func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if list, _, err := c.Nodes().List(nil); err != nil || len(list) != nodes {
				b.Fatalf("%d nodes, %v", len(list), err)
			}
		}
	})
	b.Run(fmt.Sprintf("nodes=%d/list+info-sequential", nodes), func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			list, _, err := c.Nodes().List(nil)
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range list {
				if _, _, err := c.Nodes().Info(s.ID, nil); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run(fmt.Sprintf("nodes=%d/watch.List", nodes), func(b *testing.B) {
		var s *watch.Snapshot
		for i := 0; i < b.N; i++ {
			var err error
			if s, err = watch.List(ctx, c, watch.Config{}); err != nil || len(s.Nodes) != nodes {
				b.Fatalf("%v", err)
			}
		}
		b.StopTimer()
		s = nil
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s, _ = watch.List(ctx, c, watch.Config{})
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc)-float64(before.HeapAlloc), "view-heap-bytes")
		runtime.KeepAlive(s)
	})
}

// fakeNodes is a cluster of n nodes of 8 V100s each, 20 to a rack, for
// the node simulator (bin/nodesim), which registers them with the server
// and keeps them alive as n client agents would, without running them.
func fakeNodes(n int) harness.NodesimSpec {
	var spec harness.NodesimSpec
	for i := 0; i < n; i++ {
		spec.Nodes = append(spec.Nodes, harness.NodesimNode{
			Name:    fmt.Sprintf("fake-%03d", i),
			Rack:    fmt.Sprintf("r%d", i/20),
			Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1),
			GPUs:    []harness.NodesimGPU{{Model: "Tesla V100-SXM2-16GB", Count: 8, MemoryMiB: 16384}},
		})
	}
	return spec
}
