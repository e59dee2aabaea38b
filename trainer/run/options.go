package run

import (
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"time"

	"github.com/hadar-sched/hadar/trainer"

	"github.com/hadar-sched/hadar/contract"
)

// Options configure one training process.
type Options struct {
	Data  trainer.DataConfig
	Train trainer.TrainConfig

	Steps            int           // the job's total steps
	ProgressFile     string        // where progress is written
	CheckpointDir    string        // where checkpoints are written and resumed from
	StepsPerSec      float64       // emulated pace; 0 runs flat out
	JobID            string        // shared by all copies; checked in merge files
	CopyIndex        int           // HadarE: this copy, 0-based
	Copies           int           // HadarE: number of copies
	MergeDir         string        // HadarE: shared directory; "" disables merging
	MergeEvery       int           // HadarE: local steps between merges
	MergeTimeout     time.Duration // HadarE: how long to wait for the other copies
	ProgressInterval time.Duration // how often the progress file is rewritten
	CheckpointEvery  int           // local steps between periodic checkpoints; 0: only on stop and at the end
	KeepCheckpoints  int           // newest checkpoints kept; older ones are removed

	// Membership merging (HadarE copies that come and go).
	Unit           int           // HADAR_UNIT: the sidecar's unit number, -1 unset; a copy's index when HADAR_COPY_INDEX is unset
	MergeInterval  time.Duration // HadarE: when > 0 and the pace is known, a round is this long: merge-every = pace x interval
	MemberTTL      time.Duration // HadarE: a copy whose heartbeat is older has left
	heartbeatEvery time.Duration // how often a copy rewrites its heartbeat (tests shorten it)

	// Distributed emulation: one unit of WorldSize workers, rank 0 training
	// and the others following its steps in lockstep (docs/trainer.md).
	Rank              int           // RANK
	WorldSize         int           // WORLD_SIZE
	MasterAddr        string        // MASTER_ADDR: rank 0's address
	MasterPort        int           // MASTER_PORT: rank 0's rendezvous port
	NodeRank          int           // GROUP_RANK (or NODE_RANK): the worker's node in the unit, -1 unknown
	GPUModel          string        // HADAR_GPU_MODEL: informational, reported at the rendezvous
	SpreadStepsPerSec float64       // HADAR_SPREAD_STEPS_PER_SEC: pace when the unit spans nodes; 0: StepsPerSec
	SyncEvery         int           // steps between barriers; 0: about a quarter second at the unit's pace
	RendezvousTimeout time.Duration // how long the unit may take to gather
	PeerTimeout       time.Duration // silence after which a peer counts as lost
	StopGrace         time.Duration // how long a worker whose unit broke waits for its own stop signal
}

// Distributed reports whether the process is one worker of a unit of
// several.
func (o Options) Distributed() bool { return o.WorldSize > 1 }

// Merging reports whether the process merges with HadarE copies (only a
// unit's rank 0 does).
func (o Options) Merging() bool { return o.MergeDir != "" && o.Rank == 0 }

// ParseTrainArgs builds Options from command-line args and the environment
// (getenv, usually os.Getenv). Precedence, highest first: a flag given on the
// command line, the HADAR_* variable bound to it, the flag's default. The
// path defaults follow the contract: $NOMAD_TASK_DIR/hadar-progress.json and
// $NOMAD_ALLOC_DIR/data/checkpoints (relative to the working directory when
// the Nomad variables are unset). Usage and flag errors go to usage.
func ParseTrainArgs(args []string, getenv func(string) string, usage io.Writer) (Options, error) {
	fs := flag.NewFlagSet("hadar-trainer train", flag.ContinueOnError)
	fs.SetOutput(usage)
	dc := trainer.DefaultDataConfig(1)
	tc := trainer.DefaultTrainConfig(trainer.MLP, 1)
	var o Options
	model := fs.String("model", string(tc.Model), "model: mlp or softmax")
	fs.IntVar(&tc.Hidden, "hidden", tc.Hidden, "hidden units of the mlp")
	seed := fs.Uint64("seed", 1, "seed of the dataset, the initial parameters and the data order (the same for all copies of a job)")
	fs.IntVar(&tc.Batch, "batch", tc.Batch, "minibatch size")
	fs.Float64Var(&tc.LR, "lr", tc.LR, "learning rate")
	fs.Float64Var(&tc.Momentum, "momentum", tc.Momentum, "SGD momentum in [0, 1); 0 disables it")
	fs.IntVar(&dc.Size, "dataset-size", dc.Size, "samples generated, train plus test")
	fs.IntVar(&dc.Dim, "dim", dc.Dim, "features per sample")
	fs.IntVar(&dc.Classes, "classes", dc.Classes, "number of classes")
	fs.IntVar(&dc.ClustersPerClass, "clusters", dc.ClustersPerClass, "Gaussian clusters per class")
	fs.Float64Var(&dc.Spread, "spread", dc.Spread, "standard deviation of the cluster centers (noise around them is 1)")
	fs.Float64Var(&dc.TestFraction, "test-fraction", dc.TestFraction, "share of the samples held out for evaluation")
	fs.IntVar(&o.Steps, "steps", 4000, "the job's total steps (env HADAR_TOTAL_STEPS)")
	fs.StringVar(&o.ProgressFile, "progress-file", "", "progress file (env HADAR_PROGRESS_FILE; default $NOMAD_TASK_DIR/hadar-progress.json)")
	fs.StringVar(&o.CheckpointDir, "checkpoint-dir", "", "checkpoint directory (env HADAR_CHECKPOINT_DIR; default $NOMAD_ALLOC_DIR/data/checkpoints)")
	fs.Float64Var(&o.StepsPerSec, "steps-per-sec", 0, "emulated pace in steps/s; 0 runs flat out (env HADAR_STEPS_PER_SEC)")
	fs.StringVar(&o.JobID, "job-id", "", "job ID shared by all copies (env HADAR_JOB_ID)")
	fs.IntVar(&o.CopyIndex, "copy-index", 0, "HadarE: this copy's index, 0-based (env HADAR_COPY_INDEX)")
	fs.IntVar(&o.Copies, "copies", 1, "HadarE: number of copies (env HADAR_COPIES)")
	fs.StringVar(&o.MergeDir, "merge-dir", "", "HadarE: directory shared by the copies; empty disables merging (env HADAR_MERGE_DIR)")
	fs.IntVar(&o.MergeEvery, "merge-every", 100, "HadarE: steps between merges (env HADAR_MERGE_EVERY)")
	fs.DurationVar(&o.MergeTimeout, "merge-timeout", 2*time.Minute, "HadarE: how long to wait for the other copies at a merge before skipping them")
	fs.DurationVar(&o.ProgressInterval, "progress-interval", time.Second, "how often the progress file is rewritten (the contract requires at most 5s)")
	fs.IntVar(&o.CheckpointEvery, "checkpoint-every", 0, "local steps between periodic checkpoints; 0 checkpoints only when stopped and at the end")
	fs.IntVar(&o.KeepCheckpoints, "keep-checkpoints", 2, "newest checkpoints kept in the checkpoint directory")
	fs.IntVar(&o.Unit, "unit", -1, "the hadar sidecar's unit number; a HadarE copy's index when --copy-index is not given (env HADAR_UNIT)")
	fs.DurationVar(&o.MergeInterval, "merge-interval", 0, "HadarE: merge about this often: each copy's merge-every becomes its pace times this (needs a pace); 0 uses --merge-every (env HADAR_MERGE_INTERVAL)")
	fs.DurationVar(&o.MemberTTL, "member-ttl", 15*time.Second, "HadarE: a copy whose heartbeat in the merge directory is older than this has left")
	fs.IntVar(&o.Rank, "rank", 0, "this worker's rank in its unit (env RANK)")
	fs.IntVar(&o.WorldSize, "world-size", 1, "workers in the unit (env WORLD_SIZE)")
	fs.StringVar(&o.MasterAddr, "master-addr", "", "rank 0's address, where the other ranks join (env MASTER_ADDR)")
	fs.IntVar(&o.MasterPort, "master-port", 0, "rank 0's rendezvous port (env MASTER_PORT)")
	fs.IntVar(&o.NodeRank, "node-rank", -1, "this worker's node in the unit (env NODE_RANK, else GROUP_RANK); -1: tell nodes apart by host name")
	fs.StringVar(&o.GPUModel, "gpu-model", "", "the GPU model, reported at the rendezvous (env HADAR_GPU_MODEL)")
	fs.Float64Var(&o.SpreadStepsPerSec, "spread-steps-per-sec", 0, "emulated pace when the unit spans several nodes; 0: --steps-per-sec (env HADAR_SPREAD_STEPS_PER_SEC)")
	fs.IntVar(&o.SyncEvery, "sync-every", 0, "distributed: steps between barriers; 0: about a quarter second at the unit's pace")
	fs.DurationVar(&o.RendezvousTimeout, "rendezvous-timeout", 10*time.Minute, "distributed: how long the unit's workers may take to gather before giving up")
	fs.DurationVar(&o.PeerTimeout, "peer-timeout", 20*time.Second, "distributed: a peer silent this long is lost")
	fs.DurationVar(&o.StopGrace, "stop-grace", 10*time.Second, "distributed: when the unit breaks, how long a worker waits for its own stop signal (exit 0) before failing (exit 1)")
	if err := fs.Parse(args); err != nil {
		return Options{}, err
	}
	if fs.NArg() > 0 {
		return Options{}, fmt.Errorf("unexpected argument %q; all options are flags (see -h)", fs.Arg(0))
	}
	// The contract's environment variables and the flags they stand in for
	// when the flag is not given on the command line.
	envBindings := []struct{ env, flag string }{
		{contract.EnvProgressFile, "progress-file"},
		{contract.EnvCheckpointDir, "checkpoint-dir"},
		{contract.EnvTotalSteps, "steps"},
		{contract.EnvStepsPerSec, "steps-per-sec"},
		{contract.EnvJobID, "job-id"},
		{contract.EnvCopyIndex, "copy-index"},
		{contract.EnvCopies, "copies"},
		{contract.EnvMergeDir, "merge-dir"},
		{contract.EnvMergeEvery, "merge-every"},
		{contract.EnvMergeInterval, "merge-interval"},
		{contract.EnvUnit, "unit"},
		{contract.EnvGPUModel, "gpu-model"},
		{contract.EnvSpreadStepsPerSec, "spread-steps-per-sec"},
		// torchrun's names, as the hadar sidecar sets them.
		{contract.EnvRank, "rank"},
		{contract.EnvWorldSize, "world-size"},
		{contract.EnvMasterAddr, "master-addr"},
		{contract.EnvMasterPort, "master-port"},
		// NODE_RANK is hadar's node index (the sidecar sets it; GROUP_RANK
		// is then the worker's own, one GPU per torchrun "node"); under
		// torchrun itself GROUP_RANK is the node's.
		{contract.EnvNodeRank, "node-rank"},
		{contract.EnvGroupRank, "node-rank"},
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	fromEnv := map[string]bool{}
	for _, b := range envBindings {
		v := getenv(b.env)
		if explicit[b.flag] || fromEnv[b.flag] || v == "" {
			continue
		}
		if err := fs.Set(b.flag, v); err != nil {
			return Options{}, fmt.Errorf("env %s=%q: not a valid value for --%s (%w); fix or unset it", b.env, v, b.flag, err)
		}
		fromEnv[b.flag] = true
	}
	if !explicit["copy-index"] && !fromEnv["copy-index"] && o.Unit >= 0 && o.MergeDir != "" {
		// A HadarE copy the sidecar placed: its unit is its copy. (Not
		// otherwise: a job that is not forked keeps one data order and
		// one checkpoint across the units it is moved through.)
		o.CopyIndex = o.Unit
	}
	o.heartbeatEvery = time.Second
	if o.ProgressFile == "" {
		o.ProgressFile = filepath.Join(getenv("NOMAD_TASK_DIR"), contract.ProgressFileName)
	}
	if o.CheckpointDir == "" {
		o.CheckpointDir = filepath.Join(getenv("NOMAD_ALLOC_DIR"), "data", "checkpoints")
	}
	// Absolute paths, so the progress file names a checkpoint the driver
	// can open whatever its working directory.
	for _, p := range []*string{&o.ProgressFile, &o.CheckpointDir, &o.MergeDir} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return Options{}, fmt.Errorf("path %q: %w", *p, err)
		}
		*p = abs
	}
	m, err := trainer.ParseModel(*model)
	if err != nil {
		return Options{}, fmt.Errorf("flag --model: %w", err)
	}
	tc.Model, tc.Seed, dc.Seed = m, *seed, *seed
	o.Train, o.Data = tc, dc
	if err := o.Validate(); err != nil {
		return Options{}, err
	}
	return o, nil
}

// Validate reports the first bad option, naming its flag.
func (o Options) Validate() error {
	if err := o.Data.Validate(); err != nil {
		return err
	}
	if err := o.Train.Validate(); err != nil {
		return err
	}
	switch {
	case o.Steps < 1:
		return fmt.Errorf("--steps (HADAR_TOTAL_STEPS): want >= 1, got %d", o.Steps)
	case o.StepsPerSec < 0 || math.IsNaN(o.StepsPerSec):
		return fmt.Errorf("--steps-per-sec (HADAR_STEPS_PER_SEC): want >= 0 (0 = flat out), got %g", o.StepsPerSec)
	case o.Copies < 1:
		return fmt.Errorf("--copies (HADAR_COPIES): want >= 1, got %d", o.Copies)
	case o.CopyIndex < 0:
		return fmt.Errorf("--copy-index (HADAR_COPY_INDEX, else HADAR_UNIT): want >= 0, got %d", o.CopyIndex)
	case o.Copies > 1 && o.CopyIndex >= o.Copies:
		return fmt.Errorf("--copy-index (HADAR_COPY_INDEX): want 0..%d for %d copies, got %d", o.Copies-1, o.Copies, o.CopyIndex)
	case o.Copies > 1 && o.MergeDir == "":
		return fmt.Errorf("--copies (HADAR_COPIES) is %d but --merge-dir (HADAR_MERGE_DIR) is empty; copies must share a merge directory", o.Copies)
	case o.MergeEvery < 1:
		return fmt.Errorf("--merge-every (HADAR_MERGE_EVERY): want >= 1, got %d", o.MergeEvery)
	case o.MergeTimeout <= 0:
		return fmt.Errorf("--merge-timeout: want > 0, got %s", o.MergeTimeout)
	case o.ProgressInterval <= 0 || o.ProgressInterval > 5*time.Second:
		return fmt.Errorf("--progress-interval: want in (0, 5s] as the contract requires, got %s", o.ProgressInterval)
	case o.CheckpointEvery < 0:
		return fmt.Errorf("--checkpoint-every: want >= 0, got %d", o.CheckpointEvery)
	case o.KeepCheckpoints < 1:
		return fmt.Errorf("--keep-checkpoints: want >= 1, got %d", o.KeepCheckpoints)
	case o.ProgressFile == "" || o.CheckpointDir == "":
		return fmt.Errorf("--progress-file and --checkpoint-dir must not be empty")
	case o.MergeInterval < 0:
		return fmt.Errorf("--merge-interval (HADAR_MERGE_INTERVAL): want >= 0, got %s", o.MergeInterval)
	case o.MemberTTL <= 0:
		return fmt.Errorf("--member-ttl: want > 0, got %s", o.MemberTTL)
	case o.WorldSize < 1:
		return fmt.Errorf("--world-size (WORLD_SIZE): want >= 1, got %d", o.WorldSize)
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return fmt.Errorf("--rank (RANK): want 0..%d for a world size of %d, got %d", o.WorldSize-1, o.WorldSize, o.Rank)
	case o.WorldSize > 1 && (o.MasterPort < 1 || o.MasterPort > 65535):
		return fmt.Errorf("--master-port (MASTER_PORT): a unit of %d workers needs rank 0's rendezvous port (1..65535), got %d", o.WorldSize, o.MasterPort)
	case o.WorldSize > 1 && o.Rank > 0 && o.MasterAddr == "":
		return fmt.Errorf("--master-addr (MASTER_ADDR): rank %d of %d needs rank 0's address to join it", o.Rank, o.WorldSize)
	case o.SpreadStepsPerSec < 0 || math.IsNaN(o.SpreadStepsPerSec):
		return fmt.Errorf("--spread-steps-per-sec (HADAR_SPREAD_STEPS_PER_SEC): want >= 0 (0 = the pace of --steps-per-sec), got %g", o.SpreadStepsPerSec)
	case o.SyncEvery < 0:
		return fmt.Errorf("--sync-every: want >= 0 (0 = automatic), got %d", o.SyncEvery)
	case o.RendezvousTimeout <= 0 || o.PeerTimeout <= 0 || o.StopGrace < 0:
		return fmt.Errorf("--rendezvous-timeout %s, --peer-timeout %s, --stop-grace %s: want positive durations", o.RendezvousTimeout, o.PeerTimeout, o.StopGrace)
	}
	return nil
}

// spreadPace is the emulated pace when the unit spans several nodes.
func (o Options) spreadPace() float64 {
	if o.SpreadStepsPerSec > 0 {
		return o.SpreadStepsPerSec
	}
	return o.StepsPerSec
}
