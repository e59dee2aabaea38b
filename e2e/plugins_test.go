// Package e2e holds hadar's end-to-end tests against real Nomad agents
// (see e2e/harness). They build Nomad and the plugins on first use;
// `go test -short` skips them. The plugin tests of what Nomad does with
// the plugins run on every Nomad release the harness builds (1.11.3 and
// the LTS 1.10.5); the rest on 1.11.3.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
)

// inventory is the hadar-gpu plugin block of the test node: a mixed
// cluster in one node, declared because CI has no GPUs.
const inventory = `
fingerprint_period = "2s"
gpu {
  id                 = "v100-0"
  model              = "Tesla V100-SXM2-16GB"
  memory             = "16GiB"
  compute_capability = "7.0"
  pci_bus_id         = "0000:06:00.0"
  nvlink_group       = "a"
  utilization        = 80
  memory_used        = "10GiB"
}
gpu {
  id                 = "v100-1"
  model              = "Tesla V100-SXM2-16GB"
  memory             = "16GiB"
  compute_capability = "7.0"
  pci_bus_id         = "0000:07:00.0"
  nvlink_group       = "a"
}
gpu {
  id                 = "k80-0"
  model              = "Tesla K80"
  memory             = "12GiB"
  compute_capability = "3.7"
  pcie_switch        = "s0"
}
gpu {
  id                 = "k80-1"
  model              = "Tesla K80"
  memory             = "12GiB"
  compute_capability = "3.7"
  pcie_switch        = "s0"
}
gpu {
  id                 = "p100-0"
  model              = "Tesla P100-PCIE-16GB"
  memory             = "16GiB"
  compute_capability = "6.0"
  healthy            = false
}
`

// parser is the server-only agent that the tests which only parse
// jobspecs share: it starts on first use, and harness.Main stops it.
var parser = harness.NewShared(harness.Options{Name: "e2e-parser", Mode: harness.ModeServer})

// TestMain fails the package when its tests leave a process, mount,
// cgroup, directory or port behind (see harness.Main).
func TestMain(m *testing.M) { os.Exit(harness.Main(m, parser)) }

// onNomad runs f once per Nomad release given, as subtests named
// "nomad-<version>" (so -run 'TestNodeDevices/nomad-1.10.5' picks one).
// The plugins speak one protocol to the whole range the harness builds
// (harness.NomadVersions): the tests of what the plugins do with Nomad
// run on each; the rest run on harness.NomadVersion alone.
func onNomad(t *testing.T, versions []string, f func(t *testing.T, version string)) {
	t.Helper()
	for _, v := range versions {
		t.Run("nomad-"+v, func(t *testing.T) { f(t, v) })
	}
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("real-Nomad test; skipped with -short")
	}
}

// startAgent starts a dev agent of the Nomad release given ("" for
// harness.NomadVersion) with both plugins.
func startAgent(t *testing.T, version, checkpointRoot string) *harness.Agent {
	return startAgentMerge(t, version, checkpointRoot, harness.SharedDir(t))
}

func startAgentMerge(t *testing.T, version, checkpointRoot, mergeRoot string) *harness.Agent {
	return harness.StartAgent(t, harness.Options{
		NomadVersion: version,
		Plugins: map[string]string{
			"hadar-gpu": inventory,
			"hadar-train": fmt.Sprintf(`
checkpoint_root        = %q
merge_root             = %q
progress_poll_interval = "500ms"`, checkpointRoot, mergeRoot),
		},
	})
}

// parseJobspec parses a file of jobspecs/ through the agent, with
// trainer as the value of its "trainer" variable.
func parseJobspec(t *testing.T, a *harness.Agent, name, trainer string, vars ...string) *api.Job {
	t.Helper()
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(root, "jobspecs", name))
	if err != nil {
		t.Fatal(err)
	}
	job, err := a.Client.Jobs().ParseHCLOpts(&api.JobsParseRequest{
		JobHCL:       string(src),
		Variables:    fmt.Sprintf("trainer = %q\n", trainer) + strings.Join(vars, "\n"),
		Canonicalize: true,
	})
	if err != nil {
		t.Fatalf("parse jobspec %s: %v", name, err)
	}
	return job
}

func TestNodeDevices(t *testing.T) {
	skipShort(t)
	onNomad(t, harness.NomadVersions(), testNodeDevices)
}

func testNodeDevices(t *testing.T, version string) {
	a := startAgent(t, version, harness.SharedDir(t))
	node, _, err := a.Client.Nodes().Info(a.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]*api.NodeDeviceResource{}
	for _, g := range node.NodeResources.Devices {
		groups[g.Name] = g
	}
	tests := []struct {
		model   string
		attrs   map[string]string
		ids     []string
		healthy int
	}{
		{"Tesla V100-SXM2-16GB", map[string]string{"memory": "16384 MiB", "compute_capability": "7.0", "nvlink_domain_size": "2", "nvlink_domains": "v100-0,v100-1", "source": "declared"}, []string{"v100-0", "v100-1"}, 2},
		{"Tesla K80", map[string]string{"memory": "12288 MiB", "compute_capability": "3.7", "nvlink_domain_size": "0", "pcie_switch_domains": "k80-0,k80-1"}, []string{"k80-0", "k80-1"}, 2},
		{"Tesla P100-PCIE-16GB", map[string]string{"memory": "16384 MiB", "compute_capability": "6.0"}, []string{"p100-0"}, 0},
	}
	if len(groups) != len(tests) {
		t.Errorf("node has %d device groups, want %d: %v", len(groups), len(tests), keys(groups))
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			g, ok := groups[tc.model]
			if !ok {
				t.Fatalf("no device group %q on the node (have %v)", tc.model, keys(groups))
			}
			if g.Vendor != "nvidia" || g.Type != "gpu" {
				t.Errorf("group %s/%s, want nvidia/gpu", g.Vendor, g.Type)
			}
			for k, want := range tc.attrs {
				a, ok := g.Attributes[k]
				if !ok {
					t.Errorf("attribute %s missing; have %v", k, g.Attributes)
					continue
				}
				if got := a.String(); got != want {
					t.Errorf("attribute %s = %q, want %q", k, got, want)
				}
			}
			var ids []string
			healthy := 0
			for _, d := range g.Instances {
				ids = append(ids, d.ID)
				if d.Healthy {
					healthy++
				}
			}
			if strings.Join(sorted(ids), ",") != strings.Join(tc.ids, ",") || healthy != tc.healthy {
				t.Errorf("instances %v (%d healthy), want %v (%d healthy)", ids, healthy, tc.ids, tc.healthy)
			}
		})
	}
	if node.Attributes["driver.hadar-train"] != "1" {
		t.Errorf("node attribute driver.hadar-train = %q, want 1 (Nomad renders true as 1)", node.Attributes["driver.hadar-train"])
	}
}

// TestTrainStopResume runs jobspecs/train-emulated.nomad.hcl with
// hadar-trainer: it must land on the two V100s, see them in its
// environment, report progress, checkpoint when stopped, and resume from
// the checkpoint when the job is run again.
func TestTrainStopResume(t *testing.T) {
	skipShort(t)
	onNomad(t, harness.NomadVersions(), testTrainStopResume)
}

func testTrainStopResume(t *testing.T, version string) {
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	ckRoot := harness.SharedDir(t)
	a := startAgent(t, version, ckRoot)
	parse := func() *api.Job { return parseJobspec(t, a, "train-emulated.nomad.hcl", trainer) }
	jobID := "train-emulated"

	// First run.
	if _, _, err := a.Client.Jobs().Register(parse(), nil); err != nil {
		t.Fatal(err)
	}
	alloc := waitRunning(t, a, jobID, "")
	devs := alloc.AllocatedResources.Tasks["trainer"].Devices
	if len(devs) != 1 || devs[0].Name != "Tesla V100-SXM2-16GB" || len(devs[0].DeviceIDs) != 2 {
		t.Fatalf("allocated devices %+v, want 2 of Tesla V100-SXM2-16GB", devs)
	}
	ids := sorted(devs[0].DeviceIDs)
	if strings.Join(ids, ",") != "v100-0,v100-1" {
		t.Fatalf("allocated %v, want v100-0,v100-1", ids)
	}

	// The driver's start event says what the process was given.
	ev := waitEvent(t, a, alloc.ID, "training process started", 30*time.Second)
	if got := strings.Join(sorted(strings.Split(ev.Details["hadar.gpus"], ",")), ","); got != "v100-0,v100-1" {
		t.Errorf("process got NVIDIA_VISIBLE_DEVICES %q, want the two allocated V100s", ev.Details["hadar.gpus"])
	}
	if ev.Details["hadar.gpu_model"] != "Tesla V100-SXM2-16GB" || ev.Details["hadar.steps_per_sec"] != "40" {
		t.Errorf("start event details %v: want model Tesla V100-SXM2-16GB at 40 steps/s", ev.Details)
	}

	// The agent, its plugins and the task's logmon keep their sockets in
	// the agent's directory: a killed plugin's would stay in /tmp.
	if out := a.SocketsOutside(); len(out) > 0 {
		t.Errorf("sockets bound outside the agent's directory: %v", out)
	}

	// The training process itself has them in its environment.
	env := processEnv(t, alloc.ID, "hadar-trainer")
	for k, want := range map[string]string{"HADAR_STEPS_PER_SEC": "40", "HADAR_GPU_MODEL": "Tesla V100-SXM2-16GB", "HADAR_TOTAL_STEPS": "100000", "HADAR_JOB_ID": jobID} {
		if env[k] != want {
			t.Errorf("trainer env %s = %q, want %q", k, env[k], want)
		}
	}
	for _, k := range []string{"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} {
		if got := strings.Join(sorted(strings.Split(env[k], ",")), ","); got != "v100-0,v100-1" {
			t.Errorf("trainer env %s = %q, want the two allocated V100s", k, env[k])
		}
	}

	// Progress through the alloc filesystem, paced at the V100 rate.
	p := waitProgress(t, a, alloc, 60*time.Second, func(p progress) bool { return p.StepsDone >= 200 })
	if p.TotalSteps != 100000 || p.StepsPerSec < 20 || p.StepsPerSec > 60 {
		t.Errorf("progress %+v: want total 100000 at about 40 steps/s", p)
	}
	if uid, _ := strconv.Atoi(ev.Details["hadar.uid"]); ev.Details["hadar.gpu_model_source"] != "hadar-gpu reservation" || !jobUID(uid) || ev.Details["hadar.job_gid"] != ev.Details["hadar.uid"] {
		t.Errorf("start event details %v: want the model from hadar-gpu's reservation, the task run as its job's own uid", ev.Details)
	}

	// Stop mid-run: the trainer checkpoints and exits 0.
	if _, _, err := a.Client.Jobs().Deregister(jobID, false, nil); err != nil {
		t.Fatal(err)
	}
	stopped := waitAlloc(t, a, alloc.ID, 60*time.Second, func(al *api.Allocation) bool {
		return al.ClientStatus == api.AllocClientStatusComplete || al.ClientStatus == api.AllocClientStatusFailed
	})
	ts := stopped.TaskStates["trainer"]
	var exit *api.TaskEvent
	for _, e := range ts.Events {
		if e.Type == api.TaskTerminated {
			exit = e
		}
	}
	if exit == nil || exit.ExitCode != 0 || exit.Signal != 0 {
		t.Fatalf("stopped task did not exit cleanly: %+v (events %s)", exit, eventList(ts.Events))
	}
	// The driver's event follows the exit by as long as the restarted
	// client takes to pass it on: seconds beside other work.
	ck := waitEvent(t, a, alloc.ID, "checkpoint saved", time.Minute)
	saved, _ := strconv.Atoi(ck.Details["hadar.steps_done"])
	ckPath := ck.Details["hadar.checkpoint"]
	wantDir := filepath.Join(ckRoot, "default", jobID, "train", "trainer")
	if saved < 200 || !strings.HasPrefix(ckPath, wantDir+string(filepath.Separator)) {
		t.Fatalf("checkpoint event %v: want step >= 200 under %s", ck.Details, wantDir)
	}
	if _, err := os.Stat(ckPath); err != nil {
		t.Fatalf("checkpoint file: %v", err)
	}
	// Progress lives in the alloc filesystem; events mark only what
	// changed: no periodic progress events (Nomad keeps 10 per task).
	wantEvents(t, a, alloc.ID, "training process started", "checkpoint saved", "final progress")
	// The end's event carries the progress state: a stopped run is not
	// done (the sidecar finishes a job whose rank 0 ends "done").
	if fin := waitEvent(t, a, alloc.ID, "final progress", 10*time.Second); fin.Details["hadar.state"] != "stopped" {
		t.Errorf("final progress event details %v: want hadar.state stopped", fin.Details)
	}

	// Run again: a new allocation that resumes from the checkpoint.
	if _, _, err := a.Client.Jobs().Register(parse(), nil); err != nil {
		t.Fatal(err)
	}
	alloc2 := waitRunning(t, a, jobID, alloc.ID)
	first := waitProgress(t, a, alloc2, 60*time.Second, func(p progress) bool { return p.StepsDone > 0 })
	if first.StepsDone < int64(saved) {
		t.Fatalf("second run started at step %d, want resumed from the checkpoint at %d", first.StepsDone, saved)
	}
	resumedLine := func(logs string) bool {
		return strings.Contains(logs, "resumed") && strings.Contains(logs, filepath.Base(ckPath))
	}
	logs := waitTaskLog(t, a, alloc2, 30*time.Second, resumedLine, "stderr", "stdout")
	if !resumedLine(logs) {
		t.Errorf("second run's log does not say it resumed from %s:\n%s", ckPath, logs)
	}
	re := waitEvent(t, a, alloc2.ID, "resumed from checkpoint "+ckPath, 10*time.Second)
	if n, _ := strconv.Atoi(re.Details["hadar.steps_done"]); n < saved {
		t.Errorf("resume event %q details %v: want a step >= %d", re.DriverMessage, re.Details, saved)
	}
	t.Logf("first run checkpointed at step %d (%s); second run resumed at step %d", saved, ckPath, first.StepsDone)
}

// TestBadConfigRejected: a declared inventory with a bad unit stops the
// agent at plugin load, with a message naming the field.
func TestBadConfigRejected(t *testing.T) {
	skipShort(t)
	_, err := harness.TryStartAgent(t, harness.Options{
		Plugins:      map[string]string{"hadar-gpu": `gpu { id = "a"  model = "Tesla K80"  memory = "12GX" }`},
		StartTimeout: 30 * time.Second,
	})
	want := `gpu[0] (id "a").memory: "12GX": unknown unit "GX"`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("agent start error %v, want one containing %q", err, want)
	}
}

// TestRecoverAfterClientRestart restarts a (non-dev) agent under a
// running training task: the driver plugin is restarted, RecoverTask
// reattaches, the task keeps running without a restart, and a later stop
// still checkpoints it.
func TestRecoverAfterClientRestart(t *testing.T) {
	skipShort(t)
	onNomad(t, harness.NomadVersions(), testRecoverAfterClientRestart)
}

func testRecoverAfterClientRestart(t *testing.T, version string) {
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	a := harness.StartAgent(t, harness.Options{
		NomadVersion: version,
		Mode:         harness.ModePersistent,
		Plugins: map[string]string{
			"hadar-gpu": inventory,
			"hadar-train": fmt.Sprintf(`
checkpoint_root        = %q
progress_poll_interval = "500ms"`, harness.SharedDir(t)),
		},
	})
	if _, _, err := a.Client.Jobs().Register(parseJobspec(t, a, "train-emulated.nomad.hcl", trainer), nil); err != nil {
		t.Fatal(err)
	}
	alloc := waitRunning(t, a, "train-emulated", "")
	before := waitProgress(t, a, alloc, 60*time.Second, func(p progress) bool { return p.StepsDone >= 80 })

	begin := time.Now()
	a.Restart(t)
	t.Logf("agent restarted in %v", time.Since(begin).Round(time.Millisecond))

	// The same allocation goes on counting from where it was.
	after := waitProgress(t, a, alloc, 60*time.Second, func(p progress) bool { return p.StepsDone >= before.StepsDone+80 })
	al, _, err := a.Client.Allocations().Info(alloc.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := al.TaskStates["trainer"]
	if al.ClientStatus != api.AllocClientStatusRunning || ts.Restarts != 0 {
		t.Fatalf("after the restart the alloc is %s with %d task restarts; events: %s", al.ClientStatus, ts.Restarts, eventList(ts.Events))
	}
	for _, e := range ts.Events {
		if e.Type == api.TaskTerminated || e.Type == api.TaskStarted && e.Time > ts.StartedAt.UnixNano() {
			t.Fatalf("task ended or started again across the client restart: %s", eventList(ts.Events))
		}
	}
	t.Logf("steps %d before the client restart, %d after", before.StepsDone, after.StepsDone)

	// The recovered driver still stops it properly.
	stopAt := time.Now()
	if _, _, err := a.Client.Jobs().Deregister("train-emulated", false, nil); err != nil {
		t.Fatal(err)
	}
	// Logged because it varies (2-30 s here) with how soon the restarted
	// client picks up the stop from the server.
	defer func() { t.Logf("stop to checkpoint event: %v", time.Since(stopAt).Round(time.Millisecond)) }()
	stopped := waitAlloc(t, a, alloc.ID, 60*time.Second, func(al *api.Allocation) bool {
		return al.ClientStatus == api.AllocClientStatusComplete || al.ClientStatus == api.AllocClientStatusFailed
	})
	var exit *api.TaskEvent
	for _, e := range stopped.TaskStates["trainer"].Events {
		if e.Type == api.TaskTerminated {
			exit = e
		}
	}
	if exit == nil || exit.ExitCode != 0 || exit.Signal != 0 {
		t.Fatalf("recovered task did not exit cleanly on stop: %s", eventList(stopped.TaskStates["trainer"].Events))
	}
	// The driver's event follows the exit by as long as the restarted
	// client takes to pass it on: seconds beside other work.
	ck := waitEvent(t, a, alloc.ID, "checkpoint saved", time.Minute)
	if n, _ := strconv.Atoi(ck.Details["hadar.steps_done"]); int64(n) < after.StepsDone {
		t.Fatalf("checkpoint at step %d, before the last progress seen (%d)", n, after.StepsDone)
	}
}

// TestHeterogeneousCluster runs one server and two client agents on
// loopback, one declaring V100s (rack r1) and one K80s (rack r2), and
// runs the training jobspec on K80s: it must land on the K80 node and
// keep the K80's emulated pace.
func TestHeterogeneousCluster(t *testing.T) {
	skipShort(t)
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	server := harness.StartAgent(t, harness.Options{Name: "server", Mode: harness.ModeServer})
	train := fmt.Sprintf(`checkpoint_root = %q
progress_poll_interval = "500ms"`, harness.SharedDir(t))
	gpus := func(model, mem string, ids ...string) string {
		var b strings.Builder
		for _, id := range ids {
			fmt.Fprintf(&b, "gpu {\n  id = %q\n  model = %q\n  memory = %q\n}\n", id, model, mem)
		}
		return b.String()
	}
	nodes := map[string]string{}
	for _, c := range []struct{ name, rack, inv string }{
		{"node-v100", "r1", gpus("Tesla V100-SXM2-16GB", "16GiB", "v100-a", "v100-b")},
		{"node-k80", "r2", gpus("Tesla K80", "12GiB", "k80-a", "k80-b")},
	} {
		a := harness.StartAgent(t, harness.Options{
			Name: c.name, Mode: harness.ModeClient, Servers: []string{server.RPCAddr},
			Meta:    map[string]string{"rack": c.rack},
			Plugins: map[string]string{"hadar-gpu": c.inv, "hadar-train": train},
		})
		nodes[a.NodeID] = c.name
	}
	// The server sees both nodes with their own device groups.
	list, _, err := server.Client.Nodes().List(&api.QueryOptions{Params: map[string]string{"resources": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, n := range list {
		node, _, err := server.Client.Nodes().Info(n.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range node.NodeResources.Devices {
			seen[node.Name] += g.Name + "x" + strconv.Itoa(len(g.Instances)) + " rack=" + node.Meta["rack"]
		}
	}
	want := map[string]string{"node-v100": "Tesla V100-SXM2-16GBx2 rack=r1", "node-k80": "Tesla K80x2 rack=r2"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("devices per node %v, want %v", seen, want)
	}

	job := parseJobspec(t, server, "train-emulated.nomad.hcl", trainer, `gpu_model = "Tesla K80"`)
	if _, _, err := server.Client.Jobs().Register(job, nil); err != nil {
		t.Fatal(err)
	}
	alloc := waitRunning(t, server, "train-emulated", "")
	if nodes[alloc.NodeID] != "node-k80" {
		t.Fatalf("placed on %s, want node-k80", nodes[alloc.NodeID])
	}
	// Let the rate settle over a few progress intervals, then check the
	// K80 pace (12 steps/s) rather than the V100's (40).
	p := waitProgress(t, server, alloc, 60*time.Second, func(p progress) bool { return p.StepsDone >= 60 })
	if p.StepsPerSec < 6 || p.StepsPerSec > 18 {
		t.Errorf("progress %+v: want about 12 steps/s on a K80", p)
	}
}

// TestHadarE runs jobspecs/hadare-emulated.nomad.hcl: two copies of one
// job on different GPUs merge parameters through the driver's merge_root,
// and each copy's progress counts the whole job's steps.
func TestHadarE(t *testing.T) {
	skipShort(t)
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	mergeRoot := harness.SharedDir(t)
	a := startAgentMerge(t, "", harness.SharedDir(t), mergeRoot)
	jobID := "hadare-emulated"
	if _, _, err := a.Client.Jobs().Register(parseJobspec(t, a, "hadare-emulated.nomad.hcl", trainer), nil); err != nil {
		t.Fatal(err)
	}
	var allocs []*api.Allocation
	err := harness.Eventually(context.Background(), 60*time.Second, 250*time.Millisecond, func() error {
		stubs, _, err := a.Client.Jobs().Allocations(jobID, false, nil)
		if err != nil {
			return err
		}
		allocs = allocs[:0]
		for _, s := range stubs {
			if s.ClientStatus == api.AllocClientStatusFailed {
				return fmt.Errorf("alloc %s failed: %s", s.ID, taskEvents(s.TaskStates))
			}
			if s.ClientStatus == api.AllocClientStatusRunning {
				al, _, err := a.Client.Allocations().Info(s.ID, nil)
				if err != nil {
					return err
				}
				allocs = append(allocs, al)
			}
		}
		if len(allocs) != 2 {
			return fmt.Errorf("%d of 2 copies running", len(allocs))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, al := range allocs {
		// Each copy counts the job's steps: after merging, more than its
		// own.
		p := waitProgress(t, a, al, 90*time.Second, func(p progress) bool { return p.Merges >= 2 && p.StepsDone > p.LocalSteps })
		if p.Copies != 2 {
			t.Errorf("copy %d reports %d copies, want 2", p.CopyIndex, p.Copies)
		}
		t.Logf("copy %d on %s: steps_done %d, local %d, merges %d", p.CopyIndex, al.AllocatedResources.Tasks["trainer"].Devices[0].Name, p.StepsDone, p.LocalSteps, p.Merges)
	}
	for _, f := range []string{"round-1/copy-0.json", "round-1/copy-1.json"} {
		if _, err := os.Stat(filepath.Join(mergeRoot, "default", jobID, f)); err != nil {
			t.Errorf("merge file: %v", err)
		}
	}
}

// processEnv returns the environment of the process of allocation
// allocID whose program is named prog (the agent runs on this machine).
func processEnv(t *testing.T, allocID, prog string) map[string]string {
	t.Helper()
	var env map[string]string
	err := harness.Eventually(context.Background(), 10*time.Second, 200*time.Millisecond, func() error {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return err
		}
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err != nil {
				continue
			}
			cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]) != prog {
				continue
			}
			raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
			if err != nil {
				continue
			}
			m := map[string]string{}
			for _, kv := range strings.Split(string(raw), "\x00") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					m[k] = v
				}
			}
			if m["NOMAD_ALLOC_ID"] == allocID {
				env = m
				return nil
			}
		}
		return fmt.Errorf("no %s process of allocation %s", prog, allocID)
	})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

type progress struct {
	CopyIndex   int     `json:"copy_index"`
	Copies      int     `json:"copies"`
	LocalSteps  int64   `json:"local_steps"`
	Merges      int     `json:"merges"`
	StepsDone   int64   `json:"steps_done"`
	TotalSteps  int64   `json:"total_steps"`
	StepsPerSec float64 `json:"steps_per_sec"`
	Loss        float64 `json:"loss"`
	Checkpoint  string  `json:"checkpoint"`
}

func waitRunning(t *testing.T, a *harness.Agent, jobID, notID string) *api.Allocation {
	t.Helper()
	var found *api.Allocation
	err := harness.Eventually(context.Background(), 60*time.Second, 250*time.Millisecond, func() error {
		allocs, _, err := a.Client.Jobs().Allocations(jobID, true, nil)
		if err != nil {
			return err
		}
		for _, s := range allocs {
			if s.ID == notID {
				continue
			}
			if s.ClientStatus == api.AllocClientStatusFailed {
				return fmt.Errorf("alloc %s failed: %s", s.ID, taskEvents(s.TaskStates))
			}
			if s.ClientStatus == api.AllocClientStatusRunning {
				found, _, err = a.Client.Allocations().Info(s.ID, nil)
				return err
			}
		}
		return fmt.Errorf("no running allocation of %s yet (%d allocs)", jobID, len(allocs))
	})
	if err != nil {
		if evals, _, e := a.Client.Jobs().Evaluations(jobID, nil); e == nil {
			for _, ev := range evals {
				t.Logf("eval %s %s: %v", ev.ID, ev.Status, ev.FailedTGAllocs)
			}
		}
		t.Fatal(err)
	}
	return found
}

func waitAlloc(t *testing.T, a *harness.Agent, id string, within time.Duration, ok func(*api.Allocation) bool) *api.Allocation {
	t.Helper()
	var al *api.Allocation
	err := harness.Eventually(context.Background(), within, 250*time.Millisecond, func() error {
		var err error
		if al, _, err = a.Client.Allocations().Info(id, nil); err != nil {
			return err
		}
		if !ok(al) {
			return fmt.Errorf("alloc %s is %s", id, al.ClientStatus)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return al
}

// waitEvent waits for a driver task event whose message starts with
// prefix and returns the newest such.
func waitEvent(t *testing.T, a *harness.Agent, allocID, prefix string, within time.Duration) *api.TaskEvent {
	t.Helper()
	var found *api.TaskEvent
	err := harness.Eventually(context.Background(), within, 250*time.Millisecond, func() error {
		al, _, err := a.Client.Allocations().Info(allocID, nil)
		if err != nil {
			return err
		}
		ts := al.TaskStates["trainer"]
		if ts == nil {
			return fmt.Errorf("no task state yet")
		}
		for _, e := range ts.Events {
			if e.Type == "Driver" && strings.HasPrefix(e.DriverMessage, prefix) {
				found = e
			}
		}
		if found == nil {
			return fmt.Errorf("no %q driver event; events: %s", prefix, eventList(ts.Events))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// wantEvents checks the driver's task events of an allocation: exactly
// these, in order (message prefixes).
func wantEvents(t *testing.T, a *harness.Agent, allocID string, want ...string) {
	t.Helper()
	var got []string
	err := harness.Eventually(context.Background(), 10*time.Second, 250*time.Millisecond, func() error {
		al, _, err := a.Client.Allocations().Info(allocID, nil)
		if err != nil {
			return err
		}
		got = got[:0]
		for _, e := range al.TaskStates["trainer"].Events {
			if e.Type == "Driver" {
				got = append(got, e.DriverMessage)
			}
		}
		if len(got) != len(want) {
			return fmt.Errorf("driver events %q, want %q", got, want)
		}
		for i, w := range want {
			if !strings.HasPrefix(got[i], w) {
				return fmt.Errorf("driver events %q, want %q", got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitProgress reads the progress file through Nomad's alloc filesystem
// API, the way the sidecar does.
func waitProgress(t *testing.T, a *harness.Agent, alloc *api.Allocation, within time.Duration, ok func(progress) bool) progress {
	t.Helper()
	var p progress
	err := harness.Eventually(context.Background(), within, 250*time.Millisecond, func() error {
		rc, err := a.Client.AllocFS().Cat(alloc, "trainer/local/hadar-progress.json", nil)
		if err != nil {
			return err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &p); err != nil {
			return fmt.Errorf("progress file %q: %w", b, err)
		}
		if !ok(p) {
			return fmt.Errorf("progress %+v", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func taskLog(t *testing.T, a *harness.Agent, alloc *api.Allocation, stream string) string {
	t.Helper()
	cancel := make(chan struct{})
	defer close(cancel)
	frames, errs := a.Client.AllocFS().Logs(alloc, false, "trainer", stream, "start", 0, cancel, nil)
	var b strings.Builder
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				return b.String()
			}
			b.Write(f.Data)
		case err := <-errs:
			if err != nil {
				t.Logf("logs %s: %v", stream, err)
			}
			return b.String()
		case <-time.After(10 * time.Second):
			return b.String()
		}
	}
}

// waitTaskLog reads a running task's streams until ok holds of what they
// say together or within passes: the task's lines reach Nomad's log files
// through its log collector, seconds behind the task on a loaded machine
// (make test run 6 read an empty log after the task's first progress).
func waitTaskLog(t *testing.T, a *harness.Agent, alloc *api.Allocation, within time.Duration, ok func(string) bool, streams ...string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var b strings.Builder
		for _, s := range streams {
			b.WriteString(taskLog(t, a, alloc, s))
		}
		if ok(b.String()) || time.Now().After(deadline) {
			return b.String()
		}
		time.Sleep(time.Second)
	}
}

func eventList(evs []*api.TaskEvent) string {
	var parts []string
	for _, e := range evs {
		parts = append(parts, fmt.Sprintf("%s: %s%s", e.Type, e.DisplayMessage, e.DriverMessage))
	}
	return strings.Join(parts, "; ")
}

func taskEvents(states map[string]*api.TaskState) string {
	var parts []string
	for name, s := range states {
		parts = append(parts, name+": "+eventList(s.Events))
	}
	return strings.Join(parts, " | ")
}

func keys(m map[string]*api.NodeDeviceResource) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return sorted(out)
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// gpuHealth returns "id=healthy" / "id=unhealthy" for every GPU of the
// node, sorted.
func gpuHealth(t *testing.T, a *harness.Agent) string {
	t.Helper()
	node, _, err := a.Client.Nodes().Info(a.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range node.NodeResources.Devices {
		for _, d := range g.Instances {
			h := "healthy"
			if !d.Healthy {
				h = "unhealthy"
			}
			out = append(out, d.ID+"="+h)
		}
	}
	return strings.Join(sorted(out), ",")
}

func waitGPUHealth(t *testing.T, a *harness.Agent, want string) {
	t.Helper()
	err := harness.Eventually(context.Background(), 30*time.Second, 250*time.Millisecond, func() error {
		if got := gpuHealth(t, a); got != want {
			return fmt.Errorf("node GPUs %q, want %q", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGPUHealth: a GPU an operator marks unhealthy through health_file
// stops taking work and takes it again once cleared; and an unreadable
// health_file (which used to make hadar-gpu send a fingerprint error, on
// which Nomad drops the node's devices until the client restarts) only
// marks the GPUs unhealthy until it is readable again.
func TestGPUHealth(t *testing.T) {
	skipShort(t)
	healthFile := filepath.Join(t.TempDir(), "unhealthy-gpus")
	a := harness.StartAgent(t, harness.Options{Plugins: map[string]string{"hadar-gpu": fmt.Sprintf(`
fingerprint_period = "1s"
health_file        = %q
gpu {
  id     = "k80-0"
  model  = "Tesla K80"
  memory = "12GiB"
}
gpu {
  id     = "k80-1"
  model  = "Tesla K80"
  memory = "12GiB"
}`, healthFile)}})
	waitGPUHealth(t, a, "k80-0=healthy,k80-1=healthy")

	if err := os.WriteFile(healthFile, []byte("k80-0 XID 79: fell off the bus\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitGPUHealth(t, a, "k80-0=unhealthy,k80-1=healthy")

	// A job that needs both GPUs is not placed while one is unhealthy.
	job := &api.Job{
		ID: pointerTo("two-gpus"), Name: pointerTo("two-gpus"), Type: pointerTo("batch"),
		Datacenters: []string{"*"},
		TaskGroups: []*api.TaskGroup{{
			Name: pointerTo("g"),
			Tasks: []*api.Task{{
				Name: "t", Driver: "raw_exec",
				Config: map[string]interface{}{"command": "/bin/sh", "args": []string{"-c", "echo $NVIDIA_VISIBLE_DEVICES; sleep 60"}},
				Resources: &api.Resources{
					CPU: pointerTo(50), MemoryMB: pointerTo(32),
					Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: pointerTo(uint64(2))}},
				},
			}},
		}},
	}
	if _, _, err := a.Client.Jobs().Register(job, nil); err != nil {
		t.Fatal(err)
	}
	err := harness.Eventually(context.Background(), 30*time.Second, 250*time.Millisecond, func() error {
		evals, _, err := a.Client.Jobs().Evaluations("two-gpus", nil)
		if err != nil {
			return err
		}
		for _, ev := range evals {
			if m := ev.FailedTGAllocs["g"]; m != nil {
				t.Logf("placement failure while k80-0 is unhealthy: %v %v", m.DimensionExhausted, m.ConstraintFiltered)
				return nil
			}
		}
		return fmt.Errorf("no placement failure yet (%d evals)", len(evals))
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs, _, _ := a.Client.Jobs().Allocations("two-gpus", false, nil); len(allocs) != 0 {
		t.Fatalf("job placed on an unhealthy GPU: %d allocations", len(allocs))
	}

	// An unreadable health_file: both GPUs unhealthy, none dropped.
	if err := os.Remove(healthFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(healthFile, 0o755); err != nil {
		t.Fatal(err)
	}
	waitGPUHealth(t, a, "k80-0=unhealthy,k80-1=unhealthy")

	// Cleared: both healthy again, and the waiting job is placed on them.
	if err := os.Remove(healthFile); err != nil {
		t.Fatal(err)
	}
	waitGPUHealth(t, a, "k80-0=healthy,k80-1=healthy")
	alloc := waitRunning(t, a, "two-gpus", "")
	devs := alloc.AllocatedResources.Tasks["t"].Devices
	if len(devs) != 1 || strings.Join(sorted(devs[0].DeviceIDs), ",") != "k80-0,k80-1" {
		t.Fatalf("allocated %+v, want k80-0 and k80-1", devs)
	}
}

func pointerTo[T any](v T) *T { return &v }

// trainJob is a batch job of one hadar-train task running sh -c script,
// never restarted nor rescheduled.
func trainJob(id, script string, cpu, memoryMB int, user string) *api.Job {
	return &api.Job{
		ID: pointerTo(id), Name: pointerTo(id), Type: pointerTo("batch"),
		Datacenters: []string{"*"},
		TaskGroups: []*api.TaskGroup{{
			Name:             pointerTo("train"),
			RestartPolicy:    &api.RestartPolicy{Attempts: pointerTo(0), Mode: pointerTo("fail")},
			ReschedulePolicy: &api.ReschedulePolicy{Attempts: pointerTo(0), Unlimited: pointerTo(false)},
			Tasks: []*api.Task{{
				Name: "trainer", Driver: "hadar-train", User: user,
				Config:    map[string]interface{}{"command": "/bin/sh", "args": []string{"-c", script}},
				Resources: &api.Resources{CPU: pointerTo(cpu), MemoryMB: pointerTo(memoryMB)},
			}},
		}},
	}
}

// taskPid finds the pid of the allocation's process named prog.
func taskPid(t *testing.T, allocID, prog string) int {
	t.Helper()
	var pid int
	err := harness.Eventually(context.Background(), 10*time.Second, 200*time.Millisecond, func() error {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			n, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
			if filepath.Base(strings.SplitN(string(cmd), "\x00", 2)[0]) == prog && strings.Contains(string(env), "NOMAD_ALLOC_ID="+allocID+"\x00") {
				pid = n
				return nil
			}
		}
		return fmt.Errorf("no %s process of allocation %s", prog, allocID)
	})
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// taskEventOf waits for the allocation's task event of type typ.
func taskEventOf(t *testing.T, a *harness.Agent, allocID, typ string) *api.TaskEvent {
	t.Helper()
	var found *api.TaskEvent
	err := harness.Eventually(context.Background(), 60*time.Second, 250*time.Millisecond, func() error {
		al, _, err := a.Client.Allocations().Info(allocID, nil)
		if err != nil {
			return err
		}
		if ts := al.TaskStates["trainer"]; ts != nil {
			for _, e := range ts.Events {
				if e.Type == typ {
					found = e
					return nil
				}
			}
			return fmt.Errorf("no %q event: %s", typ, eventList(ts.Events))
		}
		return fmt.Errorf("no task state")
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// firstAlloc waits for the job's first allocation.
func firstAlloc(t *testing.T, a *harness.Agent, jobID string) *api.AllocationListStub {
	t.Helper()
	var al *api.AllocationListStub
	err := harness.Eventually(context.Background(), 30*time.Second, 250*time.Millisecond, func() error {
		allocs, _, err := a.Client.Jobs().Allocations(jobID, true, nil)
		if err != nil {
			return err
		}
		if len(allocs) == 0 {
			return fmt.Errorf("no allocation of %s yet", jobID)
		}
		al = allocs[0]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return al
}

// jobUID tells whether uid is one hadar-train gives jobs by default
// (its job_id_range, 200000-265535).
func jobUID(uid int) bool { return uid >= 200000 && uid <= 265535 }

// TestTaskIsolation runs hadar-train tasks on a real agent: a task runs
// as its job's own uid by default (not as the client's root, nor as
// nobody, whom every job would share), in the cgroup Nomad
// made for it with its CPU share and memory limit, and reports its CPU in
// MHz; root needs allow_root; a runaway task is killed at its memory
// limit and reported OOM-killed; a program that cannot start fails the
// start.
func TestTaskIsolation(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skipf("the agent would run as uid %d: a Nomad client needs root to switch users and make cgroups", os.Geteuid())
	}
	a := harness.StartAgent(t, harness.Options{Plugins: map[string]string{"hadar-train": `progress_poll_interval = "500ms"`}})
	node, _, err := a.Client.Nodes().Info(a.NodeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	cgroups := cgroupMode()
	t.Logf("cgroups: %s", cgroups)

	t.Run("user and limits", func(t *testing.T) {
		if _, _, err := a.Client.Jobs().Register(trainJob("busy", `while :; do :; done`, 500, 64, ""), nil); err != nil {
			t.Fatal(err)
		}
		alloc := waitRunning(t, a, "busy", "")
		defer func() { _, _, _ = a.Client.Jobs().Deregister("busy", false, nil) }()
		pid := taskPid(t, alloc.ID, "sh")
		status := readTrim(t, fmt.Sprintf("/proc/%d/status", pid))
		// The job's uid and gid, and that group only (Nomad's executor
		// would add root's, 0).
		id := waitEvent(t, a, alloc.ID, "training process started", 10*time.Second).Details["hadar.uid"]
		if uid, _ := strconv.Atoi(id); !jobUID(uid) || !strings.Contains(status, "\nUid:\t"+id+"\t"+id+"\t"+id+"\t"+id+"\n") ||
			!strings.Contains(status, "\nGid:\t"+id+"\t"+id+"\t"+id+"\t"+id+"\n") || !strings.Contains(status, "\nGroups:\t"+id+" \n") {
			t.Errorf("task does not run as its job's uid %s with that group only:\n%s", id, status)
		}
		scope := alloc.ID + ".trainer"
		switch cgroups {
		case "v1":
			if cg := readTrim(t, fmt.Sprintf("/proc/%d/cgroup", pid)); !strings.Contains(cg, ":memory:/nomad/"+scope+"\n") {
				t.Errorf("task not in its memory cgroup:\n%s", cg)
			}
			if got := readTrim(t, "/sys/fs/cgroup/memory/nomad/"+scope+"/memory.limit_in_bytes"); got != strconv.Itoa(64<<20) {
				t.Errorf("memory.limit_in_bytes %s, want %d", got, 64<<20)
			}
			if got := readTrim(t, "/sys/fs/cgroup/cpu/nomad/"+scope+"/cpu.shares"); got != "500" {
				t.Errorf("cpu.shares %s, want 500 (the task's cpu)", got)
			}
		case "v2":
			dir := "/sys/fs/cgroup/nomad.slice/share.slice/" + scope + ".scope"
			if got := readTrim(t, dir+"/memory.max"); got != strconv.Itoa(64<<20) {
				t.Errorf("memory.max %s, want %d", got, 64<<20)
			}
			if got := readTrim(t, dir+"/cpu.weight"); got == "100" || got == "" {
				t.Errorf("cpu.weight %q: not set from the task's cpu", got)
			}
		default:
			t.Logf("no cgroup checks: %s", cgroups)
		}

		// CPU in MHz, as `nomad alloc status` shows it (used/reserved),
		// consistent with the percent and the node's compute.
		perCore := float64(node.NodeResources.Cpu.CpuShares) / float64(node.NodeResources.Cpu.TotalCpuCores)
		samples := 0
		err := harness.Eventually(context.Background(), 30*time.Second, time.Second, func() error {
			st, err := a.Client.Allocations().Stats(&api.Allocation{ID: alloc.ID, NodeID: alloc.NodeID}, nil)
			if err != nil {
				return err
			}
			cpu := st.ResourceUsage.CpuStats
			if cpu.Percent < 20 {
				return fmt.Errorf("cpu %.1f%%: no busy sample yet", cpu.Percent)
			}
			want := cpu.Percent / 100 * perCore
			t.Logf("cpu %.1f%% = %.0f MHz (want about %.0f; node %d MHz over %d cores); memory rss %d", cpu.Percent, cpu.TotalTicks, want, node.NodeResources.Cpu.CpuShares, node.NodeResources.Cpu.TotalCpuCores, st.ResourceUsage.MemoryStats.RSS)
			if cpu.TotalTicks < 0.75*want || cpu.TotalTicks > 1.25*want || cpu.TotalTicks > float64(node.NodeResources.Cpu.CpuShares) {
				t.Fatalf("TotalTicks %.0f is not the MHz used: want about %.0f at %.1f%%", cpu.TotalTicks, want, cpu.Percent)
			}
			if samples++; samples < 3 {
				return fmt.Errorf("%d samples", samples)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("root refused", func(t *testing.T) {
		if _, _, err := a.Client.Jobs().Register(trainJob("as-root", `id -u`, 100, 32, "root"), nil); err != nil {
			t.Fatal(err)
		}
		ev := taskEventOf(t, a, firstAlloc(t, a, "as-root").ID, api.TaskDriverFailure)
		if !strings.Contains(ev.DisplayMessage, "allow_root = true") {
			t.Fatalf("driver failure %q, want the allow_root refusal", ev.DisplayMessage)
		}
	})

	t.Run("program cannot start", func(t *testing.T) {
		job := trainJob("no-program", "", 100, 32, "")
		job.TaskGroups[0].Tasks[0].Config = map[string]interface{}{"command": "/nonexistent/train"}
		if _, _, err := a.Client.Jobs().Register(job, nil); err != nil {
			t.Fatal(err)
		}
		al := firstAlloc(t, a, "no-program")
		ev := taskEventOf(t, a, al.ID, api.TaskDriverFailure)
		if !strings.Contains(ev.DisplayMessage, "/nonexistent/train") {
			t.Fatalf("driver failure %q, want one naming the program", ev.DisplayMessage)
		}
		full, _, err := a.Client.Allocations().Info(al.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range full.TaskStates["trainer"].Events {
			if e.Type == api.TaskStarted || e.Type == api.TaskTerminated {
				t.Fatalf("a task that could not start was reported %s: %s", e.Type, eventList(full.TaskStates["trainer"].Events))
			}
		}
	})

	t.Run("memory limit kills a runaway task", func(t *testing.T) {
		if cgroups == "off" {
			t.Skip("cgroups are off on this machine: no memory limit to enforce")
		}
		if _, _, err := a.Client.Jobs().Register(trainJob("runaway", `head -c 1G /dev/zero | tail > /dev/null`, 100, 32, ""), nil); err != nil {
			t.Fatal(err)
		}
		ev := taskEventOf(t, a, firstAlloc(t, a, "runaway").ID, api.TaskTerminated)
		if ev.ExitCode != 137 || ev.Details["oom_killed"] != "true" {
			t.Fatalf("runaway task ended with %q (exit %d, details %v), want OOM-killed at its 32 MB limit", ev.DisplayMessage, ev.ExitCode, ev.Details)
		}
	})
}

// cgroupMode says which cgroup hierarchy a root Nomad client uses here,
// as Nomad's cgroupslib decides it.
func cgroupMode() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "off"
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == "/sys/fs/cgroup" {
			switch {
			case strings.Contains(line, " - tmpfs "):
				return "v1"
			case strings.Contains(line, " - cgroup2 "):
				return "v2"
			}
		}
	}
	return "off"
}

// TestPreemptionByJobUpdate evicts running batch allocations the way the
// hadar sidecar does, by re-registering the job against its modify index.
// A gate constraint no node satisfies does not evict: Nomad's destructive
// update stops the old allocation only once the replacement is placed, and
// the gate blocks that. Scaling the unit's group to 0 (keeping it, gated)
// and removing a group do: Nomad stops those allocations with the task's
// kill_signal and kill_timeout. The trainer checkpoints within the timeout
// and exits 0, its allocation completes and is not replaced; the task
// that ignores the signal is killed once the timeout is over.
// (Allocations().Stop is no preemption for a batch job: Nomad places a
// replacement at once.)
func TestPreemptionByJobUpdate(t *testing.T) {
	skipShort(t)
	onNomad(t, harness.NomadVersions(), testPreemptionByJobUpdate)
}

func testPreemptionByJobUpdate(t *testing.T, version string) {
	trainer := harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	ckRoot := harness.SharedDir(t)
	a := harness.StartAgent(t, harness.Options{NomadVersion: version, Plugins: map[string]string{
		"hadar-train": fmt.Sprintf("checkpoint_root = %q\nprogress_poll_interval = \"250ms\"", ckRoot)}})
	group := func(name, killTimeout string, task *api.Task) *api.TaskGroup {
		task.KillSignal = "SIGINT"
		task.KillTimeout = pointerTo(mustDuration(t, killTimeout))
		task.Resources = &api.Resources{CPU: pointerTo(100), MemoryMB: pointerTo(128)}
		return &api.TaskGroup{
			Name:             pointerTo(name),
			RestartPolicy:    &api.RestartPolicy{Attempts: pointerTo(0), Mode: pointerTo("fail")},
			ReschedulePolicy: &api.ReschedulePolicy{Attempts: pointerTo(0), Unlimited: pointerTo(false)},
			Tasks:            []*api.Task{task},
		}
	}
	job := &api.Job{
		ID: pointerTo("preempt"), Name: pointerTo("preempt"), Type: pointerTo("batch"),
		Datacenters: []string{"*"},
		TaskGroups: []*api.TaskGroup{
			group("unit-a", "20s", &api.Task{
				Name: "trainer", Driver: "hadar-train",
				Env: map[string]string{"HADAR_STEPS_PER_SEC": "40"},
				Config: map[string]interface{}{"command": trainer, "total_steps": 100000,
					"args": []string{"--model", "mlp", "--progress-interval", "1s"}},
			}),
			group("unit-b", "2s", &api.Task{
				Name: "trainer", Driver: "hadar-train",
				Config: map[string]interface{}{"command": "/bin/sh",
					"args": []string{"-c", `trap 'echo got SIGINT' INT; trap 'echo got SIGTERM' TERM; while :; do sleep 0.2; done`}},
			}),
		},
	}
	if _, _, err := a.Client.Jobs().Register(job, nil); err != nil {
		t.Fatal(err)
	}
	running := map[string]*api.Allocation{}
	err := harness.Eventually(context.Background(), 60*time.Second, 250*time.Millisecond, func() error {
		stubs, _, err := a.Client.Jobs().Allocations("preempt", false, nil)
		if err != nil {
			return err
		}
		for _, s := range stubs {
			if s.ClientStatus == api.AllocClientStatusRunning && running[s.TaskGroup] == nil {
				if running[s.TaskGroup], _, err = a.Client.Allocations().Info(s.ID, nil); err != nil {
					return err
				}
			}
		}
		if len(running) != 2 {
			return fmt.Errorf("%d of 2 groups running", len(running))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	before := waitProgress(t, a, running["unit-a"], 60*time.Second, func(p progress) bool { return p.StepsDone >= 40 })

	// Each write is guarded by the job's modify index, as the sidecar's.
	update := func(change func(*api.Job)) {
		t.Helper()
		cur, _, err := a.Client.Jobs().Info("preempt", nil)
		if err != nil {
			t.Fatal(err)
		}
		change(cur)
		if _, _, err := a.Client.Jobs().RegisterOpts(cur, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: *cur.JobModifyIndex}, nil); err != nil {
			t.Fatal(err)
		}
	}

	// A gate alone leaves the running allocation alone.
	update(func(j *api.Job) {
		j.TaskGroups[0].Constraints = append(j.TaskGroups[0].Constraints, api.NewConstraint("${meta.hadar_gate}", "=", "closed"))
	})
	err = harness.Eventually(context.Background(), 30*time.Second, 250*time.Millisecond, func() error {
		evals, _, err := a.Client.Jobs().Evaluations("preempt", nil)
		if err != nil {
			return err
		}
		for _, ev := range evals {
			if ev.Status == "blocked" {
				return nil
			}
		}
		return fmt.Errorf("the gated replacement is not blocked yet")
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if al, _, err := a.Client.Allocations().Info(running["unit-a"].ID, nil); err != nil || al.ClientStatus != api.AllocClientStatusRunning || al.DesiredStatus != api.AllocDesiredStatusRun {
		t.Fatalf("a gate constraint alone: unit-a allocation %v (%v), want still running (no eviction)", al, err)
	}

	// The eviction: unit-a scaled to 0 (gate kept), unit-b removed.
	update(func(j *api.Job) {
		j.TaskGroups[0].Count = pointerTo(0)
		j.TaskGroups = j.TaskGroups[:1]
	})

	// unit-a: checkpointed within its kill_timeout, exit 0, complete.
	stopped := waitAlloc(t, a, running["unit-a"].ID, 60*time.Second, func(al *api.Allocation) bool { return al.ClientStatus != api.AllocClientStatusRunning })
	if stopped.ClientStatus != api.AllocClientStatusComplete || stopped.DesiredStatus != api.AllocDesiredStatusStop {
		t.Fatalf("unit-a allocation %s/%s, want complete/stop: %s", stopped.ClientStatus, stopped.DesiredStatus, eventList(stopped.TaskStates["trainer"].Events))
	}
	evs := stopped.TaskStates["trainer"].Events
	var killing, exit *api.TaskEvent
	for _, e := range evs {
		switch e.Type {
		case api.TaskKilling:
			killing = e
		case api.TaskTerminated:
			exit = e
		}
	}
	if killing == nil || exit == nil || exit.ExitCode != 0 || exit.Signal != 0 {
		t.Fatalf("unit-a: want Killing, then a clean exit: %s", eventList(evs))
	}
	took := time.Duration(exit.Time - killing.Time)
	if took >= 20*time.Second {
		t.Fatalf("unit-a took %v to exit, past its 20s kill_timeout", took)
	}
	ck := waitEvent(t, a, stopped.ID, "checkpoint saved", 10*time.Second)
	if n, _ := strconv.Atoi(ck.Details["hadar.steps_done"]); int64(n) < before.StepsDone {
		t.Fatalf("checkpoint at step %d, before the progress seen (%d)", n, before.StepsDone)
	}
	if _, err := os.Stat(ck.Details["hadar.checkpoint"]); err != nil {
		t.Fatalf("checkpoint file: %v", err)
	}
	t.Logf("unit-a: signalled, checkpointed at step %s and exited 0 in %v", ck.Details["hadar.steps_done"], took.Round(time.Millisecond))

	// unit-b: got SIGINT, ignored it, killed after its 2s kill_timeout.
	killed := waitAlloc(t, a, running["unit-b"].ID, 60*time.Second, func(al *api.Allocation) bool { return al.ClientStatus != api.AllocClientStatusRunning })
	killing, exit = nil, nil
	for _, e := range killed.TaskStates["trainer"].Events {
		switch e.Type {
		case api.TaskKilling:
			killing = e
		case api.TaskTerminated:
			exit = e
		}
	}
	if killing == nil || exit == nil || exit.Signal != int(syscall.SIGKILL) {
		t.Fatalf("unit-b: want Killing, then SIGKILL: %s", eventList(killed.TaskStates["trainer"].Events))
	}
	tookB := time.Duration(exit.Time - killing.Time)
	if tookB < 2*time.Second || tookB > 10*time.Second {
		t.Fatalf("unit-b killed %v after the stop, want just after its 2s kill_timeout", tookB)
	}
	t.Logf("unit-b: ignored SIGINT, killed %v after the stop (kill_timeout 2s)", tookB.Round(time.Millisecond))
	if logs := taskLog(t, a, killed, "stdout"); !strings.Contains(logs, "got SIGINT") {
		t.Fatalf("unit-b did not get its kill_signal SIGINT: %q", logs)
	}

	// Not replaced: the gate keeps unit-a's new placement pending.
	time.Sleep(3 * time.Second)
	stubs, _, err := a.Client.Jobs().Allocations("preempt", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stubs {
		if s.ID != stopped.ID && s.ID != killed.ID {
			t.Fatalf("allocation %s (%s, %s) replaced an evicted one", s.ID, s.TaskGroup, s.ClientStatus)
		}
	}
	summary, _, err := a.Client.Jobs().Summary("preempt", nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := summary.Summary["unit-a"]; s.Running != 0 || s.Starting != 0 {
		t.Fatalf("unit-a summary %+v: want nothing running", s)
	}
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
