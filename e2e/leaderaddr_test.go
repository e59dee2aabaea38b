package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// leaderByService finds the leader's status API as docs/deploy.md tells
// people to, through Nomad alone: the registrations of the hadar-leader
// service, and among them the one whose allocation's "hadar leader" check
// passes. Nomad's service API lists every replica whatever its checks;
// registered counts them.
func (d *deployed) leaderByService() (reg *api.ServiceRegistration, registered int, err error) {
	regs, _, err := d.mgmt.Services().Get("hadar-leader", nil)
	if err != nil {
		return nil, 0, err
	}
	var passing []*api.ServiceRegistration
	for _, r := range regs {
		checks, err := d.mgmt.Allocations().Checks(r.AllocID, nil)
		if err != nil {
			return nil, len(regs), err
		}
		for _, ch := range checks {
			if ch.Check == "hadar leader" && ch.Status == "success" {
				passing = append(passing, r)
			}
		}
	}
	if len(passing) != 1 {
		return nil, len(regs), fmt.Errorf("%d hadar-leader registrations, %d passing the leader check", len(regs), len(passing))
	}
	return passing[0], len(regs), nil
}

// statusOK asks the status API at addr for /v1/status with token: 200, and
// the replica says it leads.
func statusOK(addr, token string) (replica string, err error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var st wire.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK || !st.Sidecar.Leader {
		return "", fmt.Errorf("GET %s/v1/status: %d, leader %v (%v)", addr, resp.StatusCode, st.Sidecar.Leader, err)
	}
	return st.Sidecar.Replica, nil
}

// TestLeaderServiceAddress: the deployed sidecar's leader is found through
// Nomad's service API and check results alone (the hadar-leader service,
// whose /v1/leader check only the leader passes), its status API answers;
// Nomad lists both replicas under the name, which is why the check decides.
// Stopping the leader's allocation, then killing the next leader's process,
// the address moves to the new leader within a bound each time. Then
// Prometheus, run by deploy/prometheus/prometheus.nomad.hcl, finds the
// replicas through Nomad's service registrations (a template Nomad renders
// again as they move) and scrapes them with a token it reads from the
// job's Nomad Variable: the token is nowhere in the
// jobspec, the job Nomad stores or the rendered prometheus.yml. On the
// older of the two Nomad lines hadar is tested on (1.10; TestDeployedSidecar
// checks the same checks on 1.11).
func TestLeaderServiceAddress(t *testing.T) {
	skipShort(t)
	const ttl = 10 * time.Second
	d := deploySidecar(t, "ldr", harness.NomadLTSVersion, ttl)
	c := d.c
	token := c.server.Token

	var lead *api.ServiceRegistration
	var replica string // the leading process (host-pid): a restart in place is another
	c.waitFor("one hadar-leader registration passing its check, of two", 3*time.Minute, func() error {
		r, n, err := d.leaderByService()
		if err != nil {
			return err
		}
		if n != 2 {
			return fmt.Errorf("%d registrations", n)
		}
		lead = r
		replica, err = statusOK(fmt.Sprintf("%s:%d", r.Address, r.Port), token)
		return err
	})
	t.Logf("leader %s at %s:%d; Nomad's service API lists 2 hadar-leader registrations, 1 passes its check", lead.AllocID, lead.Address, lead.Port)

	// docs/deploy.md's one line finds the same address with the CLI.
	if got := docsLeaderLine(t, d); got != fmt.Sprintf("%s:%d", lead.Address, lead.Port) {
		t.Fatalf("docs/deploy.md's line for the leader's address prints %q", got)
	}

	// The address follows the leader: wait until the registration that
	// passes is another leading process's (another allocation's, or, after
	// a kill, the same allocation's task restarted by Nomad, which may win
	// the lapsed lock as well as the other replica), its status API saying
	// it leads; within bound.
	follow := func(how string, old string, bound time.Duration) *api.ServiceRegistration {
		t.Helper()
		start := time.Now()
		var next *api.ServiceRegistration
		c.waitFor("the hadar-leader address moves off "+old+" after "+how, 2*time.Minute, func() error {
			r, _, err := d.leaderByService()
			if err != nil {
				return err
			}
			rep, err := statusOK(fmt.Sprintf("%s:%d", r.Address, r.Port), token)
			if err != nil {
				return err
			}
			if rep == old {
				return fmt.Errorf("the leading process %s (allocation %s) still passes", old, r.AllocID)
			}
			next, replica = r, rep
			return nil
		})
		took := time.Since(start)
		t.Logf("after %s: leader %s at %s:%d, found through Nomad in %v (bound %v)", how, next.AllocID, next.Address, next.Port, took.Round(time.Millisecond), bound)
		if took > bound {
			t.Fatalf("the leader's address took %v to move after %s, over %v", took, how, bound)
		}
		return next
	}
	// A stopped leader releases the lock: the other replica (or the
	// replacement) takes it within the acquire retry (2 s) and a round
	// (4 s), Nomad's check sees it within its interval (5 s) and timeout
	// (3 s); 10 s for a replacement's start.
	if _, err := d.mgmt.Allocations().Stop(&api.Allocation{ID: lead.AllocID}, nil); err != nil {
		t.Fatal(err)
	}
	// slack: the machine runs other suites beside this one.
	const slack = 10 * time.Second
	lead = follow("stopping the leader's allocation", replica, 2*time.Second+4*time.Second+5*time.Second+3*time.Second+10*time.Second+slack)

	// A killed leader leaves its lock to lapse: 2 x TTL + the lock delay
	// (1 s), then the same as above.
	pid := taskPID(t, d, lead.AllocID)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lead = follow("SIGKILL of the leader's process", replica, 2*ttl+time.Second+2*time.Second+4*time.Second+5*time.Second+3*time.Second+slack)

	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus binary installed: the Prometheus job's part needs one (`make prometheus`)")
	}
	runPrometheusJob(t, d, promBin)
}

// docsLeaderLine runs the shell lines of docs/deploy.md ("The leader's
// address") that print the leader's address, with bin/nomad and jq.
func docsLeaderLine(t *testing.T, d *deployed) string {
	t.Helper()
	if _, err := exec.LookPath("jq"); err != nil {
		t.Log("no jq: docs/deploy.md's line for the leader's address is not run")
		return ""
	}
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	const from = "# print the leader's address\n"
	i := strings.Index(string(doc), from)
	j := strings.Index(string(doc[i+1:]), "\ndone\n")
	if i < 0 || j < 0 {
		t.Fatal("docs/deploy.md has no line for the leader's address")
	}
	script := string(doc[i+len(from) : i+1+j+len("\ndone")])
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), d.env...)
	cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(harness.NomadBinary(t))+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return strings.TrimSpace(string(out))
}

// taskPID is the pid of the hadar task of an allocation: the process whose
// command line names the allocation's directory.
func taskPID(t *testing.T, d *deployed, allocID string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) < 2 || args[1] != "sidecar" {
			continue
		}
		cwd, err := os.Readlink(filepath.Join(filepath.Dir(p), "cwd"))
		if err != nil || !strings.Contains(cwd, allocID) {
			continue
		}
		var pid int
		fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid)
		return pid
	}
	t.Fatalf("no sidecar process of allocation %s", allocID)
	return 0
}

// runPrometheusJob runs deploy/prometheus/prometheus.nomad.hcl as
// docs/observability.md says and waits until Prometheus scrapes both
// replicas with one leading; then looks for the token where it must not be.
func runPrometheusJob(t *testing.T, d *deployed, promBin string) {
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	d.nomadCLI("acl", "policy", "apply", "-description", "Prometheus: hadar's metrics", "prometheus", filepath.Join(root, "docs", "acl", "prometheus.nomad.hcl"))
	tok, _, err := d.mgmt.ACLTokens().Create(&api.ACLToken{Name: "prometheus", Type: "client", Policies: []string{"prometheus"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.nomadCLI("var", "put", "nomad/jobs/prometheus", "hadar_token="+tok.SecretID)
	jobFile := filepath.Join(root, "deploy", "prometheus", "prometheus.nomad.hcl")
	d.nomadCLI("job", "run", "-detach", "-var", "prometheus_binary="+promBin, "-var", "scrape_interval=2s", jobFile)
	t.Cleanup(func() {
		d.mgmt.Jobs().Deregister("prometheus", true, nil)
		harness.Eventually(t.Context(), time.Minute, 500*time.Millisecond, func() error {
			as, _, err := d.mgmt.Jobs().Allocations("prometheus", true, nil)
			if err != nil {
				return nil // purged
			}
			for _, a := range as {
				if a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending {
					return fmt.Errorf("allocation %s %s", a.ID, a.ClientStatus)
				}
			}
			return nil
		})
	})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, a := range d.clients {
			logs, _ := filepath.Glob(filepath.Join(a.Dir, "data", "alloc", "*", "alloc", "logs", "prometheus.std*"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", l, tail(b, 4000))
			}
		}
	})

	var promAddr, allocID string
	d.c.waitFor("Prometheus scrapes both replicas found through Nomad's service registrations, one leading", 3*time.Minute, func() error {
		regs, _, err := d.mgmt.Services().Get("prometheus", nil)
		if err != nil || len(regs) != 1 {
			return fmt.Errorf("prometheus registrations %d (%v)", len(regs), err)
		}
		promAddr, allocID = fmt.Sprintf("%s:%d", regs[0].Address, regs[0].Port), regs[0].AllocID
		var targets struct {
			Data struct {
				ActiveTargets []struct {
					ScrapePool string `json:"scrapePool"`
					Health     string `json:"health"`
					LastError  string `json:"lastError"`
					ScrapeURL  string `json:"scrapeUrl"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := fetchJSON("http://"+promAddr+"/api/v1/targets", &targets); err != nil {
			return err
		}
		up := 0
		var seen []string
		for _, tg := range targets.Data.ActiveTargets {
			seen = append(seen, tg.ScrapeURL+" "+tg.Health+" "+tg.LastError)
			if tg.ScrapePool == "hadar" && tg.Health == "up" {
				up++
			}
		}
		if up != 2 {
			return fmt.Errorf("%d hadar targets up: %v", up, seen)
		}
		var q struct {
			Data struct {
				Result []struct {
					Value []any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if err := fetchJSON("http://"+promAddr+"/api/v1/query?query=sum(hadar_leader)", &q); err != nil {
			return err
		}
		if len(q.Data.Result) != 1 || len(q.Data.Result[0].Value) != 2 || q.Data.Result[0].Value[1] != "1" {
			return fmt.Errorf("sum(hadar_leader): %+v", q.Data.Result)
		}
		return nil
	})
	t.Logf("Prometheus at %s scrapes 2 replicas found through Nomad, sum(hadar_leader) = 1", promAddr)

	// The token: in the task's secrets (the task's user alone may read
	// it), nowhere else.
	secret := tok.SecretID
	var rendered, tokenFile string
	for _, a := range d.clients {
		dir := filepath.Join(a.Dir, "data", "alloc", allocID, "prometheus")
		if _, err := os.Stat(dir); err == nil {
			rendered, tokenFile = filepath.Join(dir, "local", "prometheus.yml"), filepath.Join(dir, "secrets", "hadar-token")
		}
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil || strings.TrimSpace(string(b)) != secret {
		t.Fatalf("the token file %s: %q (%v)", tokenFile, b, err)
	}
	if fi, _ := os.Stat(tokenFile); fi.Mode().Perm() != 0o400 {
		t.Fatalf("the token file's mode %v", fi.Mode())
	}
	cfg, err := os.ReadFile(rendered)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := os.ReadFile(jobFile)
	stored := d.nomadCLI("job", "inspect", "prometheus")
	for what, text := range map[string]string{"the jobspec": string(spec), "the rendered prometheus.yml": string(cfg), "the job Nomad stores": stored} {
		if strings.Contains(text, secret) {
			t.Fatalf("the token is in %s", what)
		}
	}
	if !strings.Contains(string(cfg), "credentials_file: "+filepath.Dir(tokenFile)) {
		t.Fatalf("prometheus.yml does not read the token file:\n%s", cfg)
	}
}

func fetchJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
