package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/config"
)

// Options configure a demo run.
type Options struct {
	// Repo is the repository root: jobspecs/ is read from it.
	Repo string
	// Bin holds nomad, hadar, hadar-trainer and plugins/ (make demo
	// builds them).
	Bin string
	// Out receives the logs, the summary and the state file.
	Out      string
	Workload Workload
	// NomadPorts: the server's HTTP, RPC and Serf ports, then three per
	// client, in Cluster order (3 + 3*len(Cluster) ports).
	NomadPorts []int
	Settings   SidecarSettings
	// Baseline runs the workload again under Nomad's own placement.
	Baseline bool
	// BaselineLimit stops that run early (0: the larger of 3 minutes and
	// one and a half times the hadar run's makespan: Nomad's own placement
	// of the full workload takes about 12 minutes, and the summary
	// extrapolates the jobs it cuts off).
	BaselineLimit time.Duration
	Stdout        io.Writer
}

// DefaultNomadPorts: Nomad's own defaults for the server (so `nomad`
// finds it without NOMAD_ADDR), and 4661 onwards for the clients.
func DefaultNomadPorts() []int {
	ports := []int{4646, 4647, 4648}
	for i := range Cluster {
		ports = append(ports, 4661+3*i, 4662+3*i, 4663+3*i)
	}
	return ports
}

// demo is one run.
type demo struct {
	o         Options
	out       io.Writer
	dir       string // temporary: agents' data, shared checkpoints
	tmp       string // TMPDIR of the agents and the sidecar, under dir
	shared    string
	logs      string
	run       string
	statePath string
	state     State

	mu      sync.Mutex
	server  *proc
	clients []*proc
	sidecar *proc

	nomad   *api.Client
	trainer string
	infos   []JobInfo
	jobs    map[string]*api.Job
	scr     *screen
}

// Run runs the demo; it stops everything it started before it returns,
// also when ctx is cancelled (Ctrl-C).
func Run(ctx context.Context, o Options) (err error) {
	d := &demo{o: o, out: o.Stdout, run: fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()), jobs: map[string]*api.Job{}}
	if len(o.NomadPorts) != 3+3*len(Cluster) {
		return fmt.Errorf("nomad ports: want %d (server http, rpc, serf, then 3 per client), got %d", 3+3*len(Cluster), len(o.NomadPorts))
	}
	if err := d.preflight(); err != nil {
		return err
	}
	started := time.Now()
	d.header()
	defer func() {
		left := d.teardown()
		if len(left) > 0 {
			err = errors.Join(err, fmt.Errorf("left behind: %v", left))
		}
		fmt.Fprintf(d.out, "demo over after %s\n", time.Since(started).Round(time.Second))
	}()
	if err := d.startCluster(ctx); err != nil {
		return d.interrupted(ctx, err)
	}
	if err := d.parseWorkload(); err != nil {
		return err
	}
	hadarPred, err := PredictHadar(ctx, Cluster, d.infos, o.Settings)
	if err != nil {
		return err
	}
	nomadPred, err := PredictNomad(ctx, Cluster, d.infos, o.Settings.Round)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "the simulator (planner/sim, the sidecar's engine) predicts: makespan %s under %s, %s under Nomad's own placement (a model: first fit, blind to GPU types)\n",
		secs(hadarPred.Makespan), hadarPred.Policy, secs(nomadPred.Makespan))
	if err := d.startSidecar(ctx); err != nil {
		return d.interrupted(ctx, err)
	}
	d.step(3, "hadar run: %d jobs from jobspecs/ submitted over %s; the sidecar places the managed ones", len(o.Workload.Jobs), lastArrival(o.Workload.Jobs))
	hadar, err := d.runWorkload(ctx, "hadar", "http://"+o.Settings.HTTPAddr, 20*time.Minute)
	if err != nil {
		return d.interrupted(ctx, err)
	}
	d.stopSidecar()
	var nomad *runResult
	if o.Baseline {
		limit := o.BaselineLimit
		if limit == 0 {
			limit = max(3*time.Minute, 3*hadar.makespan()/2)
		}
		d.step(4, "the same jobs under Nomad's own placement: no gate, count = workers, Nomad places them (stopped after %s at the latest)", limit.Round(time.Second))
		if err := d.reset(ctx); err != nil {
			return d.interrupted(ctx, err)
		}
		nomad, err = d.runWorkload(ctx, "nomad", "", limit)
		if err != nil {
			return d.interrupted(ctx, err)
		}
	} else {
		d.step(4, "Nomad's own placement: skipped (-baseline=false)")
	}
	d.step(5, "summary")
	sum := summarize(d.infos, hadar, nomad, hadarPred, nomadPred)
	files, err := sum.write(d.out, o.Out)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "written: %s\n", strings.Join(files, ", "))
	return nil
}

// header says what the demo does and where to look, before anything runs.
func (d *demo) header() {
	var gpus []string
	for t, n := range Capacity(Cluster) {
		gpus = append(gpus, fmt.Sprintf("%d %s", n, t))
	}
	sort.Strings(gpus)
	fmt.Fprintf(d.out, "hadar demo: one Nomad server and %d clients on loopback (GPUs declared: %s; racks r1, r2), the hadar sidecar, %d jobs\n",
		len(Cluster), strings.Join(gpus, ", "), len(d.o.Workload.Jobs))
	fmt.Fprintf(d.out, "  status page  http://%s/   (the sidecar's, once it runs; the plan as JSON: http://%s/v1/plan)\n", d.o.Settings.HTTPAddr, d.o.Settings.HTTPAddr)
	fmt.Fprintf(d.out, "  Nomad UI     http://127.0.0.1:%d/ui/   (nomad CLI: NOMAD_ADDR=http://127.0.0.1:%d)\n", d.o.NomadPorts[0], d.o.NomadPorts[0])
	fmt.Fprintf(d.out, "  Ctrl-C stops everything at any moment, as does `make demo-stop` from another shell; logs in %s\n", filepath.Join(d.o.Out, "logs"))
}

// interrupted turns an error caused by a cancelled context into errStopped.
func (d *demo) interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errStopped
	}
	return err
}

func (d *demo) step(n int, format string, args ...any) {
	if d.scr != nil {
		d.scr.done()
	}
	fmt.Fprintf(d.out, "\n[%d/5] %s\n", n, fmt.Sprintf(format, args...))
}

// preflight checks the binaries and the ports, cleans what an earlier
// demo killed without its teardown left, and records this run's state.
func (d *demo) preflight() error {
	o := d.o
	for _, b := range []string{"nomad", "hadar", "hadar-trainer", "plugins/hadar-gpu", "plugins/hadar-train"} {
		if _, err := os.Stat(filepath.Join(o.Bin, b)); err != nil {
			return fmt.Errorf("%s missing: run `make demo`, which builds it (or make nomad plugins build)", filepath.Join(o.Bin, b))
		}
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	d.statePath = StateFile(o.Out)
	if old, err := ReadState(d.statePath); err == nil {
		if old.PID > 0 && syscall.Kill(old.PID, 0) == nil {
			if p, ok := readProc(old.PID); ok && strings.Contains(p.cmdline, "hadar-demo") {
				return fmt.Errorf("a demo is already running (pid %d, %s): stop it with `make demo-stop`", old.PID, d.statePath)
			}
		}
		if left := Clean(Scope{Run: old.Run, Dirs: []string{old.Dir}}); len(left) > 0 {
			return fmt.Errorf("an earlier demo left %v, which could not be removed", left)
		}
		_ = os.Remove(d.statePath)
	}
	ports := append(append([]int(nil), o.NomadPorts...), httpPort(o.Settings.HTTPAddr))
	if err := portsFree(ports); err != nil {
		return err
	}
	var err error
	if d.dir, err = os.MkdirTemp("", "hadar-demo-"); err != nil {
		return err
	}
	// Tasks run as nobody: they must traverse the directory to their task
	// directories and reach the trainer and the shared directories.
	if err := os.Chmod(d.dir, 0o755); err != nil {
		return err
	}
	d.state = State{PID: os.Getpid(), Run: d.run, Dir: d.dir, Ports: ports, Procs: map[string]int{}}
	if err := writeState(d.statePath, d.state); err != nil {
		return err
	}
	d.logs = filepath.Join(o.Out, "logs")
	_ = os.RemoveAll(d.logs)
	if err := os.MkdirAll(d.logs, 0o755); err != nil {
		return err
	}
	// The agents, their plugins, executors and logmon, and the sidecar
	// keep their temporary files (go-plugin's sockets among them) here,
	// so a demo that is killed leaves none in the system's /tmp.
	d.tmp = filepath.Join(d.dir, "tmp")
	if err := os.Mkdir(d.tmp, 0o700); err != nil {
		return err
	}
	d.shared = filepath.Join(d.dir, "shared")
	for _, sub := range []string{"checkpoints", "merge"} {
		if err := os.MkdirAll(filepath.Join(d.shared, sub), 0o755); err != nil {
			return err
		}
	}
	// A copy of the trainer nobody can reach whatever the permissions of
	// the checkout (a home directory is often private).
	d.trainer = filepath.Join(d.dir, "hadar-trainer")
	if err := copyFile(filepath.Join(o.Bin, "hadar-trainer"), d.trainer, 0o755); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return nil
}

func (d *demo) track(name string, p *proc) {
	d.mu.Lock()
	d.state.Procs[name] = p.cmd.Process.Pid
	s := d.state
	d.mu.Unlock()
	_ = writeState(d.statePath, s)
}

// startCluster starts the server, then every client at once, and waits
// until each client's node is ready with its GPUs and hadar-train.
func (d *demo) startCluster(ctx context.Context) error {
	o := d.o
	d.step(1, "starting Nomad on loopback: one server and %d clients with declared GPUs in two racks (data in %s, logs in %s)", len(Cluster), d.dir, d.logs)
	ports := o.NomadPorts
	env := []string{RunEnv + "=" + d.run, "TMPDIR=" + d.tmp}
	srvPorts := Ports{ports[0], ports[1], ports[2]}
	start := time.Now()
	p, err := d.startAgent("server", agentConfig("server", srvPorts, true, nil, nil, nil), env)
	if err != nil {
		return err
	}
	d.server = p
	addr := fmt.Sprintf("http://127.0.0.1:%d", srvPorts.HTTP)
	if d.nomad, err = api.NewClient(&api.Config{Address: addr}); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, func() error {
		if p.exited() {
			return errors.New("the server exited: " + tailFile(filepath.Join(d.logs, "server.log")))
		}
		leader, err := d.nomad.Status().Leader()
		if err != nil || leader == "" {
			return fmt.Errorf("no leader yet (%v)", err)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("nomad server: %w", err)
	}
	fmt.Fprintf(d.out, "  server ready at %s (UI %s/ui/) in %s\n", addr, addr, time.Since(start).Round(100*time.Millisecond))
	train := fmt.Sprintf("    checkpoint_root = %q\n    merge_root = %q\n    progress_poll_interval = \"1s\"\n",
		filepath.Join(d.shared, "checkpoints"), filepath.Join(d.shared, "merge"))
	for i, n := range Cluster {
		cp := Ports{ports[3+3*i], ports[4+3*i], ports[5+3*i]}
		meta := map[string]string{"rack": n.Rack, "node_index": strconv.Itoa(i)}
		plugins := map[string]string{"hadar-gpu": gpuInventory(n), "hadar-train": train}
		p, err := d.startAgent(n.Name, agentConfig(n.Name, cp, false, []string{fmt.Sprintf("127.0.0.1:%d", srvPorts.RPC)}, meta, plugins), env)
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.clients = append(d.clients, p)
		d.mu.Unlock()
	}
	ready := map[string]bool{}
	err = waitFor(ctx, 120*time.Second, func() error {
		for i, p := range d.clients {
			if p.exited() {
				return fmt.Errorf("client %s exited: %s", Cluster[i].Name, tailFile(filepath.Join(d.logs, Cluster[i].Name+".log")))
			}
		}
		nodes, _, err := d.nomad.Nodes().List(nil)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if ready[n.Name] || n.Status != "ready" {
				continue
			}
			node, _, err := d.nomad.Nodes().Info(n.ID, nil)
			if err != nil {
				return err
			}
			drv := node.Drivers["hadar-train"]
			if drv != nil && drv.Healthy && node.NodeResources != nil && len(node.NodeResources.Devices) > 0 {
				ready[n.Name] = true
				fmt.Fprintf(d.out, "  client %-7s ready in %5s: %s\n", n.Name, time.Since(start).Round(100*time.Millisecond), describeNode(n.Name))
			}
		}
		if len(ready) < len(Cluster) {
			return fmt.Errorf("%d of %d clients ready", len(ready), len(Cluster))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("nomad clients: %w", err)
	}
	return nil
}

func describeNode(name string) string {
	for _, n := range Cluster {
		if n.Name != name {
			continue
		}
		var g []string
		for _, x := range n.GPUs {
			g = append(g, fmt.Sprintf("%dx %s", x.Count, x.Model))
		}
		return "rack " + n.Rack + ", " + strings.Join(g, " + ")
	}
	return ""
}

// startAgent writes an agent's config and starts it.
func (d *demo) startAgent(name, config string, env []string) (*proc, error) {
	dir := filepath.Join(d.dir, name)
	// Nomad would create the data dir private to root; tasks running as
	// nobody must traverse it.
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(dir, "data"), 0o711); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc(name, filepath.Join(d.logs, name+".log"), env, filepath.Join(d.o.Bin, "nomad"),
		"agent", "-config", cfg, "-data-dir", filepath.Join(dir, "data"), "-plugin-dir", filepath.Join(d.o.Bin, "plugins"))
	if err != nil {
		return nil, err
	}
	d.track(name, p)
	return p, nil
}

// parseWorkload has Nomad parse every jobspec of the workload.
func (d *demo) parseWorkload() error {
	for _, s := range d.o.Workload.Jobs {
		job, err := s.Parse(d.nomad, filepath.Join(d.o.Repo, "jobspecs"), d.trainer)
		if err != nil {
			return err
		}
		ji, err := Describe(s, job)
		if err != nil {
			return err
		}
		d.jobs[s.ID] = job
		d.infos = append(d.infos, ji)
	}
	return nil
}

// sidecarConfig is the sidecar's configuration file for the demo.
func (d *demo) sidecarConfig() string {
	s := d.o.Settings
	return fmt.Sprintf(`# Written by hadar-demo: the sidecar's settings for a few minutes of jobs.
nomad {
  address = "http://127.0.0.1:%d"
}
policy       = %q
placement    = %q
round        = %q
min_run_time = %q
restart_cost = %q
merge_cost   = %q
gang_timeout = %q
stop_timeout = %q
log_level    = "info"
http {
  address = %q
}
state {
  store = "file"
  path  = %q
}
`, d.o.NomadPorts[0], s.Policy, s.Placement, s.Round, s.MinRunTime, s.RestartCost, s.MergeCost, s.GangTimeout, s.StopTimeout, s.HTTPAddr, filepath.Join(d.dir, "sidecar.db"))
}

// startSidecar runs `hadar sidecar` as a process, as an operator would.
func (d *demo) startSidecar(ctx context.Context) error {
	s := d.o.Settings
	d.step(2, "starting the hadar sidecar: policy %s, placement %s, rounds of %s", s.Policy, s.Placement, s.Round)
	path := filepath.Join(d.dir, "sidecar.hcl")
	cfg := d.sidecarConfig()
	// The file is checked as the sidecar will read it: a bad value fails
	// here with the field named, not in a log.
	c, err := config.ParseConfig(path, []byte(cfg))
	if err != nil {
		return err
	}
	if _, err := c.Resolve(); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(d.logs, "sidecar.log")
	p, err := startProc("sidecar", logPath, []string{RunEnv + "=" + d.run, "TMPDIR=" + d.tmp}, filepath.Join(d.o.Bin, "hadar"), "sidecar", "-config", path)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.sidecar = p
	d.mu.Unlock()
	d.track("sidecar", p)
	base := "http://" + s.HTTPAddr
	start := time.Now()
	err = waitFor(ctx, 60*time.Second, func() error {
		if p.exited() {
			return errors.New("the sidecar exited: " + tailFile(logPath))
		}
		resp, err := http.Get(base + "/v1/plan")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /v1/plan: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	fmt.Fprintf(d.out, "  sidecar up in %s: status page %s/ , plan %s/v1/plan , log %s\n", time.Since(start).Round(100*time.Millisecond), base, base, logPath)
	return nil
}

func (d *demo) stopSidecar() {
	d.mu.Lock()
	p := d.sidecar
	d.sidecar = nil
	d.mu.Unlock()
	if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		fmt.Fprintf(d.out, "  sidecar: %v\n", err)
	}
}

// runResult is what one run of the workload measured.
type runResult struct {
	name   string
	jct    map[string]time.Duration // done jobs
	done   map[string]float64       // steps done, for jobs cut off
	failed map[string]string
	cutOff time.Duration // > 0: stopped at this point with jobs unfinished
	events []string
	// Counted by the monitor.
	preemptions, forks, unforks, resumes, checkpoints, merges int
}

func (r *runResult) makespan() time.Duration {
	var m time.Duration
	for _, v := range r.jct {
		m = max(m, v)
	}
	return m
}

// runWorkload submits the workload on its schedule (as is to the sidecar,
// or turned into Nomad's own form when sidecar is "") and shows progress
// until every job ended or limit passed.
func (d *demo) runWorkload(ctx context.Context, name, sidecar string, limit time.Duration) (*runResult, error) {
	m := newMonitor(d.nomad, sidecar, d.o.Workload.Jobs, d.infos)
	if err := m.nodes(ctx); err != nil {
		return nil, err
	}
	d.scr = newScreen(d.out, Capacity(Cluster))
	title := "hadar (" + d.o.Settings.Policy + ")"
	if sidecar == "" {
		title = "Nomad's own placement"
	}
	m.start = time.Now()
	var snap Snapshot
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	res := &runResult{name: name, jct: map[string]time.Duration{}, done: map[string]float64{}, failed: map[string]string{}}
	masterPort := 28500
	for {
		for _, s := range m.subs {
			if _, ok := m.submitted[s.ID]; ok || time.Since(m.start) < s.At {
				continue
			}
			job := d.jobs[s.ID]
			if sidecar == "" {
				var err error
				if job, err = NomadOwn(job, masterPort); err != nil {
					return nil, err
				}
				masterPort++
			}
			if _, _, err := d.nomad.Jobs().Register(job, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
				return nil, fmt.Errorf("submit %s: %w", s.ID, err)
			}
			m.submitted[s.ID] = time.Now()
			m.event("submit   %s (%s, %s)", s.ID, s.Kind, s.File)
		}
		var err error
		snap, err = m.poll(ctx)
		if err != nil && ctx.Err() == nil {
			m.event("(reading Nomad failed: %v)", err)
		}
		d.scr.show(title, snap)
		if snap.AllDone && len(m.submitted) == len(m.subs) {
			break
		}
		if time.Since(m.start) > limit {
			res.cutOff = time.Since(m.start)
			for _, r := range snap.Jobs {
				if r.State != "done" && r.State != "failed" {
					res.done[r.ID] = r.Done
				}
			}
			m.event("stopped after %s: %d jobs unfinished", limit.Round(time.Second), len(res.done))
			d.scr.show(title, snap)
			break
		}
		select {
		case <-ctx.Done():
			d.scr.done()
			return nil, errStopped
		case <-tick.C:
		}
	}
	d.scr.done()
	for id, f := range m.finished {
		if msg, ok := m.failed[id]; ok {
			res.failed[id] = msg
			continue
		}
		res.jct[id] = f.Sub(m.submitted[id])
	}
	res.events = m.events
	for _, r := range snap.Jobs {
		res.merges += r.Merges
	}
	res.preemptions, res.forks, res.unforks, res.resumes, res.checkpoints = m.Preemptions, m.Forks, m.Unforks, m.Resumes, m.Checkpoints
	return res, nil
}

// reset stops and purges every job, garbage-collects their allocations
// and empties the shared checkpoint and merge directories, so the next
// run starts from nothing.
func (d *demo) reset(ctx context.Context) error {
	start := time.Now()
	if err := d.clearJobs(ctx); err != nil {
		return err
	}
	for _, sub := range []string{"checkpoints", "merge"} {
		dir := filepath.Join(d.shared, sub)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(d.out, "  cleared the hadar run's jobs, allocations and checkpoints in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// clearJobs stops every job, waits until its allocations ended (each
// task stopped through its driver), garbage-collects them (their tmpfs
// mounts and cgroups go with them) and purges the jobs.
func (d *demo) clearJobs(ctx context.Context) error {
	all := (&api.QueryOptions{Namespace: "*"}).WithContext(ctx)
	jobs, _, err := d.nomad.Jobs().List(all)
	if err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	for _, j := range jobs {
		_, _, _ = d.nomad.Jobs().Deregister(j.ID, false, (&api.WriteOptions{Namespace: j.Namespace}).WithContext(ctx))
	}
	var allocs []*api.AllocationListStub
	err = waitFor(ctx, 60*time.Second, func() error {
		var err error
		if allocs, _, err = d.nomad.Allocations().List(all); err != nil {
			return err
		}
		for _, a := range allocs {
			if a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending {
				return fmt.Errorf("allocation %s of %s still %s", a.ID[:8], a.JobID, a.ClientStatus)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, a := range allocs {
		// Nomad answers with an empty body, which the client reports as EOF.
		if err := d.nomad.Allocations().GC(&api.Allocation{ID: a.ID, NodeID: a.NodeID}, nil); err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
			return fmt.Errorf("garbage-collect allocation %s: %w", a.ID[:8], err)
		}
	}
	if err := waitFor(ctx, 30*time.Second, func() error {
		if m := hostpath.MountsUnder([]string{d.dir}); len(m) > 0 {
			return fmt.Errorf("%d allocation mounts left, e.g. %s", len(m), m[0].Point)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, j := range jobs {
		_, _, _ = d.nomad.Jobs().Deregister(j.ID, true, (&api.WriteOptions{Namespace: j.Namespace}).WithContext(ctx))
	}
	return nil
}

// teardown stops everything the demo started, in order, and returns what
// is still left after a final sweep (nothing, normally).
func (d *demo) teardown() []Leftover {
	if d.dir == "" {
		return nil // preflight failed before anything started
	}
	start := time.Now()
	fmt.Fprintf(d.out, "\nstopping everything: the sidecar, the jobs (each checkpoints), the Nomad agents ...\n")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d.mu.Lock()
	sidecar, server, clients := d.sidecar, d.server, d.clients
	d.mu.Unlock()
	if sidecar != nil {
		d.stopSidecar()
	}
	if server != nil && !server.exited() && d.nomad != nil {
		if err := d.clearJobs(ctx); err != nil {
			fmt.Fprintf(d.out, "  jobs: %v\n", err)
		}
	}
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.stop(syscall.SIGINT, 20*time.Second); err != nil {
				fmt.Fprintf(d.out, "  client %s: %v\n", Cluster[i].Name, err)
			}
		}()
	}
	wg.Wait()
	if err := server.stop(syscall.SIGINT, 20*time.Second); err != nil {
		fmt.Fprintf(d.out, "  server: %v\n", err)
	}
	scope := Scope{Run: d.run, Dirs: []string{d.dir}, Ports: d.state.Ports}
	// Plugins notice their agent is gone within a second or two.
	_ = waitFor(ctx, 10*time.Second, func() error {
		for _, l := range Find(scope) {
			if l.Kind == "process" || l.Kind == "port" {
				return errors.New(l.String())
			}
		}
		return nil
	})
	var stray []Leftover
	for _, l := range Find(scope) {
		if l.Kind != "directory" {
			stray = append(stray, l)
		}
	}
	left := Clean(scope)
	if len(stray) > 0 {
		fmt.Fprintf(d.out, "  removed what the agents left behind: %v\n", stray)
	}
	if len(left) == 0 {
		_ = os.Remove(d.statePath)
		fmt.Fprintf(d.out, "  stopped in %s: no process, mount, cgroup or port of the demo left\n", time.Since(start).Round(100*time.Millisecond))
	}
	return left
}

// waitFor calls f every 250 ms until it returns nil, ctx ends or timeout
// passes, and then returns f's last error.
func waitFor(ctx context.Context, timeout time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %s: %w", timeout, err)
		case <-t.C:
		}
	}
}

func tailFile(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return fmt.Sprintf("last lines of %s:\n%s", path, b)
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

func httpPort(addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, _ := strconv.Atoi(p)
	return n
}

func lastArrival(subs []Submission) time.Duration {
	var m time.Duration
	for _, s := range subs {
		m = max(m, s.At)
	}
	return m
}

func secs(s float64) string { return (time.Duration(s) * time.Second).String() }
