package nodesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/nomad/helper/pool"
	"github.com/hashicorp/nomad/helper/uuid"
	"github.com/hashicorp/nomad/nomad/structs"
	psstructs "github.com/hashicorp/nomad/plugins/shared/structs"
	"github.com/hashicorp/nomad/version"
	"github.com/hashicorp/yamux"

	cstructs "github.com/hashicorp/nomad/client/structs"
)

// Shape of every simulated node besides its GPUs: large enough that CPU,
// memory and disk never limit placement, so GPUs are what is scheduled.
const (
	nodeCPUShares = 64000 // MHz
	nodeCores     = 32
	nodeMemoryMB  = 256 * 1024
	nodeDiskMB    = 1024 * 1024
)

// node is one simulated client node.
type node struct {
	sim    *Simulator
	spec   NodeSpec
	n      *structs.Node
	pool   *pool.ConnPool
	server net.Addr

	mu      sync.Mutex
	allocs  map[string]*allocRec           // allocations Nomad lists for the node
	pending map[string]*structs.Allocation // client updates not yet sent
}

// allocRec is what the node keeps of one allocation.
type allocRec struct {
	modifyIndex uint64
	task        string
	state       *structs.TaskState
	status      string // client status last reported
}

func newNode(s *Simulator, spec NodeSpec, server net.Addr, dc string) *node {
	nd := &node{sim: s, spec: spec, server: server, allocs: map[string]*allocRec{}, pending: map[string]*structs.Allocation{}}
	nd.n = buildNode(spec, dc, s.cfg.Driver)
	// One pool, so one multiplexed connection, per node: the server maps a
	// node to the connection its RPCs came in on and forwards
	// FileSystem.Stream (the progress reads) over it.
	nd.pool = pool.NewPool(s.log.Named("pool"), 0, 2, nil, yamux.DefaultConfig())
	return nd
}

// buildNode is the node as a client would register it.
func buildNode(spec NodeSpec, dc, driver string) *structs.Node {
	attrs := map[string]string{
		"kernel.name": "linux",
		"os.name":     "nodesim",
		// What a Linux client's signal fingerprint reports: Nomad adds a
		// constraint on it for every task with a kill_signal.
		"os.signals":                "SIGABRT,SIGALRM,SIGBUS,SIGCHLD,SIGCONT,SIGFPE,SIGHUP,SIGILL,SIGINT,SIGIO,SIGIOT,SIGKILL,SIGPIPE,SIGPROF,SIGQUIT,SIGSEGV,SIGSTOP,SIGSYS,SIGTERM,SIGTRAP,SIGTSTP,SIGTTIN,SIGTTOU,SIGURG,SIGUSR1,SIGUSR2,SIGVTALRM,SIGWINCH,SIGXCPU,SIGXFSZ",
		"cpu.arch":                  "amd64",
		"arch":                      "amd64",
		"cpu.numcores":              strconv.Itoa(nodeCores),
		"cpu.totalcompute":          strconv.Itoa(nodeCPUShares),
		"memory.totalbytes":         strconv.FormatInt(nodeMemoryMB<<20, 10),
		"nomad.version":             version.Version,
		"nomad.advertise.address":   spec.Address + ":4646",
		"unique.hostname":           spec.Name,
		"unique.network.ip-address": spec.Address,
		"driver." + driver:          "1",
	}
	cores := make([]uint16, nodeCores)
	for i := range cores {
		cores[i] = uint16(i)
	}
	res := &structs.NodeResources{
		Cpu:    structs.LegacyNodeCpuResources{CpuShares: nodeCPUShares, TotalCpuCores: nodeCores, ReservableCpuCores: cores},
		Memory: structs.NodeMemoryResources{MemoryMB: nodeMemoryMB},
		Disk:   structs.NodeDiskResources{DiskMB: nodeDiskMB},
		Networks: []*structs.NetworkResource{{
			Mode: "host", Device: "eth0", IP: spec.Address, CIDR: spec.Address + "/32", MBits: 10000,
		}},
		NodeNetworks: []*structs.NodeNetworkResource{{
			Mode: "host", Device: "eth0", Speed: 10000,
			Addresses: []structs.NodeNetworkAddress{{Family: structs.NodeNetworkAF_IPv4, Alias: "default", Address: spec.Address}},
		}},
		MinDynamicPort: 20000,
		MaxDynamicPort: 32000,
	}
	for gi, g := range spec.GPUs {
		d := &structs.NodeDeviceResource{
			Vendor: "nvidia", Type: "gpu", Name: g.Model,
			Attributes: map[string]*psstructs.Attribute{
				"memory":       psstructs.NewIntAttribute(g.MemoryMiB, psstructs.UnitMiB),
				"source":       psstructs.NewStringAttribute("declared"),
				"healthy_gpus": psstructs.NewIntAttribute(int64(g.Count), ""),
			},
		}
		for i := range g.Count {
			d.Instances = append(d.Instances, &structs.NodeDevice{ID: fmt.Sprintf("%s-g%d-%d", spec.Name, gi, i), Healthy: true})
		}
		res.Devices = append(res.Devices, d)
	}
	res.Compatibility()
	n := &structs.Node{
		ID:         uuid.Generate(),
		SecretID:   uuid.Generate(),
		Datacenter: dc,
		Name:       spec.Name,
		HTTPAddr:   spec.Address + ":4646",
		Attributes: attrs,
		Drivers: map[string]*structs.DriverInfo{driver: {
			Detected: true, Healthy: true, HealthDescription: "Healthy", UpdateTime: time.Now(),
			Attributes: map[string]string{"driver." + driver: "true"},
		}},
		NodeResources: res,
		ReservedResources: &structs.NodeReservedResources{
			Networks: structs.NodeReservedNetworkResources{ReservedHostPorts: "22"},
		},
		Meta:                  map[string]string{"rack": spec.Rack},
		NodePool:              structs.NodePoolDefault,
		Status:                structs.NodeStatusInit,
		SchedulingEligibility: structs.NodeSchedulingEligible,
	}
	_ = n.ComputeClass()
	return n
}

// rpc calls the node's server over its own connection.
func (nd *node) rpc(method string, args, reply any) error {
	err := nd.pool.RPC(nd.sim.cfg.Region, nd.server, method, args, reply)
	nd.sim.count(func(s *Stats) {
		s.RPCs++
		if err != nil {
			s.RPCErrors++
		}
	})
	if err != nil {
		return fmt.Errorf("node %s: %s: %w", nd.spec.Name, method, err)
	}
	return nil
}

func (nd *node) write() structs.WriteRequest {
	return structs.WriteRequest{Region: nd.sim.cfg.Region, AuthToken: nd.n.SecretID}
}

// register registers the node and marks it ready, as a client does once
// fingerprinted; it returns the heartbeat TTL the server asks for.
func (nd *node) register() (time.Duration, error) {
	var reg structs.NodeUpdateResponse
	if err := nd.rpc("Node.Register", &structs.NodeRegisterRequest{Node: nd.n, WriteRequest: structs.WriteRequest{Region: nd.sim.cfg.Region}}, &reg); err != nil {
		return 0, err
	}
	return nd.heartbeat()
}

// heartbeat reports the node ready; the reply carries the next TTL.
func (nd *node) heartbeat() (time.Duration, error) {
	var resp structs.NodeUpdateResponse
	req := &structs.NodeUpdateStatusRequest{NodeID: nd.n.ID, Status: structs.NodeStatusReady, UpdatedAt: time.Now().Unix(), WriteRequest: nd.write()}
	if err := nd.rpc("Node.UpdateStatus", req, &resp); err != nil {
		return 0, err
	}
	return resp.HeartbeatTTL, nil
}

// heartbeats keeps the node alive: a heartbeat at half the TTL, so one
// late reply never lets the server mark it down. A node the server forgot
// (its state was lost) registers again.
func (nd *node) heartbeats(ctx context.Context, ttl time.Duration) {
	for {
		wait := max(ttl/2, time.Second)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		next, err := nd.heartbeat()
		if err != nil && strings.Contains(err.Error(), "not found") {
			next, err = nd.register()
		}
		if err != nil {
			if ctx.Err() == nil {
				nd.sim.log.Warn("heartbeat failed; retrying", "node", nd.spec.Name, "error", err)
			}
			ttl = 2 * time.Second
			continue
		}
		ttl = next
	}
}

// watch follows the allocations Nomad lists for the node, as a client's
// watchAllocations does: a blocking Node.GetClientAllocs for the modify
// index of each, then Alloc.GetAllocs for the new and changed ones.
func (nd *node) watch(ctx context.Context) {
	req := structs.NodeSpecificRequest{NodeID: nd.n.ID, SecretID: nd.n.SecretID,
		QueryOptions: structs.QueryOptions{Region: nd.sim.cfg.Region, AuthToken: nd.n.SecretID}}
	retry := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
			return true
		}
	}
	for ctx.Err() == nil {
		var resp structs.NodeClientAllocsResponse
		if err := nd.rpc("Node.GetClientAllocs", &req, &resp); err != nil {
			if ctx.Err() == nil {
				nd.sim.log.Warn("listing the node's allocations failed; retrying", "error", err)
			}
			if !retry() {
				return
			}
			continue
		}
		if resp.Index <= req.MinQueryIndex {
			continue // the blocking query timed out with nothing new
		}
		var pull []string
		var pullIndex uint64
		nd.mu.Lock()
		for id, idx := range resp.Allocs {
			if rec := nd.allocs[id]; rec == nil || idx > rec.modifyIndex {
				pull = append(pull, id)
				pullIndex = max(pullIndex, idx)
			}
		}
		var gone []string
		for id := range nd.allocs {
			if _, ok := resp.Allocs[id]; !ok {
				gone = append(gone, id)
				delete(nd.allocs, id)
			}
		}
		nd.mu.Unlock()
		for _, id := range gone {
			nd.sim.world.forget(id)
		}
		if len(pull) > 0 {
			areq := structs.AllocsGetRequest{AllocIDs: pull, QueryOptions: structs.QueryOptions{
				Region: nd.sim.cfg.Region, AllowStale: true, MinQueryIndex: pullIndex - 1, AuthToken: nd.n.SecretID}}
			var aresp structs.AllocsGetResponse
			if err := nd.rpc("Alloc.GetAllocs", &areq, &aresp); err != nil {
				if ctx.Err() == nil {
					nd.sim.log.Warn("reading the node's allocations failed; retrying", "error", err)
				}
				if !retry() {
					return
				}
				continue
			}
			for _, a := range aresp.Allocs {
				nd.apply(a)
			}
			if len(aresp.Allocs) < len(pull) {
				// A stale server: ask again from the same index.
				if !retry() {
					return
				}
				continue
			}
		}
		req.MinQueryIndex = resp.Index
	}
}

// apply acts on one allocation as Nomad now wants it.
func (nd *node) apply(a *structs.Allocation) {
	nd.mu.Lock()
	rec := nd.allocs[a.ID]
	known := rec != nil
	if !known {
		rec = &allocRec{}
		nd.allocs[a.ID] = rec
	}
	rec.modifyIndex = a.AllocModifyIndex
	terminal := rec.status == structs.AllocClientStatusComplete || rec.status == structs.AllocClientStatusFailed
	nd.mu.Unlock()
	nd.sim.count(func(s *Stats) { s.AllocUpdates++ })
	switch {
	case terminal:
	case a.ServerTerminalStatus() || a.ClientTerminalStatus():
		if known {
			nd.sim.world.stop(a.ID)
		} else if !a.ClientTerminalStatus() {
			// Stopped before it ever reached the node.
			nd.report(a.ID, "", "complete", "stopped before it started")
		}
	case !known:
		nd.startAlloc(a)
	}
}

// startAlloc starts a new allocation's training task.
func (nd *node) startAlloc(a *structs.Allocation) {
	nd.sim.count(func(s *Stats) { s.Allocs++ })
	ti, err := nd.taskInfo(a)
	if err != nil {
		nd.sim.log.Warn("allocation cannot run here", "alloc", a.ID, "error", err)
		nd.report(a.ID, ti.task, "failed", err.Error())
		return
	}
	nd.mu.Lock()
	nd.allocs[a.ID].task = ti.task
	nd.mu.Unlock()
	ti.Report = func(status, desc string) { nd.report(a.ID, ti.task, status, desc) }
	nd.sim.world.start(ti.taskInfo)
}

type namedTask struct {
	taskInfo
	task string
}

// taskInfo reads what the simulated task needs from the allocation: the
// task of the simulator's driver, its GPU, its unit, the job's steps and
// throughputs (task config total_steps, steps_per_sec and
// spread_steps_per_sec, by GPU model).
func (nd *node) taskInfo(a *structs.Allocation) (namedTask, error) {
	ti := namedTask{taskInfo: taskInfo{Alloc: a.ID, Node: nd.spec.Name, Group: a.TaskGroup}}
	if a.Job == nil {
		return ti, errors.New("allocation carries no job")
	}
	ti.Job = jobKey{Namespace: a.Namespace, ID: a.JobID, Create: a.Job.CreateIndex}
	tg := a.Job.LookupTaskGroup(a.TaskGroup)
	if tg == nil {
		return ti, fmt.Errorf("job %s has no task group %q", a.JobID, a.TaskGroup)
	}
	var t *structs.Task
	for _, x := range tg.Tasks {
		if x.Driver == nd.sim.cfg.Driver {
			t = x
			break
		}
	}
	if t == nil {
		return ti, fmt.Errorf("group %q has no task of driver %q", a.TaskGroup, nd.sim.cfg.Driver)
	}
	ti.task = t.Name
	if a.AllocatedResources != nil {
		if tr := a.AllocatedResources.Tasks[t.Name]; tr != nil {
			for _, d := range tr.Devices {
				if d != nil && d.Type == "gpu" {
					ti.Model = d.Name
					break
				}
			}
		}
	}
	// A unit: the workers hadar placed together (its env), else the task
	// group's allocations.
	ti.Unit, ti.Size = "group/"+a.TaskGroup, tg.Count
	if u, ok := t.Env["HADAR_UNIT"]; ok {
		size, err := strconv.Atoi(t.Env["WORLD_SIZE"])
		if err != nil || size <= 0 {
			return ti, fmt.Errorf("task %q: HADAR_UNIT %s with WORLD_SIZE %q: want a positive number of workers", t.Name, u, t.Env["WORLD_SIZE"])
		}
		ti.Unit, ti.Size = "hadar/"+u, size
	}
	steps, err := number(t.Config["total_steps"])
	if err != nil || steps <= 0 {
		return ti, fmt.Errorf("task %q: config total_steps %v: want a positive number of steps", t.Name, t.Config["total_steps"])
	}
	ti.TotalSteps = steps
	if ti.Rates, err = figures(t.Config["steps_per_sec"]); err != nil || len(ti.Rates) == 0 {
		return ti, fmt.Errorf("task %q: config steps_per_sec: want a map of GPU model to steps per second (%v)", t.Name, err)
	}
	if ti.Spread, err = figures(t.Config["spread_steps_per_sec"]); err != nil {
		return ti, fmt.Errorf("task %q: config spread_steps_per_sec: %w", t.Name, err)
	}
	return ti, nil
}

// number reads a numeric config value as msgpack or JSON decoded it.
func number(v any) (float64, error) {
	switch x := v.(type) {
	case float64:
		return x, nil
	case float32:
		return float64(x), nil
	case int64:
		return float64(x), nil
	case uint64:
		return float64(x), nil
	case int:
		return float64(x), nil
	case string:
		return strconv.ParseFloat(x, 64)
	}
	return 0, fmt.Errorf("%v (%T): not a number", v, v)
}

// figures reads a model -> steps/s map; HCL may hand it over wrapped in a
// one-element list.
func figures(v any) (map[string]float64, error) {
	if v == nil {
		return nil, nil
	}
	if l, ok := v.([]any); ok && len(l) == 1 {
		v = l[0]
	}
	out := map[string]float64{}
	switch m := v.(type) {
	case map[string]any:
		for k, x := range m {
			f, err := number(x)
			if err != nil || f < 0 {
				return nil, fmt.Errorf("%q = %v: want steps per second >= 0", k, x)
			}
			out[k] = f
		}
	case map[any]any:
		for k, x := range m {
			f, err := number(x)
			if err != nil || f < 0 {
				return nil, fmt.Errorf("%v = %v: want steps per second >= 0", k, x)
			}
			out[fmt.Sprint(k)] = f
		}
	default:
		return nil, fmt.Errorf("%T: want a map", v)
	}
	return out, nil
}

// report queues the allocation's new client status for the next batch
// sent to the server (a client sends its updates every 200 ms).
func (nd *node) report(alloc, task, status, desc string) {
	now := time.Now()
	nd.mu.Lock()
	defer nd.mu.Unlock()
	rec := nd.allocs[alloc]
	if rec == nil {
		rec = &allocRec{}
		nd.allocs[alloc] = rec
	}
	if rec.status == status {
		return
	}
	rec.status = status
	if task != "" {
		if rec.state == nil {
			rec.state = &structs.TaskState{State: structs.TaskStatePending}
			rec.state.Events = append(rec.state.Events, structs.NewTaskEvent(structs.TaskReceived))
		}
		st := rec.state
		switch status {
		case structs.AllocClientStatusRunning:
			st.State, st.StartedAt = structs.TaskStateRunning, now
			st.Events = append(st.Events, structs.NewTaskEvent(structs.TaskStarted))
		case structs.AllocClientStatusComplete:
			if st.StartedAt.IsZero() {
				st.StartedAt = now
			}
			st.State, st.FinishedAt = structs.TaskStateDead, now
			st.Events = append(st.Events, structs.NewTaskEvent(structs.TaskTerminated).SetExitCode(0).SetMessage(desc))
		case structs.AllocClientStatusFailed:
			st.State, st.Failed, st.FinishedAt = structs.TaskStateDead, true, now
			st.Events = append(st.Events, structs.NewTaskEvent(structs.TaskTerminated).SetExitCode(1).SetMessage(desc).SetFailsTask())
		}
	}
	up := &structs.Allocation{ID: alloc, NodeID: nd.n.ID, ClientStatus: status, ClientDescription: desc}
	if rec.state != nil && task != "" {
		up.TaskStates = map[string]*structs.TaskState{task: rec.state.Copy()}
	}
	nd.pending[alloc] = up
	nd.sim.dirty(nd)
}

// flush sends the queued updates in one Node.UpdateAlloc; on failure they
// go back to the queue unless a newer one replaced them.
func (nd *node) flush() {
	nd.mu.Lock()
	if len(nd.pending) == 0 {
		nd.mu.Unlock()
		return
	}
	batch := nd.pending
	nd.pending = map[string]*structs.Allocation{}
	nd.mu.Unlock()
	ups := make([]*structs.Allocation, 0, len(batch))
	for _, a := range batch {
		ups = append(ups, a)
	}
	var resp structs.GenericResponse
	err := nd.rpc("Node.UpdateAlloc", &structs.AllocUpdateRequest{Alloc: ups, WriteRequest: nd.write()}, &resp)
	if err == nil {
		nd.sim.count(func(s *Stats) { s.UpdatesSent += uint64(len(ups)) })
		return
	}
	nd.sim.log.Warn("sending allocation updates failed; retrying", "node", nd.spec.Name, "error", err)
	nd.mu.Lock()
	for id, a := range batch {
		if _, newer := nd.pending[id]; !newer {
			nd.pending[id] = a
		}
	}
	nd.mu.Unlock()
	nd.sim.dirty(nd)
}

// serve answers the RPCs the server makes to the node over its
// connection: FileSystem.Stream, which /v1/client/fs/cat turns into, for
// the training progress file. Other client RPCs are answered with an
// error, as a client that lacks them would.
func (nd *node) serve(ctx context.Context, conns <-chan *pool.Conn) {
	for {
		select {
		case <-ctx.Done():
			return
		case c, ok := <-conns:
			if !ok {
				return
			}
			go nd.accept(c)
		}
	}
}

func (nd *node) accept(c *pool.Conn) {
	for {
		s, err := c.AcceptStream()
		if err != nil {
			return // the connection closed; a new one comes through conns
		}
		go nd.handle(s)
	}
}

func (nd *node) handle(s net.Conn) {
	defer s.Close()
	b := make([]byte, 1)
	if _, err := io.ReadFull(s, b); err != nil {
		return
	}
	switch pool.RPCType(b[0]) {
	case pool.RpcNomad:
		// No client endpoints: net/rpc answers "can't find service".
		_ = rpc.NewServer().ServeRequest(pool.NewServerCodec(s))
	case pool.RpcStreaming:
		nd.stream(s)
	}
}

// progressFile is the path of the training progress file under a task's
// directory (sidecar/watch DefaultProgressPath without "{task}/").
const progressFileName = "local/hadar-progress.json"

func (nd *node) stream(s net.Conn) {
	dec := codec.NewDecoder(s, structs.MsgpackHandle)
	enc := codec.NewEncoder(s, structs.MsgpackHandle)
	var hdr structs.StreamingRpcHeader
	if err := dec.Decode(&hdr); err != nil {
		return
	}
	if hdr.Method != "FileSystem.Stream" {
		_ = enc.Encode(structs.StreamingRpcAck{Error: fmt.Sprintf("nodesim: unknown streaming RPC %q", hdr.Method)})
		return
	}
	if err := enc.Encode(structs.StreamingRpcAck{}); err != nil {
		return
	}
	var req cstructs.FsStreamRequest
	if err := dec.Decode(&req); err != nil {
		return
	}
	nd.sim.count(func(s *Stats) { s.ProgressReads++ })
	fail := func(code int64, err error) {
		_ = enc.Encode(cstructs.StreamErrWrapper{Error: cstructs.NewRpcError(err, &code)})
	}
	nd.mu.Lock()
	rec := nd.allocs[req.AllocID]
	nd.mu.Unlock()
	if rec == nil || rec.task == "" {
		fail(404, fmt.Errorf("unknown allocation %q on node %s", req.AllocID, nd.spec.Name))
		return
	}
	if req.Path != rec.task+"/"+progressFileName {
		fail(400, fmt.Errorf("stat %s: no such file or directory (a simulated task has only %s/%s)", req.Path, rec.task, progressFileName))
		return
	}
	p, err := nd.sim.world.progress(req.AllocID)
	if err != nil {
		fail(404, err)
		return
	}
	if req.Offset > 0 && req.Offset < int64(len(p)) {
		p = p[req.Offset:]
	}
	if req.Limit > 0 && req.Limit < int64(len(p)) {
		p = p[:req.Limit]
	}
	_ = enc.Encode(cstructs.StreamErrWrapper{Payload: p})
}
