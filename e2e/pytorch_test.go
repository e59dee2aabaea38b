package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/trainer/run"
)

// Real PyTorch (Debian's python3-torch, CPU, gloo) on a real Nomad
// cluster with the sidecar, through the Python library (python/): a DDP
// gang on the exec driver, a job moved to another GPU type on hadar-train
// that resumes on the loss trajectory of an uninterrupted run, and a
// HadarE job on raw_exec whose copies merge real tensors.

// debianPython is the interpreter with Debian's python3-torch; a python3
// earlier on PATH (a pyenv) may lack it.
const debianPython = "/usr/bin/python3"

// torchNode is one client of a PyTorch cluster: its name and GPUs.
type torchNode struct {
	name, prefix, model, mem string
	gpus                     int
}

// torchPaths are where the cluster keeps what tasks on Nomad's own drivers
// share: the host volumes hadar-checkpoints and hadar-merge (mode 1777:
// exec tasks run as nobody), also the node meta raw_exec tasks use.
type torchPaths struct {
	hostCkpt, hostMerge, python string
}

// startTorchCluster starts a server and the nodes, each with the
// plugins, exec, raw_exec and the contract's storage. The exec chroot is
// what a PyTorch script needs: Debian's python3 with torch and
// scikit-learn, and the library where pip would install it.
func startTorchCluster(t *testing.T, nodes []torchNode) (*sidecarCluster, torchPaths) {
	return startTorchClusterDocker(t, nodes, "")
}

// startTorchClusterDocker is startTorchCluster with Nomad's docker driver
// on the daemon at dockerSock too (none when it is empty).
func startTorchClusterDocker(t *testing.T, nodes []torchNode, dockerSock string) (*sidecarCluster, torchPaths) {
	t.Helper()
	return startTorch(t, nodes, dockerSock, "", "")
}

// startTorchDev is startTorchCluster on one dev agent (server and client)
// named name, with the GPUs of every entry of gpus (their names unused).
func startTorchDev(t *testing.T, name string, gpus []torchNode) (*sidecarCluster, torchPaths) {
	t.Helper()
	return startTorch(t, gpus, "", name, "")
}

// startTorch starts the cluster: a server and a client per node, or, with
// dev set, one dev agent of that name with all the nodes' GPUs. A
// non-empty chroot is the clients' chroot_env entries (one "host" =
// "chroot" line each) in place of the harness's own.
func startTorch(t *testing.T, nodes []torchNode, dockerSock, dev, chroot string) (*sidecarCluster, torchPaths) {
	t.Helper()
	skipShort(t)
	if err := exec.Command(debianPython, "-c", "import torch, sklearn").Run(); err != nil {
		t.Skipf("%s cannot import torch and sklearn (%v): apt-get install python3-torch python3-sklearn, as make test does", debianPython, err)
	}
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := torchPaths{hostCkpt: harness.SharedDir(t), hostMerge: harness.SharedDir(t), python: filepath.Join(root, "python")}
	for _, d := range []string{p.hostCkpt, p.hostMerge} {
		if err := os.Chmod(d, 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	if dev == "" {
		c.server = harness.StartAgent(t, harness.Options{Name: "pt-srv", Mode: harness.ModeServer})
		c.api = c.server.Client
	}
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	if chroot == "" {
		// Debian keeps some of torch's libraries (libgloo) in /usr/lib
		// itself; the chroot takes those files, not the whole of /usr/lib
		// (90,000 files).
		libs, err := filepath.Glob("/usr/lib/*.so*")
		if err != nil {
			t.Fatal(err)
		}
		var libLines strings.Builder
		for _, l := range libs {
			fmt.Fprintf(&libLines, "    %q = %q\n", l, l)
		}
		chroot = fmt.Sprintf(`    "/etc"                       = "/etc"
    "/usr/bin"                   = "/usr/bin"
    "/usr/lib64"                 = "/lib64"
    "/usr/lib/x86_64-linux-gnu"  = "/usr/lib/x86_64-linux-gnu"
    "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" = "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    "/usr/lib/python3"           = "/usr/lib/python3"
    "/usr/lib/python3.11"        = "/usr/lib/python3.11"
%s    %q = "/usr/local/lib/python3.11/dist-packages/hadar_train"
`, libLines.String(), filepath.Join(p.python, "hadar_train"))
	}
	extra := fmt.Sprintf(`client {
  host_volume "hadar-checkpoints" {
    path = %q
  }
  host_volume "hadar-merge" {
    path = %q
  }
  chroot_env {
%s  }
}
`, p.hostCkpt, p.hostMerge, chroot)
	plugins := map[string]string{"hadar-train": train, "raw_exec": "enabled = true"}
	drivers := []string{"hadar-train", "exec", "raw_exec"}
	if dockerSock != "" {
		// The harness denies docker; this client block takes it off the
		// list (Nomad merges the client blocks, the later key winning).
		extra += "client {\n  options = {\n    \"driver.denylist\" = \"java,qemu\"\n  }\n}\n"
		// The declared GPUs are emulated: no NVIDIA container runtime (real
		// GPUs need it, Nomad's default for a task with NVIDIA devices).
		plugins["docker"] = fmt.Sprintf("endpoint = %q\nnvidia_runtime = \"runc\"\nvolumes {\n  enabled = true\n}\ngc {\n  image = false\n}", "unix://"+dockerSock)
		drivers = append(drivers, "docker")
	}
	meta := map[string]string{"rack": "r1", jobform.DefaultCheckpointMeta: p.hostCkpt, jobform.DefaultMergeMeta: p.hostMerge}
	if dev != "" {
		var gpus strings.Builder
		for i, n := range nodes {
			d := declare(n.prefix, n.model, n.mem, n.gpus)
			if i > 0 {
				d = strings.TrimPrefix(d, "fingerprint_period = \"1s\"\n")
			}
			gpus.WriteString(d)
		}
		plugins["hadar-gpu"] = gpus.String()
		a := harness.StartAgent(t, harness.Options{Name: dev, Mode: harness.ModeDev, Meta: meta, Plugins: plugins, Drivers: drivers, ExtraConfig: extra})
		c.server, c.api = a, a.Client
		c.nodes[a.NodeID], c.ids[dev] = dev, a.NodeID
	}
	for _, n := range nodes {
		if dev != "" {
			break
		}
		pl := maps.Clone(plugins)
		pl["hadar-gpu"] = declare(n.prefix, n.model, n.mem, n.gpus)
		a := harness.StartAgent(t, harness.Options{Name: n.name, Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr},
			Meta:        meta,
			Plugins:     pl,
			Drivers:     drivers,
			ExtraConfig: extra})
		c.nodes[a.NodeID], c.ids[n.name] = n.name, a.NodeID
	}
	t.Cleanup(c.stopSidecar)
	return c, p
}

// torchJob is a managed PyTorch job.
type torchJob struct {
	id, driver string
	steps      int
	workers    int
	widths     string // hadar.workers of an elastic job ("1-2"), in place of workers
	forkable   bool
	throughput string
	model      string   // hadar.model (with or without a throughput)
	module     string   // hadar_train.examples.<module>
	script     string   // or a script's path, as the task sees it
	args       []string // the script's
	env        map[string]string
	config     string // more config lines (hadar-train's emulate)
	user       string // the task's user
	memory     int
}

func (p torchPaths) hcl(j torchJob) string {
	if j.workers == 0 {
		j.workers = 1
	}
	if j.memory == 0 {
		j.memory = 1024
	}
	// Under the library's launcher, as docs/pytorch.md has it.
	target := []string{"-m", "hadar_train.examples." + j.module}
	if j.script != "" {
		target = []string{j.script}
	}
	args := append(append([]string{"-m", "hadar_train.run"}, target...), j.args...)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = strconv.Quote(a)
	}
	env := map[string]string{"OMP_NUM_THREADS": "1"}
	switch j.driver {
	case "exec":
		// exec finds the library where pip puts it, in its chroot.
	case "docker":
		env["PYTHONPATH"] = dockerPython
	default:
		env["PYTHONPATH"] = p.python
	}
	for k, v := range j.env {
		env[k] = v
	}
	user := ""
	if j.user != "" {
		user = fmt.Sprintf("      user   = %q\n", j.user)
	}
	var envLines strings.Builder
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Fprintf(&envLines, "        %s = %q\n", k, env[k])
	}
	workers := strconv.Itoa(j.workers)
	if j.widths != "" {
		workers = j.widths
	}
	var meta strings.Builder
	if j.throughput != "" || j.model == "" {
		fmt.Fprintf(&meta, "    \"hadar.throughput\" = %q\n", j.throughput)
	}
	if j.model != "" {
		fmt.Fprintf(&meta, "    \"hadar.model\"      = %q\n", j.model)
	}
	return fmt.Sprintf(`job %q {
  type = "batch"
  meta = {
%s    "hadar.steps"      = "%d"
    "hadar.workers"    = %q
    "hadar.forkable"   = "%t"
  }
  %s
  group "train" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "trainer" {
      driver = %q
%s      config {
        command = %q
        args    = [%s]
%s      }
      env {
%s      }
      resources {
        cpu    = 200
        memory = %d
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
`, j.id, meta.String(), j.steps, workers, j.forkable, jobspec.GateHCL, j.driver, user, debianPython, strings.Join(quoted, ", "), j.config, envLines.String(), j.memory)
}

func (c *sidecarCluster) submitTorch(p torchPaths, j torchJob) {
	c.t.Helper()
	src := p.hcl(j)
	job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: src, Canonicalize: true})
	if err != nil {
		c.t.Fatalf("parse job %s: %v\n%s", j.id, err, src)
	}
	if _, _, err := c.api.Jobs().Register(job, nil); err != nil {
		c.t.Fatalf("register job %s: %v", j.id, err)
	}
}

// allocInfo reads an allocation.
func (c *sidecarCluster) allocInfo(id string) *api.Allocation {
	c.t.Helper()
	al, _, err := c.api.Allocations().Info(id, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return al
}

// waitDead waits for a job to finish and checks that no allocation of it
// failed.
func (c *sidecarCluster) waitDead(id string, within time.Duration) {
	c.t.Helper()
	c.waitFor("job "+id+" completes", within, func() error {
		for _, al := range c.allocs(id) {
			if al.ClientStatus == api.AllocClientStatusFailed {
				c.t.Fatalf("job %s: allocation %s (%s) failed: %s\n%s", id, al.ID[:8], al.TaskGroup, taskEvents(al.TaskStates),
					taskLog(c.t, &harness.Agent{Client: c.api}, c.allocInfo(al.ID), "stderr"))
			}
		}
		if st := c.jobStatus(id); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
}

// logOf returns a stream of an allocation's training task.
func (c *sidecarCluster) logOf(allocID, stream string) string {
	c.t.Helper()
	return taskLog(c.t, &harness.Agent{Client: c.api}, c.allocInfo(allocID), stream)
}

// TestPyTorchDDPGangOnExec: a 2-worker DDP job on Nomad's exec driver
// (chroot, cgroups) is placed by the sidecar on two client nodes, one GPU
// each; the workers rendezvous through the environment the sidecar wrote
// (torch.distributed from MASTER_ADDR:MASTER_PORT, RANK, WORLD_SIZE;
// LOCAL_RANK 0 for each), train in lockstep to the job's steps with equal
// replicas, report progress where the sidecar reads it, and rank 0's
// checkpoints land on the mounted host volume.
func TestPyTorchDDPGangOnExec(t *testing.T) {
	c, p := startTorchCluster(t, []torchNode{
		{"ddp-a", "da", modelV100, "16GiB", 1},
		{"ddp-b", "db", modelV100, "16GiB", 1},
	})
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack"}, Workers: config.Workers{Storage: &config.StorageConfig{}}})
	const steps = 300
	c.submitTorch(p, torchJob{id: "ddp", driver: "exec", steps: steps, workers: 2, throughput: "v100=40", module: "ddp"})
	var ws []placedWorker
	c.waitFor("both workers run", 3*time.Minute, func() error {
		if ws = c.workersOf("ddp"); len(ws) != 2 {
			return fmt.Errorf("%d workers running", len(ws))
		}
		return nil
	})
	if ws[0].unit != ws[1].unit || ws[0].node == ws[1].node {
		t.Fatalf("workers %+v: want one unit over the two nodes", ws)
	}
	c.waitDead("ddp", 5*time.Minute)

	job := c.job("ddp")
	var digests []string
	for _, w := range ws {
		env := map[string]string{}
		for _, g := range job.TaskGroups {
			if *g.Name == w.alloc.TaskGroup {
				env = g.Tasks[0].Env
			}
		}
		want := map[string]string{contract.EnvRank: strconv.Itoa(w.rank), contract.EnvWorldSize: "2", contract.EnvLocalRank: "0", contract.EnvLocalWorldSize: "1",
			contract.EnvGroupRank: strconv.Itoa(w.rank), contract.EnvGroupWorldSize: "2", contract.EnvNodeRank: strconv.Itoa(w.rank),
			contract.EnvJobID: "ddp", contract.EnvProgressFile: "${NOMAD_TASK_DIR}/hadar-progress.json",
			contract.EnvCheckpointDir: "/hadar/checkpoints/default/ddp/train/trainer"}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: env %s = %q, want %q", w.rank, k, env[k], v)
			}
		}
		pr, err := c.progressOf(w.alloc.ID)
		if err != nil {
			t.Fatal(err)
		}
		if pr.State != contract.StateDone || pr.StepsDone != steps || pr.WorldSize != 2 || pr.Rank != w.rank || pr.Nodes != 2 || pr.Version != contract.Version {
			t.Errorf("rank %d's progress %+v: want done at %d in a unit of 2 on 2 nodes", w.rank, pr, steps)
		}
		out := c.logOf(w.alloc.ID, "stdout")
		m := regexp.MustCompile(`final steps_done=(\d+) rank=(\d) world_size=2 params=(\w+)`).FindStringSubmatch(out)
		if m == nil || m[1] != strconv.Itoa(steps) || m[2] != strconv.Itoa(w.rank) {
			t.Fatalf("rank %d's output: %q", w.rank, out)
		}
		digests = append(digests, m[3])
		t.Logf("rank %d on %s: %s", w.rank, w.node, strings.TrimSpace(out))
	}
	if digests[0] != digests[1] {
		t.Fatalf("the replicas differ: %v", digests)
	}
	ck := filepath.Join(p.hostCkpt, "default", "ddp", "train", "trainer", contract.CheckpointName(steps, "pt"))
	if _, err := os.Stat(ck); err != nil {
		t.Fatalf("rank 0's last checkpoint on the host volume: %v", err)
	}
	if w := a.Applier().Writes(); w["rollback"] != 0 {
		t.Fatalf("writes %v: the gang was rolled back", w)
	}
}

// TestPyTorchResumesOnAnotherGPUType: a PyTorch job on hadar-train runs
// on a V100; the node is taken away and the sidecar moves the job to the
// only other GPU, a K80: the process is stopped, checkpoints and exits 0;
// the new one resumes at that checkpoint's step (the driver's event says
// so), at the K80's pace, and the losses of both runs together are, digit
// for digit, those of the same script run uninterrupted.
func TestPyTorchResumesOnAnotherGPUType(t *testing.T) {
	c, p := startTorchCluster(t, []torchNode{
		{"res-v100", "rv", modelV100, "16GiB", 1},
		{"res-k80", "rk", modelK80, "12GiB", 1},
	})
	const steps = 900
	args := []string{"--steps", strconv.Itoa(steps), "--log-every", "1"}
	// The reference: the same script, uninterrupted, outside hadar.
	ref := exec.Command(debianPython, append([]string{"-m", "hadar_train.examples.single"}, args...)...)
	ref.Env = append(os.Environ(), "PYTHONPATH="+p.python, "OMP_NUM_THREADS=1")
	out, err := ref.Output()
	if err != nil {
		t.Fatalf("the reference run: %v", err)
	}
	want := lossLines(string(out))
	if len(want) != steps {
		t.Fatalf("the reference run printed %d losses", len(want))
	}

	c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "hadar", Placement: "pack"}})
	c.submitTorch(p, torchJob{id: "mover", driver: "hadar-train", steps: steps, throughput: "v100=60,k80=30", module: "single", args: args,
		config: fmt.Sprintf("        emulate {\n          steps_per_sec = {\n            %q = 60\n            %q = 30\n          }\n        }\n", modelV100, modelK80)})
	var first []placedWorker
	c.waitFor("the job runs on the V100", 3*time.Minute, func() error {
		if first = c.workersOf("mover"); len(first) != 1 || first[0].node != "res-v100" {
			return fmt.Errorf("workers %+v", first)
		}
		return nil
	})
	c.waitFor("the job trains", 2*time.Minute, func() error {
		pr, err := c.progressOf(first[0].alloc.ID)
		if err != nil || pr.StepsDone < 150 {
			return fmt.Errorf("progress %+v, %v", pr, err)
		}
		return nil
	})
	if _, err := c.api.Nodes().ToggleEligibility(c.ids["res-v100"], false, nil); err != nil {
		t.Fatal(err)
	}
	saved := c.eventWith(first[0].alloc.ID, "checkpoint saved at step ", 2*time.Minute)
	var step int64
	var ckpt string
	if _, err := fmt.Sscanf(saved, "checkpoint saved at step %d: %s", &step, &ckpt); err != nil {
		t.Fatalf("event %q: %v", saved, err)
	}
	c.waitFor("the V100 run ends cleanly", time.Minute, func() error {
		al := c.allocInfo(first[0].alloc.ID)
		if al.ClientStatus == api.AllocClientStatusFailed {
			t.Fatalf("the V100 run failed: %s", taskEvents(al.TaskStates))
		}
		if al.ClientStatus != api.AllocClientStatusComplete {
			return fmt.Errorf("status %s", al.ClientStatus)
		}
		return nil
	})
	var second []placedWorker
	c.waitFor("the job runs on the K80", 3*time.Minute, func() error {
		if second = c.workersOf("mover"); len(second) != 1 || second[0].node != "res-k80" {
			return fmt.Errorf("workers %+v", second)
		}
		return nil
	})
	// The driver's event names the checkpoint and the steps of the first
	// progress it read (the run may be a few steps on by then); the
	// process says where it resumed.
	resumed := c.eventWith(second[0].alloc.ID, "resumed from checkpoint "+ckpt+" at step ", 2*time.Minute)
	var at int64
	if _, err := fmt.Sscanf(strings.TrimPrefix(resumed, "resumed from checkpoint "+ckpt), " at step %d", &at); err != nil || at < step {
		t.Fatalf("the K80 run: %q; want a resume from %s at step %d or after", resumed, ckpt, step)
	}
	started := c.eventWith(second[0].alloc.ID, "training process started", time.Minute)
	if !strings.Contains(started, "Tesla K80") || !strings.Contains(started, "pace 30 steps/s") {
		t.Fatalf("the K80 run started as %q", started)
	}
	c.waitDead("mover", 3*time.Minute)
	if log := c.logOf(second[0].alloc.ID, "stderr"); !strings.Contains(log, fmt.Sprintf("resumed from checkpoint %s at step %d ", ckpt, step)) {
		t.Fatalf("the K80 run does not say it resumed from %s at step %d:\n%s", ckpt, step, log)
	}
	firstLosses, secondLosses := lossLines(c.logOf(first[0].alloc.ID, "stdout")), lossLines(c.logOf(second[0].alloc.ID, "stdout"))
	t.Logf("moved at step %d of %d (%s); %d losses on the V100, %d on the K80", step, steps, ckpt, len(firstLosses), len(secondLosses))
	if int64(len(firstLosses)) != step {
		t.Fatalf("the V100 run printed %d losses and checkpointed at step %d", len(firstLosses), step)
	}
	if got := append(firstLosses, secondLosses...); !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("the loss trajectory leaves the uninterrupted run's at %q (want %q); %d losses, %d in the reference", got[i], want[i], len(got), len(want))
			}
		}
		t.Fatalf("%d losses, %d in the reference", len(got), len(want))
	}
}

func lossLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "step ") {
			out = append(out, l)
		}
	}
	return out
}

// TestPyTorchHadarEForks: a forkable PyTorch job on raw_exec starts as
// one copy; when nodes free up, the sidecar forks it onto them; the copies
// (the sidecar gave each its merge directory and copy index) merge real
// tensors, round after round, through the contract's files; and the
// merged model's accuracy on scikit-learn's digits is within a point of
// one job trained the same steps.
func TestPyTorchHadarEForks(t *testing.T) {
	c, p := startTorchCluster(t, []torchNode{
		{"he-a", "ha", modelV100, "16GiB", 1},
		{"he-b", "hb", modelV100, "16GiB", 1},
		{"he-k80", "hk", modelK80, "12GiB", 1},
	})
	for _, n := range []string{"he-b", "he-k80"} {
		if _, err := c.api.Nodes().ToggleEligibility(c.ids[n], false, nil); err != nil {
			t.Fatal(err)
		}
	}
	const total = 3000
	c.startSidecar(config.Config{
		Scheduling: config.Scheduling{Policy: "hadare", Round: "10s"},
		RunLimits:  config.RunLimits{RestartCost: "1s", MergeCost: "1s"},
		Workers:    config.Workers{Storage: &config.StorageConfig{}},
	})
	// Paced (raw_exec has no emulation): a copy does 25 steps/s and merges
	// every 50 steps, so one copy alone would take two minutes. (At 50
	// steps/s, on a machine loaded enough that the forks' start-up took
	// a minute, the first copy had done all but a few rounds alone.)
	c.submitTorch(p, torchJob{id: "forked", driver: "raw_exec", steps: total, forkable: true, throughput: "v100=25,k80=12.5", module: "hadare",
		env: map[string]string{contract.EnvStepsPerSec: "25", contract.EnvMergeEvery: "50"}})
	dir := filepath.Join(p.hostMerge, "default", "forked")
	var first []placedWorker
	c.waitFor("the first copy runs and merges", 3*time.Minute, func() error {
		if first = c.workersOf("forked"); len(first) != 1 {
			return fmt.Errorf("%d copies", len(first))
		}
		if rs, err := run.MergedRounds(dir); err != nil || len(rs) < 3 {
			return fmt.Errorf("closed rounds %v, %v", rs, err)
		}
		return nil
	})
	for _, n := range []string{"he-b", "he-k80"} {
		if _, err := c.api.Nodes().ToggleEligibility(c.ids[n], true, nil); err != nil {
			t.Fatal(err)
		}
	}
	units := map[int]string{}
	c.waitFor("the job completes", 6*time.Minute, func() error {
		for _, w := range c.workersOf("forked") {
			units[w.unit] = w.node
		}
		for _, al := range c.allocs("forked") {
			if al.ClientStatus == api.AllocClientStatusFailed {
				t.Fatalf("copy %s failed: %s\n%s", al.TaskGroup, taskEvents(al.TaskStates), c.logOf(al.ID, "stderr"))
			}
		}
		if st := c.jobStatus("forked"); st != "dead" {
			return fmt.Errorf("status %s, copies seen %v", st, units)
		}
		return nil
	})
	if len(units) < 2 {
		t.Fatalf("the job never ran as more than one copy (units %v)", units)
	}
	rs, err := run.MergedRounds(dir)
	if err != nil {
		t.Fatal(err)
	}
	var prev int64
	several := 0
	var last *run.Merged
	for i, r := range rs {
		m, err := run.ReadMerged(run.MergedPath(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		if m.Round != i {
			t.Fatalf("closed rounds: %d missing", i)
		}
		var sum int64
		for _, cb := range m.Members {
			sum += cb.Steps
			if _, ok := units[cb.Copy]; !ok {
				t.Fatalf("round %d merged copy %d, no unit of the job (%v)", r, cb.Copy, units)
			}
		}
		if m.StepsDone != prev+sum {
			t.Fatalf("round %d: %d steps after %d with members %+v", r, m.StepsDone, prev, m.Members)
		}
		prev = m.StepsDone
		if len(m.Members) > 1 {
			several++
		}
		last = m
	}
	if !last.Done || last.StepsDone != total || several < 5 {
		t.Fatalf("last round %d: %d steps, done %v; %d rounds with several copies; want done at %d, >= 5 such rounds", last.Round, last.StepsDone, last.Done, several, total)
	}
	if w := last.State["0.weight"]; w.DType != "float32" || !slices.Equal(w.Shape, []int{64, 64}) {
		t.Fatalf("the merged model's first layer: %s %v", w.DType, w.Shape)
	}

	// The merged model against one job of the same steps (the same script
	// with no merge directory: a plain run).
	score := func(args ...string) float64 {
		cmd := exec.CommandContext(context.Background(), debianPython, append([]string{"-m", "hadar_train.examples.hadare"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+p.python, "OMP_NUM_THREADS=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("hadare %v: %v", args, err)
		}
		m := regexp.MustCompile(`test_accuracy=([0-9.]+)`).FindStringSubmatch(string(out))
		if m == nil {
			t.Fatalf("hadare %v printed %q", args, out)
		}
		acc, _ := strconv.ParseFloat(m[1], 64)
		return acc
	}
	merged := score("--evaluate", run.MergedPath(dir, last.Round))
	single := score("--steps", strconv.Itoa(total))
	t.Logf("%d rounds, %d with several copies; copies seen %v; merged model accuracy %.2f%%, one job's %.2f%%", len(rs), several, units, 100*merged, 100*single)
	if 100*(single-merged) > 1 {
		t.Fatalf("the merged model's accuracy %.4f is more than a point below one job's %.4f", merged, single)
	}
}

// The docker test's image and mounts: an empty root whose /usr (Debian's
// python3 with torch) and the library are the host's, read-only. No
// registry is reachable from these machines: the image is imported.
const (
	dockerImage  = "hadar-host-python:e2e"
	dockerPython = "/opt/hadar-python"
)

// startDocker runs Debian's Docker daemon (make docker unpacks it into
// bin/docker) on a socket and data root of its own, with no network of
// its own (no bridge, no iptables), imports the test image, runs one
// container from it the way the test's tasks run (the host's python3 and
// torch, as nobody, no network), and stops the daemon when the test ends
// (after the agents: start it first). It returns the daemon's socket, or
// why Docker cannot run that container on this machine (no daemon
// unpacked, a daemon that does not start, an image it cannot make or
// run: a kernel or a sandbox without what containers need).
func startDocker(t *testing.T) (sock, why string) {
	t.Helper()
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "docker")
	dockerd := filepath.Join(bin, "usr", "sbin", "dockerd")
	if _, err := os.Stat(dockerd); err != nil {
		return "", fmt.Sprintf("no Docker daemon at %s (%v): make docker unpacks Debian's", dockerd, err)
	}
	dir := harness.SharedDir(t)
	sock = filepath.Join(dir, "docker.sock")
	env := append(os.Environ(), "PATH="+filepath.Join(bin, "usr", "bin")+":"+filepath.Join(bin, "usr", "sbin")+":"+os.Getenv("PATH"))
	logPath := filepath.Join(dir, "dockerd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(dockerd, "--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"), "-H", "unix://"+sock, "--iptables=false", "--ip-forward=false",
		"--ip-masq=false", "--bridge=none", "--containerd-namespace", "hadar-e2e", "--containerd-plugins-namespace", "hadar-e2e-plugins")
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", fmt.Sprintf("%s does not start: %v", dockerd, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("dockerd did not stop in 30s; killing it")
			_ = cmd.Process.Kill()
			<-done
		}
		// dockerd leaves the default network namespace's bind mount
		// (exec-root/netns/default) behind when it stops.
		unmountUnder(t, dir)
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("dockerd.log:\n%s", tail(b, 4000))
			}
		}
	})
	logTail := func() string {
		b, _ := os.ReadFile(logPath)
		return tail(b, 1500)
	}
	docker := func(stdin []byte, args ...string) ([]byte, error) {
		c := exec.Command(filepath.Join(bin, "usr", "bin", "docker"), args...)
		c.Env = append(env, "DOCKER_HOST=unix://"+sock)
		if stdin != nil {
			c.Stdin = bytes.NewReader(stdin)
		}
		return c.CombinedOutput()
	}
	// A daemon that exits (a kernel without what it needs) ends the wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := harness.Eventually(ctx, time.Minute, 200*time.Millisecond, func() error {
		_, err := docker(nil, "version")
		return err
	}); err != nil {
		select {
		case <-done:
			err = fmt.Errorf("dockerd exited: %v", cmd.ProcessState)
		default:
		}
		return "", fmt.Sprintf("dockerd did not answer on %s: %v; its log ends:\n%s", sock, err, logTail())
	}
	// The image: directories, and /bin, /lib, /lib64 into /usr as on the host.
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, d := range []string{"usr", "etc", "etc/alternatives", "tmp", "proc", "sys", "dev", "opt", "opt/hadar-python", "hadar", "local", "alloc", "secrets"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode}); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := docker(b.Bytes(), "import", "-", dockerImage); err != nil {
		return "", fmt.Sprintf("docker import: %v: %s; dockerd's log ends:\n%s", err, out, logTail())
	}
	args := []string{"run", "--rm", "--network", "none", "--user", "65534:65534", "-e", "PYTHONPATH=" + dockerPython}
	for _, v := range dockerVolumes(root) {
		args = append(args, "-v", v)
	}
	args = append(args, dockerImage, debianPython, "-c", "import torch, hadar_train; print(torch.ones(2).sum().item())")
	if out, err := docker(nil, args...); err != nil || strings.TrimSpace(string(out)) != "2.0" {
		return "", fmt.Sprintf("docker run of the host's python3 in %s: %v: %s; dockerd's log ends:\n%s", dockerImage, err, out, logTail())
	}
	return sock, ""
}

// dockerVolumes are the test image's bind mounts: Debian's python3 with
// torch, and the library, read-only.
func dockerVolumes(repo string) []string {
	return []string{"/usr:/usr:ro", "/etc/alternatives:/etc/alternatives:ro", "/etc/ld.so.cache:/etc/ld.so.cache:ro",
		filepath.Join(repo, "python") + ":" + dockerPython + ":ro"}
}

// TestPyTorchDDPOnDocker: Nomad's docker driver, on Debian's daemon, runs
// a 2-worker DDP gang the sidecar placed on one node with two GPUs: the
// co-located workers each see one GPU at LOCAL_RANK 0, rendezvous on the
// host's network, write progress where the sidecar reads it (/local in
// the container), and checkpoint onto the host volume the sidecar mounted.
// Where Docker cannot run a container (startDocker says why), it checks
// what the sidecar writes into the docker tasks it generates, and skips
// the run.
func TestPyTorchDDPOnDocker(t *testing.T) {
	skipShort(t)
	sock, why := startDocker(t)
	c, p := startTorchClusterDocker(t, []torchNode{{"dk-a", "dk", modelV100, "16GiB", 2}}, sock)
	const steps = 200
	root, err := hostpath.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, 0, 4)
	for _, v := range dockerVolumes(root) {
		quoted = append(quoted, strconv.Quote(v))
	}
	volumes := fmt.Sprintf("        image        = %q\n        network_mode = \"host\"\n        volumes      = [%s]\n",
		dockerImage, strings.Join(quoted, ", "))
	j := torchJob{id: "dkddp", driver: "docker", steps: steps, workers: 2, throughput: "v100=40", module: "ddp", config: volumes, user: "65534:65534"}
	if why != "" {
		// No docker driver on the node: the sidecar would not place the
		// job. What it would write for it, and that Nomad takes it.
		job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: p.hcl(j), Canonicalize: true})
		if err != nil {
			t.Fatal(err)
		}
		spec, err := jobspec.Parse(job)
		if err != nil {
			t.Fatal(err)
		}
		w := jobform.Worker{Node: c.ids["dk-a"], Type: "v100", Models: []string{modelV100}, Addr: "127.0.0.1"}
		placed, err := jobform.Placed(job, spec, []jobform.Unit{{ID: 0, Port: 29500, Workers: []jobform.Worker{w, w}}})
		if err != nil {
			t.Fatal(err)
		}
		if v, _, err := c.api.Jobs().Validate(placed, nil); err != nil || v.Error != "" || len(v.ValidationErrors) > 0 {
			t.Fatalf("Nomad refuses the placed job: %v %+v", err, v)
		}
		checkDockerTasks(t, generatedGroups(placed))
		t.Skipf("checked the docker tasks the sidecar generates (Nomad validates them); Docker cannot run a container on this machine, so the gang was not run: %s", why)
	}
	c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack"}, Workers: config.Workers{Storage: &config.StorageConfig{}}})
	c.submitTorch(p, j)
	c.waitFor("the sidecar writes both workers", 2*time.Minute, func() error {
		if n := len(generatedGroups(c.job("dkddp"))); n != 2 {
			return fmt.Errorf("%d generated groups", n)
		}
		return nil
	})
	checkDockerTasks(t, generatedGroups(c.job("dkddp")))

	var ws []placedWorker
	c.waitFor("both workers run", 4*time.Minute, func() error {
		if ws = c.workersOf("dkddp"); len(ws) != 2 {
			for _, al := range c.allocs("dkddp") {
				if al.ClientStatus == api.AllocClientStatusFailed {
					t.Fatalf("worker %s failed: %s", al.TaskGroup, taskEvents(al.TaskStates))
				}
			}
			return fmt.Errorf("%d workers running", len(ws))
		}
		return nil
	})
	c.waitDead("dkddp", 5*time.Minute)
	var digests []string
	for _, w := range ws {
		pr, err := c.progressOf(w.alloc.ID)
		if err != nil {
			t.Fatal(err)
		}
		if pr.State != contract.StateDone || pr.StepsDone != steps || pr.WorldSize != 2 || pr.Nodes != 1 {
			t.Errorf("rank %d's progress %+v", w.rank, pr)
		}
		out := c.logOf(w.alloc.ID, "stdout")
		m := regexp.MustCompile(`params=(\w+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("rank %d printed %q", w.rank, out)
		}
		digests = append(digests, m[1])
		if log := c.logOf(w.alloc.ID, "stderr"); !strings.Contains(log, fmt.Sprintf("rank %d/2 (local rank 0, node 0 of 1)", w.rank)) {
			t.Errorf("rank %d's log does not show LOCAL_RANK 0:\n%s", w.rank, log)
		}
	}
	if digests[0] != digests[1] {
		t.Fatalf("the replicas differ: %v", digests)
	}
	if _, err := os.Stat(filepath.Join(p.hostCkpt, "default", "dkddp", "train", "trainer", contract.CheckpointName(steps, "pt"))); err != nil {
		t.Fatalf("rank 0's checkpoint on the host volume: %v", err)
	}
}

// generatedGroups are the worker groups the sidecar generated in job.
func generatedGroups(job *api.Job) []*api.TaskGroup {
	var out []*api.TaskGroup
	for _, g := range job.TaskGroups {
		if _, ok := groupname.Parse(*g.Name); ok {
			out = append(out, g)
		}
	}
	return out
}

// checkDockerTasks checks what the sidecar writes into the docker tasks of
// the test's 2-worker gang: torchrun's variables with LOCAL_RANK 0, the
// contract's paths, the checkpoint volume mounted, time to checkpoint.
func checkDockerTasks(t *testing.T, groups []*api.TaskGroup) {
	t.Helper()
	if len(groups) != 2 {
		t.Fatalf("%d generated groups, want 2", len(groups))
	}
	for _, g := range groups {
		w, _ := groupname.Parse(*g.Name)
		rank := w.Rank
		task := g.Tasks[0]
		want := map[string]string{
			contract.EnvRank: strconv.Itoa(rank), contract.EnvWorldSize: "2", contract.EnvLocalRank: "0", contract.EnvLocalWorldSize: "1",
			contract.EnvJobID: "dkddp", contract.EnvCheckpointDir: "/hadar/checkpoints/default/dkddp/train/trainer",
			contract.EnvProgressFile: "${NOMAD_TASK_DIR}/" + contract.ProgressFileName,
		}
		for k, v := range want {
			if task.Env[k] != v {
				t.Errorf("%s: env %s=%q, want %q", *g.Name, k, task.Env[k], v)
			}
		}
		if v := g.Volumes["hadar-checkpoints"]; v == nil || v.Type != "host" || v.Source != jobform.DefaultCheckpointVolume {
			t.Errorf("%s: volume hadar-checkpoints %+v, want the host volume %s", *g.Name, v, jobform.DefaultCheckpointVolume)
		}
		if len(task.VolumeMounts) != 1 || *task.VolumeMounts[0].Destination != "/hadar/checkpoints" || *task.VolumeMounts[0].ReadOnly {
			t.Errorf("%s: volume mounts %v, want hadar-checkpoints read-write at /hadar/checkpoints", *g.Name, task.VolumeMounts)
		}
		if task.KillSignal != jobform.DefaultKillSignal || task.KillTimeout == nil || *task.KillTimeout < jobform.DefaultKillTimeout {
			t.Errorf("%s: kill_signal %q kill_timeout %v, want %s and at least %v", *g.Name, task.KillSignal, task.KillTimeout,
				jobform.DefaultKillSignal, jobform.DefaultKillTimeout)
		}
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Errorf("mountinfo: %v", err)
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", p, err)
		}
	}
}
