package scale

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/trace"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// Simulated times of the live run, as `hadar sim` defaults them.
const (
	roundSim   = 360 * time.Second // Gavel's round
	restartSim = 20 * time.Second  // restart cost of a (re)start
	minRunSim  = 30 * time.Minute  // the sidecar's default min_run_time
	// rendezvousSim is how long a worker waits for its unit's others
	// (torch.distributed's default store timeout); the sidecar's gang
	// timeout is half of it, so hadar rolls a stuck gang back before its
	// workers give up.
	rendezvousSim = 30 * time.Minute
)

// Driver is the task driver of the simulated nodes (nodesim's default).
const Driver = "nodesim"

// Durations of the scale workload: Gavel's shape (log-uniform minutes on
// the reference V100) with the exponents lowered from Gavel's 10^1.5..10^4
// minutes to 10^minExp..10^maxExp and no long class, so that a run at a
// time compression that keeps rounds in seconds ends in minutes of wall
// time. The full run uses 10^1..10^2 (10 to 100 minutes: from a sixth of
// a round to hours on a K80).
func Durations(minExp, maxExp float64) trace.DurationDist {
	return trace.DurationDist{Unit: 60, ShortMinExp: minExp, ShortMaxExp: maxExp, LongMinExp: maxExp, LongMaxExp: maxExp, LongProb: 0}
}

// Workload draws the trace: n jobs of Gavel's models and sizes (1, 2, 4, 8
// GPUs at 70/10/15/5 %), durations drawn from d, arriving as a Poisson process at the rate that
// offers the cluster the given nominal load (trace.RateForLoad).
func Workload(c Cluster, n int, load float64, seed int64, d trace.DurationDist) ([]planner.Job, float64, error) {
	cfg := trace.SynthConfig{Jobs: n, Seed: seed, Profile: profile.Default(), Durations: &d}
	rate, err := trace.RateForLoad(cfg, c.Planner, load)
	if err != nil {
		return nil, 0, fmt.Errorf("workload: %w", err)
	}
	cfg.RatePerHour = rate
	jobs, err := trace.Synthesize(cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("workload: %w", err)
	}
	return jobs, rate, nil
}

// figures are a job's throughputs by device model, consolidated and
// spread: the truth nodesim runs the job at (the profile's, so the
// planner's estimates are exact, as in `hadar sim` without estimate
// errors).
func figures(prof *profile.Profile, j planner.Job) (cons, spread map[string]any, models []string) {
	cons, spread = map[string]any{}, map[string]any{}
	for _, k := range Kinds {
		c, err := prof.Throughput(j.Model, j.ScaleFactor, k.Type, false)
		if err != nil || c <= 0 {
			continue
		}
		cons[k.Model] = c
		models = append(models, k.Model)
		if s, err := prof.Throughput(j.Model, j.ScaleFactor, k.Type, true); err == nil && s > 0 {
			spread[k.Model] = s
		}
	}
	sort.Strings(models)
	return cons, spread, models
}

// task is the simulated training task of a job.
func task(prof *profile.Profile, j planner.Job) *api.Task {
	cons, spread, _ := figures(prof, j)
	t := api.NewTask("trainer", Driver)
	t.Config = map[string]any{"total_steps": int64(j.TotalSteps), "steps_per_sec": cons, "spread_steps_per_sec": spread}
	cpu, mem := 100, 128
	one := uint64(1)
	t.Resources = &api.Resources{CPU: &cpu, MemoryMB: &mem, Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: &one}}}
	kill := 5 * time.Second
	t.KillTimeout = &kill
	return t
}

// group is the job's one task group. Nomad never restarts a worker in
// place (a restarted worker would rejoin a rendezvous its peers left). A
// managed job's worker is never rescheduled either: a failure is hadar's
// to handle (it restarts the job from its checkpoint). A plain job's
// failed worker (a rendezvous that timed out because Nomad placed only
// part of the gang) is rescheduled as Nomad's batch default does, without
// its attempt limit: the job retries until its gang runs.
func group(count int, t *api.Task, managed bool) *api.TaskGroup {
	g := api.NewTaskGroup("train", count)
	zero, mode := 0, "fail"
	g.RestartPolicy = &api.RestartPolicy{Attempts: &zero, Mode: &mode}
	unlimited := !managed
	g.ReschedulePolicy = &api.ReschedulePolicy{Attempts: &zero, Unlimited: &unlimited}
	if !managed {
		delay, fn := 5*time.Second, "constant"
		g.ReschedulePolicy.Delay, g.ReschedulePolicy.DelayFunction = &delay, &fn
	}
	g.AddTask(t)
	return g
}

// ManagedJob is j as a hadar-managed batch job (docs/jobspec.md): hadar
// meta with the profile's model, its steps and workers, the gate, and one
// template group with one GPU.
func ManagedJob(prof *profile.Profile, j planner.Job) *api.Job {
	job := api.NewBatchJob(j.ID, j.ID, "global", 50)
	job.Datacenters = []string{"*"}
	job.Meta = map[string]string{
		jobspec.KeyModel:   j.Model,
		jobspec.KeySteps:   strconv.FormatInt(int64(j.TotalSteps), 10),
		jobspec.KeyWorkers: strconv.Itoa(j.ScaleFactor),
	}
	job.Constraints = []*api.Constraint{jobspec.GateConstraint()}
	job.AddTaskGroup(group(1, task(prof, j), true))
	return job
}

// PlainJob is j as a Nomad user would submit it without hadar: no gate, no
// hadar meta, the group's count its workers, each asking for one GPU of a
// model the job can run on (so Nomad never places it where it cannot
// train).
func PlainJob(prof *profile.Profile, j planner.Job) *api.Job {
	job := api.NewBatchJob(j.ID, j.ID, "global", 50)
	job.Datacenters = []string{"*"}
	t := task(prof, j)
	_, _, models := figures(prof, j)
	t.Resources.Devices[0].Constraints = []*api.Constraint{api.NewConstraint("${device.model}", "set_contains_any", strings.Join(models, ","))}
	job.AddTaskGroup(group(j.ScaleFactor, t, false))
	return job
}

// Compressed returns the profile with every throughput times c: the
// sidecar plans in wall seconds while nodesim trains c times faster than
// the profile, so the sidecar's estimates stay exact (as `hadar sim`'s are)
// when its profile is compressed the same way.
func Compressed(prof *profile.Profile, c float64) (*profile.Profile, error) {
	es := prof.Entries()
	for i := range es {
		scale := func(m map[planner.GPUType]float64) map[planner.GPUType]float64 {
			out := make(map[planner.GPUType]float64, len(m))
			for t, v := range m {
				out[t] = v * c
			}
			return out
		}
		es[i].Consolidated, es[i].Spread = scale(es[i].Consolidated), scale(es[i].Spread)
	}
	p, err := profile.New(fmt.Sprintf("%s, throughputs x%g (time compression)", prof.Source(), c), es)
	if err != nil {
		return nil, fmt.Errorf("compressed profile: %w", err)
	}
	return p, nil
}
