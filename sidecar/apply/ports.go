package apply

import (
	"fmt"
	"sync"
	"time"
)

// Ports hands out rendezvous ports (MASTER_PORT) from a range, unique over
// every unit hadar wrote: on a loopback cluster all nodes share one host,
// and on a real one a unique port costs nothing. A port that leaves the
// written units stays quarantined for a while, since the workers that
// used it may still be checkpointing and listening.
type Ports struct {
	mu        sync.Mutex
	low, high int
	used      map[int]bool
	released  map[int]time.Time
	// Quarantine is how long a released port is not reused (default 5m).
	Quarantine time.Duration
	now        time.Time
}

// NewPorts returns a pool over [low, high].
func NewPorts(low, high int) *Ports {
	return &Ports{low: low, high: high, used: map[int]bool{}, released: map[int]time.Time{}, Quarantine: 5 * time.Minute}
}

// Reset sets the ports in use now (those written in managed jobs); ports
// that were in use and are no more start their quarantine.
func (p *Ports) Reset(used []int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := map[int]bool{}
	for _, u := range used {
		next[u] = true
	}
	for u := range p.used {
		if !next[u] {
			p.released[u] = now
		}
	}
	for u, at := range p.released {
		if next[u] || now.Sub(at) >= p.Quarantine {
			delete(p.released, u)
		}
	}
	p.used, p.now = next, now
}

// Take returns the lowest free port and marks it used.
func (p *Ports) Take() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for port := p.low; port <= p.high; port++ {
		if !p.used[port] && p.released[port].IsZero() {
			p.used[port] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("no rendezvous port left in %d-%d (%d in use, %d quarantined): widen rendezvous_ports in the sidecar config", p.low, p.high, len(p.used), len(p.released))
}

// Give returns a port taken for a write that was not made.
func (p *Ports) Give(port int) {
	p.mu.Lock()
	delete(p.used, port)
	p.mu.Unlock()
}
