package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hashicorp/go-hclog"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/agent"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/status"
	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// statusToken stands for the sidecar's Nomad token: no response may carry
// it. (The e2e cluster runs without ACLs, so Nomad ignores it.)
const statusToken = "4b0c33d2-hadar-e2e-status-token-9f1a"

// statusServer is the telemetry and the status API of an in-process
// sidecar, on a free loopback port.
type statusServer struct {
	base string
	tel  *telemetry.Telemetry
}

func (c *sidecarCluster) startStatus(t *testing.T, a *agent.Agent, policy string) *statusServer {
	t.Helper()
	tel, err := telemetry.New(a, telemetry.Options{Policy: policy, Interval: 250 * time.Millisecond, UtilStep: time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "telemetry", Output: testWriter{t}})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.OnCycle(tel.ObserveRound)
	go func() { tel.Run(ctx); close(done) }()
	srv := status.New(a, status.Options{Telemetry: tel, Secrets: []string{statusToken}})
	base := serveStatus(t, ctx, srv, func() { cancel(); <-done })
	return &statusServer{base: base, tel: tel}
}

// serveStatus serves srv on a free loopback port until ctx ends and
// returns its base URL; stop, at cleanup, ends ctx and whatever else runs.
func serveStatus(t *testing.T, ctx context.Context, srv *status.Server, stop func()) string {
	t.Helper()
	bound := make(chan net.Addr, 1)
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(ctx, status.Listener{Address: "127.0.0.1:0"}, func(ad net.Addr) { bound <- ad })
	}()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("status API: %v", err)
		}
	})
	select {
	case ad := <-bound:
		return "http://" + ad.String()
	case err := <-served:
		t.Fatalf("status API: %v", err)
	}
	return ""
}

func (s *statusServer) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(s.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

func (s *statusServer) status(t *testing.T) wire.Status {
	t.Helper()
	code, body := s.get(t, "/v1/status")
	var st wire.Status
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("GET /v1/status: %d %v\n%s", code, err, body)
	}
	return st
}

func (s *statusServer) job(t *testing.T, id string) wire.JobDetail {
	t.Helper()
	code, body := s.get(t, "/v1/jobs/"+id)
	var d wire.JobDetail
	if err := json.Unmarshal([]byte(body), &d); code != 200 || err != nil {
		t.Fatalf("GET /v1/jobs/%s: %d %v\n%s", id, code, err, body)
	}
	return d
}

// metrics reads /metrics into series (name{labels sorted}) -> value.
func (s *statusServer) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	code, body := s.get(t, "/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// series names a series as the Prometheus text format prints it: labels
// sorted by name.
func series(name string, kv ...string) string {
	var ls []string
	for i := 0; i+1 < len(kv); i += 2 {
		ls = append(ls, fmt.Sprintf("%s=%q", kv[i], kv[i+1]))
	}
	sort.Strings(ls)
	return name + "{" + strings.Join(ls, ",") + "}"
}

// expect checks series against wanted values, returning the first miss.
func expect(m map[string]float64, want map[string]float64) error {
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		got, ok := m[k]
		if !ok {
			return fmt.Errorf("%s not served", k)
		}
		if got != want[k] {
			return fmt.Errorf("%s = %v, want %v", k, got, want[k])
		}
	}
	return nil
}

// TestStatusMetricsOnALiveCluster: on the four-node cluster with two
// jobs of people holding GPUs, /metrics serves what the cluster is: GPUs
// per type and rack (hadar's, others', idle), a job hadar holds (delay
// scheduling waits for its rack though eight V100s are free) apart from
// one without capacity (four K80s wanted, two free), decisions, admission
// waits and preemptions as the decision history records them, and Nomad's
// counters as the watcher counts them. /v1/status, /v1/jobs/<id> and
// `hadar status` say the same, and no response carries the Nomad token.
func TestStatusMetricsOnALiveCluster(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	c.plainGPUJob("busy", "v100-a", "Tesla V100-SXM2-16GB", 2)
	c.plainGPUJob("k80hold", "k80-a", "Tesla K80", 2)
	const policy = "gavel-maxmin"
	// An eight-worker gang can take over a minute to start on a loaded
	// two-core machine: a rollback is not what this test is about.
	a := c.startSidecar(config.Config{
		Scheduling: config.Scheduling{Policy: policy, Placement: "delay"},
		RunLimits:  config.RunLimits{GangTimeout: "4m"},
		Cluster:    config.Cluster{Nomad: &config.NomadConfig{Token: statusToken}},
	})
	s := c.startStatus(t, a, policy)
	p := func(name string, kv ...string) string {
		return series(name, append([]string{"policy", policy}, kv...)...)
	}

	p100 := `    "hadar.throughput" = "p100=20"` // wins over the template's
	c.submit(scJob{id: "p", steps: 100000, gated: true, extra: p100})
	c.waitFor("p runs on a P100", 90*time.Second, func() error {
		if n := c.running("p"); len(n) != 1 || n[groupname.Format("train", 0, 0)] != "mix-a" {
			return fmt.Errorf("running %v", n)
		}
		return nil
	})
	submitted := time.Now()
	// Delay scheduling holds tight for its rack for a time proportional to
	// its run time (938 s of its 1,250 here): long enough that the checks
	// below, however slow, end before it would accept the two racks, and
	// that it does not finish before they look at it running.
	c.submit(scJob{id: "tight", steps: 400000, workers: 8, gated: true, extra: `    "hadar.throughput" = "v100=320"` + "\n    \"hadar.sensitivity\" = \"4\""})
	c.submit(scJob{id: "k4", steps: 400, workers: 4, gated: true, extra: `    "hadar.throughput" = "k80=40"`})
	// Zero rounds counted so far is not a reading: wait for the metrics
	// to show the scene, and every figure at once.
	c.waitFor("the metrics show the cluster", 60*time.Second, func() error {
		return expect(s.metrics(t), map[string]float64{
			p("hadar_pending_jobs", "status", "held"):                          1,
			p("hadar_pending_jobs", "status", "no_capacity"):                   1,
			p("hadar_jobs", "state", "running"):                                1,
			p("hadar_jobs", "state", "waiting"):                                2,
			p("hadar_gpus_total", "gpu_type", "v100", "rack", "r1"):            8,
			p("hadar_gpus_unmanaged", "gpu_type", "v100", "rack", "r1"):        2,
			p("hadar_gpus_idle", "gpu_type", "v100", "rack", "r1"):             6,
			p("hadar_gpus_idle", "gpu_type", "v100", "rack", "r2"):             2,
			p("hadar_gpus_allocated", "gpu_type", "p100", "rack", "r2"):        1,
			p("hadar_gpus_idle", "gpu_type", "p100", "rack", "r2"):             1,
			p("hadar_gpus_unmanaged", "gpu_type", "k80", "rack", "r2"):         2,
			p("hadar_gpus_idle", "gpu_type", "k80", "rack", "r2"):              2,
			p("hadar_decisions_total", "action", "start", "result", "applied"): 1,
			p("hadar_admission_wait_time_seconds_count", "gpu_type", "p100"):   1,
			p("hadar_nomad_writes_total", "kind", "start"):                     1,
			p("hadar_leader"):                                   1,
			p("hadar_fork_copies"):                              0,
			p("hadar_refused_jobs"):                             0,
			p("hadar_preemptions_total", "reason", "preempted"): 0,
		})
	})
	// The sidecar admitted tight by now (it counts it held): its wait
	// began between its submission and this moment, however slowly a
	// loaded machine let the sidecar see it.
	seen := time.Now()
	m := s.metrics(t)
	if ts := m[p("hadar_last_plan_timestamp_seconds")]; time.Since(time.Unix(int64(ts), 0)) > 30*time.Second {
		t.Errorf("last plan at %v: more than 30 s ago", time.Unix(int64(ts), 0))
	}
	if m[p("hadar_rounds_total")] < 1 {
		t.Errorf("rounds_total %v", m[p("hadar_rounds_total")])
	}
	if n := m[p("hadar_round_duration_seconds_count", "kind", "round")] + m[p("hadar_round_duration_seconds_count", "kind", "fill")]; n < 1 {
		t.Errorf("round_duration_seconds_count %v: the agent's cycles are not observed", n)
	}
	for src, want := range map[string]uint64{"watch": a.WatchStats().APIErrors, "progress": a.WatchStats().ProgressErrors} {
		// Counters only grow: what the watcher counted before the read.
		if got := m[p("hadar_nomad_api_errors_total", "source", src)]; got > float64(want) {
			t.Errorf("api errors %s: %v served, the watcher counts %d", src, got, want)
		}
	}

	// The same in /v1/status and /v1/jobs, and in `hadar status`.
	st := s.status(t)
	var q []string
	for _, e := range st.Queue {
		q = append(q, fmt.Sprintf("%d:%s:%s", e.Position, e.ID, e.Waits))
	}
	if got := strings.Join(q, " "); got != "1:default/tight:held 2:default/k4:no_capacity" {
		t.Errorf("queue %q", got)
	}
	if len(st.Running) != 1 || st.Running[0].ID != "default/p" || st.Running[0].Units[0].Slots[0].Type != "p100" {
		t.Errorf("running %+v", st.Running)
	}
	tight := s.job(t, "default/tight")
	t.Logf("tight waits: %s", tight.Why)
	if tight.State != "waiting" || tight.Waits != "held" || tight.QueuePosition != 1 || tight.QueueLength != 2 || !strings.Contains(tight.Why, "delay scheduling") {
		t.Errorf("/v1/jobs/default/tight: %+v", tight)
	}
	bin := harness.GoBinary(t, "./cmd/hadar", "hadar")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"status", "-addr", strings.TrimPrefix(s.base, "http://")}, []string{"policy gavel-maxmin", "default/tight", "held by hadar", "default/k4", "no capacity", "mix-a", "default/busy x2 (not hadar's)", "QUEUE (2)", "RUNNING (1)"}},
		{[]string{"status", "-addr", s.base, "tight"}, []string{"job default/tight: waiting", "#1 of 2 in the queue, held by hadar", "delay scheduling"}},
		{[]string{"status", "-addr", s.base, "default/p"}, []string{"job default/p: running", "runs on 1xp100@", "PLACEMENTS", "start"}},
	} {
		out, err := exec.Command(bin, c.args...).CombinedOutput()
		if err != nil {
			t.Fatalf("hadar %v: %v\n%s", c.args, err, out)
		}
		for _, w := range c.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("hadar %v does not say %q:\n%s", strings.Join(c.args, " "), w, out)
			}
		}
	}
	out, err := exec.Command(bin, "status", "-json", "-addr", s.base).Output()
	var js wire.Status
	if err != nil || json.Unmarshal(out, &js) != nil || len(js.Queue) != 2 {
		t.Errorf("hadar status -json: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "status", "-addr", s.base, "nosuchjob").CombinedOutput(); err == nil || !strings.Contains(string(out), `no managed job "nosuchjob"`) {
		t.Errorf("hadar status nosuchjob: %v\n%s", err, out)
	}

	// The person's job leaves r1: the held job starts there, and its wait
	// is recorded.
	released := time.Now()
	if _, _, err := c.api.Jobs().Deregister("busy", true, nil); err != nil {
		t.Fatal(err)
	}
	// Within the gang timeout and a round or two beyond it: a start slower
	// than the timeout is rolled back and written again, counted below.
	c.waitFor("tight runs", 5*time.Minute, func() error {
		if n := len(c.running("tight")); n != 8 {
			return fmt.Errorf("%d of 8 workers running", n)
		}
		return nil
	})
	runs := time.Now()
	// A start rolled back all the same (slower than even that timeout)
	// is one more start and one more admission wait: count them in.
	rollbacks := s.metrics(t)[p("hadar_nomad_writes_total", "kind", "rollback")]
	c.waitFor("the metrics show tight's start", 30*time.Second, func() error {
		return expect(s.metrics(t), map[string]float64{
			p("hadar_pending_jobs", "status", "held"):                          0,
			p("hadar_pending_jobs", "status", "no_capacity"):                   1,
			p("hadar_gpus_allocated", "gpu_type", "v100", "rack", "r1"):        8,
			p("hadar_gpus_unmanaged", "gpu_type", "v100", "rack", "r1"):        0,
			p("hadar_decisions_total", "action", "start", "result", "applied"): 2 + rollbacks,
			p("hadar_admission_wait_time_seconds_count", "gpu_type", "v100"):   1 + rollbacks,
		})
	})
	m = s.metrics(t)
	// It waited from its admission (after its submission, before the
	// metrics counted it held) until its start (after busy left, before
	// its workers ran); a second either way for the clocks' rounding.
	waited := m[p("hadar_admission_wait_time_seconds_sum", "gpu_type", "v100")]
	if least, most := released.Sub(seen).Seconds()-1, runs.Sub(submitted).Seconds()+1; rollbacks == 0 && (waited < least || waited > most) {
		t.Errorf("tight waited %.1f s by the metrics; want %.1f to %.1f s", waited, least, most)
	}
	tight = s.job(t, "tight")
	// A start Nomad's plan refused is written again a round later: each
	// placement before the last is such a refusal, none applied. Nomad
	// publishes a write's events before it commits the write to its state
	// (nomad/state/state_changes.go, txn.Commit), so on a loaded machine
	// the sidecar can plan on the purge's event while the plan it asks
	// for still sees busy's two GPUs (CI of stop 44).
	n := len(tight.Placements)
	if tight.State != "running" || n == 0 || tight.ETA == nil {
		t.Errorf("/v1/jobs/tight after its start: %+v", tight)
	} else {
		for _, pl := range tight.Placements[:n-1] {
			if pl.Action != "start" || !strings.HasPrefix(pl.Result, "not applied") {
				t.Errorf("/v1/jobs/tight: placement before its start %+v: want only refused starts", pl)
			}
		}
		if last := tight.Placements[n-1]; last.Action != "start" || last.Result != "" || last.Units[0].Slots[0].Rack != "r1" {
			t.Errorf("/v1/jobs/tight: last placement %+v: want its start on r1", last)
		}
	}

	// Three P100-only jobs for two P100s: max-min fairness time-slices
	// them, stopping one each round; the preemption counters follow the
	// decision history exactly.
	for _, id := range []string{"p2", "p3"} {
		c.submit(scJob{id: id, steps: 100000, gated: true, extra: p100})
	}
	c.waitFor("a P100 job is preempted", 2*time.Minute, func() error {
		if m := s.metrics(t); m[p("hadar_preemptions_total", "reason", "preempted")] < 1 {
			return fmt.Errorf("preemptions %v", m[p("hadar_preemptions_total", "reason", "preempted")])
		}
		return nil
	})
	c.waitFor("the counters match the decision history", 30*time.Second, func() error {
		time.Sleep(time.Second) // a sample after the history was read
		count := map[wire.Action]float64{}
		for _, ev := range a.History() {
			if ev.Result == "" {
				count[ev.Action]++
			}
		}
		// The history is read after the metrics: it may hold one more.
		m := s.metrics(t)
		want := map[string]float64{
			p("hadar_decisions_total", "action", "start", "result", "applied"): count[wire.ActionStart],
			p("hadar_decisions_total", "action", "stop", "result", "applied"):  count[wire.ActionStop],
			p("hadar_preemptions_total", "reason", "preempted"):                count[wire.ActionStop],
			p("hadar_evictions_total", "reason", "preempted"):                  count[wire.ActionStop],
			p("hadar_preemptions_total", "reason", "migrated"):                 count[wire.ActionMove],
		}
		return expect(m, want)
	})

	// No response carries the token.
	for _, path := range []string{"/", "/ui/app.js", "/ui/style.css", "/v1/status", "/v1/plan", "/v1/jobs", "/v1/jobs/default/tight", "/v1/decisions", "/v1/health", "/metrics"} {
		code, body := s.get(t, path)
		if code != 200 {
			t.Errorf("GET %s: %d", path, code)
		}
		if strings.Contains(body, statusToken) {
			t.Errorf("GET %s carries the Nomad token", path)
		}
	}
}

// browser starts Debian's headless Chromium, with a user data directory of
// its own; the test ends it and everything it started, and removes the
// directory. It skips the test when no Chromium is installed.
func browser(t *testing.T) context.Context {
	t.Helper()
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("no chromium binary installed: the status page test needs a real browser (Debian: apt-get install -y chromium; `make chromium` does it)")
	}
	// One directory holds all the browser writes: its profile, and its
	// temporary files (the singleton socket it leaves in TMPDIR when it is
	// killed rather than closed).
	root, err := os.MkdirTemp("", "hadar-e2e-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	dir, tmp := filepath.Join(root, "profile"), filepath.Join(root, "tmp")
	for _, d := range []string{dir, tmp} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(dir), chromedp.Env("TMPDIR="+tmp), chromedp.WindowSize(1500, 1300))
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // kills the browser and waits for it
		// Its helpers (zygote, renderers, network service) can outlive
		// it: every process started with this user data directory ends.
		want := "--user-data-dir=" + dir
		for range 50 {
			left := 0
			entries, _ := os.ReadDir("/proc")
			for _, e := range entries {
				pid, err := strconv.Atoi(e.Name())
				if err != nil {
					continue
				}
				cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				for _, arg := range strings.Split(string(cmdline), "\x00") {
					if arg == want {
						syscall.Kill(pid, syscall.SIGKILL)
						left++
						break
					}
				}
			}
			if left == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("removing chromium's directory: %v", err)
		}
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	return ctx
}

// pageJobs reads, from the page, the jobs on each node's GPU squares, the
// running jobs and the queue.
type pageView struct {
	Updates int               `json:"updates"`
	GPUs    map[string]string `json:"gpus"` // job -> node/type of its GPUs, sorted, joined
	Running []string          `json:"running"`
	Queue   []string          `json:"queue"`
	Waits   []string          `json:"waits"`
	Bars    []string          `json:"bars"`
	Lines   int               `json:"lines"`
	Actions []string          `json:"actions"`
	Types   map[string]string `json:"types"` // GPU type -> its summary card's text
	Text    string            `json:"text"`  // the whole page's text
}

const readPage = `(() => {
  const v = {updates: +(document.body.dataset.updates || 0), gpus: {}, running: [], queue: [], waits: [], bars: [], actions: []};
  for (const sq of document.querySelectorAll('#racks .sq[data-job]')) {
    const j = sq.dataset.job;
    const nodes = new Set((v.gpus[j] || '').split(',').filter(x => x));
    nodes.add(sq.dataset.node + '/' + sq.dataset.type);
    v.gpus[j] = [...nodes].sort().join(',');
  }
  for (const tr of document.querySelectorAll('#running tbody tr[data-job]')) {
    v.running.push(tr.dataset.job);
    v.bars.push(tr.querySelector('.bar > div').style.width);
  }
  for (const tr of document.querySelectorAll('#queue tbody tr[data-job]')) { v.queue.push(tr.dataset.job); v.waits.push(tr.dataset.waits); }
  for (const tr of document.querySelectorAll('#decisions tbody tr[data-job]')) v.actions.push(tr.dataset.job + ':' + tr.dataset.action);
  v.lines = document.querySelectorAll('#plot polyline').length;
  v.types = {};
  for (const card of document.querySelectorAll('#gpus .gpu-type')) v.types[card.dataset.type] = card.textContent;
  v.text = document.body.innerText;
  return v;
})()`

func readView(t *testing.T, ctx context.Context) pageView {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(cctx, chromedp.Evaluate[pageView](readPage))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	return v
}

// TestStatusPageInChromium: the page the sidecar serves at / loads in a
// real headless Chromium with nothing but its own files, shows the jobs
// of a live cluster (on the GPU squares of the nodes they run on, with a
// progress bar, and in the queue with why they wait), and redraws by
// itself as jobs start and move: three jobs for two P100s under max-min
// fairness are time-sliced, so the P100s change hands every few rounds,
// and a fourth job that arrives later shows up. The test writes a
// screenshot (and copies it to out/status-page.png).
func TestStatusPageInChromium(t *testing.T) {
	skipShort(t)
	ctx := browser(t)
	c := startSidecarCluster(t)
	c.plainGPUJob("someone", "k80-a", "Tesla K80", 2)
	const policy = "gavel-maxmin"
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: policy, Placement: "pack", Round: "6s"}})
	s := c.startStatus(t, a, policy)
	c.submit(scJob{id: "wide", steps: 16000, workers: 4, gated: true, extra: `    "hadar.throughput" = "v100=160"`})
	for _, id := range []string{"slice-1", "slice-2", "slice-3"} {
		c.submit(scJob{id: id, steps: 100000, gated: true, extra: `    "hadar.throughput" = "p100=20"`})
	}
	c.submit(scJob{id: "k80s", steps: 400, workers: 4, gated: true, extra: `    "hadar.throughput" = "k80=40"`})

	// What the browser complains of: script errors, and anything the
	// page's Content-Security-Policy blocked (a file from elsewhere).
	var mu sync.Mutex
	var complaints []string
	cctx, stopConsole := context.WithCancel(ctx)
	messages := chromedp.Console(cctx)
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleException || m.Type == chromedp.ConsoleError {
				mu.Lock()
				complaints = append(complaints, fmt.Sprintf("%s %s (%s:%d)", m.Type, m.Text, m.URL, m.Line+1))
				mu.Unlock()
			}
		}
	}()
	nctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(nctx, chromedp.Navigate(s.base+"/?refresh=0.5"), chromedp.WaitVisible(chromedp.CSS("#racks .rack"))); err != nil {
		t.Fatalf("loading the page: %v", err)
	}

	// The jobs of the cluster, where they run.
	var v pageView
	c.waitFor("the page shows the running jobs", 2*time.Minute, func() error {
		v = readView(t, ctx)
		if v.GPUs["default/wide"] == "" || len(v.Running) < 3 || len(v.Queue) < 2 {
			return fmt.Errorf("page %+v", v)
		}
		return nil
	})
	// wide does not move: the page puts it where the API says it runs.
	for _, r := range s.status(t).Running {
		if r.ID != "default/wide" {
			continue
		}
		var nodes []string
		for _, u := range r.Units {
			for _, sl := range u.Slots {
				nodes = append(nodes, c.nodes[sl.Node]+"/"+string(sl.Type))
			}
		}
		sort.Strings(nodes)
		if got := v.GPUs[r.ID]; got != strings.Join(nodes, ",") {
			t.Errorf("the page shows wide on %q, the API on %v", got, nodes)
		}
	}
	if v.GPUs["default/someone"] != "k80-a/k80" {
		t.Errorf("the person's job is not shown on k80-a: %v", v.GPUs)
	}
	waits := map[string]string{}
	for i, q := range v.Queue {
		waits[q] = v.Waits[i]
	}
	if waits["default/k80s"] != "no_capacity" {
		t.Errorf("the page's queue %v: k80s (4 K80s wanted, 2 free) should wait for capacity", waits)
	}
	if len(v.Bars) == 0 || !strings.HasSuffix(v.Bars[0], "%") {
		t.Errorf("progress bars %v", v.Bars)
	}
	// The GPU summary says what the API says, and nothing on the page is
	// a JavaScript value printed by mistake.
	// (Totals only: who holds what may change between the two reads.)
	for _, g := range s.status(t).GPUs {
		if got, want := v.Types[g.Type], fmt.Sprintf("%s %d GPUs", g.Type, g.Total); !strings.HasPrefix(got, want) {
			t.Errorf("the page's %s summary %q, the API's %q", g.Type, got, want)
		}
	}
	for _, bad := range []string{"undefined", "NaN", "null", "[object"} {
		if strings.Contains(v.Text, bad) {
			t.Errorf("the page shows %q:\n%s", bad, v.Text)
		}
	}

	// It redraws by itself: the P100s change hands under time slicing,
	// and a new job appears. Nothing reloads the page.
	first := v.GPUs
	var before []string
	for _, id := range []string{"default/slice-1", "default/slice-2", "default/slice-3"} {
		before = append(before, id+"@"+first[id])
	}
	c.waitFor("the page shows the P100s change hands", 3*time.Minute, func() error {
		v = readView(t, ctx)
		var now []string
		for _, id := range []string{"default/slice-1", "default/slice-2", "default/slice-3"} {
			now = append(now, id+"@"+v.GPUs[id])
		}
		if strings.Join(now, " ") == strings.Join(before, " ") {
			return fmt.Errorf("slices still %v", now)
		}
		return nil
	})
	c.submit(scJob{id: "late", steps: 4000, gated: true, extra: `    "hadar.throughput" = "v100=40"`})
	c.waitFor("the page shows the late job start", 90*time.Second, func() error {
		v = readView(t, ctx)
		if !strings.HasSuffix(v.GPUs["default/late"], "/v100") {
			return fmt.Errorf("late on %q", v.GPUs["default/late"])
		}
		found := false
		for _, act := range v.Actions {
			found = found || act == "default/late:start"
		}
		if !found {
			return fmt.Errorf("no start of late among the decisions %v", v.Actions)
		}
		return nil
	})
	c.waitFor("a progress bar moves", time.Minute, func() error {
		v = readView(t, ctx)
		for _, w := range v.Bars {
			if w != "0%" {
				return nil
			}
		}
		return fmt.Errorf("progress bars %v", v.Bars)
	})
	c.waitFor("the utilisation plot has a line per GPU type", 30*time.Second, func() error {
		if v = readView(t, ctx); v.Lines < 3 {
			return fmt.Errorf("%d lines", v.Lines)
		}
		return nil
	})

	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	shot, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(t.TempDir(), "status-page.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	if root, err := hostpath.RepoRoot(); err == nil {
		if err := os.MkdirAll(filepath.Join(root, "out"), 0o755); err == nil {
			os.WriteFile(filepath.Join(root, "out", "status-page.png"), shot, 0o644)
		}
	}
	t.Logf("screenshot: %s (%d bytes), copied to out/status-page.png", path, len(shot))
	stopConsole()
	<-consoleDone
	mu.Lock()
	defer mu.Unlock()
	for _, m := range complaints {
		t.Errorf("the browser reports %s", m)
	}
}
