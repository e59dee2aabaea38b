package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/internal/observability"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// prometheusServer is Debian's Prometheus on a loopback port, its data in
// a temporary directory.
type prometheusServer struct {
	base string
}

// startPrometheus runs Prometheus scraping target (host:port) every
// second with the rule files given; it is stopped, and its directory
// removed, when the test ends.
func startPrometheus(t *testing.T, bin, target string, rules ...string) *prometheusServer {
	t.Helper()
	ports, err := harness.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var rf strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&rf, "  - %q\n", r)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
%sscrape_configs:
  - job_name: hadar
    static_configs:
      - targets: [%q]
`, rf.String(), target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Stopped before t.TempDir's removal (cleanups run last in, first
	// out), so that nothing writes into the directory as it goes.
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		log.Close()
		if t.Failed() {
			if b, err := os.ReadFile(log.Name()); err == nil {
				harness.KeepLog(t, "prometheus.log", b)
			}
		}
	})
	p := &prometheusServer{base: "http://" + addr}
	if err := harness.Eventually(context.Background(), time.Minute, 250*time.Millisecond, func() error {
		select {
		case err := <-done:
			b, _ := os.ReadFile(log.Name())
			return fmt.Errorf("prometheus exited: %v\n%s", err, b)
		default:
		}
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/-/ready: %s", resp.Status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// promResult is one series of an instant query's answer.
type promResult struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (r promResult) float() float64 {
	s, _ := r.Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// query runs an instant query through the HTTP API (/api/v1/query): the
// series of a vector, or the one value of a scalar.
func (p *prometheusServer) query(expr string) ([]promResult, error) {
	resp, err := http.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, fmt.Errorf("querying prometheus: %w", err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("decoding prometheus' answer: %w", err)
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s: %s", resp.Status, out.Error)
	}
	switch out.Data.ResultType {
	case "vector":
		var rs []promResult
		err := json.Unmarshal(out.Data.Result, &rs)
		return rs, err
	case "scalar":
		var v [2]any
		err := json.Unmarshal(out.Data.Result, &v)
		return []promResult{{Value: v}}, err
	}
	return nil, fmt.Errorf("result type %s", out.Data.ResultType)
}

// queueJob submits a one-GPU managed job of a model no profile names into
// a team queue; its true speed is only in the task's emulate block.
func (c *sidecarCluster) queueJob(id, team, model string, pace float64) {
	c.t.Helper()
	hcl := fmt.Sprintf(`job %q {
  type = "batch"
  meta = {
    "hadar.model" = %q
    "hadar.steps" = "1000000"
    "hadar.queue" = %q
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
        total_steps = 1000000
        emulate {
          steps_per_sec = {
            %q = %g
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
`, id, model, team, jobspec.GateHCL, c.trainer, h100Model, pace)
	job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: hcl, Canonicalize: true})
	if err != nil {
		c.t.Fatalf("parse job %s: %v\n%s", id, err, hcl)
	}
	if _, _, err := c.api.Jobs().Register(job, nil); err != nil {
		c.t.Fatalf("register job %s: %v", id, err)
	}
}

// Issue 33, item 5: Debian's Prometheus scrapes a live sidecar (team
// queues, learning on) on a real Nomad cluster; promtool accepts the
// alert rules, Prometheus loads and evaluates them without error, and
// every query of the Grafana dashboard, through Prometheus' HTTP API,
// returns data, with the figures the cluster has.
func TestDashboardOnPrometheus(t *testing.T) {
	skipShort(t)
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus binary installed: the dashboard test needs a real Prometheus (Debian: apt-get install -y prometheus; `make prometheus` does it)")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool installed (Debian's prometheus package ships it; `make prometheus`)")
	}
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(root, observability.RulesFile)
	if out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", rules, err, out)
	} else {
		t.Logf("promtool check rules: %s", strings.TrimSpace(string(out)))
	}
	dash, err := observability.LoadDashboard(filepath.Join(root, observability.DashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	queries, err := dash.Queries()
	if err != nil {
		t.Fatal(err)
	}

	// One client of four H100s, a type and a model no profile names: the
	// sidecar learns the jobs' speed there within seconds (short warm-up
	// and evidence). Team A, guaranteed one H100 and limited to two, runs
	// two jobs (one H100 borrowed) and waits at its limit with a third;
	// team B, guaranteed one, runs nothing: every queue panel has data.
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: "obs-srv", Mode: harness.ModeServer})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	node := harness.StartAgent(t, harness.Options{Name: "h100-a", Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr},
		Meta: map[string]string{"rack": "r1"}, Plugins: map[string]string{"hadar-gpu": declare("ha", h100Model, "80GiB", 4), "hadar-train": train}})
	c.nodes[node.NodeID], c.ids["h100-a"] = "h100-a", node.NodeID
	t.Cleanup(c.stopSidecar)
	const policy = "gavel-maxmin"
	a := c.startSidecar(config.Config{
		Scheduling: config.Scheduling{Policy: policy, Placement: "pack"},
		Learning:   config.Learning{LearnWarmup: "1s", LearnEvidence: "5s"},
		TeamQueues: config.TeamQueues{Queues: []queue.Block{
			{Name: "team-a", MetaNamespaces: []string{"*"}, Guarantee: map[string]int{"h100": 1}, Limit: map[string]int{"h100": 2}},
			{Name: "team-b", MetaNamespaces: []string{"*"}, Guarantee: map[string]int{"h100": 1}},
		}},
	})
	s := c.startStatus(t, a, policy)
	// Scraping starts before the job does, so that rates over the
	// admission and the decisions see them happen.
	p := startPrometheus(t, prom, strings.TrimPrefix(s.base, "http://"), rules)

	const pace = 40.0
	for _, id := range []string{"obs-1", "obs-2"} {
		c.queueJob(id, "team-a", "obs-llm", pace)
	}
	for _, id := range []string{"obs-1", "obs-2"} {
		c.waitFor(id+" runs on an H100", 3*time.Minute, func() error {
			if len(c.running(id)) == 0 {
				return errNotYet
			}
			return nil
		})
	}
	c.queueJob("obs-3", "team-a", "obs-llm", pace)

	// Every panel's query returns data once the learned rate is in.
	empty := func() []string {
		var out []string
		for _, q := range queries {
			rs, err := p.query(observability.Instantiate(q.Expr, "30s"))
			switch {
			case err != nil:
				out = append(out, fmt.Sprintf("%s: %v", q.Where, err))
			case len(rs) == 0:
				out = append(out, fmt.Sprintf("%s: no data: %s", q.Where, q.Expr))
			}
		}
		return out
	}
	var left []string
	if err := harness.Eventually(context.Background(), 4*time.Minute, 2*time.Second, func() error {
		if left = empty(); len(left) > 0 {
			return fmt.Errorf("%d of %d queries without data", len(left), len(queries))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v:\n%s", err, strings.Join(left, "\n"))
	}
	t.Logf("all %d queries of %s return data", len(queries), observability.DashboardFile)

	// The figures are the cluster's.
	want := func(expr string, check func(float64) bool, what string) {
		t.Helper()
		rs, err := p.query(observability.Instantiate(expr, "30s"))
		if err != nil || len(rs) != 1 || !check(rs[0].float()) {
			t.Errorf("%s = %+v (%v): want %s", expr, rs, err, what)
		}
	}
	want(`sum(hadar_leader{policy=~"$policy"})`, func(v float64) bool { return v == 1 }, "1 leader")
	want(`sum by (gpu_type) (max by (gpu_type, rack) (hadar_gpus_allocated{policy=~"$policy"}) + max by (gpu_type, rack) (hadar_gpus_unmanaged{policy=~"$policy"})) / sum by (gpu_type) (max by (gpu_type, rack) (hadar_gpus_total{policy=~"$policy"}))`,
		func(v float64) bool { return v == 0.5 }, "two H100s of four in use")
	want(`max by (model, workers, gpu_type) (hadar_learned_rate_steps_per_second{model="obs-llm", gpu_type="h100"})`,
		func(v float64) bool { return v > 0.8*pace && v < 1.2*pace }, fmt.Sprintf("about %g steps/s", pace))
	want(`max by (queue, gpu_type) (hadar_queue_used_gpus{queue="team-a"})`, func(v float64) bool { return v == 2 }, "team-a uses 2 H100s")
	want(`max by (queue, gpu_type) (hadar_queue_borrowed_gpus{queue="team-a"})`, func(v float64) bool { return v == 1 }, "team-a borrows 1 H100")
	want(`max by (queue, reason) (hadar_queue_pending_jobs{queue="team-a", reason="at_limit"})`, func(v float64) bool { return v == 1 }, "one job of team-a at its limit")
	want(`max by (queue, gpu_type) (hadar_queue_guaranteed_gpus{queue="team-a"})`, func(v float64) bool { return v == 1 }, "team-a is guaranteed 1 H100")

	// Prometheus loaded every rule and evaluated each without error.
	var ruleNames []string
	if err := harness.Eventually(context.Background(), time.Minute, time.Second, func() error {
		resp, err := http.Get(p.base + "/api/v1/rules")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name           string `json:"name"`
						Health         string `json:"health"`
						LastError      string `json:"lastError"`
						LastEvaluation string `json:"lastEvaluation"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return err
		}
		ruleNames = ruleNames[:0]
		for _, g := range out.Data.Groups {
			for _, r := range g.Rules {
				if r.Health != "ok" {
					return fmt.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
				}
				ruleNames = append(ruleNames, r.Name)
			}
		}
		loaded, err := observability.LoadRules(rules)
		if err != nil {
			return err
		}
		if len(ruleNames) != len(loaded) {
			return fmt.Errorf("%d rules evaluated, the file has %d", len(ruleNames), len(loaded))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(ruleNames)
	t.Logf("prometheus evaluates %d rules: %s", len(ruleNames), strings.Join(ruleNames, ", "))
}
