package harness

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/internal/hostpath"
)

// TestNomadVersionPinned keeps each Nomad release the harness builds and
// its wrapper module and make target in step: the binaries are rebuilt by
// version, and the module decides what is built.
func TestNomadVersionPinned(t *testing.T) {
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "GNUmakefile"))
	if err != nil {
		t.Fatal(err)
	}
	makeVar := map[string]string{NomadVersion: "NOMAD_VERSION", NomadLTSVersion: "NOMAD_LTS_VERSION"}
	for _, v := range NomadVersions() {
		t.Run(v, func(t *testing.T) {
			tool, err := nomadToolFor(v)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(root, tool.module, "go.mod"))
			if err != nil {
				t.Fatal(err)
			}
			if want := "\nrequire github.com/hashicorp/nomad v" + v + "\n"; !strings.Contains(string(b), want) {
				t.Errorf("%s/go.mod does not require %q", tool.module, strings.TrimSpace(want))
			}
			if want := makeVar[v] + " := " + v + "\n"; !strings.Contains(string(mk), want) {
				t.Errorf("GNUmakefile lacks %q", strings.TrimSpace(want))
			}
		})
	}
	if _, err := nomadToolFor("1.6.0"); err == nil || !strings.Contains(err.Error(), NomadLTSVersion) {
		t.Errorf("an unknown version: error %v, want one listing the versions known", err)
	}
}

func TestAgentConfig(t *testing.T) {
	tests := []struct {
		name    string
		meta    map[string]string
		plugins map[string]string
		mode    Mode
		servers []string
		want    []string
		notWant []string
	}{
		{
			name: "plugins and meta",
			meta: map[string]string{"rack": "r1"},
			plugins: map[string]string{
				"hadar-train": `checkpoint_root = "/ck"`,
				"hadar-gpu":   `gpu { id = "g0" }`,
			},
			want: []string{
				"ports {\n  http = 1\n  rpc  = 2\n  serf = 3\n}",
				`"fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"`,
				`"driver.denylist"      = "docker,java,qemu"`,
				"meta {\n    \"rack\" = \"r1\"\n  }",
				"plugin \"hadar-gpu\" {\n  config {\ngpu { id = \"g0\" }\n  }\n}\nplugin \"hadar-train\"",
				"disable_update_check = true",
			},
		},
		{
			name:    "no plugins",
			want:    []string{`name = "n"`},
			notWant: []string{"plugin \"", "meta {", "server {"},
		},
		{
			name: "persistent",
			mode: ModePersistent,
			want: []string{"server {\n  enabled          = true\n  bootstrap_expect = 1\n}", "  enabled           = true\n  network_interface = \"lo\"", "advertise {"},
		},
		{
			name:    "server only",
			mode:    ModeServer,
			plugins: map[string]string{"hadar-gpu": ""},
			want:    []string{"server {\n  enabled          = true"},
			notWant: []string{"client {", "plugin \""},
		},
		{
			name:    "client joining",
			mode:    ModeClient,
			servers: []string{"127.0.0.1:9", "127.0.0.1:10"},
			want:    []string{`servers           = ["127.0.0.1:9", "127.0.0.1:10"]`, "advertise {"},
			notWant: []string{"server {"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AgentConfig(Options{Name: "n", Mode: tc.mode, Servers: tc.servers, Meta: tc.meta, Plugins: tc.plugins}, 1, 2, 3)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("config lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(got, w) {
					t.Errorf("config has %q:\n%s", w, got)
				}
			}
		})
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: want 5 distinct", ports)
		}
		seen[p] = true
	}
}

// TestMain lets the test binary stand in for another test process holding
// port reservations (see TestPortsAcrossProcesses).
func TestMain(m *testing.M) {
	if n := os.Getenv("HARNESS_TEST_RESERVE"); n != "" {
		useTestPortRange()
		count, _ := strconv.Atoi(n)
		ports, err := reservePorts(count)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(ports)
		// Hold the reservation until stdin closes.
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// useTestPortRange moves reservations to 100 ports no agent uses, so the
// test can fill the range while other packages start agents.
func useTestPortRange() { portLow, portHigh = 14700, 14800 }

// TestPortsAcrossProcesses: ports reserved by another live process are
// never handed out, and are free again once that process is gone.
func TestPortsAcrossProcesses(t *testing.T) {
	defer func(lo, hi int) { portLow, portHigh = lo, hi }(portLow, portHigh)
	useTestPortRange()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	other := exec.Command(self, "-test.run", "^$")
	other.Env = append(os.Environ(), "HARNESS_TEST_RESERVE=40")
	stdin, err := other.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := other.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = other.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	theirs := map[int]bool{}
	for _, f := range strings.Fields(strings.Trim(strings.TrimSpace(line), "[]")) {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("other process: %q", line)
		}
		theirs[p] = true
	}
	if len(theirs) != 40 {
		t.Fatalf("other process reserved %d ports, want 40: %q", len(theirs), line)
	}
	if _, err := reservePorts(61); err == nil {
		t.Fatal("reserved 61 of the 60 ports the other process left")
	}
	mine, err := reservePorts(60)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = releasePorts(mine) }()
	for _, p := range mine {
		if theirs[p] {
			t.Fatalf("port %d handed out twice", p)
		}
	}
	if err := releasePorts(mine); err != nil {
		t.Fatal(err)
	}
	// Once the other process is gone, its ports are free again.
	stdin.Close()
	if err := other.Wait(); err != nil {
		t.Fatal(err)
	}
	again, err := reservePorts(100)
	if err != nil {
		t.Fatalf("ports of an exited process not reclaimed: %v", err)
	}
	_ = releasePorts(again)
}

// TestFindLeaks: a process carrying this run's marker, and a mount under
// a run directory, are reported; nothing is once they are gone.
func TestFindLeaks(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), RunEnv+"="+runID())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	found := func(pid int) bool {
		for _, l := range findLeaks() {
			if l.kind == leakProcess && l.pid == pid {
				return true
			}
		}
		return false
	}
	if !found(cmd.Process.Pid) {
		t.Fatalf("process %d with %s not reported: %v", cmd.Process.Pid, RunEnv, findLeaks())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if found(cmd.Process.Pid) {
		t.Fatal("a reaped process is still reported")
	}

	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	registerDir(dir)
	point := filepath.Join(dir, "with space")
	if err := os.Mkdir(point, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", point, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	var got []leak
	for _, l := range findLeaks() {
		if l.kind == leakMount {
			got = append(got, l)
		}
	}
	removeLeaks(got)
	if len(got) != 1 || got[0].path != point || got[0].desc != "tmpfs" {
		t.Fatalf("mount leaks %v, want the tmpfs at %q", got, point)
	}
	if m := hostpath.MountsUnder([]string{dir}); len(m) != 0 {
		t.Fatalf("removeLeaks left %v mounted", m)
	}
}

// TestUnmountCollected: what Nomad's destroy hook left mounted in a
// collected allocation's directory is unmounted where nothing holds it;
// a mount still held (a file open in it), or one of an allocation not
// collected, stays for the leak check.
func TestUnmountCollected(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	a := &Agent{Dir: t.TempDir()}
	registerDir(a.Dir)
	mount := func(alloc string) string {
		point := filepath.Join(a.Dir, "data", "alloc", alloc, "trainer", "secrets")
		if err := os.MkdirAll(point, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", point, "tmpfs", 0, "size=1m"); err != nil {
			t.Skipf("cannot mount a tmpfs here: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(point, syscall.MNT_DETACH) })
		return point
	}
	idle, held, other := mount("collected-idle"), mount("collected-held"), mount("running")
	f, err := os.Create(filepath.Join(held, "token"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a.unmountCollected(t, []string{"collected-idle", "collected-held"})
	var left []string
	for _, m := range hostpath.MountsUnder([]string{a.Dir}) {
		left = append(left, m.Point)
	}
	if slices.Contains(left, idle) || !slices.Contains(left, held) || !slices.Contains(left, other) || len(left) != 2 {
		t.Fatalf("mounted after: %q; want %q and %q only", left, held, other)
	}
}

// TestShared: a Shared agent starts on first use only, is the same agent
// for every caller, answers the API (a jobspec parses), and Close stops
// it and removes its directory; Close of one never used does nothing.
// Each Nomad release the harness builds runs as one.
func TestShared(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real Nomad agent; skipped with -short")
	}
	unused := NewShared(Options{Mode: ModeServer})
	if err := unused.Close(); err != nil {
		t.Fatalf("Close of an unused agent: %v", err)
	}
	for _, v := range NomadVersions() {
		t.Run(v, func(t *testing.T) { testShared(t, v) })
	}
}

func testShared(t *testing.T, version string) {
	s := NewShared(Options{Name: "shared-test-" + version, Mode: ModeServer, NomadVersion: version})
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = s.Close()
		}
	})
	a := s.Agent(t)
	if b := s.Agent(t); b != a {
		t.Fatal("a second call started another agent")
	}
	if a.Version != version {
		t.Errorf("agent version %q, want %s", a.Version, version)
	}
	self, err := a.Client.Agent().Self()
	if err != nil {
		t.Fatal(err)
	}
	if got := self.Config["Version"]; got == nil || !strings.Contains(fmt.Sprint(got), `Version:`+version) {
		t.Errorf("the agent reports version %v, want %s", got, version)
	}
	job, err := a.Client.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: `job "p" {
  group "g" {
    task "t" {
      driver = "raw_exec"
    }
  }
}`})
	if err != nil || job.ID == nil || *job.ID != "p" {
		t.Fatalf("parse through the shared agent: job %+v, %v", job, err)
	}
	exited := a.Exited()
	closed = true
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	default:
		t.Fatal("the agent still runs after Close")
	}
	if _, err := os.Stat(a.Dir); !os.IsNotExist(err) {
		t.Fatalf("agent directory %s after Close: %v", a.Dir, err)
	}
}

// TestNodesim: the node simulator registers its nodes with a real server
// and keeps them ready, with their rack and GPUs as the spec says.
func TestNodesim(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real Nomad agent; skipped with -short")
	}
	srv := StartAgent(t, Options{Mode: ModeServer, ExtraConfig: NodesimServerConfig})
	spec := NodesimSpec{Nodes: []NodesimNode{
		{Name: "sim-a", Rack: "r1", Address: "10.9.0.1", GPUs: []NodesimGPU{{Model: "Tesla V100-SXM2-16GB", Count: 8, MemoryMiB: 16384}}},
		{Name: "sim-b", Rack: "r2", Address: "10.9.0.2", GPUs: []NodesimGPU{{Model: "Tesla K80", Count: 2, MemoryMiB: 12288}}},
	}}
	sim := StartNodesim(t, srv, spec)
	nodes, _, err := srv.Client.Nodes().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != len(spec.Nodes) {
		t.Fatalf("%d nodes registered, want %d", len(nodes), len(spec.Nodes))
	}
	for _, n := range nodes {
		var want *NodesimNode
		for i := range spec.Nodes {
			if spec.Nodes[i].Name == n.Name {
				want = &spec.Nodes[i]
			}
		}
		if want == nil || n.Status != "ready" {
			t.Fatalf("node %s (%s): not one of the spec's, or not ready", n.Name, n.Status)
		}
		node, _, err := srv.Client.Nodes().Info(n.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if node.Meta["rack"] != want.Rack || len(node.NodeResources.Devices) != 1 {
			t.Fatalf("node %s: rack %q, %d device groups; want rack %s and one group", n.Name, node.Meta["rack"], len(node.NodeResources.Devices), want.Rack)
		}
		g := node.NodeResources.Devices[0]
		if g.Name != want.GPUs[0].Model || len(g.Instances) != want.GPUs[0].Count {
			t.Errorf("node %s: group %s with %d GPUs, want %s with %d", n.Name, g.Name, len(g.Instances), want.GPUs[0].Model, want.GPUs[0].Count)
		}
	}
	if stats := sim.Stop(t); !strings.Contains(stats, `"Nodes":2`) {
		t.Errorf("nodesim counters %q, want 2 nodes", stats)
	}
}

// TestPortRange: a range is consecutive, held in the registry under this
// process until released, and handed out to no other reservation.
func TestPortRange(t *testing.T) {
	low, high, release, err := PortRange(16)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = release() }()
	if high-low != 15 {
		t.Fatalf("range %d-%d: want 16 ports", low, high)
	}
	held := func() map[int]bool {
		out := map[int]bool{}
		if err := withPortRegistry(func(e map[int]int) (map[int]int, error) {
			for p, pid := range e {
				if pid == os.Getpid() {
					out[p] = true
				}
			}
			return e, nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	h := held()
	for p := low; p <= high; p++ {
		if !h[p] {
			t.Fatalf("port %d of %d-%d is not reserved", p, low, high)
		}
	}
	low2, high2, release2, err := PortRange(16)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = release2() }()
	if low2 <= high && high2 >= low {
		t.Fatalf("ranges %d-%d and %d-%d overlap", low, high, low2, high2)
	}
	ports, err := FreePorts(64)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = releasePorts(ports) }()
	for _, p := range ports {
		if p >= low && p <= high {
			t.Fatalf("FreePorts handed out %d of the reserved range %d-%d", p, low, high)
		}
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	h = held()
	for p := low; p <= high; p++ {
		if h[p] {
			t.Fatalf("port %d still reserved after release", p)
		}
	}
}

// TestPortLeaksAreThisRuns: a port this run reserved and released, then
// reserved and bound by another test process (make test runs side by
// side), is not this run's leak; one it released and is still bound with
// no other holder is.
func TestPortLeaksAreThisRuns(t *testing.T) {
	defer func(lo, hi int) { portLow, portHigh = lo, hi }(portLow, portHigh)
	useTestPortRange()
	mine, err := reservePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	port := mine[0]
	// Bound while this run holds it, then released: this run's leak.
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := releasePorts(mine); err != nil {
		t.Fatal(err)
	}
	portLeak := func() bool {
		for _, lk := range findLeaks() {
			if lk.kind == leakPort && lk.port == port {
				return true
			}
		}
		return false
	}
	if !portLeak() {
		t.Fatalf("port %d released and still bound with no other holder: not reported", port)
	}
	// Another test process reserves the whole range, this port with it
	// (the listener stands for that process's agent).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	other := exec.Command(self, "-test.run", "^$")
	other.Env = append(os.Environ(), "HARNESS_TEST_RESERVE=100")
	stdin, err := other.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := other.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = other.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.Contains(line, strconv.Itoa(port)) {
		t.Fatalf("other process reserved %q (%v), want port %d among them", line, err, port)
	}
	l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if portLeak() {
		t.Fatalf("port %d, held and bound by another test process, reported as this run's leak", port)
	}
}
