package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/internal/hostpath"
)

// Mode is what an agent runs.
type Mode int

const (
	// ModeDev is `nomad agent -dev`: server and client in one process,
	// state in memory; it destroys its allocations when it stops.
	ModeDev Mode = iota
	// ModePersistent is a regular agent with server and client enabled
	// and its state on disk, so Restart keeps jobs and running tasks, as
	// a production client restart does.
	ModePersistent
	// ModeServer is a server only (bootstrap_expect = 1). Join clients to
	// its RPCAddr.
	ModeServer
	// ModeClient is a client only, joining Options.Servers.
	ModeClient
)

// Options describes one agent.
type Options struct {
	// Mode defaults to ModeDev.
	Mode Mode
	// Servers are the RPC addresses ("127.0.0.1:4647") a ModeClient agent
	// joins; Agent.RPCAddr of a ModeServer agent.
	Servers []string
	// Name is the node name; default "hadar-e2e-<pid>-<n>", distinct
	// for every agent of every test binary.
	Name string
	// NomadVersion picks the Nomad release (one of NomadVersions) when
	// NomadBin is empty; default NomadVersion.
	NomadVersion string
	// NomadBin defaults to NomadBinaryVersion(t, NomadVersion).
	NomadBin string
	// PluginDir defaults to PluginDir(t) (hadar-gpu and hadar-train),
	// except for a ModeServer agent, which loads no plugins: it gets none.
	PluginDir string
	// Plugins maps a plugin file name to the body of its config block,
	// e.g. {"hadar-gpu": `gpu { id = "g0" ... }`}. Nomad loads only the
	// plugins named here.
	Plugins map[string]string
	// Meta is the client's node meta.
	Meta map[string]string
	// Drivers are task drivers that must be detected and healthy before
	// StartAgent returns; default: "hadar-train" when Plugins configures
	// it. (Device plugins need no wait: the client registers its node only
	// after their first fingerprint.)
	Drivers []string
	// ExtraConfig is appended to the generated agent.hcl.
	ExtraConfig string
	// StartTimeout bounds the wait for a ready node; default 60s.
	StartTimeout time.Duration
	// ACL enables Nomad's ACLs. A ModeServer agent bootstraps them and
	// keeps the management token (Agent.Token, and its Client uses it); a
	// ModeClient agent needs Token, the management token, for its checks.
	ACL   bool
	Token string
}

// Agent is a running Nomad agent.
type Agent struct {
	// Addr is the HTTP API address, "http://127.0.0.1:<port>".
	Addr string
	// RPCAddr is the RPC address clients join, "127.0.0.1:<port>".
	RPCAddr string
	// Client talks to Addr.
	Client *api.Client
	// NodeID is the client node's ID, once ready (empty for ModeServer).
	NodeID string
	// Token is the management token when Options.ACL is set.
	Token string
	// Version is the Nomad release it runs (Options.NomadVersion); empty
	// when Options.NomadBin was given without a version.
	Version string
	// Dir holds agent.hcl, data/, and agent.log.
	Dir        string
	ConfigFile string
	LogFile    string

	opts  Options
	ports []int
	mu    sync.Mutex
	proc  *agentProc
}

// agentSeq numbers the agents of this test binary for their default names.
var agentSeq atomic.Int64

// agentProc is one run of the agent process.
type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid once done is closed
}

// FreePorts returns n distinct free ports on 127.0.0.1, reserved for this
// process (see reservePorts) so that a test package running beside this
// one cannot be handed the same ports before they are bound.
func FreePorts(n int) ([]int, error) {
	return reservePorts(n)
}

// AgentConfig renders the agent.hcl the harness uses: loopback ports,
// no cloud fingerprinters (they fail without internet), no docker, java
// or qemu, one plugin block per entry of Plugins, and the server and
// client blocks of opts.Mode.
func AgentConfig(opts Options, http, rpc, serf int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name = %q\nbind_addr = \"127.0.0.1\"\ndisable_update_check = true\nlog_level = \"DEBUG\"\n", opts.Name)
	fmt.Fprintf(&b, "ports {\n  http = %d\n  rpc  = %d\n  serf = %d\n}\n", http, rpc, serf)
	if opts.Mode != ModeDev {
		// Outside dev mode Nomad refuses to advertise loopback by default.
		b.WriteString("advertise {\n  http = \"127.0.0.1\"\n  rpc  = \"127.0.0.1\"\n  serf = \"127.0.0.1\"\n}\n")
	}
	if opts.Mode == ModePersistent || opts.Mode == ModeServer {
		b.WriteString("server {\n  enabled          = true\n  bootstrap_expect = 1\n}\n")
	}
	if opts.ACL {
		b.WriteString("acl {\n  enabled = true\n}\n")
	}
	if opts.Mode == ModeServer {
		return b.String() + opts.ExtraConfig
	}
	b.WriteString("client {\n")
	if opts.Mode != ModeDev {
		b.WriteString("  enabled           = true\n  network_interface = \"lo\"\n")
	}
	if opts.Mode == ModeClient {
		quoted := make([]string, len(opts.Servers))
		for i, s := range opts.Servers {
			quoted[i] = fmt.Sprintf("%q", s)
		}
		fmt.Fprintf(&b, "  servers           = [%s]\n", strings.Join(quoted, ", "))
	}
	b.WriteString("  options = {\n    \"fingerprint.denylist\" = \"env_aws,env_gce,env_azure,env_digitalocean\"\n    \"driver.denylist\"      = \"docker,java,qemu\"\n  }\n")
	if len(opts.Meta) > 0 {
		b.WriteString("  meta {\n")
		for _, k := range sortedKeys(opts.Meta) {
			fmt.Fprintf(&b, "    %q = %q\n", k, opts.Meta[k])
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	for _, name := range sortedKeys(opts.Plugins) {
		fmt.Fprintf(&b, "plugin %q {\n  config {\n%s\n  }\n}\n", name, opts.Plugins[name])
	}
	b.WriteString(opts.ExtraConfig)
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// StartAgent starts an agent and waits until its node is ready with the
// drivers of opts healthy; it fails the test otherwise. In t.Cleanup it
// purges the agent's jobs (hadar-train tasks run in their own process
// groups and would outlive the agent), stops the agent, and prints the
// agent log when the test failed.
func StartAgent(t testing.TB, opts Options) *Agent {
	t.Helper()
	a, err := TryStartAgent(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TryStartAgent is StartAgent returning the failure, which includes the
// agent's output when it exited (e.g. a rejected plugin config).
func TryStartAgent(t testing.TB, opts Options) (*Agent, error) {
	t.Helper()
	if opts.NomadBin == "" {
		if opts.NomadVersion == "" {
			opts.NomadVersion = NomadVersion
		}
		opts.NomadBin = NomadBinaryVersion(t, opts.NomadVersion)
	}
	if opts.PluginDir == "" && opts.Mode != ModeServer {
		opts.PluginDir = PluginDir(t)
	}
	return startAgent(t, opts)
}

// host is what an agent needs of whoever started it: a test
// (testing.TB), or a Shared agent's host, which outlives every test.
type host interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
	Failed() bool
	Name() string
}

// startAgent starts an agent for t, with opts.NomadBin (and PluginDir
// unless opts.Mode is ModeServer) set.
func startAgent(t host, opts Options) (*Agent, error) {
	t.Helper()
	if opts.Name == "" {
		opts.Name = fmt.Sprintf("hadar-e2e-%d-%d", os.Getpid(), agentSeq.Add(1))
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if opts.Mode == ModeClient && len(opts.Servers) == 0 {
		return nil, fmt.Errorf("harness: a ModeClient agent needs Options.Servers")
	}
	if opts.Drivers == nil {
		if _, ok := opts.Plugins["hadar-train"]; ok {
			opts.Drivers = []string{"hadar-train"}
		}
	}
	// Short paths: Nomad puts unix sockets under the data dir, and
	// socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "hadar-e2e-")
	if err != nil {
		return nil, err
	}
	registerDir(dir)
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("harness: remove agent directory: %v", err)
		}
	})
	// Tasks that run as another user (hadar-train's default is nobody)
	// must reach their task directory under this one and under the data
	// dir, which Nomad would create private to root.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o711); err != nil {
		return nil, err
	}
	// The agent's TMPDIR, inherited by its plugins, executors and logmon:
	// go-plugin's sockets of a plugin that is killed stay here, removed
	// with the directory, and not in the system's /tmp.
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		return nil, err
	}
	ports, err := reservePorts(3)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := releasePorts(ports); err != nil {
			t.Logf("harness: %v", err)
		}
	})
	a := &Agent{
		ports:      ports,
		Addr:       fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		RPCAddr:    fmt.Sprintf("127.0.0.1:%d", ports[1]),
		Dir:        dir,
		ConfigFile: filepath.Join(dir, "agent.hcl"),
		LogFile:    filepath.Join(dir, "agent.log"),
		opts:       opts,
	}
	if opts.NomadVersion != "" && opts.NomadBin != "" {
		a.Version = opts.NomadVersion
	}
	cfg := AgentConfig(opts, ports[0], ports[1], ports[2])
	if err := os.WriteFile(a.ConfigFile, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	if a.Client, err = api.NewClient(&api.Config{Address: a.Addr, SecretID: opts.Token}); err != nil {
		return nil, err
	}
	a.Token = opts.Token
	t.Cleanup(func() {
		if t.Failed() {
			a.dumpLog(t)
			a.keepLogs(t)
		}
	})
	t.Cleanup(func() {
		a.stop(t, true)
		a.removeLeftovers(t)
	})
	if err := a.start(); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *Agent) start() error {
	logf, err := os.OpenFile(a.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := []string{"agent", "-config", a.ConfigFile, "-data-dir", filepath.Join(a.Dir, "data")}
	if a.opts.PluginDir != "" {
		args = append(args, "-plugin-dir", a.opts.PluginDir)
	}
	if a.opts.Mode == ModeDev {
		args = append(args, "-dev", "-bind", "127.0.0.1")
	}
	p := &agentProc{cmd: exec.Command(a.opts.NomadBin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = append(os.Environ(), RunEnv+"="+runID(), agentDirEnv+"="+a.Dir, "TMPDIR="+filepath.Join(a.Dir, "tmp"))
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start nomad agent: %w", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	a.mu.Lock()
	a.proc = p
	a.mu.Unlock()
	return a.waitReady(p)
}

func (a *Agent) waitReady(p *agentProc) error {
	var exited bool
	// Stop waiting as soon as the agent exits.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := Eventually(ctx, a.opts.StartTimeout, 250*time.Millisecond, func() error {
		select {
		case <-p.done:
			exited = true
			return fmt.Errorf("agent exited: %v", p.err)
		default:
		}
		if a.opts.Mode == ModeServer {
			leader, err := a.Client.Status().Leader()
			if err != nil || leader == "" {
				return fmt.Errorf("no leader yet (%v)", err)
			}
			if a.opts.ACL && a.Token == "" {
				tok, _, err := a.Client.ACLTokens().Bootstrap(nil)
				if err != nil {
					return fmt.Errorf("bootstrap ACLs: %w", err)
				}
				a.Token = tok.SecretID
				a.Client.SetSecretID(tok.SecretID)
			}
			// A freshly elected server refuses variable writes until its
			// keyring is initialised ("keyring has not been initialized
			// yet"): the sidecar's state and lock live there.
			probe := &api.Variable{Path: "hadar-harness/ready", Items: api.VariableItems{"ready": "1"}}
			if _, _, err := a.Client.Variables().Create(probe, nil); err != nil {
				return fmt.Errorf("variables not writable yet: %w", err)
			}
			if _, err := a.Client.Variables().Delete(probe.Path, nil); err != nil {
				return fmt.Errorf("variables: delete the probe: %w", err)
			}
			return nil
		}
		// A client's own HTTP API answers for the whole cluster: find this
		// agent's node by name.
		nodes, _, err := a.Client.Nodes().List(nil)
		if err != nil {
			return err
		}
		var n *api.NodeListStub
		for _, x := range nodes {
			if x.Name == a.opts.Name {
				n = x
			}
		}
		if n == nil {
			return fmt.Errorf("node %s not registered yet", a.opts.Name)
		}
		if n.Status != "ready" {
			return fmt.Errorf("node %s is %s", n.Name, n.Status)
		}
		node, _, err := a.Client.Nodes().Info(n.ID, nil)
		if err != nil {
			return err
		}
		for _, d := range a.opts.Drivers {
			if info, ok := node.Drivers[d]; !ok || !info.Detected || !info.Healthy {
				return fmt.Errorf("driver %s not healthy on node %s yet", d, n.Name)
			}
		}
		a.NodeID = n.ID
		return nil
	})
	if err == nil {
		return nil
	}
	if !exited {
		select {
		case <-p.done:
			exited = true
		default:
		}
	}
	if exited {
		b, _ := os.ReadFile(a.LogFile)
		return fmt.Errorf("nomad agent exited before its node was ready: %v\n%s", p.err, tail(b, 8<<10))
	}
	return fmt.Errorf("nomad agent not ready within %v: %w", a.opts.StartTimeout, err)
}

// Restart stops the agent without touching its jobs and starts it again
// with the same config and data dir, as an operator restarting a client
// would; with ModePersistent or ModeClient, running tasks must survive it.
func (a *Agent) Restart(t testing.TB) {
	t.Helper()
	a.stop(t, false)
	if err := a.start(); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

// Exited is closed when the current agent process ends.
func (a *Agent) Exited() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc.done
}

func (a *Agent) stop(t host, purge bool) {
	a.mu.Lock()
	p := a.proc
	a.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	if purge {
		a.purgeJobs(t)
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("harness: nomad agent %s did not stop within 20s of SIGINT; killing its process group", a.opts.Name)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// purgeJobs stops every job, waits until their allocations are terminal
// (so each task was stopped through its driver), garbage-collects this
// client's allocations, and then purges the jobs. Purging at once would
// drop the allocations from the state while their tasks still run.
func (a *Agent) purgeJobs(t host) {
	// Every namespace: a test may run jobs outside the default one.
	all := &api.QueryOptions{Namespace: "*"}
	jobs, _, err := a.Client.Jobs().List(all)
	if err != nil {
		t.Logf("cleanup: list jobs: %v", err)
		return
	}
	for _, j := range jobs {
		_, _, _ = a.Client.Jobs().Deregister(j.ID, false, &api.WriteOptions{Namespace: j.Namespace})
	}
	var allocs []*api.AllocationListStub
	err = Eventually(context.Background(), 60*time.Second, 250*time.Millisecond, func() error {
		var err error
		if allocs, _, err = a.Client.Allocations().List(all); err != nil {
			return err
		}
		for _, al := range allocs {
			if al.ClientStatus == api.AllocClientStatusRunning || al.ClientStatus == api.AllocClientStatusPending {
				return fmt.Errorf("alloc %s still %s", al.ID, al.ClientStatus)
			}
		}
		return nil
	})
	if err != nil {
		t.Logf("cleanup: %v", err)
	}
	a.collectAllocs(t, allocs)
	for _, j := range jobs {
		_, _, _ = a.Client.Jobs().Deregister(j.ID, true, &api.WriteOptions{Namespace: j.Namespace})
	}
}

// collectAllocs garbage-collects this client's terminal allocations and
// waits until their directories' mounts (secrets/ and private/ are tmpfs
// mounts when Nomad runs as root) and task cgroups are gone. An agent
// that stops before it has destroyed its allocations leaves both behind.
func (a *Agent) collectAllocs(t host, allocs []*api.AllocationListStub) {
	var ids []string
	for _, al := range allocs {
		ids = append(ids, al.ID)
	}
	registerAllocs(ids)
	if a.NodeID == "" {
		return
	}
	var mine []string
	for _, al := range allocs {
		if al.NodeID != a.NodeID {
			continue
		}
		mine = append(mine, al.ID)
		// The endpoint answers with an empty body, which the API client
		// reports as EOF.
		if err := a.Client.Allocations().GC(&api.Allocation{ID: al.ID, NodeID: al.NodeID}, nil); err != nil && !errors.Is(err, io.EOF) {
			t.Logf("cleanup: gc allocation %s: %v", al.ID, err)
		}
	}
	err := Eventually(context.Background(), 30*time.Second, 250*time.Millisecond, func() error {
		if m := hostpath.MountsUnder([]string{a.Dir}); len(m) > 0 {
			return fmt.Errorf("%d mounts left, e.g. %s", len(m), m[0].Point)
		}
		if cg := allocCgroups(mine); len(cg) > 0 {
			return fmt.Errorf("%d task cgroups left, e.g. %s", len(cg), cg[0])
		}
		return nil
	})
	if err != nil {
		t.Logf("cleanup: garbage collection on node %s: %v", a.opts.Name, err)
		a.unmountCollected(t, mine)
	}
}

// unmountCollected unmounts what is left mounted in the directories of
// allocations this client has collected, where nothing holds it any more.
// Nomad's destroy hook unmounts an allocation's secrets/ once and never
// again: one that found the mount busy for an instant ("error running
// destroy hooks ... unmount: device or resource busy", make test run 37,
// two suites on 2 cores) leaves it mounted for good, as it would on any
// node. Nothing of hadar's opens secrets/; a mount still held by a
// process stays busy here and is reported as left behind.
func (a *Agent) unmountCollected(t host, ids []string) {
	for _, m := range hostpath.MountsUnder([]string{a.Dir}) {
		for _, id := range ids {
			if !hostpath.Under(m.Point, []string{filepath.Join(a.Dir, "data", "alloc", id)}) {
				continue
			}
			if err := syscall.Unmount(m.Point, 0); err != nil {
				t.Logf("cleanup: %s, left mounted by Nomad: %v", m.Point, err)
			} else {
				t.Logf("cleanup: unmounted %s (%s), which Nomad's destroy hook left mounted: nothing holds it now", m.Point, m.FSType)
			}
		}
	}
}

// removeLeftovers fails the test for whatever the stopped agent left
// behind (processes of its process group, tasks and executors of its
// allocations, mounts under its directory), then removes it.
func (a *Agent) removeLeftovers(t host) {
	a.mu.Lock()
	p := a.proc
	a.mu.Unlock()
	if p == nil {
		return
	}
	pgid := p.cmd.Process.Pid
	var leaks []leak
	find := func() []leak {
		ls := scanProcesses(func(pi procInfo) string {
			switch {
			case pi.pgid == pgid:
				return "in the agent's process group"
			case pi.env[agentDirEnv] == a.Dir:
				return "started by the agent"
			case hostpath.Under(pi.cwd, []string{a.Dir}), hostpath.Under(pi.env["NOMAD_ALLOC_DIR"], []string{a.Dir}):
				return "task of the agent"
			}
			return ""
		})
		for _, m := range hostpath.MountsUnder([]string{a.Dir}) {
			ls = append(ls, leak{kind: leakMount, path: m.Point, desc: m.FSType})
		}
		return ls
	}
	// Plugins notice their agent is gone within a second or two.
	_ = Eventually(context.Background(), 10*time.Second, 200*time.Millisecond, func() error {
		if leaks = find(); len(leaks) > 0 {
			return fmt.Errorf("%d left", len(leaks))
		}
		return nil
	})
	if len(leaks) == 0 {
		return
	}
	var b strings.Builder
	for _, l := range leaks {
		fmt.Fprintf(&b, "\n  %s", l)
	}
	t.Errorf("harness: nomad agent %s left %d things behind after it stopped (now removed):%s", a.opts.Name, len(leaks), b.String())
	removeLeaks(leaks)
}

// dumpLog prints the end of the agent log into the test output.
func (a *Agent) dumpLog(t host) {
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Logf("agent log %s: %v", a.LogFile, err)
		return
	}
	b = tail(b, 64<<10)
	t.Logf("nomad agent log (%s, last %d bytes):\n%s", a.LogFile, len(b), b)
}

// LogDirEnv names the folder where the logs of a failed test's agents
// are kept; default <repository>/out/e2e-logs.
const LogDirEnv = "HADAR_E2E_LOGS"

// LogDir is the folder where a test's kept logs go:
// <HADAR_E2E_LOGS or <repository>/out/e2e-logs>/<test>.
func LogDir(t host) (string, error) {
	root := os.Getenv(LogDirEnv)
	if root == "" {
		repo, err := hostpath.RepoRoot()
		if err != nil {
			return "", err
		}
		root = filepath.Join(repo, "out", "e2e-logs")
	}
	return filepath.Join(root, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())), nil
}

// KeepLog writes b to name under the test's LogDir, for a log that
// Nomad may collect before the test ends (a failed task's stderr).
func KeepLog(t host, name string, b []byte) {
	dir, err := LogDir(t)
	if err == nil {
		path := filepath.Join(dir, name)
		if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			if err = os.WriteFile(path, b, 0o644); err == nil {
				t.Logf("harness: kept %s", path)
				return
			}
		}
	}
	t.Logf("harness: keep %s: %v", name, err)
}

// keepLogs copies the agent log and its tasks' logs (stdout, stderr,
// executor.out) into <log folder>/<test>/<agent name>/, which outlives
// the agent's temporary directory.
func (a *Agent) keepLogs(t host) {
	dir, err := LogDir(t)
	if err != nil {
		t.Logf("harness: keep logs: %v", err)
		return
	}
	dest := filepath.Join(dir, a.opts.Name)
	var copied int
	err = filepath.WalkDir(a.Dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil // a directory removed meanwhile, or unreadable: skip it
		}
		rel, _ := filepath.Rel(a.Dir, path)
		keep := path == a.LogFile || path == a.ConfigFile ||
			strings.Contains(rel, "/alloc/logs/") || filepath.Base(path) == "executor.out"
		if !keep || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		out := filepath.Join(dest, rel)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		copied++
		return os.WriteFile(out, b, 0o644)
	})
	if err != nil {
		t.Logf("harness: keep logs in %s: %v", dest, err)
		return
	}
	t.Logf("harness: kept %d log files of agent %s in %s", copied, a.opts.Name, dest)
}

func tail(b []byte, max int) []byte {
	if len(b) <= max {
		return b
	}
	b = b[len(b)-max:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return b
}

// ErrTimeout is wrapped by Eventually's error when no attempt succeeded.
var ErrTimeout = errors.New("timed out")

// Eventually calls f every interval until it returns nil, ctx ends, or
// timeout passes; it then returns f's last error, wrapping ErrTimeout.
func Eventually(ctx context.Context, timeout, interval time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, err)
		case <-t.C:
		}
	}
}

// SharedDir returns a new temporary directory that tasks running as
// another user can reach (hadar-train runs tasks as nobody by default),
// for a checkpoint_root or merge_root; t.TempDir's parent is private to
// root. It is removed when the test ends.
func SharedDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hadar-e2e-shared-")
	if err != nil {
		t.Fatal(err)
	}
	registerDir(dir)
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("harness: remove shared directory: %v", err)
		}
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
