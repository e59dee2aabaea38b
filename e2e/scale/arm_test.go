package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/sidecar/agent"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/nomadclient"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// serverConfig is appended to the server's agent.hcl. Every simulated
// node holds its own RPC connection from 127.0.0.1, and Nomad allows 100
// per client address by default (the rest are closed at once). Debug
// endpoints on: the server's CPU profile (/v1/agent/pprof/profile) shows
// where its time goes while a run is on.
const serverConfig = `
enable_debug = true
limits {
  rpc_max_conns_per_client  = 0
  http_max_conns_per_client = 0
}
`

// quietServer lowers the server's log level from the harness's DEBUG to
// INFO (log_level is reloaded on SIGHUP; the harness writes it, and a
// second one in the file is refused): a debug line per request would cost
// the server CPU this run measures.
func quietServer(t *testing.T, server *harness.Agent, pid int) {
	t.Helper()
	b, err := os.ReadFile(server.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	const debug = `log_level = "DEBUG"`
	if !bytes.Contains(b, []byte(debug)) {
		t.Logf("the server's config has no %s: log level left as it is", debug)
		return
	}
	if err := os.WriteFile(server.ConfigFile, bytes.Replace(b, []byte(debug), []byte(`log_level = "INFO"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatalf("reloading the server's config: %v", err)
	}
}

// runConfig is one scale run.
type runConfig struct {
	Nodes, Racks, Jobs int
	Load               float64
	Seed               int64
	Compress           float64
	// MinutesExp bounds the jobs' durations on a V100: 10^[0] to 10^[1]
	// minutes, log-uniform (Durations).
	MinutesExp [2]float64
	// NomadCompress, when > 0, is the compression of the arm of Nomad's
	// own placement.
	NomadCompress float64
	// Timeout bounds one arm's workload in wall time, past the last
	// submission.
	Timeout time.Duration
	// MinRun is the sidecar's min_run_time and `hadar sim`'s, in simulated
	// time; 0 is the sidecar's default (minRunSim).
	MinRun time.Duration
}

// minRun is the run's minimum run time, simulated.
func (r *run) minRun() time.Duration {
	if r.cfg.MinRun > 0 {
		return r.cfg.MinRun
	}
	return minRunSim
}

// run is the cluster and trace every arm of a run shares.
type run struct {
	cfg     runConfig
	cluster Cluster
	jobs    []planner.Job
	setup   Setup
	nodesim string
	prof    *profile.Profile
}

func newRun(t *testing.T, cfg runConfig) *run {
	t.Helper()
	c, err := NewCluster(cfg.Nodes, cfg.Racks)
	if err != nil {
		t.Fatal(err)
	}
	jobs, rate, err := Workload(c, cfg.Jobs, cfg.Load, cfg.Seed, Durations(cfg.MinutesExp[0], cfg.MinutesExp[1]))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{cfg: cfg, cluster: c, jobs: jobs, prof: profile.Default(), nodesim: nodesimBinary(t)}
	byType := map[string]int{}
	for _, n := range c.Planner.Nodes {
		for ty, k := range n.GPUs {
			byType[string(ty)] += k
		}
	}
	r.setup = Setup{Nodes: cfg.Nodes, Racks: cfg.Racks, GPUs: c.Planner.TotalGPUs(), GPUsByType: byType, Jobs: cfg.Jobs, Load: cfg.Load,
		RatePerHour: rate, Seed: cfg.Seed, Compression: cfg.Compress, Round: r.wall(roundSim), MinutesExp: cfg.MinutesExp}
	return r
}

// compressed is the same run at another time compression. Times are
// reported in simulated seconds, so arms at different compressions
// compare; what changes is how much wall time each control-loop delay
// costs in simulated time.
func (r *run) compressed(c float64) *run {
	x := *r
	x.cfg.Compress = c
	return &x
}

// wall converts a simulated duration to wall time.
func (r *run) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) / r.cfg.Compress).Round(time.Millisecond)
}

// nodesimBinary returns bin/nodesim, which `make nodesim` builds from the
// Nomad wrapper module. As e2e/harness does for bin/nomad, a test run
// without make builds it when it is missing, and also when any source of
// the wrapper module is newer than it: a binary left by an earlier build
// would otherwise simulate with old code.
func nodesimBinary(t *testing.T) string {
	t.Helper()
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockBin(t, root)
	defer unlock()
	out := filepath.Join(root, "bin", "nodesim")
	mod := filepath.Join(root, "e2e", "tools", "nomad")
	why, err := nodesimStale(out, mod)
	if err != nil {
		t.Fatal(err)
	}
	if why == "" {
		return out
	}
	t.Logf("building %s (%s), as make nodesim does", out, why)
	cmd := exec.Command("go", "build", "-o", out, "./nodesim/cmd/nodesim")
	cmd.Dir = mod
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build nodesim (in %s): %v\n%s", cmd.Dir, err, b)
	}
	return out
}

// nodesimStale says why the binary at bin needs building from the module
// at mod ("" when it is up to date).
func nodesimStale(bin, mod string) (string, error) {
	st, err := os.Stat(bin)
	if os.IsNotExist(err) {
		return "missing", nil
	}
	if err != nil {
		return "", fmt.Errorf("nodesim binary: %w", err)
	}
	newer := ""
	err = filepath.WalkDir(mod, func(path string, d os.DirEntry, err error) error {
		if err != nil || newer != "" {
			return err
		}
		name := d.Name()
		if d.IsDir() || !(strings.HasSuffix(name, ".go") || name == "go.mod" || name == "go.sum") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.ModTime().After(st.ModTime()) {
			newer = path
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("nodesim sources in %s: %w", mod, err)
	}
	if newer != "" {
		return newer + " is newer", nil
	}
	return "", nil
}

// lockBin serialises builds into bin/ with e2e/harness's lock file, so
// test binaries of several packages never build into it at once.
func lockBin(t *testing.T, root string) func() {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatalf("bin lock: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(root, "bin", ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("bin lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("bin lock: %v", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}

// nodesimProc is the node simulator's process.
type nodesimProc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	stdout bytes.Buffer
	log    string
	events string
}

// startNodesim runs the simulator against server and waits for its nodes.
func (r *run) startNodesim(t *testing.T, server *harness.Agent) *nodesimProc {
	t.Helper()
	dir := t.TempDir()
	spec, err := json.Marshal(r.cluster.Spec)
	if err != nil {
		t.Fatal(err)
	}
	specPath, ready := filepath.Join(dir, "cluster.json"), filepath.Join(dir, "ready")
	if err := os.WriteFile(specPath, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	p := &nodesimProc{done: make(chan struct{}), log: filepath.Join(dir, "nodesim.log"), events: filepath.Join(dir, "events.jsonl")}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(r.nodesim, "-spec", specPath, "-server", server.RPCAddr, "-compress", fmt.Sprint(r.cfg.Compress),
		"-restart-cost", restartSim.String(), "-rendezvous-timeout", rendezvousSim.String(), "-events", p.events, "-ready", ready, "-log-level", "warn")
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start nodesim: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("nodesim log (last 4 KiB):\n%s", b[max(0, len(b)-4096):])
		}
	})
	err = harness.Eventually(context.Background(), 3*time.Minute, 250*time.Millisecond, func() error {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			return fmt.Errorf("nodesim exited: %v\n%s", p.err, b)
		default:
		}
		if _, err := os.Stat(ready); err != nil {
			return errors.New("nodes not ready yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stop ends the simulator (SIGTERM; SIGKILL to its group after 20 s).
func (p *nodesimProc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("nodesim did not stop within 20 s of SIGTERM: killed")
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// nodesimStats is what nodesim prints when it stops.
type nodesimStats struct {
	RPCs, RPCErrors, Allocs, ProgressReads uint64
}

// sample is one reading of the machine during an arm.
type sample struct {
	self, server, nodesim ProcUsage
	heap                  int64
}

// sampler reads CPU and memory every second; peaks are kept.
type sampler struct {
	mu                 sync.Mutex
	serverPID, simPID  int
	first, last, peaks sample
	n                  int
}

func (s *sampler) read() sample {
	var x sample
	x.self, _ = Usage(os.Getpid())
	x.server, _ = Usage(s.serverPID)
	if s.simPID > 0 {
		x.nodesim, _ = Usage(s.simPID)
	}
	m := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(m)
	if m[0].Value.Kind() == metrics.KindUint64 {
		x.heap = int64(m[0].Value.Uint64())
	}
	return x
}

func (s *sampler) tick() {
	x := s.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		s.first = x
	}
	s.n++
	s.last = x
	s.peaks.self.RSS = max(s.peaks.self.RSS, x.self.RSS)
	s.peaks.server.RSS = max(s.peaks.server.RSS, x.server.RSS, x.server.HWM)
	s.peaks.nodesim.RSS = max(s.peaks.nodesim.RSS, x.nodesim.RSS, x.nodesim.HWM)
	s.peaks.heap = max(s.peaks.heap, x.heap)
}

// cycleLog records the sidecar's cycles.
type cycleLog struct {
	mu sync.Mutex
	// sidecar is the sidecar's log, read when it stopped: a check made
	// after the arm (TestScaleSmoke's against `hadar sim`) keeps it.
	sidecar []byte
	cycles  []time.Duration
	rounds  []time.Duration
	// writes and requests at each round boundary, cumulative.
	writes, requests []int
	// inRound are the requests each boundary cycle made itself, by kind.
	inRound []map[string]int
	// bursts: how long each stretch with writes going out in the
	// background lasted, from the first reserved to the last returned.
	bursts []time.Duration
	// starts: per job (Nomad ID), when the sidecar decided its first
	// start that was written, and when that write was seen returned (the
	// decision in its history, sampled every 100 ms): the sidecar's share
	// of the time from submission to placement.
	starts map[string]startSeen
}

// startSeen is one job's first written start.
type startSeen struct{ decided, written time.Time }

// noteStarts records the first written start of each job in the agent's
// history (a decision enters it once its write returned).
func (l *cycleLog) noteStarts(evs []wire.Event, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.starts == nil {
		l.starts = map[string]startSeen{}
	}
	for _, ev := range evs {
		if ev.Action != wire.ActionStart || ev.Result != "" {
			continue
		}
		_, id, _ := strings.Cut(ev.Job, "/")
		if _, ok := l.starts[id]; !ok {
			l.starts[id] = startSeen{decided: ev.Time, written: now}
		}
	}
}

// sampleWrites records, every 20 ms until ctx ends, the stretches during
// which the sidecar has writes going out in the background (operations in
// the writing phase): a round's writes are out when its stretch ends.
func sampleWrites(ctx context.Context, a *agent.Agent, log *cycleLog) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var since time.Time
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if i%5 == 0 {
			log.noteStarts(a.History(), time.Now())
		}
		writing := false
		for _, op := range a.Applier().Ops() {
			writing = writing || op.Phase == apply.Writing
		}
		switch {
		case writing && since.IsZero():
			since = time.Now()
		case !writing && !since.IsZero():
			log.mu.Lock()
			log.bursts = append(log.bursts, time.Since(since))
			log.mu.Unlock()
			since = time.Time{}
		}
	}
}

// runSidecar runs the agent (agent.Run: watch, read progress ahead of
// each boundary, a cycle on every change and every second, the leader
// election when configured) and times each cycle through OnCycle.
func runSidecar(ctx context.Context, a *agent.Agent, ct *CountingTransport, log *cycleLog) error {
	var before map[string]int
	a.OnCycle(func(kind engine.Kind, took time.Duration) {
		log.mu.Lock()
		defer log.mu.Unlock()
		log.cycles = append(log.cycles, took)
		if kind == engine.Boundary {
			log.rounds = append(log.rounds, took)
			total, req := 0, 0
			for _, n := range a.Applier().Writes() {
				total += n
			}
			in := map[string]int{}
			now := ct.Counts()
			for k, n := range now {
				req += n
				if d := n - before[k]; d > 0 {
					in[k] = d
				}
			}
			before = now
			log.writes = append(log.writes, total)
			log.requests = append(log.requests, req)
			log.inRound = append(log.inRound, in)
		}
	})
	sampled := make(chan struct{})
	sctx, stop := context.WithCancel(ctx)
	defer func() { stop(); <-sampled }()
	go func() { defer close(sampled); sampleWrites(sctx, a, log) }()
	if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// startSidecar builds the sidecar on the server with policy, the profile
// compressed as nodesim's time, and runs its loop until the returned stop
// is called.
func (r *run) startSidecar(t *testing.T, server *harness.Agent, policy string) (*agent.Agent, *CountingTransport, *cycleLog, func()) {
	t.Helper()
	dir := t.TempDir()
	prof, err := Compressed(r.prof, r.cfg.Compress)
	if err != nil {
		t.Fatal(err)
	}
	profPath := filepath.Join(dir, "profile.json")
	f, err := os.Create(profPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := prof.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	learn := false
	// "POLICY+ha": the state in Nomad Variables and the leader lock on, as
	// a replicated sidecar runs (one replica here: what the store and the
	// lease cost a round).
	arm := policy
	policy, ha := strings.CutSuffix(policy, "+ha")
	cfg := config.Config{
		Cluster:    config.Cluster{Nomad: &config.NomadConfig{Address: server.Addr}},
		Scheduling: config.Scheduling{Policy: policy, Placement: "pack", Round: config.Duration(r.wall(roundSim).String()), Profile: profPath},
		RunLimits:  config.RunLimits{RestartCost: config.Duration(r.wall(restartSim).String()), MinRunTime: config.Duration(r.wall(r.minRun()).String()), GangTimeout: config.Duration(max(r.wall(rendezvousSim/2), time.Second).String())},
		Learning:   config.Learning{Learn: &learn},
		Service:    config.Service{State: &config.StateConfig{Store: "file", Path: filepath.Join(dir, "sidecar.db")}},
	}
	if ha {
		cfg.State = &config.StateConfig{Store: "nomad"}
		cfg.Leader = &config.LeaderConfig{Enabled: true, TTL: "15s", LockDelay: "1s"}
	}
	s, err := cfg.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	// The sidecar's own transport (its connection share, kept between
	// uses), counted.
	tr := nomadclient.Transport()
	ct := &CountingTransport{Base: tr}
	ct.CountDials(tr)
	client, err := api.NewClient(&api.Config{Address: server.Addr, HttpClient: &http.Client{Transport: ct}})
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "sidecar.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(s, client, hclog.New(&hclog.LoggerOptions{Name: "sidecar", Level: hclog.Info, Output: lf}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := &cycleLog{}
	done := make(chan error, 1)
	go func() { done <- runSidecar(ctx, a, ct, log) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("sidecar: %v", err)
			}
			if err := a.Close(); err != nil {
				t.Errorf("sidecar: close: %v", err)
			}
			lf.Close()
			// Kept beside the table: the decisions behind its figures.
			if *scaleOut != "" {
				if err := keepLog(logPath, filepath.Join(*scaleOut, "sidecar-"+arm+".log")); err != nil {
					t.Errorf("keeping the sidecar's log: %v", err)
				}
			}
			b, _ := os.ReadFile(logPath)
			log.mu.Lock()
			log.sidecar = b
			log.mu.Unlock()
			if t.Failed() {
				t.Logf("sidecar log (last 8 KiB):\n%s", b[max(0, len(b)-8192):])
			}
		})
	}
	t.Cleanup(stop)
	return a, ct, log, stop
}

// submitter registers the trace's jobs at their compressed arrival times.
type submitter struct {
	mu     sync.Mutex
	submit map[string]time.Time
	errs   []error
	done   chan struct{}
}

func (r *run) submit(ctx context.Context, client *api.Client, managed bool, t0 time.Time) *submitter {
	s := &submitter{submit: map[string]time.Time{}, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for _, j := range r.jobs {
			at := t0.Add(time.Duration(j.Arrival / r.cfg.Compress * float64(time.Second)))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(at)):
			}
			job := PlainJob(r.prof, j)
			if managed {
				job = ManagedJob(r.prof, j)
			}
			_, _, err := client.Jobs().Register(job, nil)
			s.mu.Lock()
			if err != nil {
				s.errs = append(s.errs, fmt.Errorf("register %s: %w", j.ID, err))
			} else {
				s.submit[j.ID] = time.Now()
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// arm runs the trace once: through the sidecar with policy, or, for
// "nomad", with Nomad's own placement; each on a fresh server and node
// simulator.
func (r *run) arm(t *testing.T, policy string) Result {
	res := Result{Arm: policy, Compression: r.cfg.Compress}
	server := harness.StartAgent(t, harness.Options{Mode: harness.ModeServer, Name: "scale-" + policy, ExtraConfig: serverConfig})
	sp := &sampler{}
	var err error
	if sp.serverPID, err = FindProcess(server.ConfigFile); err != nil {
		t.Fatalf("the Nomad server's process: %v", err)
	}
	quietServer(t, server, sp.serverPID)
	begin := time.Now()
	sim := r.startNodesim(t, server)
	t.Logf("%s: %d simulated nodes ready in %v", policy, len(r.cluster.Spec.Nodes), time.Since(begin).Round(time.Millisecond))
	sp.simPID = sim.cmd.Process.Pid
	managed := policy != "nomad"
	var (
		a     *agent.Agent
		ct    *CountingTransport
		cl    *cycleLog
		stopS = func() {}
	)
	sp.tick()
	if managed {
		a, ct, cl, stopS = r.startSidecar(t, server, policy)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				sp.tick()
			}
		}
	}()
	t0 := time.Now()
	sub := r.submit(ctx, server.Client, managed, t0)
	tail := NewTail(sim.events)
	lastArrival := time.Duration(r.jobs[len(r.jobs)-1].Arrival / r.cfg.Compress * float64(time.Second))
	deadline := t0.Add(lastArrival + r.cfg.Timeout)
	report := time.Now()
	for {
		if err := tail.Read(); err != nil {
			t.Fatal(err)
		}
		done := tail.Completed()
		if done == len(r.jobs) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d of %d jobs complete %v after the last arrival", policy, done, len(r.jobs), r.cfg.Timeout)
			r.explainIncomplete(t, server.Client, tail)
			break
		}
		select {
		case <-sim.done:
			t.Fatalf("nodesim exited: %v", sim.err)
		default:
		}
		if time.Since(report) >= 30*time.Second {
			report = time.Now()
			line := fmt.Sprintf("%s: %v: %d submitted, %d placed, %d complete", policy, time.Since(t0).Round(time.Second), len(sub.times()), len(tail.Jobs), done)
			if a != nil {
				cl.mu.Lock()
				if n := len(cl.rounds); n > 0 {
					line += fmt.Sprintf("; %d rounds, last %v", n, cl.rounds[n-1].Round(time.Millisecond))
				}
				cl.mu.Unlock()
			}
			t.Log(line)
		}
		time.Sleep(500 * time.Millisecond)
	}
	res.Wall = time.Since(t0)
	cancel()
	<-sub.done
	sp.tick()
	if a != nil {
		st := a.Watcher().Stats()
		res.ProgressReads, res.ProgressErrors, res.Relists = st.ProgressReads, st.ProgressErrors, st.Relists
		stopS()
		cl.mu.Lock()
		res.sidecarLog = cl.sidecar
		cl.mu.Unlock()
		res.Requests, res.Connections = ct.Counts(), ct.Dials()
		res.ProgressLatency, res.RegisterLatency, res.PlanLatency = ct.Latency("progress read"), ct.Latency("register"), ct.Latency("plan")
	}
	begin = time.Now()
	sim.stop(t)
	t.Logf("%s: workload done in %v; node simulator stopped in %v", policy, res.Wall.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
	var ns nodesimStats
	if err := json.Unmarshal(bytes.TrimSpace(sim.stdout.Bytes()), &ns); err == nil {
		res.NodesimRPCs, res.NodesimRPCErrors, res.NodesimProgressReads = ns.RPCs, ns.RPCErrors, ns.ProgressReads
	} else {
		t.Errorf("nodesim's counters: %v in %q", err, sim.stdout.String())
	}
	for _, err := range sub.errs {
		t.Error(err)
	}
	r.schedule(&res, tail, sub.times(), t0)
	if a != nil {
		r.loop(&res, cl)
		r.sidecarShare(&res, cl, sub.times())
	}
	wall := res.Wall.Seconds()
	res.SidecarCPU = (sp.last.self.CPU - sp.first.self.CPU).Seconds() / wall
	res.ServerCPU = (sp.last.server.CPU - sp.first.server.CPU).Seconds() / wall
	res.NodesimCPU = (sp.last.nodesim.CPU - sp.first.nodesim.CPU).Seconds() / wall
	res.SidecarPeakRSS, res.ServerPeakRSS, res.NodesimRSS, res.SidecarPeakHeap = sp.peaks.self.RSS, sp.peaks.server.RSS, sp.peaks.nodesim.RSS, sp.peaks.heap
	return res
}

func (s *submitter) times() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]time.Time, len(s.submit))
	for k, v := range s.submit {
		out[k] = v
	}
	return out
}

// schedule fills the live schedule's numbers from the event log: JCT from
// submission to completion, makespan from the first submission, both in
// simulated seconds.
func (r *run) schedule(res *Result, tail *Tail, submitted map[string]time.Time, t0 time.Time) {
	var jcts, placed, running []float64
	var last time.Time
	for id, st := range submitted {
		jt := tail.Jobs[id]
		if jt == nil {
			continue
		}
		if jt.Stalled {
			res.Stalled++
		}
		res.GeneratedPlacements += jt.Generated
		res.OtherPlacements += jt.Other
		res.Preemptions += jt.Stops
		res.RendezvousTimeouts += jt.Timeouts
		if !jt.Placed.IsZero() {
			placed = append(placed, jt.Placed.Sub(st).Seconds())
		}
		if !jt.Running.IsZero() {
			running = append(running, jt.Running.Sub(st).Seconds())
		}
		if !jt.Complete.IsZero() {
			res.Completed++
			jcts = append(jcts, jt.Complete.Sub(st).Seconds()*r.cfg.Compress)
			if jt.Complete.After(last) {
				last = jt.Complete
			}
		}
	}
	if res.Completed > 0 {
		res.MakespanSim = last.Sub(t0).Seconds() * r.cfg.Compress
		res.AvgJCTSim, res.P99JCTSim = Mean(jcts), Quantile(jcts, 0.99)
	}
	res.PlacedP50, res.PlacedP99 = seconds(Quantile(placed, 0.5)), seconds(Quantile(placed, 0.99))
	res.RunningP50, res.RunningP99 = seconds(Quantile(running, 0.5)), seconds(Quantile(running, 0.99))
}

// seconds is a duration of s seconds (0 for NaN: no sample).
func seconds(s float64) time.Duration {
	if math.IsNaN(s) {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}

// keepLog copies the log at from to to, making to's directory.
func keepLog(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// sidecarShare fills the sidecar's share of placement: submission to
// its start decision, and to that write's return.
func (r *run) sidecarShare(res *Result, cl *cycleLog, submitted map[string]time.Time) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var decided, written []float64
	for id, st := range submitted {
		if s, ok := cl.starts[id]; ok {
			decided = append(decided, max(s.decided.Sub(st).Seconds(), 0))
			written = append(written, max(s.written.Sub(st).Seconds(), 0))
		}
	}
	res.DecidedP50, res.DecidedP99 = seconds(Quantile(decided, 0.5)), seconds(Quantile(decided, 0.99))
	res.WrittenP50, res.WrittenP99 = seconds(Quantile(written, 0.5)), seconds(Quantile(written, 0.99))
	res.DecidedJobs = len(decided)
}

// loop fills the control loop's numbers.
func (r *run) loop(res *Result, cl *cycleLog) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	q := func(ds []time.Duration, p float64) time.Duration {
		xs := make([]float64, len(ds))
		for i, x := range ds {
			xs[i] = float64(x)
		}
		v := Quantile(xs, p)
		if math.IsNaN(v) {
			return 0
		}
		return time.Duration(v)
	}
	res.Rounds = len(cl.rounds)
	res.RoundP50, res.RoundP99, res.RoundMax = q(cl.rounds, 0.5), q(cl.rounds, 0.99), q(cl.rounds, 1)
	res.CycleP50, res.CycleP99 = q(cl.cycles, 0.5), q(cl.cycles, 0.99)
	res.WritesOutP50, res.WritesOutP99, res.WritesOutMax = q(cl.bursts, 0.5), q(cl.bursts, 0.99), q(cl.bursts, 1)
	slow := -1
	for i, d := range cl.rounds {
		if slow < 0 || d > cl.rounds[slow] {
			slow = i
		}
	}
	if slow >= 0 {
		res.SlowestRound = fmt.Sprintf("%v: %s", cl.rounds[slow].Round(time.Millisecond), requestSummary(cl.inRound[slow]))
	}
	var per, req []float64
	for i := 1; i < len(cl.writes); i++ {
		per = append(per, float64(cl.writes[i]-cl.writes[i-1]))
		req = append(req, float64(cl.requests[i]-cl.requests[i-1]))
	}
	if len(cl.writes) > 0 {
		res.WritesTotal = float64(cl.writes[len(cl.writes)-1])
	}
	if len(per) > 0 {
		res.WritesPerRound, res.WritesPerRoundMax, res.RequestsPerRound = Mean(per), Quantile(per, 1), Mean(req)
	}
}

// predict runs `hadar sim` for the sidecar arms.
func (r *run) predict(t *testing.T, res *Result) {
	t.Helper()
	policy, _ := strings.CutSuffix(res.Arm, "+ha")
	p, err := Predict(context.Background(), r.cluster.Planner, r.jobs, r.prof, policy, roundSim.Seconds(), restartSim.Seconds(), r.minRun().Seconds())
	if err != nil {
		t.Fatal(err)
	}
	res.PredMakespan, res.PredAvgJCT = p.Makespan, p.AvgJCT
	var waits []float64
	for _, j := range p.Jobs {
		if j.Start >= 0 {
			waits = append(waits, j.Start-j.Arrival)
		}
		res.PredRestarts += j.Restarts
	}
	// In the live arm's wall time, to set beside its placement latency.
	wall := func(s float64) time.Duration {
		if math.IsNaN(s) {
			return 0
		}
		return time.Duration(s / r.cfg.Compress * float64(time.Second))
	}
	res.PredWaitP50, res.PredWaitP99 = wall(Quantile(waits, 0.5)), wall(Quantile(waits, 0.99))
}

// requestSummary lists requests by kind, most frequent first.
func requestSummary(req map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var kvs []kv
	for k, v := range req {
		kvs = append(kvs, kv{k, v})
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].v > kvs[j].v || kvs[i].v == kvs[j].v && kvs[i].k < kvs[j].k })
	var parts []string
	for _, x := range kvs {
		parts = append(parts, fmt.Sprintf("%s %d", x.k, x.v))
	}
	return strings.Join(parts, ", ")
}

// explainIncomplete logs what the event log and Nomad say of a few jobs
// that did not complete.
func (r *run) explainIncomplete(t *testing.T, client *api.Client, tail *Tail) {
	n := 0
	for _, j := range r.jobs {
		jt := tail.Jobs[j.ID]
		if jt != nil && !jt.Complete.IsZero() {
			continue
		}
		if n++; n > 10 {
			return
		}
		line := fmt.Sprintf("%s (%s, %d workers): ", j.ID, j.Model, j.ScaleFactor)
		if jt != nil {
			line += fmt.Sprintf("placed %v, running %v, %d starts, %d stops, %d timeouts, stalled %t; ", !jt.Placed.IsZero(), !jt.Running.IsZero(), jt.Starts, jt.Stops, jt.Timeouts, jt.Stalled)
		}
		allocs, _, err := client.Jobs().Allocations(j.ID, true, nil)
		if err != nil {
			line += err.Error()
		}
		for _, a := range allocs {
			line += fmt.Sprintf("[%s %s %s/%s %s] ", a.ID[:8], a.TaskGroup, a.DesiredStatus, a.ClientStatus, a.NodeName)
		}
		if evals, _, err := client.Jobs().Evaluations(j.ID, nil); err == nil {
			for _, e := range evals {
				if e.Status == "blocked" {
					for g, m := range e.FailedTGAllocs {
						line += fmt.Sprintf("blocked %s: %v %v; ", g, m.DimensionExhausted, m.ConstraintFiltered)
					}
				}
			}
		}
		t.Log(line)
	}
}
