package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/state"
)

// faultWatch polls Nomad while the sidecar is killed and restarted and
// records every breach of what must never happen.
type faultWatch struct {
	c        *sidecarCluster
	managed  []string
	mu       sync.Mutex
	breaches []string
	// stops counts, per job and generated group, its allocations stopped
	// by a write (desired stop): more than one is a double eviction.
	stops map[string]map[string]bool
	// failed are the failed allocations whose task logs were kept (in
	// out/e2e-logs at once: Nomad collects an allocation's directory
	// when it keeps more than gc_max_allocs).
	failed map[string]bool
}

// keepFailed keeps a failed allocation's task stdout and stderr, once.
func (w *faultWatch) keepFailed(a *api.AllocationListStub) {
	w.mu.Lock()
	seen := w.failed[a.ID]
	if w.failed == nil {
		w.failed = map[string]bool{}
	}
	w.failed[a.ID] = true
	w.mu.Unlock()
	if seen {
		return
	}
	for _, stream := range []string{"stderr", "stdout"} {
		harness.KeepLog(w.c.t, filepath.Join("failed-allocs", a.JobID+"-"+a.TaskGroup+"-"+a.ID[:8]+"."+stream), []byte(w.c.logOf(a.ID, stream)))
	}
}

func (w *faultWatch) breach(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	for _, b := range w.breaches {
		if b == msg {
			return
		}
	}
	w.breaches = append(w.breaches, msg)
}

func (w *faultWatch) poll() {
	for _, id := range w.managed {
		as, _, err := w.c.api.Jobs().Allocations(id, true, nil)
		if err != nil {
			continue
		}
		perGroup := map[string]int{}
		for _, a := range as {
			_, gen := groupname.Parse(a.TaskGroup)
			if !gen {
				// The template is gated: an allocation of it ran unplanned.
				w.breach("job %s: allocation %s of the template group %q (client status %s): it ran unplanned", id, a.ID[:8], a.TaskGroup, a.ClientStatus)
				continue
			}
			if a.ClientStatus == api.AllocClientStatusFailed {
				w.keepFailed(a)
			}
			if a.DesiredStatus == api.AllocDesiredStatusRun && (a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending) {
				perGroup[a.TaskGroup]++
			}
			if a.DesiredStatus == api.AllocDesiredStatusStop {
				g := id + "/" + a.TaskGroup
				w.mu.Lock()
				if w.stops[g] == nil {
					w.stops[g] = map[string]bool{}
				}
				w.stops[g][a.ID] = true
				w.mu.Unlock()
			}
		}
		for g, n := range perGroup {
			if n > 1 {
				w.breach("job %s: %d live allocations of worker group %s: placed twice", id, n, g)
			}
		}
	}
}

// TestSidecarSurvivesKill9: the sidecar is killed with SIGKILL at 20
// seeded random moments in the middle of rounds, and started again on its
// state file each time, while managed jobs run, are time-sliced (Gavel's
// max-min fairness on a short round moves and stops them), and complete
// beside a human job. No job is lost, none runs unplanned, no worker is
// evicted twice, the human job is never touched, and the cluster
// converges to the plan.
func TestSidecarSurvivesKill9(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	c.plainGPUJob("human", "k80-a", "Tesla K80", 2)
	human := c.job("human")
	humanAllocs := c.allocs("human")

	rng := rand.New(rand.NewPCG(20261123, 9))
	stateFile := filepath.Join(t.TempDir(), "sidecar.db")
	body := fmt.Sprintf(`policy = "gavel-maxmin"
placement = "pack"
round = "3s"
min_run_time = "1s"
gang_timeout = "30s"
stop_timeout = "20s"
state {
  path = %q
}`, stateFile)
	var jobs []string
	for i := range 8 {
		m := scJob{id: fmt.Sprintf("k%d", i), steps: 1200 + 400*(i%3), workers: 1 + i%2, gated: true}
		c.submit(m)
		jobs = append(jobs, m.id)
	}
	w := &faultWatch{c: c, managed: jobs, stops: map[string]map[string]bool{}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for ctx.Err() == nil {
			w.poll()
			time.Sleep(300 * time.Millisecond)
		}
	}()

	r := c.startReplica(t, "s0", body)
	const kills = 20
	for k := range kills {
		// A random moment: a few round lengths in, not on a boundary.
		time.Sleep(time.Duration(800+rng.IntN(3200)) * time.Millisecond)
		r.kill(syscall.SIGKILL)
		<-r.done
		r = c.startReplica(t, fmt.Sprintf("s%d", k+1), body)
	}
	t.Logf("killed the sidecar %d times", kills)
	for _, id := range jobs {
		c.waitFor("job "+id+" completes", 5*time.Minute, func() error {
			if st := c.jobStatus(id); st != "dead" {
				return fmt.Errorf("status %s", st)
			}
			return nil
		})
	}
	stop()
	w.poll()

	// No job lost: every one finished its steps (its last worker exited 0).
	for _, id := range jobs {
		done := false
		for _, a := range c.allocs(id) {
			if _, gen := groupname.Parse(a.TaskGroup); gen && a.ClientStatus == api.AllocClientStatusComplete && a.DesiredStatus == api.AllocDesiredStatusRun {
				done = true
			}
			if a.ClientStatus == api.AllocClientStatusFailed {
				w.breach("job %s: allocation %s failed: %s", id, a.ID[:8], a.ClientDescription)
			}
		}
		if !done {
			w.breach("job %s: no worker completed its steps: lost", id)
		}
	}
	// No double eviction.
	evictions := 0
	for g, ids := range w.stops {
		evictions += len(ids)
		if len(ids) > 1 {
			w.breach("worker group %s evicted %d times", g, len(ids))
		}
	}
	// The human job untouched.
	after := c.job("human")
	if *after.Version != *human.Version || *after.JobModifyIndex != *human.JobModifyIndex {
		w.breach("the human job was written: version %d -> %d", *human.Version, *after.Version)
	}
	if got := c.allocs("human"); len(got) != len(humanAllocs) || got[0].ID != humanAllocs[0].ID {
		w.breach("the human job's allocations changed")
	}
	// Converged: the last sidecar is healthy and plans nothing running.
	c.waitFor("the sidecar converges", time.Minute, func() error {
		h, err := r.health()
		if err != nil || !h.OK || h.Jobs != 0 || h.InFlight != 0 {
			return fmt.Errorf("health %+v (%v)", h, err)
		}
		return nil
	})
	r.kill(syscall.SIGTERM)
	<-r.done
	b, err := state.OpenBolt(stateFile, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	es, err := b.Journal(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, e := range es {
		if e.Applied {
			kinds[e.Kind]++
		}
	}
	t.Logf("journal: %d entries, applied writes by kind %v; evictions seen in Nomad: %d", len(es), kinds, evictions)
	sort.Strings(w.breaches)
	if len(w.breaches) > 0 {
		t.Fatalf("%d breaches:\n%s", len(w.breaches), strings.Join(w.breaches, "\n"))
	}
}

// faultProxy stands between the sidecar and Nomad: it answers a share of
// requests with an error and delays others, and counts what it did.
type faultProxy struct {
	target string
	rng    *rand.Rand
	mu     sync.Mutex
	// failRate of requests get a 500 (writes: before they reach Nomad);
	// slowRate are delayed by up to maxDelay.
	failRate, slowRate float64
	maxDelay           time.Duration
	failed, slowed     int
	writesSeen         int
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	fail := p.rng.Float64() < p.failRate && !strings.HasPrefix(r.URL.Path, "/v1/event/stream")
	delay := time.Duration(0)
	if p.rng.Float64() < p.slowRate {
		delay = time.Duration(p.rng.Int64N(int64(p.maxDelay)))
	}
	if fail {
		p.failed++
	}
	if delay > 0 {
		p.slowed++
	}
	if r.Method == http.MethodPut || r.Method == http.MethodPost {
		p.writesSeen++
	}
	p.mu.Unlock()
	time.Sleep(delay)
	if fail {
		http.Error(w, "injected fault", http.StatusInternalServerError)
		return
	}
	u, _ := url.Parse(p.target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // the event stream flows as Nomad sends it
	rp.ServeHTTP(w, r)
}

// TestSidecarUnderAPIFaults: Nomad's API, seen through a proxy, fails 15 %
// of requests and delays 20 % by up to 2 s. The sidecar makes no wrong
// write (nothing runs unplanned, nothing is placed twice or evicted twice,
// the human job is untouched), retries with backoff, completes every job,
// and its counters show the errors.
func TestSidecarUnderAPIFaults(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	c.plainGPUJob("human", "k80-a", "Tesla K80", 2)
	human := c.job("human")
	p := &faultProxy{target: c.server.Addr, rng: rand.New(rand.NewPCG(7, 7)), failRate: 0.15, slowRate: 0.2, maxDelay: 2 * time.Second}
	srv := httptest.NewServer(p)
	// Closed after the sidecar stops (cleanups run last in, first out):
	// its event stream holds a connection open until then.
	t.Cleanup(srv.Close)
	var jobs []string
	for i := range 4 {
		m := scJob{id: fmt.Sprintf("f%d", i), steps: 600 + 200*(i%3), workers: 1 + i%2, gated: true}
		c.submit(m)
		jobs = append(jobs, m.id)
	}
	w := &faultWatch{c: c, managed: jobs, stops: map[string]map[string]bool{}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for ctx.Err() == nil {
			w.poll()
			time.Sleep(300 * time.Millisecond)
		}
	}()
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "4s"}, Cluster: config.Cluster{Nomad: &config.NomadConfig{Address: srv.URL}}})
	for _, id := range jobs {
		c.waitFor("job "+id+" completes", 5*time.Minute, func() error {
			if st := c.jobStatus(id); st != "dead" {
				return fmt.Errorf("status %s", st)
			}
			return nil
		})
	}
	stop()
	w.poll()
	for g, ids := range w.stops {
		if len(ids) > 1 {
			w.breach("worker group %s evicted %d times", g, len(ids))
		}
	}
	for _, id := range jobs {
		for _, al := range c.allocs(id) {
			if al.ClientStatus == api.AllocClientStatusFailed {
				w.breach("job %s: allocation %s failed: %s", id, al.ID[:8], al.ClientDescription)
			}
		}
	}
	if after := c.job("human"); *after.Version != *human.Version {
		w.breach("the human job was written")
	}
	st := a.Watcher().Stats()
	p.mu.Lock()
	t.Logf("proxy: %d requests failed, %d delayed, %d writes passed through; watcher: %d API errors, %d re-lists, %d reconnects; applier writes %v",
		p.failed, p.slowed, p.writesSeen, st.APIErrors, st.Relists, st.Reconnects, a.Applier().Writes())
	failed := p.failed
	p.mu.Unlock()
	if failed == 0 || st.APIErrors == 0 {
		t.Fatalf("no fault was injected or counted (%d injected, %d counted)", failed, st.APIErrors)
	}
	if len(w.breaches) > 0 {
		sort.Strings(w.breaches)
		t.Fatalf("%d breaches:\n%s", len(w.breaches), strings.Join(w.breaches, "\n"))
	}
}
