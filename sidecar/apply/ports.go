package apply

import (
	"fmt"
	"sync"
	"time"
)

// Ports hands out rendezvous ports (MASTER_PORT) from a range, unique per
// address: units whose rank 0 listens on the same address (the same node,
// or every node of a loopback cluster) never share a port. A port that
// leaves the written units stays quarantined for a while, since the
// workers that used it may still be checkpointing and listening.
type Ports struct {
	mu        sync.Mutex
	low, high int
	used      map[string]map[int]bool
	released  map[string]map[int]time.Time
	// Quarantine is how long a released port is not reused (default 5m).
	Quarantine time.Duration
}

// NewPorts returns a pool over [low, high].
func NewPorts(low, high int) *Ports {
	return &Ports{low: low, high: high, used: map[string]map[int]bool{}, released: map[string]map[int]time.Time{}, Quarantine: 5 * time.Minute}
}

// Reset sets the ports in use now, by address (those written in managed
// jobs); ports that were in use and are no more start their quarantine.
func (p *Ports) Reset(used map[string][]int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := map[string]map[int]bool{}
	for addr, ports := range used {
		next[addr] = map[int]bool{}
		for _, port := range ports {
			next[addr][port] = true
		}
	}
	for addr, ports := range p.used {
		for port := range ports {
			if !next[addr][port] {
				if p.released[addr] == nil {
					p.released[addr] = map[int]time.Time{}
				}
				p.released[addr][port] = now
			}
		}
	}
	for addr, ports := range p.released {
		for port, at := range ports {
			if next[addr][port] || now.Sub(at) >= p.Quarantine {
				delete(ports, port)
			}
		}
		if len(ports) == 0 {
			delete(p.released, addr)
		}
	}
	p.used = next
}

// Take returns the lowest free port on addr and marks it used.
func (p *Ports) Take(addr string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used[addr] == nil {
		p.used[addr] = map[int]bool{}
	}
	for port := p.low; port <= p.high; port++ {
		if !p.used[addr][port] && p.released[addr][port].IsZero() {
			p.used[addr][port] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("no rendezvous port left on %s in %d-%d (%d in use, %d quarantined): widen rendezvous_ports in the sidecar config",
		addr, p.low, p.high, len(p.used[addr]), len(p.released[addr]))
}

// Give returns a port taken for a write that was not made.
func (p *Ports) Give(addr string, port int) {
	p.mu.Lock()
	delete(p.used[addr], port)
	p.mu.Unlock()
}
