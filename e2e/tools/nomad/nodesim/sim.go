package nodesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/helper/pool"
)

// Config of a Simulator.
type Config struct {
	// Servers are Nomad servers' RPC addresses ("127.0.0.1:4647"); nodes
	// are spread over them.
	Servers []string
	// Region of the servers; default "global".
	Region string
	// Driver is the task driver the nodes advertise and run; default
	// "nodesim". Jobs for simulated nodes name it in their task.
	Driver string
	// Compression is how many simulated seconds pass per wall second:
	// tasks train this many times faster than their throughputs say, and
	// the restart delay is this many times shorter. Default 1.
	Compression float64
	// RestartCost is the simulated time a unit spends restoring its
	// checkpoint before it makes progress, at every start.
	RestartCost time.Duration
	// RendezvousTimeout is the simulated time a worker waits for the rest
	// of its unit before it fails; 0 waits forever.
	RendezvousTimeout time.Duration
	// Events receives the event log (JSON lines, see event); nil discards it.
	Events io.Writer
	// Parallel bounds registrations and update batches in flight; default 16.
	Parallel int
	Logger   hclog.Logger
}

// Stats are the simulator's counters.
type Stats struct {
	Nodes, Ready int
	RPCs         uint64
	RPCErrors    uint64
	// Allocs counts allocations started; AllocUpdates the allocation
	// versions pulled from the server; UpdatesSent the client updates
	// sent back; ProgressReads the progress files served.
	Allocs        uint64
	AllocUpdates  uint64
	UpdatesSent   uint64
	ProgressReads uint64
}

// Simulator runs a spec's nodes against Nomad servers.
type Simulator struct {
	cfg   Config
	spec  Spec
	log   hclog.Logger
	world *world
	nodes []*node
	ready chan struct{}

	mu         sync.Mutex
	stats      Stats
	dirtyNodes map[*node]bool
}

// New checks the config and spec and builds the simulator; Run starts it.
func New(cfg Config, spec Spec) (*Simulator, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("nodesim spec: %w", err)
	}
	if len(cfg.Servers) == 0 {
		return nil, errors.New("nodesim: no servers: want at least one Nomad server RPC address, e.g. 127.0.0.1:4647")
	}
	if cfg.Region == "" {
		cfg.Region = "global"
	}
	if cfg.Driver == "" {
		cfg.Driver = "nodesim"
	}
	if cfg.Compression == 0 {
		cfg.Compression = 1
	}
	if !(cfg.Compression > 0) || math.IsInf(cfg.Compression, 0) {
		return nil, fmt.Errorf("nodesim: compression %v: want a positive factor, e.g. 60 (a simulated minute per wall second)", cfg.Compression)
	}
	if cfg.RestartCost < 0 || cfg.RendezvousTimeout < 0 {
		return nil, fmt.Errorf("nodesim: restart cost %v, rendezvous timeout %v: want durations >= 0", cfg.RestartCost, cfg.RendezvousTimeout)
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	dc := spec.Datacenter
	if dc == "" {
		dc = "dc1"
	}
	s := &Simulator{cfg: cfg, spec: spec, log: cfg.Logger, ready: make(chan struct{}), dirtyNodes: map[*node]bool{}}
	s.world = newWorld(cfg.Compression, cfg.RestartCost, cfg.RendezvousTimeout, newEventLog(cfg.Events))
	for i, ns := range spec.Nodes {
		addr, err := net.ResolveTCPAddr("tcp", cfg.Servers[i%len(cfg.Servers)])
		if err != nil {
			return nil, fmt.Errorf("nodesim: server %q: %w", cfg.Servers[i%len(cfg.Servers)], err)
		}
		s.nodes = append(s.nodes, newNode(s, ns, addr, dc))
	}
	s.stats.Nodes = len(s.nodes)
	return s, nil
}

// Ready is closed once every node is registered and ready.
func (s *Simulator) Ready() <-chan struct{} { return s.ready }

// Stats returns the counters.
func (s *Simulator) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Simulator) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

// dirty marks a node with updates to send.
func (s *Simulator) dirty(nd *node) {
	s.mu.Lock()
	s.dirtyNodes[nd] = true
	s.mu.Unlock()
}

// updateInterval is how often queued allocation updates go out (a Nomad
// client's allocSyncIntv).
const updateInterval = 200 * time.Millisecond

// Run registers the nodes, keeps them alive and runs their allocations
// until ctx ends; then it closes every connection (the server marks the
// nodes down once their heartbeats stop). It fails only when a node cannot
// register at all.
func (s *Simulator) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer func() {
		cancel()
		for _, nd := range s.nodes {
			_ = nd.pool.Shutdown()
		}
		wg.Wait()
		s.world.close()
	}()
	for _, nd := range s.nodes {
		conns := make(chan *pool.Conn, 4)
		nd.pool.SetConnListener(conns)
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd.serve(ctx, conns)
		}()
	}
	ttls := make([]time.Duration, len(s.nodes))
	errs := make([]error, len(s.nodes))
	sem := make(chan struct{}, s.cfg.Parallel)
	var rg sync.WaitGroup
	for i, nd := range s.nodes {
		rg.Add(1)
		go func() {
			defer rg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			// The server may still be electing itself: retry for a while.
			deadline := time.Now().Add(time.Minute)
			for {
				ttls[i], errs[i] = nd.register()
				if errs[i] == nil || time.Now().After(deadline) || ctx.Err() != nil {
					return
				}
				time.Sleep(time.Second)
			}
		}()
	}
	rg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nodesim: registering nodes: %w", err)
	}
	s.count(func(st *Stats) { st.Ready = len(s.nodes) })
	for i, nd := range s.nodes {
		wg.Add(2)
		go func() {
			defer wg.Done()
			nd.heartbeats(ctx, ttls[i])
		}()
		go func() {
			defer wg.Done()
			nd.watch(ctx)
		}()
	}
	close(s.ready)
	s.log.Info("nodes ready", "nodes", len(s.nodes), "gpus", s.spec.GPUs())
	tick := time.NewTicker(updateInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			s.flush()
		}
	}
}

// flush sends every node's queued updates, a few nodes at a time.
func (s *Simulator) flush() {
	s.mu.Lock()
	nodes := make([]*node, 0, len(s.dirtyNodes))
	for nd := range s.dirtyNodes {
		nodes = append(nodes, nd)
	}
	s.dirtyNodes = map[*node]bool{}
	s.mu.Unlock()
	sem := make(chan struct{}, s.cfg.Parallel)
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nd.flush()
		}()
	}
	wg.Wait()
}

// EventErr is the first error writing the event log, if any.
func (s *Simulator) EventErr() error { return s.world.log.Err() }
