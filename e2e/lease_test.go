package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/state"
)

// leaseProxy stands between a leader and Nomad: it can hold job plans
// (the request the sidecar makes before each write) and fail the leader
// lock's renewals, and records every job registration that reaches Nomad.
type leaseProxy struct {
	target *url.URL
	mu     sync.Mutex
	// hold: plans wait until release is closed or their caller gives up.
	hold    bool
	release chan struct{}
	held    int
	// failRenews answers lock renewals with a 500, as a Nomad server
	// that cannot be reached would leave them failing.
	failRenews bool
	registers  []registration
}

type registration struct {
	at   time.Time
	path string
}

func (p *leaseProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	hold, release := p.hold && strings.HasSuffix(r.URL.Path, "/plan"), p.release
	failRenew := p.failRenews && r.URL.Query().Has("lock-renew")
	if hold {
		p.held++
	}
	p.mu.Unlock()
	if failRenew {
		http.Error(w, "injected: server unreachable", http.StatusInternalServerError)
		return
	}
	if hold {
		select {
		case <-release:
		case <-r.Context().Done():
			return // the caller gave up (its lease ended): nothing goes on
		}
	}
	if r.Method == http.MethodPut && r.URL.Path == "/v1/jobs" {
		p.mu.Lock()
		p.registers = append(p.registers, registration{time.Now(), r.URL.Path})
		p.mu.Unlock()
	}
	rp := httputil.NewSingleHostReverseProxy(p.target)
	rp.FlushInterval = -1
	rp.ServeHTTP(w, r)
}

func (p *leaseProxy) registersAfter(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.registers {
		if r.at.After(t) {
			n++
		}
	}
	return n
}

// TestLeaderLosesItsLeaseMidWrite: the leader decides to start a job; while
// Nomad's plan for that write is held, the leader's lock renewals fail and
// its lease lapses. The write that was decided under the lease never goes
// out, and no journal entry is made for it: not after the lease ended, and
// never with generation 0. Once renewals work again the replica leads again
// and places the job under its new generation.
func TestLeaderLosesItsLeaseMidWrite(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	u, err := url.Parse(c.server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &leaseProxy{target: u, release: make(chan struct{})}
	srv := httptest.NewServer(p)
	// Closed after the sidecar stops (cleanups run last in, first out):
	// its event stream holds a connection open until then.
	t.Cleanup(srv.Close)
	a := c.startSidecar(config.Config{
		Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack", Round: "4s"},
		Service:    config.Service{Leader: &config.LeaderConfig{Enabled: true, TTL: "10s", LockDelay: "1s"}, State: &config.StateConfig{Store: "nomad"}},
		Cluster:    config.Cluster{Nomad: &config.NomadConfig{Address: srv.URL}},
	})
	c.waitFor("the sidecar leads", 90*time.Second, func() error {
		if h := a.Health(); !h.Leader {
			return fmt.Errorf("not leading (%s)", h.Problem)
		}
		return nil
	})
	gen := a.Health().Generation

	p.mu.Lock()
	p.hold, p.failRenews = true, true
	p.mu.Unlock()
	submitted := c.submit(scJob{id: "x", steps: 300, gated: true})
	c.waitFor("the start of x is being written (its plan held)", time.Minute, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.held == 0 {
			return errNotYet
		}
		return nil
	})
	c.waitFor("the lease lapses", time.Minute, func() error {
		if a.Health().Leader {
			return errNotYet
		}
		return nil
	})
	lost := time.Now()
	// The held plan goes on to Nomad now (if its caller still waits):
	// whatever comes back, the write must not follow.
	p.mu.Lock()
	p.hold = false
	close(p.release)
	p.mu.Unlock()
	c.waitCycles(a, 5)
	if n := p.registersAfter(lost); n != 0 {
		t.Fatalf("%d job registrations reached Nomad after the lease was lost", n)
	}
	if v := *c.job("x").Version; v != *submitted.Version {
		t.Fatalf("job x went from version %d to %d without a lease", *submitted.Version, v)
	}
	store := state.NewVariables(c.api, "default", "hadar/sidecar")
	es, err := store.Journal(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Job == "default/x" {
			t.Fatalf("journal entry %d for x (%s, generation %d, at %v; lease lost at %v) made for a write never made", e.Seq, e.Kind, e.Generation, e.Time, lost)
		}
		if e.Generation == 0 {
			t.Fatalf("journal entry %d (%s %s) carries generation 0", e.Seq, e.Kind, e.Job)
		}
	}

	// Renewals work again: the replica leads again and places x.
	p.mu.Lock()
	p.failRenews = false
	p.mu.Unlock()
	c.waitFor("x runs under the next lease", 2*time.Minute, func() error {
		if len(c.running("x")) != 1 {
			return errNotYet
		}
		return nil
	})
	if h := a.Health(); !h.Leader || h.Generation <= gen {
		t.Fatalf("leading %v with generation %d; the lost lease had %d", h.Leader, h.Generation, gen)
	}
	es, err = store.Journal(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	wrote := false
	for _, e := range es {
		if e.Job == "default/x" {
			wrote = true
			if e.Generation <= gen {
				t.Fatalf("x journaled under generation %d, the lost lease's (%d) or older", e.Generation, gen)
			}
		}
	}
	if !wrote {
		t.Fatal("x's start is not in the journal")
	}
}
