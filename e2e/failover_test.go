package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/state"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// replica is a `hadar sidecar` process.
type replica struct {
	name string
	cmd  *exec.Cmd
	addr string
	log  string
	done chan struct{}
}

// startReplica runs bin/hadar sidecar with the given config body (HCL)
// and its status API on a free port.
func (c *sidecarCluster) startReplica(t *testing.T, name, body string) *replica {
	t.Helper()
	bin := harness.GoBinary(t, "./cmd/hadar", "hadar")
	ports, err := harness.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sidecar.hcl")
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	if err := os.WriteFile(cfg, []byte(body+fmt.Sprintf("\nhttp {\n  address = %q\n}\n", addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "sidecar", "-config", cfg)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+c.server.Addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, cmd: cmd, addr: addr, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(r.done) }()
	t.Cleanup(func() {
		r.kill(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			r.kill(syscall.SIGKILL)
			<-r.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("replica %s log:\n%s", name, tail(b, 6000))
		}
	})
	return r
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (r *replica) kill(sig syscall.Signal) {
	select {
	case <-r.done:
	default:
		r.cmd.Process.Signal(sig)
	}
}

func (r *replica) health() (wire.Health, error) {
	var h wire.Health
	resp, err := http.Get("http://" + r.addr + "/v1/health")
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	return h, json.NewDecoder(resp.Body).Decode(&h)
}

// TestSidecarFailover: two replicas share their state in Nomad Variables
// and elect a leader through a Nomad Variables lock. The leader is killed
// with SIGKILL in the middle of a round; the standby takes over within the
// lock's TTL and delay plus a round, places the jobs submitted meanwhile,
// and the shared journal shows that no write of an older lock generation
// came after one of a newer: never two leaders acting at once.
func TestSidecarFailover(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	body := `policy    = "gavel-maxmin"
placement = "pack"
round     = "4s"
min_run_time = "1s"
gang_timeout = "40s"
stop_timeout = "30s"
leader {
  enabled    = true
  ttl        = "10s"
  lock_delay = "1s"
}
state {
  store = "nomad"
}`
	reps := []*replica{c.startReplica(t, "a", body), c.startReplica(t, "b", body)}
	var lead, standby *replica
	c.waitFor("one replica leads", 90*time.Second, func() error {
		n := 0
		for _, r := range reps {
			if h, err := r.health(); err == nil && h.Leader {
				lead, n = r, n+1
			}
		}
		if n != 1 {
			return fmt.Errorf("%d leaders", n)
		}
		return nil
	})
	for _, r := range reps {
		if r != lead {
			standby = r
		}
	}
	c.submit(scJob{id: "before", steps: 4000, gated: true})
	c.waitFor("the leader places a job", 60*time.Second, func() error {
		if len(c.running("before")) != 1 {
			return errNotYet
		}
		return nil
	})
	// Mid-round: a job just arrived (the leader is planning it) when it
	// dies.
	c.submit(scJob{id: "during", steps: 400, gated: true})
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	lead.kill(syscall.SIGKILL)
	<-lead.done
	c.submit(scJob{id: "after", steps: 400, gated: true})
	c.waitFor("the standby leads", 60*time.Second, func() error {
		h, err := standby.health()
		if err != nil || !h.Leader {
			return fmt.Errorf("leader %v (%v)", h.Leader, err)
		}
		return nil
	})
	took := time.Since(killed)
	// The bound: Nomad frees a dead holder's lock after twice its TTL
	// (nomad/locks.go: "Adjust the given TTL by multiplier of 2"), then
	// the lock delay; then the standby's acquire retry and a round.
	bound := 2*10*time.Second + time.Second + 2*time.Second + 4*time.Second
	t.Logf("the standby took over %v after the leader was killed (bound: 2 x TTL 10s + lock delay 1s + acquire retry 2s + round 4s = %v)", took.Round(time.Millisecond), bound)
	if took > bound {
		t.Fatalf("takeover took %v", took)
	}
	for _, id := range []string{"during", "after"} {
		c.waitFor("job "+id+" completes under the new leader", 2*time.Minute, func() error {
			if st := c.jobStatus(id); st != "dead" {
				return fmt.Errorf("status %s", st)
			}
			return nil
		})
	}
	if len(c.running("before")) != 1 {
		t.Fatal("the job the old leader placed no longer runs once: it was stopped or placed twice")
	}
	// The write log: generations never go back.
	store := state.NewVariables(c.api, "default", "hadar/sidecar")
	es, err := store.Journal(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) == 0 {
		t.Fatal("no journal")
	}
	byGen := map[uint64]string{}
	var top uint64
	for _, e := range es {
		if e.Generation < top {
			t.Fatalf("journal entry %d (%s %s by %s, generation %d) after a write of generation %d: two leaders acted at once", e.Seq, e.Kind, e.Job, e.Leader, e.Generation, top)
		}
		top = e.Generation
		if l, ok := byGen[e.Generation]; ok && l != e.Leader {
			t.Fatalf("generation %d written by %s and %s", e.Generation, l, e.Leader)
		}
		byGen[e.Generation] = e.Leader
	}
	var gens []string
	for g, l := range byGen {
		gens = append(gens, fmt.Sprintf("%d:%s", g, l))
	}
	sort.Strings(gens)
	t.Logf("%d journal entries, generations %s", len(es), strings.Join(gens, " "))
	if len(byGen) < 2 {
		t.Fatalf("journal shows one leader only (%v): the standby wrote nothing", gens)
	}

	// A graceful handover: the leader stopped with SIGTERM saves its
	// state and releases the lock, so a new follower leads well before
	// the lease's TTL would have lapsed, and goes on from that state.
	c.handover(t, standby, c.startReplica(t, "c", body))
	c.submit(scJob{id: "handed", steps: 400, gated: true})
	c.waitFor("the new leader completes a job", 2*time.Minute, func() error {
		if st := c.jobStatus("handed"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	// It may have completed by now (400 s on a K80 at worst); it must not
	// run twice.
	if n := len(c.running("before")); n > 1 || n == 0 && c.jobStatus("before") != "dead" {
		t.Fatalf("after the handover the first job runs %d times, status %s", n, c.jobStatus("before"))
	}
}

// handover stops leader with SIGTERM while next follows: next must lead
// in less than the lock's TTL (10 s in these tests: the stopped leader
// released the lock, it did not leave it to lapse) and the stopped one
// must say it released it.
func (c *sidecarCluster) handover(t *testing.T, leader, next *replica) {
	t.Helper()
	c.waitFor("replica "+next.name+" follows", 60*time.Second, func() error {
		h, err := next.health()
		if err != nil || h.Leader || h.Cycles == 0 {
			return fmt.Errorf("leader %v, cycles %d (%v)", h.Leader, h.Cycles, err)
		}
		return nil
	})
	stopped := time.Now()
	leader.kill(syscall.SIGTERM)
	c.waitFor("replica "+next.name+" leads", 60*time.Second, func() error {
		h, err := next.health()
		if err != nil || !h.Leader {
			return fmt.Errorf("leader %v (%v)", h.Leader, err)
		}
		return nil
	})
	took := time.Since(stopped)
	<-leader.done
	logged, err := os.ReadFile(leader.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("graceful handover from %s to %s in %v (a lapsed lease takes over 2 x TTL = 20s)", leader.name, next.name, took.Round(time.Millisecond))
	if !strings.Contains(string(logged), "released the leader lock") || took >= 10*time.Second {
		t.Fatalf("replica %s did not hand over: %s led %v after the SIGTERM; its log:\n%s", leader.name, next.name, took, tail(logged, 4000))
	}
}
