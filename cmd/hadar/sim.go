package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/hadar-sched/hadar/internal/report"
	"github.com/hadar-sched/hadar/netmodel"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/estimate"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/registry"
	"github.com/hadar-sched/hadar/planner/sim"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/planner/trace"
)

var errUsage = errors.New("usage")

func runPolicies(w io.Writer) error {
	for _, n := range registry.Names() {
		fmt.Fprintln(w, n)
	}
	return nil
}

type simFlags struct {
	trace       string
	synthetic   int
	rate        float64
	cluster     string
	typeAs      string
	policies    string
	throughputs string
	round       time.Duration
	restart     time.Duration
	gpusPerNode int
	seed        int64
	format      string
	out         string
	fidelity    string
	prices      string
	reference   string
	parallel    int
	merge       time.Duration
	utility     string
	topology    string
	placement   string
	delayScale  float64
	maxWait     time.Duration
	maxPreempt  int
	minRun      time.Duration
	estError    float64
	profError   float64
	stepError   float64
	estSeed     int64
	learn       bool
	known       string
	estimator   string
	events      string
	queues      string
	queueModes  string
	unprofiled  string
	sizes       string
	load        float64
	workload    string
	elastic     float64
}

// runSim is `hadar sim`: flags, then the models they describe, then the
// simulations (concurrently), then the report.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseSimFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	s, err := buildSim(f, stderr)
	if err != nil {
		return err
	}
	results, err := s.runAll(ctx, stderr)
	if err != nil {
		return err
	}
	return s.write(results, stdout, stderr)
}

// parseSimFlags reads the flags and checks what needs no file: the
// output format, the fidelity's name, the round.
func parseSimFlags(args []string, stderr io.Writer) (simFlags, error) {
	var f simFlags
	fs := flag.NewFlagSet("hadar sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.trace, "trace", "", "trace file: Gavel's .trace (10- or legacy 7-column) or hadar's CSV (docs/formats.md); several as FILE[@QUEUE],... put each file's jobs in a queue (docs/queues.md)")
	fs.IntVar(&f.synthetic, "synthetic", 0, "generate this many Gavel-style jobs instead of reading --trace")
	fs.Float64Var(&f.rate, "rate", 0, "with --synthetic: Poisson arrivals per hour (0 = all jobs at t=0)")
	fs.StringVar(&f.cluster, "cluster", "v100=36,p100=36,k80=36", "GPUs per type, TYPE=COUNT,...")
	fs.StringVar(&f.typeAs, "type-as", "", "NEW=TYPE,...: GPU type NEW has TYPE's throughputs and price (say v100b=v100 with --cluster v100=18,v100b=18,...: one type split in two identical ones)")
	fs.StringVar(&f.policies, "policies", "fifo,gavel-maxmin,gavel-makespan", "comma-separated policies (hadar policies lists them)")
	fs.StringVar(&f.throughputs, "throughputs", "", "throughput profile (Gavel JSON or hadar's format); default: Gavel's simulation throughputs")
	fs.DurationVar(&f.round, "round", 360*time.Second, "round length")
	fs.DurationVar(&f.restart, "restart-cost", 20*time.Second, "progress lost each time a job starts on new GPUs (improved fidelity only)")
	fs.IntVar(&f.gpusPerNode, "gpus-per-node", 4, "GPUs per server")
	fs.Int64Var(&f.seed, "seed", 1, "seed for synthetic jobs")
	fs.StringVar(&f.format, "format", "table", "output: table, json or csv")
	fs.StringVar(&f.out, "out", "", "directory for per-job CSVs and plots (SVG)")
	fs.StringVar(&f.fidelity, "fidelity", "improved", "improved, or gavel to reproduce Gavel's simulator")
	fs.StringVar(&f.prices, "prices", "", "price per GPU-hour, TYPE=DOLLARS,... (default: Gavel's GCP prices for v100, p100, k80)")
	fs.StringVar(&f.reference, "reference", "v100", "with --synthetic: GPU type whose throughput turns durations into steps")
	fs.DurationVar(&f.merge, "merge-cost", 10*time.Second, "hadare: time each copy spends merging parameters per round")
	fs.StringVar(&f.utility, "hadar-utility", "makespan", "hadar/hadare utility: makespan (total time duration) or jct (average JCT)")
	fs.IntVar(&f.parallel, "parallel", 0, "policies simulated at once (default: number of CPUs)")
	fs.StringVar(&f.topology, "topology", "", "network topology (netmodel JSON, docs/netmodel.md): prices every placement with the calibrated network model")
	fs.StringVar(&f.placement, "placement", placement.Pack, "comma-separated placement policies, each run with every policy: "+strings.Join(placement.Names(), ", ")+" (docs/placement.md)")
	fs.Float64Var(&f.delayScale, "delay-scale", placement.DefaultScale, "delay: timer scale (wait scale*(slowdown-1)*remaining time before accepting a looser level); delay-autotune starts here")
	fs.DurationVar(&f.maxWait, "max-wait", time.Duration(placement.DefaultMaxWait)*time.Second, "delay: cap on any delay timer")
	fs.IntVar(&f.maxPreempt, "max-preemptions", placement.DefaultMaxPreemptions, "delay: preemptions per job for network-sensitive jobs (negative = none)")
	fs.DurationVar(&f.minRun, "min-run-time", time.Duration(placement.DefaultMinRunTime)*time.Second, "least run time on its GPUs before a job may be preempted (stopped, moved, its copies removed) by any policy, as the sidecar's min_run_time; ignored with --fidelity gavel")
	fs.Float64Var(&f.estError, "estimate-error", 0, "make what schedulers know wrong: profiled throughputs and declared steps off by up to this fraction (0.3 = 30 %), seeded (docs/simulator.md)")
	fs.Float64Var(&f.profError, "profile-error", -1, "throughput error alone (default: --estimate-error)")
	fs.Float64Var(&f.stepError, "step-error", -1, "declared-steps error alone (default: --estimate-error)")
	fs.Int64Var(&f.estSeed, "estimate-seed", 0, "seed of the estimate errors (default: --seed)")
	fs.BoolVar(&f.learn, "learn", false, "learn throughputs online from observed progress")
	fs.StringVar(&f.known, "known-profile", "", "what schedulers are told of throughputs while the world runs on --throughputs: a profile file, or none for nothing at all (default: --throughputs, full knowledge); what it lacks is estimated (docs/simulator.md)")
	fs.StringVar(&f.estimator, "estimator", "", "how estimates fill what the known profile lacks: "+estimatorNames()+" (docs/results.md)")
	fs.StringVar(&f.unprofiled, "unprofiled", "refuse", "jobs whose (model, scale factor) the profile lacks: refuse (name each pair), skip (and count), or extrapolate (docs/formats.md)")
	fs.StringVar(&f.sizes, "sizes", "gavel", "with --synthetic: job sizes, gavel (1/2/4/8 GPUs), philly (up to 32 GPUs) or SF=WEIGHT,... (docs/formats.md)")
	fs.StringVar(&f.workload, "workload", "", "a named synthetic workload instead of --trace or --synthetic: "+strings.Join(trace.WorkloadNames(), ", ")+" (Philly-derived, as Sia's paper sizes them; default cluster "+trace.SiaCluster+"; docs/formats.md)")
	fs.Float64Var(&f.elastic, "elastic", 0, "make this fraction of the jobs elastic (drawn from --seed and each job's ID): each may run at every width its model is profiled at between 1 and twice its scale factor, at a fixed global batch; sia chooses widths, sia:rigid and the other policies run them at their scale factor (docs/simulator.md)")
	fs.Float64Var(&f.load, "load", 0, "with --synthetic: arrival rate for this nominal load of the cluster (e.g. 0.95) instead of --rate")
	fs.StringVar(&f.events, "events", "", "cluster events file: node drains, losses and joins during the run (docs/simulator.md)")
	fs.StringVar(&f.queues, "queues", "", "queue blocks (HCL, or the sidecar's config file): teams with guarantees, limits, weights and policies; results per queue (docs/queues.md)")
	fs.StringVar(&f.queueModes, "queue-modes", "", "with --queues, comma-separated: queues (default: guarantees, borrowing, reclaim), static (each queue on its guarantee alone), flat (no queues, measured per queue)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, errUsage
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected argument %q: all inputs are flags", fs.Arg(0))
	}
	switch f.format {
	case "table", "json", "csv":
	default:
		return f, fmt.Errorf("--format %q: want table, json or csv", f.format)
	}
	if f.round <= 0 {
		return f, fmt.Errorf("--round %v: want a positive duration such as 360s", f.round)
	}
	if f.workload != "" {
		set := map[string]bool{}
		fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
		if err := workloadDefaults(&f, set); err != nil {
			return f, err
		}
	}
	return f, nil
}

// workloadDefaults checks --workload against the flags that describe jobs
// some other way, and fills in the workload's cluster and the extrapolation
// its 16-GPU jobs need unless --cluster or --unprofiled says otherwise.
func workloadDefaults(f *simFlags, set map[string]bool) error {
	w, err := trace.LookupWorkload(f.workload)
	if err != nil {
		return fmt.Errorf("--workload: %w", err)
	}
	f.workload = w.Name
	for _, name := range []string{"trace", "synthetic", "rate", "load", "sizes"} {
		if set[name] {
			return fmt.Errorf("--workload %s fixes the jobs, their rate and sizes: drop --%s", w.Name, name)
		}
	}
	if set["unprofiled"] && f.unprofiled != "extrapolate" {
		return fmt.Errorf("--unprofiled %s: --workload %s is drawn with extrapolated throughputs (philly-8h and philly-48h have 16-GPU jobs Gavel's profile lacks): want --unprofiled extrapolate (the default with --workload)", f.unprofiled, w.Name)
	}
	f.unprofiled = "extrapolate"
	if !set["cluster"] {
		f.cluster = w.Cluster
	}
	return nil
}

// simSetup is everything the simulations share, built once from the
// flags: the cluster, the jobs, the world's speed model and what the
// schedulers are told, and the runs (policy x placement x queue mode).
type simSetup struct {
	f        simFlags
	fid      sim.Fidelity
	cluster  planner.Cluster
	jobs     []planner.Job
	model    speed.Model
	est      sim.EstimateConfig
	events   []sim.Event
	placeCfg placement.Config
	opts     registry.Options
	queues   simQueues
	runs     []simRun
}

// simRun is one simulation: a policy with a placement in a queue mode.
type simRun struct{ policy, place, mode, label string }

// buildSim loads and checks every input before any simulation runs, so
// a typo in the last flag fails at once.
func buildSim(f simFlags, stderr io.Writer) (*simSetup, error) {
	s := &simSetup{f: f}
	var err error
	if s.fid, err = sim.ParseFidelity(f.fidelity); err != nil {
		return nil, fmt.Errorf("--fidelity: %w", err)
	}
	if s.cluster, err = planner.ParseClusterSpec(f.cluster, f.gpusPerNode); err != nil {
		return nil, fmt.Errorf("--cluster: %w", err)
	}
	prof, err := s.loadJobs(stderr)
	if err != nil {
		return nil, err
	}
	if err := s.buildModels(prof); err != nil {
		return nil, err
	}
	if err := s.buildSchedulers(prof); err != nil {
		return nil, err
	}
	return s, nil
}

// loadJobs reads the throughput profile and the trace (or synthesizes
// jobs), and resolves the jobs against the profile; it returns the
// resolved profile, the world's truth.
func (s *simSetup) loadJobs(stderr io.Writer) (*profile.Profile, error) {
	f := s.f
	prof := profile.Default()
	var err error
	if f.throughputs != "" {
		if prof, err = profile.Load(f.throughputs); err != nil {
			return nil, fmt.Errorf("--throughputs: %w", err)
		}
	}
	if prof, err = withTypesAs(prof, f.typeAs); err != nil {
		return nil, fmt.Errorf("--type-as: %w", err)
	}
	mode, err := profile.ParseUnprofiled(f.unprofiled)
	if err != nil {
		return nil, fmt.Errorf("--unprofiled: %w", err)
	}
	var jobs []planner.Job
	var lines *trace.Lines
	switch {
	case f.workload != "":
		w, err := trace.LookupWorkload(f.workload)
		if err != nil {
			return nil, fmt.Errorf("--workload: %w", err)
		}
		sc, err := w.Config(f.seed, s.cluster, prof)
		if err != nil {
			return nil, fmt.Errorf("--workload with --cluster %s: %w", f.cluster, err)
		}
		sc.Reference = planner.GPUType(f.reference)
		if jobs, err = trace.Synthesize(sc); err != nil {
			return nil, fmt.Errorf("--workload: %w", err)
		}
	case f.trace != "" && f.synthetic > 0:
		return nil, fmt.Errorf("give either --trace or --synthetic, not both")
	case f.trace != "" && (f.sizes != "gavel" || f.load > 0):
		return nil, fmt.Errorf("--sizes and --load shape synthetic jobs: give them with --synthetic, not --trace")
	case f.trace != "":
		if jobs, lines, err = trace.LoadSet(f.trace); err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
	case f.synthetic > 0:
		sizes, err := trace.ParseSizeMix(f.sizes)
		if err != nil {
			return nil, fmt.Errorf("--sizes: %w", err)
		}
		sc := trace.SynthConfig{Jobs: f.synthetic, RatePerHour: f.rate, Seed: f.seed, Profile: prof, Reference: planner.GPUType(f.reference),
			ScaleFactors: sizes.ScaleFactors, ScaleFactorWeights: sizes.Weights, Extrapolate: mode == profile.Extrapolate}
		if f.load > 0 {
			if f.rate > 0 {
				return nil, fmt.Errorf("give either --rate or --load, not both")
			}
			if sc.RatePerHour, err = trace.RateForLoad(sc, s.cluster, f.load); err != nil {
				return nil, fmt.Errorf("--load: %w", err)
			}
		}
		if jobs, err = trace.Synthesize(sc); err != nil {
			return nil, fmt.Errorf("--synthetic: %w", err)
		}
	default:
		return nil, fmt.Errorf("no jobs: give --trace FILE, --synthetic N or --workload NAME")
	}
	res, err := prof.Resolve(jobs, s.cluster.Types(), mode, lines.Where)
	if err != nil {
		return nil, fmt.Errorf("trace against profile: %w", err)
	}
	s.jobs = res.Jobs
	if f.elastic != 0 {
		if s.jobs, err = trace.MakeElastic(s.jobs, f.elastic, f.seed, res.Profile.ScaleFactors); err != nil {
			return nil, fmt.Errorf("--elastic: %w", err)
		}
	}
	if r := res.Report(); r != "" {
		fmt.Fprintln(stderr, r)
	}
	return res.Profile, nil
}

// buildModels makes the world's speed model (with the network model on a
// topology), what schedulers are told of it (errors, a known profile,
// learning) and the cluster's events.
func (s *simSetup) buildModels(prof *profile.Profile) error {
	f := s.f
	var err error
	s.model = speed.Model{Profile: prof, IgnoreSpread: s.fid == sim.Gavel}
	if f.topology != "" {
		if s.fid == sim.Gavel {
			return fmt.Errorf("--topology needs --fidelity improved: Gavel's simulator has no placement effect")
		}
		tp, err := netmodel.LoadTopologyFile(f.topology)
		if err != nil {
			return fmt.Errorf("--topology: %w", err)
		}
		if s.cluster, err = placement.ApplyTopology(s.cluster, tp, f.topology); err != nil {
			return fmt.Errorf("--topology: %w", err)
		}
		rep, err := netmodel.DefaultCalibration()
		if err != nil {
			return fmt.Errorf("--topology: calibrating the network model: %w", err)
		}
		nw, err := placement.NewNetwork(tp, rep, prof, s.jobs, s.cluster.Types())
		if err != nil {
			return fmt.Errorf("--topology: %w", err)
		}
		s.model.Network = nw
	}
	est := sim.EstimateConfig{ProfileError: f.estError, StepError: f.estError, Seed: uint64(f.seed), Learn: f.learn}
	if f.profError >= 0 {
		est.ProfileError = f.profError
	}
	if f.stepError >= 0 {
		est.StepError = f.stepError
	}
	if f.estSeed != 0 {
		est.Seed = uint64(f.estSeed)
	}
	if est.Estimator, err = estimate.ParseMethod(f.estimator); err != nil {
		return fmt.Errorf("--estimator: %w", err)
	}
	est.RestartCost = f.restart.Seconds()
	switch f.known {
	case "":
	case "none":
		est.Known = sim.NoProfile()
	default:
		known, err := profile.Load(f.known)
		if err != nil {
			return fmt.Errorf("--known-profile: %w", err)
		}
		if known, err = withTypesAs(known, f.typeAs); err != nil {
			return fmt.Errorf("--known-profile with --type-as: %w", err)
		}
		est.Known = known
	}
	if _, _, err := sim.EstimatedModel(s.model, est); err != nil {
		return fmt.Errorf("--estimate-error: %w", err)
	}
	s.est = est
	if f.events != "" {
		if s.events, err = sim.LoadEvents(f.events); err != nil {
			return fmt.Errorf("--events: %w", err)
		}
	}
	return nil
}

// buildSchedulers checks every policy, placement and queue mode by
// building each once, and lists the runs.
func (s *simSetup) buildSchedulers(prof *profile.Profile) error {
	f := s.f
	prices, err := parsePrices(f.prices)
	if err != nil {
		return err
	}
	if prices, err = pricesAs(prices, f.typeAs); err != nil {
		return err
	}
	names := splitList(f.policies)
	if len(names) == 0 {
		return fmt.Errorf("--policies is empty: want one or more of %s", strings.Join(registry.Names(), ", "))
	}
	places := splitList(f.placement)
	if len(places) == 0 {
		return fmt.Errorf("--placement is empty: want one or more of %s", strings.Join(placement.Names(), ", "))
	}
	// The minimum run time as the sidecar maps it (registry.Live): 0 is
	// none for the policies and the placer alike.
	opts, live := registry.Live(s.model, max(f.minRun.Seconds(), 0), f.restart.Seconds(), f.merge.Seconds())
	s.placeCfg = placement.Config{Speed: s.model, Seed: f.seed, Scale: f.delayScale, MaxWait: f.maxWait.Seconds(),
		MaxPreemptions: f.maxPreempt, MinRunTime: live.MinRunTime, RestartCost: live.RestartCost}
	if f.delayScale == 0 {
		s.placeCfg.Scale = -1 // an explicit 0: no waiting
	}
	if f.maxPreempt == 0 {
		s.placeCfg.MaxPreemptions = -1
	}
	for _, pl := range places {
		if _, err := placement.New(pl, s.placeCfg); err != nil {
			return fmt.Errorf("--placement: %w", err)
		}
	}
	opts.Types, opts.PricePerHour, opts.GavelFidelity, opts.HadarUtility = s.cluster.Types(), prices, s.fid == sim.Gavel, f.utility
	s.opts = opts
	if s.fid == sim.Gavel {
		s.opts.RestartCost, s.opts.MergeCost = 0, 0
	}
	for _, n := range names {
		if _, err := registry.New(n, s.opts); err != nil {
			return fmt.Errorf("--policies: %w", err)
		}
	}
	if s.queues, err = loadSimQueues(f.queues, f.queueModes, s.cluster, s.jobs, prof); err != nil {
		return err
	}
	for _, n := range names {
		for _, pl := range places {
			label := n
			if len(places) > 1 || pl != placement.Pack {
				label = n + "+" + pl
			}
			for _, mode := range s.queues.modes {
				s.runs = append(s.runs, simRun{n, pl, mode, s.queues.label(label, mode)})
			}
		}
	}
	return nil
}

func (s *simSetup) labels() []string {
	out := make([]string, len(s.runs))
	for i, r := range s.runs {
		out[i] = r.label
	}
	return out
}

// runAll runs every simulation, --parallel at a time, with a progress
// line on a terminal; each run plans with estimates of its own (they
// learn).
func (s *simSetup) runAll(ctx context.Context, stderr io.Writer) ([]simOutcome, error) {
	prog := newProgress(stderr, s.labels())
	out := make([]simOutcome, len(s.runs))
	errs := make([]error, len(s.runs))
	par := s.f.parallel
	if par <= 0 {
		par = max(1, numCPU())
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, run := range s.runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = s.run(ctx, run, func(now float64, done, total int) { prog.update(i, now, done, total) })
			if errs[i] != nil {
				errs[i] = fmt.Errorf("policy %s: %w", run.label, errs[i])
			}
		}()
	}
	wg.Wait()
	prog.finish()
	return out, errors.Join(errs...)
}

// simOutcome is one run's result and its placer (for the placement
// notes and the tuner's CSVs).
type simOutcome struct {
	result sim.Result
	placer *placement.Policy
}

func (s *simSetup) run(ctx context.Context, run simRun, progress func(now float64, done, total int)) (simOutcome, error) {
	var out simOutcome
	plan, _, err := sim.EstimatedModel(s.model, s.est)
	if err != nil {
		return out, err
	}
	o := s.opts
	o.Speed = plan
	pc := s.placeCfg
	pc.Speed = plan
	sched, pl, err := s.queues.build(run.mode, run.policy, run.place, o, pc)
	if err != nil {
		return out, err
	}
	out.placer, _ = pl.(*placement.Policy)
	f := s.f
	cfg := sim.Config{Queues: s.queues.cfg,
		Cluster: s.cluster, Jobs: s.jobs, Speed: s.model, Plan: plan, Estimate: s.est, Events: s.events,
		Round: f.round.Seconds(), RestartCost: f.restart.Seconds(), MergeCost: f.merge.Seconds(), MinRunTime: f.minRun.Seconds(), Fidelity: s.fid,
		Progress: progress,
	}
	out.result, err = sim.Run(ctx, cfg, sched)
	out.result.Scheduler = run.label
	return out, err
}

// write prints the results as --format says, and the files of --out.
func (s *simSetup) write(outcomes []simOutcome, stdout, stderr io.Writer) error {
	f := s.f
	results := make([]sim.Result, len(outcomes))
	placers := make([]*placement.Policy, len(outcomes))
	for i, o := range outcomes {
		results[i], placers[i] = o.result, o.placer
	}
	labels := s.labels()
	var err error
	switch f.format {
	case "json":
		err = report.WriteJSON(stdout, results)
	case "csv":
		err = report.WriteCSV(stdout, results)
	default:
		est := s.est
		fmt.Fprintf(stdout, "%d jobs on %s (%d GPUs), round %v, fidelity %s", len(s.jobs), f.cluster, s.cluster.TotalGPUs(), f.round, s.fid)
		if est.ProfileError > 0 || est.StepError > 0 || est.Learn {
			fmt.Fprintf(stdout, ", estimates off by up to %.0f %% (throughput) and %.0f %% (steps)", 100*est.ProfileError, 100*est.StepError)
			if est.Learn {
				fmt.Fprint(stdout, ", learned online")
			}
		}
		if f.known != "" {
			fmt.Fprintf(stdout, ", schedulers told %s", f.known)
		}
		if len(s.events) > 0 {
			fmt.Fprintf(stdout, ", %d cluster events", len(s.events))
		}
		if f.topology != "" {
			fmt.Fprintf(stdout, ", topology %s", f.topology)
		}
		fmt.Fprint(stdout, "\n\n")
		err = report.WriteTable(stdout, results)
		if err == nil && slices.ContainsFunc(results, func(r sim.Result) bool { return len(r.Queues) > 0 }) {
			fmt.Fprintln(stdout)
			err = report.WriteQueueTable(stdout, results)
		}
		if err == nil {
			err = writePlacementNotes(stdout, labels, placers)
		}
	}
	if err != nil {
		return err
	}
	if f.out != "" {
		files, err := report.WriteDir(f.out, results)
		if err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		more, err := writeTunerCSVs(f.out, labels, placers)
		if err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		files = append(files, more...)
		fmt.Fprintf(stderr, "wrote %d files to %s\n", len(files), f.out)
	}
	return nil
}

func estimatorNames() string {
	var out []string
	for _, m := range estimate.Methods() {
		out = append(out, string(m))
	}
	return strings.Join(out, ", ")
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// typeAsPairs reads --type-as: NEW=TYPE pairs.
func typeAsPairs(s string) ([][2]planner.GPUType, error) {
	var out [][2]planner.GPUType
	for _, p := range splitList(s) {
		t, as, ok := strings.Cut(p, "=")
		t, as = strings.ToLower(strings.TrimSpace(t)), strings.ToLower(strings.TrimSpace(as))
		if !ok || t == "" || as == "" {
			return nil, fmt.Errorf("entry %q: want NEW=TYPE, e.g. v100b=v100", p)
		}
		out = append(out, [2]planner.GPUType{planner.GPUType(t), planner.GPUType(as)})
	}
	return out, nil
}

// withTypesAs gives each new type of --type-as its model type's figures.
func withTypesAs(p *profile.Profile, s string) (*profile.Profile, error) {
	pairs, err := typeAsPairs(s)
	if err != nil {
		return nil, err
	}
	for _, pr := range pairs {
		if p, err = p.WithTypeAs(pr[0], pr[1]); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// pricesAs gives each new type of --type-as its model type's price unless
// --prices names it.
func pricesAs(prices map[planner.GPUType]float64, s string) (map[planner.GPUType]float64, error) {
	pairs, err := typeAsPairs(s)
	if err != nil || len(pairs) == 0 {
		return prices, err
	}
	if prices == nil {
		prices = registry.DefaultPrices()
	}
	for _, pr := range pairs {
		if _, ok := prices[pr[0]]; !ok {
			if v, ok := prices[pr[1]]; ok {
				prices[pr[0]] = v
			}
		}
	}
	return prices, nil
}

func parsePrices(s string) (map[planner.GPUType]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := registry.DefaultPrices()
	for _, p := range splitList(s) {
		name, val, ok := strings.Cut(p, "=")
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if !ok || err != nil || !(v > 0) {
			return nil, fmt.Errorf("--prices entry %q: want TYPE=DOLLARS_PER_GPU_HOUR with a positive number", p)
		}
		out[planner.GPUType(strings.ToLower(strings.TrimSpace(name)))] = v
	}
	return out, nil
}

// progress prints one status line for all running simulations, only when
// stderr is a terminal.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	names []string
	state []string
	last  time.Time
}

func newProgress(w io.Writer, names []string) *progress {
	p := &progress{w: w, names: names, state: make([]string, len(names))}
	if fh, ok := w.(*os.File); ok {
		p.tty = term.IsTerminal(int(fh.Fd()))
	}
	return p
}

func (p *progress) update(i int, now float64, done, total int) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state[i] = fmt.Sprintf("%s %d/%d @%.0fh", p.names[i], done, total, now/3600)
	if time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	var parts []string
	for _, s := range p.state {
		if s != "" {
			parts = append(parts, s)
		}
	}
	line := strings.Join(parts, " | ")
	if width, _, err := term.GetSize(int(p.w.(*os.File).Fd())); err == nil && width > 4 && len(line) > width-1 {
		line = line[:width-4] + "..."
	}
	fmt.Fprintf(p.w, "\r\033[K%s", line)
}

func (p *progress) finish() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
