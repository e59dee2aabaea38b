package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/agent"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// Emulated paces of the test workloads: steps/s of a one-GPU job on each
// model (hadar.throughput says the same to the planner).
var paces = map[string]float64{"Tesla V100-SXM2-16GB": 40, "Tesla P100-PCIE-16GB": 20, "Tesla K80": 10}

var modelOfType = map[string]string{"v100": "Tesla V100-SXM2-16GB", "p100": "Tesla P100-PCIE-16GB", "k80": "Tesla K80"}

// sidecarCluster is one Nomad server and four clients on loopback, with
// declared GPUs in two racks, both plugins, and the sidecar in process.
type sidecarCluster struct {
	t        *testing.T
	server   *harness.Agent
	api      *api.Client
	nodes    map[string]string // node ID -> name
	ids      map[string]string // name -> node ID
	trainer  string
	ckpt     string
	merge    string
	stateDir string

	mu     sync.Mutex
	agent  *agent.Agent
	cancel context.CancelFunc
	done   chan error
}

func declare(prefix, model, mem string, n int) string {
	var b strings.Builder
	b.WriteString("fingerprint_period = \"1s\"\n")
	for i := range n {
		fmt.Fprintf(&b, "gpu {\n  id = \"%s-%d\"\n  model = %q\n  memory = %q\n}\n", prefix, i, model, mem)
	}
	return b.String()
}

// startSidecarCluster starts the cluster (not the sidecar):
//
//	rack r1: v100-a (4x V100), v100-b (4x V100)
//	rack r2: mix-a (2x V100, 2x P100), k80-a (4x K80)
func startSidecarCluster(t *testing.T) *sidecarCluster {
	t.Helper()
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: "sc-srv", Mode: harness.ModeServer})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	for _, n := range []struct{ name, rack, gpus string }{
		{"v100-a", "r1", declare("va", "Tesla V100-SXM2-16GB", "16GiB", 4)},
		{"v100-b", "r1", declare("vb", "Tesla V100-SXM2-16GB", "16GiB", 4)},
		{"mix-a", "r2", declare("ma", "Tesla V100-SXM2-16GB", "16GiB", 2) + strings.TrimPrefix(declare("mb", "Tesla P100-PCIE-16GB", "16GiB", 2), "fingerprint_period = \"1s\"\n")},
		{"k80-a", "r2", declare("ka", "Tesla K80", "12GiB", 4)},
	} {
		a := harness.StartAgent(t, harness.Options{Name: n.name, Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr},
			Meta: map[string]string{"rack": n.rack}, Plugins: map[string]string{"hadar-gpu": n.gpus, "hadar-train": train}})
		c.nodes[a.NodeID], c.ids[n.name] = n.name, a.NodeID
	}
	t.Cleanup(c.stopSidecar)
	return c
}

// startSidecar runs the sidecar in this process against the cluster.
func (c *sidecarCluster) startSidecar(cfg config.Config) *agent.Agent {
	c.t.Helper()
	// Blocks left out are nil until Resolve's defaults.
	cfg.Nomad = cmp.Or(cfg.Nomad, &config.NomadConfig{})
	cfg.State = cmp.Or(cfg.State, &config.StateConfig{})
	if cfg.Nomad.Address == "" {
		cfg.Nomad.Address = c.server.Addr
	}
	if cfg.Round == "" {
		cfg.Round = "8s"
	}
	if cfg.GangTimeout == "" {
		cfg.GangTimeout = "40s"
	}
	if cfg.StopTimeout == "" {
		cfg.StopTimeout = "30s"
	}
	if cfg.MinRunTime == "" {
		cfg.MinRunTime = "1s"
	}
	if cfg.State.Path == "" {
		cfg.State.Path = filepath.Join(c.stateDir, "sidecar.db")
	}
	if cfg.RendezvousPorts == "" {
		// Rendezvous ports of this test's own: every node here is
		// 127.0.0.1, so the default range's first port (29500) is the
		// one every test's first gang binds, and another test process
		// on the machine (or an earlier test's worker still stopping)
		// may hold it.
		low, high, release, err := harness.PortRange(128)
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { _ = release() })
		cfg.RendezvousPorts = config.PortRange(fmt.Sprintf("%d-%d", low, high))
	}
	s, err := cfg.Resolve()
	if err != nil {
		c.t.Fatal(err)
	}
	// The token goes to Nomad only on a cluster with ACLs: elsewhere it is a
	// stand-in the status tests check is never shown (Nomad refuses one not
	// shaped like a UUID).
	secret := ""
	if c.server.Token != "" {
		secret = s.Nomad.Token
	}
	// Built as `hadar sidecar` builds it: its connection share to the
	// agent, kept between uses.
	client, err := nomadclient.New(nomadclient.Config{Address: s.Nomad.Address, Token: secret})
	if err != nil {
		c.t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "sidecar", Level: hclog.Debug, Output: testWriter{c.t}})
	a, err := agent.New(s, client, log)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	c.mu.Lock()
	c.agent, c.cancel, c.done = a, cancel, done
	c.mu.Unlock()
	// Stopped before whatever the test set up before it (a proxy in front
	// of Nomad, say) is torn down: cleanups run last in, first out.
	c.t.Cleanup(c.stopSidecar)
	return a
}

func (c *sidecarCluster) stopSidecar() {
	c.mu.Lock()
	cancel, done := c.cancel, c.done
	c.cancel, c.done, c.agent = nil, nil, nil
	c.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			c.t.Errorf("sidecar: %v", err)
		}
	case <-time.After(30 * time.Second):
		c.t.Error("the sidecar did not stop within 30 s")
	}
}

// testWriter sends the sidecar's log to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// scJob is the HCL of a managed emulated training job.
type scJob struct {
	id       string
	steps    int
	workers  int
	weight   float64
	forkable bool
	extra    string // more meta lines
	task     string // more task lines
	gated    bool
}

func (c *sidecarCluster) hcl(m scJob) string {
	if m.workers == 0 {
		m.workers = 1
	}
	if m.weight == 0 {
		m.weight = 1
	}
	var thr []string
	for t, model := range modelOfType {
		thr = append(thr, fmt.Sprintf("%s=%g", t, paces[model]*float64(m.workers)))
	}
	sort.Strings(thr)
	gate := ""
	if m.gated {
		gate = jobspec.GateHCL
	}
	pace := func(model string) float64 { return paces[model] * float64(m.workers) }
	return fmt.Sprintf(`job %q {
  type = "batch"
  meta = {
    "hadar.throughput" = %q
    "hadar.steps"      = "%d"
    "hadar.workers"    = "%d"
    "hadar.weight"     = "%g"
    "hadar.forkable"   = "%t"
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
      kill_timeout = "15s"
      config {
        command     = %q
        args        = ["--model", "mlp", "--progress-interval", "500ms"]
        total_steps = %d
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = %g
            "Tesla P100-PCIE-16GB" = %g
            "Tesla K80"            = %g
          }
        }
      }
%s
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
`, m.id, strings.Join(thr, ","), m.steps, m.workers, m.weight, m.forkable, m.extra, gate, c.trainer, m.steps,
		pace("Tesla V100-SXM2-16GB"), pace("Tesla P100-PCIE-16GB"), pace("Tesla K80"), m.task)
}

// submit registers a managed job (gated unless told otherwise).
func (c *sidecarCluster) submit(m scJob) *api.Job {
	c.t.Helper()
	job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: c.hcl(m), Canonicalize: true})
	if err != nil {
		c.t.Fatalf("parse job %s: %v\n%s", m.id, err, c.hcl(m))
	}
	if _, _, err := c.api.Jobs().Register(job, nil); err != nil {
		c.t.Fatalf("register job %s: %v", m.id, err)
	}
	return job
}

// allocs returns a job's allocations.
func (c *sidecarCluster) allocs(id string) []*api.AllocationListStub {
	c.t.Helper()
	as, _, err := c.api.Jobs().Allocations(id, true, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return as
}

// waitFor polls f until it returns nil.
func (c *sidecarCluster) waitFor(what string, timeout time.Duration, f func() error) {
	c.t.Helper()
	if err := harness.Eventually(context.Background(), timeout, 500*time.Millisecond, f); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

// waitCycles waits until the sidecar ran n more cycles (each syncs with
// Nomad, plans and acts): what a negative assertion waits for, instead of
// a fixed time a loaded machine may not give it.
func (c *sidecarCluster) waitCycles(a *agent.Agent, n int) {
	c.t.Helper()
	start := a.Health().Cycles
	c.waitFor(fmt.Sprintf("%d sidecar cycles", n), 2*time.Minute, func() error {
		if got := a.Health().Cycles - start; got < n {
			return fmt.Errorf("%d cycles", got)
		}
		return nil
	})
}

// waitRounds waits until the sidecar planned n more round boundaries.
func (c *sidecarCluster) waitRounds(a *agent.Agent, n int) {
	c.t.Helper()
	start := a.Health().Rounds
	c.waitFor(fmt.Sprintf("%d round boundaries", n), 3*time.Minute, func() error {
		if got := a.Health().Rounds - start; got < n {
			return fmt.Errorf("%d rounds", got)
		}
		return nil
	})
}

// running returns the nodes (by name) and groups of a job's running
// allocations.
func (c *sidecarCluster) running(id string) map[string]string {
	out := map[string]string{}
	for _, a := range c.allocs(id) {
		if a.ClientStatus == api.AllocClientStatusRunning && a.DesiredStatus == api.AllocDesiredStatusRun {
			out[a.TaskGroup] = c.nodes[a.NodeID]
		}
	}
	return out
}

func (c *sidecarCluster) jobStatus(id string) string {
	j, _, err := c.api.Jobs().Info(id, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return *j.Status
}

func (c *sidecarCluster) planOf(a *agent.Agent, id string) wire.JobView {
	for _, jv := range a.Plan().Jobs {
		if jv.Job == id {
			return jv
		}
	}
	return wire.JobView{}
}

var errNotYet = errors.New("not yet")

// TestSidecarPlacesManagedJobs: a managed job submitted while the sidecar
// is down waits, pending, with the gate as Nomad's reason, and runs only
// after the sidecar placed it, on the GPUs the plan chose; a plain Nomad
// job beside it is never touched; jobs complete and leave the plan.
func TestSidecarPlacesManagedJobs(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	// A plain Nomad job holding two K80s: never hadar's.
	plain := c.hcl(scJob{id: "plain", steps: 100000})
	plain = strings.Replace(plain, "meta = {", "meta = { # no hadar keys\n    owner = \"a-person\"", 1)
	for _, key := range []string{"hadar.throughput", "hadar.steps", "hadar.workers", "hadar.weight", "hadar.forkable"} {
		lines := strings.Split(plain, "\n")
		plain = ""
		for _, l := range lines {
			if !strings.Contains(l, `"`+key+`"`) {
				plain += l + "\n"
			}
		}
	}
	plain = strings.Replace(plain, `count = 1`, "count = 2\n          constraint {\n            attribute = \"${device.model}\"\n            value = \"Tesla K80\"\n          }", 1)
	pj, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: plain, Canonicalize: true})
	if err != nil {
		t.Fatalf("plain job: %v\n%s", err, plain)
	}
	if _, _, err := c.api.Jobs().Register(pj, nil); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the plain job runs", time.Minute, func() error {
		if len(c.running("plain")) != 1 {
			return errNotYet
		}
		return nil
	})
	plainBefore, _, _ := c.api.Jobs().Info("plain", nil)

	// Submitted while no sidecar runs: pending, no allocation, and Nomad
	// says the gate is why.
	for _, m := range []scJob{{id: "a", steps: 400, gated: true}, {id: "b", steps: 300, gated: true}} {
		c.submit(m)
	}
	// Once Nomad evaluated them (its reason names the gate), neither
	// may have an allocation.
	for _, id := range []string{"a", "b"} {
		c.waitFor("Nomad names the gate as why job "+id+" waits", time.Minute, func() error {
			evals, _, err := c.api.Jobs().Evaluations(id, nil)
			if err != nil {
				return err
			}
			why := ""
			for _, ev := range evals {
				for _, m := range ev.FailedTGAllocs {
					for cons := range m.ConstraintFiltered {
						why += cons
					}
				}
			}
			if !strings.Contains(why, jobspec.GateAttribute) {
				return fmt.Errorf("Nomad's reason %q does not name the gate", why)
			}
			return nil
		})
		if n := len(c.allocs(id)); n != 0 {
			t.Fatalf("job %s has %d allocations before the sidecar ran", id, n)
		}
		if st := c.jobStatus(id); st != "pending" {
			t.Fatalf("job %s is %s before the sidecar ran, want pending", id, st)
		}
	}

	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin"}})
	for _, id := range []string{"a", "b"} {
		c.waitFor("job "+id+" runs", 90*time.Second, func() error {
			run := c.running(id)
			if len(run) != 1 {
				return fmt.Errorf("%d running allocations", len(run))
			}
			return nil
		})
		// It runs where the plan put it.
		jv := c.planOf(a, id)
		run := c.running(id)
		if len(jv.Units) != 1 || len(jv.Units[0].Slots) != 1 {
			t.Fatalf("job %s: plan %+v", id, jv)
		}
		want := c.nodes[jv.Units[0].Slots[0].Node]
		if got := run[groupname.Format("train", 0, 0)]; got != want {
			t.Fatalf("job %s runs on %q, the plan put it on %q", id, got, want)
		}
		if want == "k80-a" && jv.Units[0].Slots[0].Type != "k80" || strings.HasPrefix(want, "v100") && jv.Units[0].Slots[0].Type != "v100" {
			t.Fatalf("job %s: type %s on node %s", id, jv.Units[0].Slots[0].Type, want)
		}
	}
	for _, id := range []string{"a", "b"} {
		c.waitFor("job "+id+" completes", 3*time.Minute, func() error {
			if st := c.jobStatus(id); st != "dead" {
				return fmt.Errorf("status %s", st)
			}
			return nil
		})
	}
	c.waitFor("completed jobs leave the plan", 30*time.Second, func() error {
		if n := len(a.Plan().Jobs); n != 0 {
			return fmt.Errorf("%d jobs in the plan", n)
		}
		return nil
	})
	plainAfter, _, _ := c.api.Jobs().Info("plain", nil)
	if *plainAfter.Version != *plainBefore.Version || *plainAfter.JobModifyIndex != *plainBefore.JobModifyIndex {
		t.Fatalf("the plain job was written: version %d -> %d", *plainBefore.Version, *plainAfter.Version)
	}
	if len(c.running("plain")) != 1 {
		t.Fatal("the plain job no longer runs")
	}
	if w := a.Applier().Writes(); w["stop"] != 0 || w["rollback"] != 0 {
		t.Fatalf("writes %v: no stop or rollback expected", w)
	}
}

// plainGPUJob registers a plain Nomad job (no hadar meta) holding n GPUs of
// model on the named node.
func (c *sidecarCluster) plainGPUJob(id, node, model string, n int) {
	c.t.Helper()
	src := fmt.Sprintf(`job %q {
  type = "batch"
  constraint {
    attribute = "${node.unique.name}"
    value     = %q
  }
  group "g" {
    task "t" {
      driver = "hadar-train"
      config {
        command = %q
        args    = ["--model", "mlp", "--progress-interval", "1s"]
        total_steps = 10000000
      }
      resources {
        cpu    = 50
        memory = 64
        device "nvidia/gpu" {
          count = %d
          constraint {
            attribute = "${device.model}"
            value     = %q
          }
        }
      }
    }
  }
}
`, id, node, c.trainer, n, model)
	job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: src, Canonicalize: true})
	if err != nil {
		c.t.Fatalf("plain job %s: %v", id, err)
	}
	if _, _, err := c.api.Jobs().Register(job, nil); err != nil {
		c.t.Fatal(err)
	}
	c.waitFor("plain job "+id+" runs", time.Minute, func() error {
		if len(c.running(id)) != 1 {
			return errNotYet
		}
		return nil
	})
}

func (c *sidecarCluster) job(id string) *api.Job {
	c.t.Helper()
	j, _, err := c.api.Jobs().Info(id, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return j
}

// TestSidecarRefusesAndRespects: a bad jobspec gets its error where its
// author looks (the status API, and on the job, shown by Nomad as the
// reason it waits) and nothing else happens to it; a gang whose worker
// Nomad cannot place starts no worker; a person's edit to a waiting
// managed job is kept when hadar places it.
func TestSidecarRefusesAndRespects(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	// One V100 free on each of v100-a and v100-b, none on mix-a: a 2-GPU
	// V100 job must span v100-a and v100-b.
	c.plainGPUJob("hold-a", "v100-a", "Tesla V100-SXM2-16GB", 3)
	c.plainGPUJob("hold-b", "v100-b", "Tesla V100-SXM2-16GB", 3)
	c.plainGPUJob("hold-m", "mix-a", "Tesla V100-SXM2-16GB", 2)
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack"}})

	// 1. A bad jobspec.
	bad := c.submit(scJob{id: "bad", steps: 300, gated: true, extra: `    "hadar.min_run_time" = "soon"`})
	badVersion := *bad.Version
	c.waitFor("the refusal is in the status API", 30*time.Second, func() error {
		for _, r := range a.Plan().Refused {
			if strings.Contains(r.Job, "bad") && strings.Contains(r.Error, "hadar.min_run_time") {
				return nil
			}
		}
		return errNotYet
	})
	c.waitFor("the error is on the job", 30*time.Second, func() error {
		for _, cons := range c.job("bad").Constraints {
			if cons.LTarget == agent.ErrorAttribute && strings.Contains(cons.RTarget, "hadar.min_run_time") {
				return nil
			}
		}
		return errNotYet
	})
	c.waitFor("Nomad gives the error as why the job waits", 30*time.Second, func() error {
		evals, _, err := c.api.Jobs().Evaluations("bad", nil)
		if err != nil {
			return err
		}
		for _, ev := range evals {
			for _, m := range ev.FailedTGAllocs {
				for cons := range m.ConstraintFiltered {
					if strings.Contains(cons, "hadar.min_run_time") {
						return nil
					}
				}
			}
		}
		return errNotYet
	})
	c.waitCycles(a, 5) // several cycles: no second write
	if v := *c.job("bad").Version; v != badVersion+1 {
		t.Fatalf("the bad job's version went %d -> %d: want exactly one write (the error note)", badVersion, v)
	}
	if n := len(c.allocs("bad")); n != 0 {
		t.Fatalf("the bad job has %d allocations", n)
	}

	// 2. A gang whose second worker could only go where its own
	// constraint forbids: only V100s, two workers, and a constraint that
	// keeps it off v100-b, the only other node with a free V100. hadar
	// plans with Nomad's placement rules (sidecar/feasible): it never plans
	// the gang there, so it never writes a start Nomad would refuse.
	gang := scJob{id: "gang", steps: 200, workers: 2, gated: true, task: `      constraint {
        attribute = "${node.unique.name}"
        operator  = "!="
        value     = "v100-b"
      }`}
	c.submit(gang)
	// hadar.throughput names V100 only.
	gj := c.job("gang")
	gj.Meta["hadar.throughput"] = "v100=80"
	if _, _, err := c.api.Jobs().Register(gj, nil); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the gang is planned and waits", 60*time.Second, func() error {
		jv := c.planOf(a, "gang")
		if jv.State != "waiting" || jv.Reason.Why == "" {
			return fmt.Errorf("state %s, why %q", jv.State, jv.Reason.Why)
		}
		return nil
	})
	c.waitCycles(a, 3)
	if jv := c.planOf(a, "gang"); jv.State != "waiting" || len(jv.Units) != 0 {
		t.Fatalf("the gang: %s on %+v; want it waiting: its constraint excludes the only free V100s", jv.State, jv.Units)
	}
	if n := len(c.allocs("gang")); n != 0 {
		t.Fatalf("the gang has %d allocations: a worker started without its peer", n)
	}
	if w := a.Applier().Writes(); w["start"] != 0 {
		t.Fatalf("writes %v: the unplaceable start was written", w)
	}

	// 3. A person edits the waiting gang's template; then capacity frees
	// on v100-a and hadar places it there with the edit.
	gj = c.job("gang")
	gj.TaskGroups[0].Tasks[0].Env = map[string]string{"EDITED_BY": "a-person"}
	if _, _, err := c.api.Jobs().Register(gj, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.api.Jobs().Deregister("hold-a", true, nil); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the gang runs on v100-a", 2*time.Minute, func() error {
		run := c.running("gang")
		if len(run) != 2 {
			return fmt.Errorf("%d workers running", len(run))
		}
		for g, n := range run {
			if n != "v100-a" {
				return fmt.Errorf("%s on %s", g, n)
			}
		}
		return nil
	})
	placed := c.job("gang")
	for _, g := range placed.TaskGroups {
		if _, gen := groupname.Parse(*g.Name); gen && g.Tasks[0].Env["EDITED_BY"] != "a-person" {
			t.Fatalf("generated group %s lost the person's edit: env %v", *g.Name, g.Tasks[0].Env)
		}
	}
	if placed.TaskGroups[0].Tasks[0].Env["EDITED_BY"] != "a-person" {
		t.Fatal("the template lost the person's edit")
	}
	// Both workers of the gang got the distributed-training environment.
	ranks := map[string]bool{}
	for _, g := range placed.TaskGroups {
		if _, gen := groupname.Parse(*g.Name); gen {
			env := g.Tasks[0].Env
			ranks[env["RANK"]] = env["WORLD_SIZE"] == "2" && env["MASTER_PORT"] != "" && env["MASTER_ADDR"] != ""
		}
	}
	if !ranks["0"] || !ranks["1"] {
		t.Fatalf("ranks %v", ranks)
	}

	c.waitFor("the gang completes", 2*time.Minute, func() error {
		if st := c.jobStatus("gang"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	for _, al := range c.allocs("gang") {
		if al.ClientStatus == api.AllocClientStatusFailed {
			t.Fatalf("gang worker %s (%s) failed: %s", al.Name, al.ID[:8], al.ClientDescription)
		}
	}
	for _, ev := range a.History() {
		if strings.Contains(ev.Job, "gang") && strings.Contains(ev.Result, "failed") {
			t.Fatalf("sidecar history: %+v", ev)
		}
	}

	// 4. The bad job, fixed and submitted again, is planned and runs.
	c.submit(scJob{id: "bad", steps: 300, gated: true})
	c.waitFor("the fixed job completes", 2*time.Minute, func() error {
		if st := c.jobStatus("bad"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
}

// racksOf returns the racks a job's running workers sit in.
func (c *sidecarCluster) racksOf(id string) map[string]bool {
	rack := map[string]string{"v100-a": "r1", "v100-b": "r1", "mix-a": "r2", "k80-a": "r2"}
	out := map[string]bool{}
	for _, n := range c.running(id) {
		out[rack[n]] = true
	}
	return out
}

// TestSidecarKeepsSensitiveJobsInARack: with two V100s of rack r1 busy, an
// insensitive 8-V100 job spreads over both racks at once, while a
// network-sensitive one (hadar.sensitivity = 4: 4x slower across racks)
// waits (delay scheduling) and lands within r1 when it frees.
func TestSidecarKeepsSensitiveJobsInARack(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "delay"}})
	v100 := `    "hadar.throughput" = "v100=320"`

	c.plainGPUJob("busy", "v100-a", "Tesla V100-SXM2-16GB", 2)
	loose := scJob{id: "loose", steps: 3200, workers: 8, gated: true}
	c.submit(loose)
	setThroughput(t, c, "loose", "v100=320")
	c.waitFor("the insensitive job runs", 3*time.Minute, func() error {
		if n := len(c.running("loose")); n != 8 {
			return fmt.Errorf("%d of 8 workers running", n)
		}
		return nil
	})
	if r := c.racksOf("loose"); !r["r1"] || !r["r2"] {
		t.Fatalf("the insensitive job runs in racks %v; with r1 short of two V100s it should have spread at once", r)
	}
	c.waitFor("the insensitive job completes", 2*time.Minute, func() error {
		if st := c.jobStatus("loose"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})

	// Delay scheduling would accept the two racks after about 3/4 of the
	// job's run time: a long job, so that however slowly the cycles below
	// pass, its timer does not run out before r1 frees.
	tight := scJob{id: "tight", steps: 400000, workers: 8, gated: true, extra: v100 + "\n    \"hadar.sensitivity\" = \"4\""}
	c.submit(tight)
	c.waitFor("the sensitive job waits for its rack", 30*time.Second, func() error {
		jv := c.planOf(a, "tight")
		if jv.State != "waiting" || !strings.Contains(jv.Reason.Why, "delay scheduling") {
			return fmt.Errorf("state %q, why %q", jv.State, jv.Reason.Why)
		}
		return nil
	})
	c.waitCycles(a, 3)
	if n := len(c.allocs("tight")); n != 0 {
		t.Fatalf("the sensitive job has %d allocations while its rack is short", n)
	}
	if _, _, err := c.api.Jobs().Deregister("busy", true, nil); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the sensitive job runs", 3*time.Minute, func() error {
		if n := len(c.running("tight")); n != 8 {
			return fmt.Errorf("%d of 8 workers running", n)
		}
		return nil
	})
	if r := c.racksOf("tight"); len(r) != 1 || !r["r1"] {
		t.Fatalf("the sensitive job runs in racks %v, want r1 only", r)
	}
}

func setThroughput(t *testing.T, c *sidecarCluster, id, thr string) {
	t.Helper()
	j := c.job(id)
	j.Meta["hadar.throughput"] = thr
	if _, _, err := c.api.Jobs().Register(j, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSidecarSurvivesServerRestart: the Nomad server restarts while jobs
// run and a round is due; the sidecar reconnects and resumes without a
// duplicate action: no write to the running jobs, the same allocations;
// then it places a new job.
func TestSidecarSurvivesServerRestart(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "5s"}})
	for _, id := range []string{"r1", "r2"} {
		c.submit(scJob{id: id, steps: 3600, gated: true})
	}
	allocsOf := func() map[string]string {
		out := map[string]string{}
		for _, id := range []string{"r1", "r2"} {
			for _, al := range c.allocs(id) {
				out[al.ID] = al.ClientStatus
			}
		}
		return out
	}
	c.waitFor("both jobs run", 90*time.Second, func() error {
		if len(c.running("r1")) != 1 || len(c.running("r2")) != 1 {
			return errNotYet
		}
		return nil
	})
	before := allocsOf()
	versions := map[string]uint64{"r1": *c.job("r1").Version, "r2": *c.job("r2").Version}
	writes := a.Applier().Writes()
	relists := a.Watcher().Stats().Relists

	c.server.Restart(t)
	c.waitFor("the sidecar re-synced with the restarted server", 90*time.Second, func() error {
		if a.Watcher().Stats().Relists <= relists {
			return errNotYet
		}
		if h := a.Health(); !h.OK {
			return errors.New(h.Problem)
		}
		return nil
	})
	c.waitRounds(a, 2)
	if w := a.Applier().Writes(); fmt.Sprint(w) != fmt.Sprint(writes) {
		t.Fatalf("writes %v after the restart, %v before: a duplicate action", w, writes)
	}
	for id, v := range versions {
		if got := *c.job(id).Version; got != v {
			t.Fatalf("job %s went from version %d to %d across the restart", id, v, got)
		}
	}
	after := allocsOf()
	for id := range after {
		if _, ok := before[id]; !ok {
			t.Fatalf("allocation %s appeared across the restart: %v -> %v", id, before, after)
		}
	}
	c.submit(scJob{id: "r3", steps: 200, gated: true})
	c.waitFor("a job submitted after the restart runs", 90*time.Second, func() error {
		if st := c.jobStatus("r3"); st != "running" && st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
}

// TestSidecarRestartRestoresItsState: a sidecar stopped mid-run and a new
// one started on the same state file restores the engine (time received
// per GPU type, decisions) and goes on without a write to the running
// jobs; jobs that arrived while it was down are planned.
func TestSidecarRestartRestoresItsState(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "5s"}})
	c.submit(scJob{id: "long", steps: 2400, gated: true})
	c.waitFor("the job runs", 90*time.Second, func() error {
		if len(c.running("long")) != 1 {
			return errNotYet
		}
		return nil
	})
	c.waitRounds(a, 1) // a round boundary: progress read, state saved
	before, _, ok := a.Job("default/long")
	if !ok {
		t.Fatal("job not in the plan")
	}
	version := *c.job("long").Version
	history := len(a.History())
	c.stopSidecar()

	c.submit(scJob{id: "late", steps: 200, gated: true}) // while no sidecar runs
	b := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "5s"}})
	c.waitFor("the late job runs or finished", 90*time.Second, func() error {
		if st := c.jobStatus("late"); st != "running" && st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	after, evs, ok := b.Job("default/long")
	if !ok {
		t.Fatal("the running job is not in the restored plan")
	}
	if after.State != "running" {
		t.Fatalf("restored job state %q", after.State)
	}
	if len(evs) == 0 || len(b.History()) < history {
		t.Fatalf("decision history not restored: %d events, %d before", len(b.History()), history)
	}
	if got := *c.job("long").Version; got != version {
		t.Fatalf("the running job was written across the restart: version %d -> %d", version, got)
	}
	if w := b.Applier().Writes(); w["start"] != 1 || w["stop"] != 0 {
		t.Fatalf("writes after the restart %v: want the late job's start only", w)
	}
	if after.StepsDone < before.StepsDone {
		t.Fatalf("progress went back: %v -> %v", before.StepsDone, after.StepsDone)
	}
}
