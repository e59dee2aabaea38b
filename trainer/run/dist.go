package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The unit protocol (docs/trainer.md, "Distributed emulation"): the
// workers of one unit (WORLD_SIZE > 1) meet at rank 0's MASTER_ADDR:
// MASTER_PORT and then run in lockstep, as synchronous data-parallel
// training does.
//
//   - Rendezvous. Rank 0 listens; every other rank connects (retrying
//     until --rendezvous-timeout) and sends a hello: job, unit, rank,
//     world size, node, GPU model and its paces. Rank 0 answers start
//     only once all WORLD_SIZE workers are there, so no step runs on a
//     partial gang. A hello of another job or unit, a second worker of
//     one rank, or another world size is refused with an error message.
//   - Steps. Rank 0 trains the real model; it announces each batch of
//     steps (step), runs them at its own pace while every other rank
//     emulates them at its own, and waits for every rank's done: a
//     barrier per batch, over the TCP connections. The unit therefore
//     runs at its slowest worker's pace, and at the spread pace when it
//     spans nodes: hadar's speed model of a mixed unit (planner/speed).
//   - End. Rank 0 ends the unit with a stop message: "done" (the job is
//     finished: every rank exits 0), "signal" (rank 0 was asked to stop
//     and has checkpointed), "peer-left" or "peer-lost" (a rank asked to
//     stop, or vanished; rank 0 has checkpointed). A rank asked to stop
//     (SIGTERM) tells rank 0 (leaving) and exits 0 once rank 0 has
//     checkpointed. A rank whose unit ended without it being asked to
//     stop waits --stop-grace for its own signal (an eviction stops all
//     of a unit's workers at about the same time) and otherwise exits 1,
//     so the scheduler sees a broken unit and re-plans.
//   - Liveness. Both ends ping every second; a peer silent for
//     --peer-timeout, or whose connection ends, is lost: the others fail
//     fast instead of waiting on a gang that cannot finish.
//
// Messages are JSON objects, one per line.

// protocolVersion is bumped when the unit protocol changes.
const protocolVersion = 1

// Message types.
const (
	msgHello   = "hello"   // rank > 0 -> rank 0: who it is
	msgStart   = "start"   // rank 0 -> all: the unit is complete
	msgError   = "error"   // rank 0 -> a refused rank
	msgStep    = "step"    // rank 0 -> all: run the next batch
	msgDone    = "done"    // all -> rank 0: batch finished
	msgLeaving = "leaving" // rank > 0 -> rank 0: asked to stop
	msgStop    = "stop"    // rank 0 -> all: the unit ends
	msgPing    = "ping"
)

// Reasons a unit ends (stop messages).
const (
	stopDone     = "done"
	stopSignal   = "signal"
	stopPeerLeft = "peer-left"
	stopPeerLost = "peer-lost"
	stopError    = "error"
)

// wire is one message.
type wire struct {
	Type       string  `json:"type"`
	Version    int     `json:"version,omitempty"`
	JobID      string  `json:"job_id,omitempty"`
	Unit       int     `json:"unit"`
	Rank       int     `json:"rank"`
	WorldSize  int     `json:"world_size,omitempty"`
	Node       string  `json:"node,omitempty"`
	Model      string  `json:"model,omitempty"`
	Pace       float64 `json:"pace,omitempty"`
	SpreadPace float64 `json:"spread_pace,omitempty"`
	Seq        int64   `json:"seq,omitempty"`
	Steps      int64   `json:"steps,omitempty"`      // step: the batch's steps
	StepsDone  int64   `json:"steps_done,omitempty"` // the job's steps as rank 0 holds them
	Checkpoint string  `json:"checkpoint,omitempty"` // rank 0's newest checkpoint
	Spread     bool    `json:"spread,omitempty"`     // start: the unit spans nodes
	UnitPace   float64 `json:"unit_pace,omitempty"`  // start: the predicted pace of the unit
	Nodes      int     `json:"nodes,omitempty"`
	Reason     string  `json:"reason,omitempty"`
	Error      string  `json:"error,omitempty"`
	// Retry marks an error that may pass (a worker of another unit
	// reached the port another unit still holds): the worker dials again.
	Retry bool `json:"retry,omitempty"`
}

// Timing of the protocol.
const (
	pingEvery    = time.Second
	helloTimeout = 10 * time.Second
	leaveWait    = 3 * time.Second // a stopping rank waits this long for rank 0's checkpoint
	drainWait    = 2 * time.Second // how long a closing end waits for the peer to close first
)

// hello describes this worker to the unit.
func (o Options) hello() wire {
	return wire{Type: msgHello, Version: protocolVersion, JobID: o.JobID, Unit: o.Unit, Rank: o.Rank, WorldSize: o.WorldSize,
		Node: nodeName(o), Model: o.GPUModel, Pace: o.StepsPerSec, SpreadPace: o.spreadPace()}
}

// nodeName tells a worker's node apart from the unit's others: its node
// rank as the launcher gave it, else the host name.
func nodeName(o Options) string {
	if o.NodeRank >= 0 {
		return "node-" + strconv.Itoa(o.NodeRank)
	}
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}

// unitPace is the pace of a unit whose workers said hellos: the slowest
// worker's (spread paces when the unit spans several nodes); a worker
// running flat out (0) does not bound it.
func unitPace(hellos []wire) (pace float64, spread bool, nodes int) {
	var names []string
	for _, h := range hellos {
		if !slices.Contains(names, h.Node) {
			names = append(names, h.Node)
		}
	}
	spread = len(names) > 1
	pace = math.Inf(1)
	for _, h := range hellos {
		p := h.Pace
		if spread {
			p = h.SpreadPace
		}
		if p > 0 {
			pace = min(pace, p)
		}
	}
	if math.IsInf(pace, 1) {
		pace = 0
	}
	return pace, spread, len(names)
}

// syncBatch is the steps between barriers: --sync-every, else about a
// quarter second at the unit's pace (50 flat out), so a barrier costs a
// negligible share of the time and progress stays fine-grained.
func syncBatch(o Options, pace float64) int64 {
	switch {
	case o.SyncEvery > 0:
		return int64(o.SyncEvery)
	case pace > 0:
		return max(1, int64(math.Round(pace/4)))
	}
	return 50
}

// UnitBroken is the error of a unit that lost a worker: the process
// exits non-zero (unless it was itself asked to stop) so the scheduler
// re-plans the job.
type UnitBroken struct {
	Rank   int    // the rank that left or was lost (-1: rank 0 ended the unit)
	Left   bool   // it was asked to stop, rather than vanishing
	Reason string // rank 0's stop reason, for the other ranks
	Err    error
}

func (e *UnitBroken) Error() string {
	switch {
	case e.Rank < 0:
		return fmt.Sprintf("rank 0 ended the unit (%s): the unit cannot go on without all its workers", e.Reason)
	case e.Left:
		return fmt.Sprintf("rank %d left the unit (it was asked to stop): the unit cannot go on without it", e.Rank)
	}
	return fmt.Sprintf("rank %d was lost (%v): the unit cannot go on without it", e.Rank, e.Err)
}

func (e *UnitBroken) Unwrap() error { return e.Err }

// peerMsg is a message (or the read error that ended a connection) from
// one rank.
type peerMsg struct {
	rank int
	m    wire
	err  error
}

// link is one TCP connection of the unit: a reader goroutine that hands
// messages (pings dropped) to a channel, and a pinger.
type link struct {
	rank    int
	conn    net.Conn
	timeout time.Duration
	wmu     sync.Mutex
	enc     *json.Encoder
	quit    chan struct{}
	readEnd chan struct{}
	once    sync.Once
}

// newLink starts reading conn (through dec, which may hold bytes already
// read) into out, and pinging.
func newLink(rank int, conn net.Conn, dec *json.Decoder, timeout time.Duration, out chan<- peerMsg) *link {
	l := &link{rank: rank, conn: conn, timeout: timeout, enc: json.NewEncoder(conn), quit: make(chan struct{}), readEnd: make(chan struct{})}
	go func() {
		defer close(l.readEnd)
		for {
			_ = conn.SetReadDeadline(time.Now().Add(timeout))
			var m wire
			err := dec.Decode(&m)
			if err == nil && m.Type == msgPing {
				continue
			}
			select {
			case out <- peerMsg{rank: rank, m: m, err: err}:
			case <-l.quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		t := time.NewTicker(pingEvery)
		defer t.Stop()
		for {
			select {
			case <-l.quit:
				return
			case <-t.C:
				if l.send(wire{Type: msgPing}) != nil {
					return
				}
			}
		}
	}()
	return l
}

func (l *link) send(m wire) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_ = l.conn.SetWriteDeadline(time.Now().Add(l.timeout))
	if err := l.enc.Encode(m); err != nil {
		return fmt.Errorf("send %s to rank %d: %w", m.Type, l.rank, err)
	}
	return nil
}

// close ends the link at once.
func (l *link) close() {
	l.once.Do(func() {
		close(l.quit)
		l.conn.Close()
	})
}

// finish ends the link after what was sent is delivered: it shuts down
// its sending side and waits (bounded) for the peer to close, so that the
// last message is not lost to a reset (closing a socket with unread data
// resets the connection).
func (l *link) finish() {
	if tc, ok := l.conn.(*net.TCPConn); ok {
		l.wmu.Lock()
		_ = tc.CloseWrite()
		l.wmu.Unlock()
	}
	select {
	case <-l.readEnd:
	case <-time.After(drainWait):
	}
	l.close()
}

// group is rank 0's side of a unit: the other ranks' links.
type group struct {
	o       Options
	log     *slog.Logger
	peers   map[int]*link
	events  chan peerMsg
	done    map[int]int64 // the last batch each rank finished
	seq     int64
	failure *UnitBroken

	hellos   []wire
	pace     float64 // the unit's predicted pace
	spread   bool
	nodes    int
	ownRate  float64 // rank 0's own emulated pace in this unit
	batch    int64
	gathered time.Time
}

// listen opens rank 0's rendezvous port on every address, retrying until
// deadline while it is taken: the unit that held it before may still be
// ending (checkpointing within its kill_timeout).
func listen(ctx context.Context, port int, deadline time.Time, tick func()) (net.Listener, error) {
	for {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return nil, fmt.Errorf("rendezvous: listen on port %d (MASTER_PORT): %w", port, err)
		}
		tick()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// rendezvous is rank 0's gathering of its unit: it returns once every
// rank joined, having sent them start, or fails after
// --rendezvous-timeout. state is what the start message carries (the
// job's steps and the checkpoint rank 0 resumed from).
func rendezvous(ctx context.Context, o Options, log *slog.Logger, tick func(), stepsDone int64, checkpoint string) (*group, error) {
	deadline := time.Now().Add(o.RendezvousTimeout)
	ln, err := listen(ctx, o.MasterPort, deadline, tick)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	// quit releases the acceptor and hello readers once the rendezvous
	// is over, whichever way.
	quit := make(chan struct{})
	stop := sync.OnceFunc(func() {
		close(quit)
		ln.Close()
	})
	defer stop()
	conns := make(chan net.Conn)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case conns <- c:
			case <-quit:
				c.Close()
				return
			}
		}
	}()
	g := &group{o: o, log: log, peers: map[int]*link{}, events: make(chan peerMsg, 4*o.WorldSize), done: map[int]int64{}}
	fail := func(err error) (*group, error) {
		stop()
		<-acceptDone
		for _, l := range g.peers {
			l.close()
		}
		return nil, err
	}
	hellos := map[int]wire{0: o.hello()}
	handshakes := make(chan handshake)
	log.Info("rendezvous: waiting for the unit's workers", "port", o.MasterPort, "world_size", o.WorldSize, "unit", o.Unit)
	timer := time.NewTicker(time.Second)
	defer timer.Stop()
	for len(g.peers) < o.WorldSize-1 {
		select {
		case c := <-conns:
			go readHello(c, o.PeerTimeout, handshakes, quit)
		case h := <-handshakes:
			if h.err == nil {
				h.err = g.admit(h.hello, hellos)
			}
			if h.err != nil {
				log.Warn("rendezvous: refused a worker", "remote", h.conn.RemoteAddr().String(), "err", h.err)
				if h.hello.Type == msgHello {
					_ = json.NewEncoder(h.conn).Encode(wire{Type: msgError, Error: h.err.Error(), Retry: errors.Is(h.err, errOtherUnit)})
				}
				h.conn.Close()
				continue
			}
			hellos[h.hello.Rank] = h.hello
			g.peers[h.hello.Rank] = newLink(h.hello.Rank, h.conn, h.dec, o.PeerTimeout, g.events)
			log.Info("rendezvous: worker joined", "rank", h.hello.Rank, "node", h.hello.Node, "model", h.hello.Model, "steps_per_sec", h.hello.Pace,
				"joined", len(g.peers)+1, "world_size", o.WorldSize)
		case ev := <-g.events:
			if ev.err != nil {
				// A worker that leaves before the unit starts may come
				// back (Nomad restarts it): it can join again.
				log.Warn("rendezvous: a worker left before the unit started", "rank", ev.rank, "err", ev.err)
				g.peers[ev.rank].close()
				delete(g.peers, ev.rank)
				delete(hellos, ev.rank)
			} else if ev.m.Type == msgLeaving {
				log.Info("rendezvous: a worker was stopped before the unit started", "rank", ev.rank)
				g.peers[ev.rank].close()
				delete(g.peers, ev.rank)
				delete(hellos, ev.rank)
			}
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-timer.C:
			tick()
			if time.Now().After(deadline) {
				var missing []int
				for r := 1; r < o.WorldSize; r++ {
					if _, ok := g.peers[r]; !ok {
						missing = append(missing, r)
					}
				}
				return fail(fmt.Errorf("rendezvous: %d of %d workers joined within %s (missing ranks %v): no step runs on a partial unit; check that they run and reach %s:%d",
					len(g.peers)+1, o.WorldSize, o.RendezvousTimeout, missing, o.MasterAddr, o.MasterPort))
			}
		}
	}
	stop()
	<-acceptDone
	for r := range o.WorldSize {
		g.hellos = append(g.hellos, hellos[r])
	}
	g.pace, g.spread, g.nodes = unitPace(g.hellos)
	g.ownRate = o.StepsPerSec
	if g.spread {
		g.ownRate = o.spreadPace()
	}
	g.batch = syncBatch(o, g.pace)
	start := wire{Type: msgStart, StepsDone: stepsDone, Checkpoint: checkpoint, Spread: g.spread, UnitPace: g.pace, Nodes: g.nodes, WorldSize: o.WorldSize}
	for _, l := range g.peers {
		if err := l.send(start); err != nil {
			g.close()
			return nil, &UnitBroken{Rank: l.rank, Err: err}
		}
	}
	g.gathered = time.Now()
	var paces []string
	for _, h := range g.hellos {
		paces = append(paces, fmt.Sprintf("rank %d %s %s: %g/%g", h.Rank, h.Node, h.Model, h.Pace, h.SpreadPace))
	}
	log.Info("rendezvous: unit complete", "world_size", o.WorldSize, "nodes", g.nodes, "spread", g.spread,
		"unit_steps_per_sec", g.pace, "sync_every", g.batch, "paces", paces)
	return g, nil
}

// handshake is a connection and the hello read from it.
type handshake struct {
	conn  net.Conn
	dec   *json.Decoder
	hello wire
	err   error
}

func readHello(c net.Conn, timeout time.Duration, out chan<- handshake, quit <-chan struct{}) {
	dec := json.NewDecoder(c)
	_ = c.SetReadDeadline(time.Now().Add(min(timeout, helloTimeout)))
	var h wire
	err := dec.Decode(&h)
	if err == nil && h.Type != msgHello {
		err = fmt.Errorf("first message %q, want %q", h.Type, msgHello)
	}
	if err != nil {
		err = fmt.Errorf("rendezvous: reading hello: %w", err)
	}
	select {
	case out <- handshake{conn: c, dec: dec, hello: h, err: err}:
	case <-quit:
		c.Close()
	}
}

// errOtherUnit is a hello of another unit's worker: its own rank 0 may
// be waiting for this unit to end and free the port.
var errOtherUnit = errors.New("a worker of another unit reached this port")

// admit checks a hello against the unit.
func (g *group) admit(h wire, joined map[int]wire) error {
	o := g.o
	switch {
	case h.Version != protocolVersion:
		return fmt.Errorf("protocol version %d, rank 0 speaks %d: run the same hadar-trainer on every worker", h.Version, protocolVersion)
	case h.JobID != o.JobID || h.Unit != o.Unit:
		return fmt.Errorf("job %q unit %d, but this is job %q unit %d: %w", h.JobID, h.Unit, o.JobID, o.Unit, errOtherUnit)
	case h.WorldSize != o.WorldSize:
		return fmt.Errorf("world size %d, but this unit has %d workers", h.WorldSize, o.WorldSize)
	case h.Rank < 1 || h.Rank >= o.WorldSize:
		return fmt.Errorf("rank %d: want 1..%d", h.Rank, o.WorldSize-1)
	}
	if _, dup := joined[h.Rank]; dup {
		return fmt.Errorf("rank %d already joined: two workers were given one rank", h.Rank)
	}
	return nil
}

// take records a message from a rank; it returns the unit's failure, if
// the message is one.
func (g *group) take(ev peerMsg) *UnitBroken {
	switch {
	case ev.err != nil:
		return &UnitBroken{Rank: ev.rank, Err: ev.err}
	case ev.m.Type == msgLeaving:
		return &UnitBroken{Rank: ev.rank, Left: true}
	case ev.m.Type == msgDone:
		g.done[ev.rank] = ev.m.Seq
	}
	return nil
}

// poll takes the messages that arrived without waiting and returns the
// unit's failure, if any: merges and long waits call it so a lost rank is
// noticed before the next barrier.
func (g *group) poll() error {
	for g.failure == nil {
		select {
		case ev := <-g.events:
			g.failure = g.take(ev)
		default:
			return nil
		}
	}
	return g.failure
}

// step announces the next batch of n steps.
func (g *group) step(n, stepsDone int64, checkpoint string) error {
	if err := g.poll(); err != nil {
		return err
	}
	g.seq++
	for r := 1; r < g.o.WorldSize; r++ {
		if err := g.peers[r].send(wire{Type: msgStep, Seq: g.seq, Steps: n, StepsDone: stepsDone, Checkpoint: checkpoint}); err != nil {
			g.failure = &UnitBroken{Rank: r, Err: err}
			return g.failure
		}
	}
	return nil
}

// barrier waits until every rank finished the current batch.
func (g *group) barrier(ctx context.Context, tick func()) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if err := g.poll(); err != nil {
			return err
		}
		all := true
		for r := 1; r < g.o.WorldSize; r++ {
			all = all && g.done[r] >= g.seq
		}
		if all {
			return nil
		}
		select {
		case ev := <-g.events:
			g.failure = g.take(ev)
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			tick()
		}
	}
}

// end sends every rank the unit's end and closes the links.
func (g *group) end(reason string, stepsDone int64, checkpoint, message string) {
	for _, l := range g.peers {
		if err := l.send(wire{Type: msgStop, Reason: reason, StepsDone: stepsDone, Checkpoint: checkpoint, Error: message}); err != nil {
			g.log.Debug("stop not delivered", "rank", l.rank, "err", err)
		}
	}
	var wg sync.WaitGroup
	for _, l := range g.peers {
		wg.Go(l.finish)
	}
	wg.Wait()
}

// close ends the links without a message.
func (g *group) close() {
	for _, l := range g.peers {
		l.close()
	}
}

// waitSignal waits up to grace for ctx (the process's stop signal): a
// worker whose unit broke exits 0 if it was being stopped anyway.
func waitSignal(ctx context.Context, grace time.Duration) bool {
	if ctx.Err() != nil {
		return true
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return true
	case <-t.C:
		return false
	}
}
