package scale

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/e2e/harness"
)

var (
	scaleRun      = flag.Bool("scale", false, "run TestScale, the full-size run (make scale); it takes tens of minutes")
	scaleNodes    = flag.Int("scale.nodes", 500, "simulated client nodes")
	scaleRacks    = flag.Int("scale.racks", 20, "racks the nodes are spread over")
	scaleJobs     = flag.Int("scale.jobs", 1000, "jobs in the trace")
	scaleLoad     = flag.Float64("scale.load", 0.9, "nominal load the trace's arrival rate offers the cluster")
	scaleSeed     = flag.Int64("scale.seed", 1, "trace seed")
	scaleCompress = flag.Float64("scale.compress", 20, "simulated seconds per wall second (the round is 360 s simulated)")
	scaleNomadCmp = flag.Float64("scale.nomad.compress", 80, "compression of the arm of Nomad's own placement (no control loop to measure, and its tail of jobs on slow GPUs is hours long); 0: scale.compress")
	scaleMinExp   = flag.Float64("scale.minexp", 1, "shortest job: 10^minexp minutes on a V100")
	scaleMaxExp   = flag.Float64("scale.maxexp", 2, "longest job: 10^maxexp minutes on a V100")
	scaleArms     = flag.String("scale.arms", "gavel-maxmin,hadar,nomad", "policies run through the sidecar, and nomad for Nomad's own placement")
	scaleTimeout  = flag.Duration("scale.timeout", 40*time.Minute, "bound on one arm's wall time past its last submission")
	scaleOut      = flag.String("scale.out", "", "directory for the table (scale.md)")
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// TestScale is the full run: `make scale`, or
//
//	go test -run TestScale -v -timeout 0 ./e2e/scale -args -scale
func TestScale(t *testing.T) {
	if testing.Short() || !*scaleRun {
		t.Skip("the scale run takes tens of minutes: make scale (or -args -scale)")
	}
	cfg := runConfig{Nodes: *scaleNodes, Racks: *scaleRacks, Jobs: *scaleJobs, Load: *scaleLoad, Seed: *scaleSeed, Compress: *scaleCompress,
		MinutesExp: [2]float64{*scaleMinExp, *scaleMaxExp}, NomadCompress: *scaleNomadCmp, Timeout: *scaleTimeout}
	rs := runArms(t, cfg, strings.Split(*scaleArms, ","))
	if t.Failed() {
		return
	}
	for _, r := range rs {
		if r.Completed != cfg.Jobs {
			t.Errorf("%s: %d of %d jobs completed", r.Arm, r.Completed, cfg.Jobs)
		}
	}
}

// TestScaleSmoke runs the whole machinery small and fast (make test): a
// Nomad server, six simulated nodes of three GPU types in three racks,
// and a short trace through the sidecar and through Nomad's own
// placement. Every job must complete; in the sidecar's arm every
// allocation must sit in a group the sidecar generated (no job ran as
// submitted), progress must have been read through the server from the
// simulated nodes, and the live schedule must follow `hadar sim`'s.
func TestScaleSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Nomad server and the node simulator")
	}
	// The minimum run time is one round, not the default 30 minutes: the
	// jobs run 1 to 10 minutes on a V100, so under 30 minutes a job the
	// live run started on a K80 (its arrival seen a few wall seconds later
	// than `hadar sim` sees it, the V100s still busy) stays there to its
	// end, 3 to 4 times the prediction's makespan on a loaded machine
	// (make test runs 7 and 8, docs/results.md). With one round, a start
	// that timing sent elsewhere costs a round at most, in both.
	cfg := runConfig{Nodes: 6, Racks: 3, Jobs: 30, Load: 1.5, Seed: 3, Compress: 240, MinutesExp: [2]float64{0, 1}, Timeout: 2 * time.Minute, MinRun: roundSim}
	rs := runArms(t, cfg, []string{"gavel-maxmin", "nomad"})
	if t.Failed() {
		return
	}
	for _, r := range rs {
		if r.Completed != cfg.Jobs || r.Stalled > 0 {
			t.Errorf("%s: %d of %d jobs completed, %d ran where they cannot train", r.Arm, r.Completed, cfg.Jobs, r.Stalled)
		}
		if r.NodesimRPCs == 0 {
			t.Errorf("%s: the node simulator made no RPCs", r.Arm)
		}
		if r.Arm == "nomad" {
			if r.GeneratedPlacements != 0 || r.OtherPlacements < cfg.Jobs {
				t.Errorf("nomad: %d allocations in hadar's groups, %d as submitted: want none, and one per job at least", r.GeneratedPlacements, r.OtherPlacements)
			}
			continue
		}
		if r.OtherPlacements != 0 || r.GeneratedPlacements < cfg.Jobs {
			t.Errorf("%s: %d allocations ran as submitted, %d in groups the sidecar generated: want none, and one per job at least", r.Arm, r.OtherPlacements, r.GeneratedPlacements)
		}
		if r.Rounds < 2 || r.WritesTotal < float64(cfg.Jobs) {
			t.Errorf("%s: %d rounds, %.0f writes: want several rounds and a write per job at least", r.Arm, r.Rounds, r.WritesTotal)
		}
		// The sidecar's share of placement is measured on every job.
		if r.DecidedJobs != cfg.Jobs {
			t.Errorf("%s: a written start seen for %d of %d jobs", r.Arm, r.DecidedJobs, cfg.Jobs)
		}
		if r.ProgressReads == 0 || r.ProgressErrors > r.ProgressReads/10 {
			t.Errorf("%s: the sidecar read progress %d times, %d failed: want reads, nearly all answered", r.Arm, r.ProgressReads, r.ProgressErrors)
		}
		// Every answered read went through the server to a simulated node.
		if ok := r.ProgressReads - r.ProgressErrors; r.NodesimProgressReads < ok {
			t.Errorf("%s: the simulated nodes served %d progress files, the sidecar got %d: reads did not go through the server to the nodes", r.Arm, r.NodesimProgressReads, ok)
		}
		// The live schedule follows the simulator's within the control
		// loop's delays: seconds of wall time per placement, which are
		// minutes of simulated time at this compression. A loaded machine's
		// Nomad places slower (make test beside other work: 3,295 s
		// against an allowance of 3,037 s), which is not the scheduler
		// falling behind: the allowance grows with the placement delay
		// this run measured.
		slack := max(1800, 4*r.Compression*r.RunningP99.Seconds())
		if r.MakespanSim > 1.5*r.PredMakespan+slack || r.AvgJCTSim > 1.5*r.PredAvgJCT+slack {
			t.Errorf("%s: live makespan %.0f s and average JCT %.0f s, `hadar sim` %.0f s and %.0f s (allowance 1.5 times plus %.0f s, from placements in %s at p99): the live run is far behind its prediction",
				r.Arm, r.MakespanSim, r.AvgJCTSim, r.PredMakespan, r.PredAvgJCT, slack, r.RunningP99)
			// Which jobs fell behind, and why (a back-off, a refusal),
			// is in the sidecar's decisions.
			harness.KeepLog(t, "sidecar-"+r.Arm+".log", r.sidecarLog)
		}
	}
}

// runArms runs each arm as a subtest, then prints (and writes) the table.
func runArms(t *testing.T, cfg runConfig, arms []string) []Result {
	r := newRun(t, cfg)
	var rs []Result
	for _, arm := range arms {
		arm = strings.TrimSpace(arm)
		t.Run(arm, func(t *testing.T) {
			ar := r
			if arm == "nomad" && cfg.NomadCompress > 0 {
				ar = r.compressed(cfg.NomadCompress)
			}
			res := ar.arm(t, arm)
			if arm != "nomad" {
				r.predict(t, &res)
				t.Logf("%s: Nomad API requests: %s", arm, requestSummary(res.Requests))
				t.Logf("%s: slowest round %s; mean latency: progress read %v, plan %v, register %v", arm, res.SlowestRound,
					res.ProgressLatency.Round(time.Millisecond), res.PlanLatency.Round(time.Millisecond), res.RegisterLatency.Round(time.Millisecond))
			}
			t.Logf("%s: node simulator RPCs %d (%d failed), %d progress reads (%d failed), %d re-lists", arm, res.NodesimRPCs, res.NodesimRPCErrors, res.ProgressReads, res.ProgressErrors, res.Relists)
			rs = append(rs, res)
		})
	}
	table := Table(r.setup, rs)
	fmt.Println(table)
	if *scaleOut != "" {
		if err := os.MkdirAll(*scaleOut, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(*scaleOut, "scale.md"), []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return rs
}
