package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/state"
)

// consulAgent is a single-server Consul agent on loopback with its state on
// disk (a restart keeps it, as a real server's does).
type consulAgent struct {
	bin, dir, addr string
	args           []string
	cmd            *exec.Cmd
	done           chan struct{}
}

func startConsul(t *testing.T) *consulAgent {
	t.Helper()
	bin := harness.ConsulBinary(t)
	ports, err := harness.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := &consulAgent{bin: bin, dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), args: []string{"agent", "-server", "-bootstrap-expect=1",
		"-bind=127.0.0.1", "-client=127.0.0.1", "-data-dir=" + filepath.Join(dir, "data"), "-node=hadar-e2e", "-disable-host-node-id",
		fmt.Sprintf("-http-port=%d", ports[0]), fmt.Sprintf("-server-port=%d", ports[1]), fmt.Sprintf("-serf-lan-port=%d", ports[2]),
		fmt.Sprintf("-serf-wan-port=%d", ports[3]), "-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1", "-log-level=info"}}
	c.start(t)
	t.Cleanup(func() { c.stop(t) })
	return c
}

func (c *consulAgent) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(c.dir, "consul.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(c.bin, c.args...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); logf.Close(); close(done) }(c.cmd, c.done)
	client, err := consul.NewClient(&consul.Config{Address: c.addr})
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(context.Background(), 60*time.Second, 250*time.Millisecond, func() error {
		leader, err := client.Status().Leader()
		if err != nil || leader == "" {
			return fmt.Errorf("no Consul leader yet (%v)", err)
		}
		return nil
	}); err != nil {
		b, _ := os.ReadFile(filepath.Join(c.dir, "consul.log"))
		t.Fatalf("consul: %v\n%s", err, tail(b, 4000))
	}
}

func (c *consulAgent) stop(t *testing.T) {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
	if t.Failed() {
		b, _ := os.ReadFile(filepath.Join(c.dir, "consul.log"))
		t.Logf("consul log:\n%s", tail(b, 4000))
	}
}

// TestSidecarFailoverConsul: with CONSUL_HTTP_ADDR set, the replicas
// elect their leader through a Consul session lock. The leader is killed
// with SIGKILL mid-round and the standby takes over; then the Consul server
// goes down mid-round and comes back: the leader, unable to renew, stops
// acting before its session's TTL, waits, reconnects and leads again. The
// shared journal shows no older generation writing after a newer one.
func TestSidecarFailoverConsul(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	cs := startConsul(t)
	t.Setenv("CONSUL_HTTP_ADDR", cs.addr)
	body := `policy = "gavel-maxmin"
placement = "pack"
round = "4s"
min_run_time = "1s"
leader {
  enabled    = true
  ttl        = "10s"
  lock_delay = "1s"
}
state {
  store = "nomad"
}`
	reps := []*replica{c.startReplica(t, "ca", body), c.startReplica(t, "cb", body)}
	leaderOf := func() (*replica, error) {
		var lead *replica
		n := 0
		for _, r := range reps {
			if h, err := r.health(); err == nil && h.Leader {
				lead, n = r, n+1
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("%d leaders", n)
		}
		return lead, nil
	}
	var lead *replica
	c.waitFor("one replica leads through Consul", 90*time.Second, func() error {
		var err error
		lead, err = leaderOf()
		return err
	})
	client, _ := consul.NewClient(&consul.Config{Address: cs.addr})
	kv, _, err := client.KV().Get("hadar/sidecar/leader", nil)
	if err != nil || kv == nil || kv.Session == "" {
		t.Fatalf("the lock is not held in Consul: %+v, %v", kv, err)
	}
	c.submit(scJob{id: "c1", steps: 300, gated: true})
	time.Sleep(300 * time.Millisecond)
	lead.kill(syscall.SIGKILL)
	<-lead.done
	killed := time.Now()
	c.waitFor("the standby leads", 60*time.Second, func() error {
		_, err := leaderOf()
		return err
	})
	t.Logf("standby took over %v after the SIGKILL (Consul: session TTL 10s, invalidated within 2 x TTL, lock delay 1s)", time.Since(killed).Round(time.Millisecond))
	c.waitFor("c1 completes", 2*time.Minute, func() error {
		if st := c.jobStatus("c1"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})

	// Consul goes down in the middle of a round and comes back.
	c.submit(scJob{id: "c2", steps: 300, gated: true})
	cs.stop(t)
	down := time.Now()
	// A lease is valid for TTL - margin (10 s - 3.3 s) after its last
	// renewal and is checked every margin/4: by 8 s into the outage no
	// replica may write or journal anything.
	quiet := down.Add(8 * time.Second)
	time.Sleep(time.Until(quiet))
	c2Index := *c.job("c2").JobModifyIndex
	time.Sleep(time.Until(down.Add(25 * time.Second)))
	for _, r := range reps {
		if h, err := r.health(); err == nil && h.Leader {
			t.Fatalf("replica %s still acts with Consul down for 25 s (TTL 10s)", r.name)
		}
	}
	if got := *c.job("c2").JobModifyIndex; got != c2Index {
		t.Fatalf("c2 was written (index %d -> %d) while Consul was down and no lease could be valid", c2Index, got)
	}
	back := time.Now()
	cs.start(t)
	c.waitFor("a replica leads again once Consul is back", 90*time.Second, func() error {
		_, err := leaderOf()
		return err
	})
	c.waitFor("c2 completes", 2*time.Minute, func() error {
		if st := c.jobStatus("c2"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	// A job only the leader after the outage can start: its lease, and
	// so its generation, is newer than any before (c1's start was
	// journaled by one of those). On a loaded machine the first leader
	// can die before its first write and c2 start before Consul goes
	// down (make test run 32), so c1 and c2 alone may show one generation.
	c.submit(scJob{id: "c3", steps: 300, gated: true})
	c.waitFor("c3 completes", 2*time.Minute, func() error {
		if st := c.jobStatus("c3"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	es, err := state.NewVariables(c.api, "default", "hadar/sidecar").Journal(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var top uint64
	gens := map[uint64]string{}
	for _, e := range es {
		if e.Time.After(quiet) && e.Time.Before(back) {
			t.Fatalf("journal entry %d (%s %s by %s) at %v, while Consul was down (%v to %v): no lease was valid", e.Seq, e.Kind, e.Job, e.Leader, e.Time, quiet, back)
		}
		if e.Generation == 0 {
			t.Fatalf("journal entry %d (%s %s) carries generation 0", e.Seq, e.Kind, e.Job)
		}
		if e.Generation < top {
			t.Fatalf("journal entry %d by %s, generation %d, after generation %d: two leaders acted at once", e.Seq, e.Leader, e.Generation, top)
		}
		top = e.Generation
		if l, ok := gens[e.Generation]; ok && l != e.Leader {
			t.Fatalf("generation %d written by %s and %s", e.Generation, l, e.Leader)
		}
		gens[e.Generation] = e.Leader
	}
	t.Logf("%d journal entries over %d generations", len(es), len(gens))
	if len(gens) < 2 {
		t.Fatalf("journal generations %v: want the takeovers to show", gens)
	}

	// A graceful handover through Consul: the session's lock is released.
	lead, err = leaderOf()
	if err != nil {
		t.Fatal(err)
	}
	c.handover(t, lead, c.startReplica(t, "cc", body))
}
