package scale

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Setup is what every arm of a run shares.
type Setup struct {
	Nodes, Racks, GPUs, Jobs int
	GPUsByType               map[string]int
	Load, RatePerHour        float64
	Seed                     int64
	// Compression: simulated seconds per wall second; Round is the
	// sidecar's round in wall time (360 s simulated / Compression).
	Compression float64
	Round       time.Duration
	// MinutesExp: job durations on a V100 are 10^[0]..10^[1] minutes.
	MinutesExp [2]float64
}

// Result is one arm: a policy through the sidecar, or Nomad's own
// placement ("nomad"). Times named Sim are in simulated seconds (wall
// times the compression); the others are wall time.
type Result struct {
	Arm string
	// sidecarLog is the sidecar's log in its arm (none in Nomad's), kept
	// by a test whose check of the arm fails.
	sidecarLog []byte
	// Compression: simulated seconds per wall second in this arm.
	Compression float64
	Completed   int
	Stalled     int
	// Schedule, live: makespan and JCT, and the prediction of `hadar sim`
	// on the same trace and cluster (zero for "nomad").
	MakespanSim, AvgJCTSim, P99JCTSim float64
	PredMakespan, PredAvgJCT          float64
	// PredWaitP50/P99: `hadar sim`'s time from arrival to a job's first
	// start, in this arm's wall time; PredRestarts: its restarts.
	PredWaitP50, PredWaitP99 time.Duration
	PredRestarts             int
	Preemptions              int
	// RendezvousTimeouts counts workers that waited for their gang's
	// others until they gave up (Nomad placed part of a gang).
	RendezvousTimeouts int
	// Control loop (sidecar arms). Round: boundary cycles (sync, plan,
	// writes handed to the background; progress is read ahead); Cycle:
	// every cycle, fills included. WritesOut: how long the writes going
	// out in the background took to return, per stretch of them.
	Rounds                                   int
	RoundP50, RoundP99, RoundMax             time.Duration
	CycleP50, CycleP99                       time.Duration
	WritesOutP50, WritesOutP99, WritesOutMax time.Duration
	// SlowestRound: the longest round and the requests it made.
	SlowestRound string
	// Mean time to a response of progress reads, registrations and plans.
	ProgressLatency, RegisterLatency, PlanLatency time.Duration
	// Placement: submission until the job's first allocation reached a
	// node (Placed) or all workers of its first unit ran (Running).
	PlacedP50, PlacedP99, RunningP50, RunningP99 time.Duration
	// The sidecar's share: submission until its start decision
	// (Decided) and until that write returned (Written, to within the
	// 100 ms it is sampled at), over DecidedJobs jobs.
	DecidedP50, DecidedP99, WrittenP50, WrittenP99 time.Duration
	DecidedJobs                                    int
	// Registrations (job writes that place, stop or move jobs) and all
	// Nomad API requests, per round.
	WritesPerRound, WritesPerRoundMax, WritesTotal float64
	RequestsPerRound                               float64
	Requests                                       map[string]int
	// Connections the sidecar opened to the Nomad server.
	Connections                   int
	ProgressReads, ProgressErrors uint64
	Relists                       uint64
	// Resources: CPU in cores (CPU time over the arm's wall time) and peak
	// resident memory, of the sidecar (this process), the Nomad server and
	// the node simulator.
	Wall                                      time.Duration
	SidecarCPU, ServerCPU, NodesimCPU         float64
	SidecarPeakRSS, ServerPeakRSS, NodesimRSS int64
	SidecarPeakHeap                           int64
	NodesimRPCs, NodesimRPCErrors             uint64
	// NodesimProgressReads: progress files the simulated nodes served
	// (each read the server forwarded to a node).
	NodesimProgressReads uint64
	// GeneratedPlacements and OtherPlacements: allocations that reached a
	// node in groups hadar generated, and in groups as submitted.
	GeneratedPlacements, OtherPlacements int
}

// Table renders the results side by side in Markdown.
func Table(s Setup, rs []Result) string {
	var b strings.Builder
	types := make([]string, 0, len(s.GPUsByType))
	for t, n := range s.GPUsByType {
		types = append(types, fmt.Sprintf("%d %s", n, t))
	}
	sort.Strings(types)
	fmt.Fprintf(&b, "%d nodes in %d racks, %d GPUs (%s); %d jobs of %.0f to %.0f min on a V100 at %.0f/h simulated (nominal load %.2f, seed %d); compression %gx: round %v wall = %.0f s simulated\n\n",
		s.Nodes, s.Racks, s.GPUs, strings.Join(types, ", "), s.Jobs, math.Pow(10, s.MinutesExp[0]), math.Pow(10, s.MinutesExp[1]), s.RatePerHour, s.Load, s.Seed, s.Compression, s.Round, s.Round.Seconds()*s.Compression)
	b.WriteString("| | " + strings.Join(arms(rs), " | ") + " |\n|---|" + strings.Repeat("---|", len(rs)) + "\n")
	row := func(name string, f func(Result) string) {
		cells := make([]string, len(rs))
		for i, r := range rs {
			cells[i] = f(r)
		}
		fmt.Fprintf(&b, "| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	sidecar := func(f func(Result) string) func(Result) string {
		return func(r Result) string {
			if r.Arm == "nomad" {
				return "-"
			}
			return f(r)
		}
	}
	row("jobs completed", func(r Result) string { return fmt.Sprintf("%d", r.Completed) })
	row("makespan, live (simulated h)", func(r Result) string { return hours(r.MakespanSim) })
	row("makespan, `hadar sim` (h)", sidecar(func(r Result) string { return hours(r.PredMakespan) }))
	row("avg JCT, live (simulated h)", func(r Result) string { return hours(r.AvgJCTSim) })
	row("avg JCT, `hadar sim` (h)", sidecar(func(r Result) string { return hours(r.PredAvgJCT) }))
	row("p99 JCT, live (simulated h)", func(r Result) string { return hours(r.P99JCTSim) })
	row("units stopped before done (preemptions, moves)", func(r Result) string { return fmt.Sprintf("%d", r.Preemptions) })
	row("restarts in `hadar sim`", sidecar(func(r Result) string { return fmt.Sprintf("%d", r.PredRestarts) }))
	row("workers that gave up waiting for their gang", func(r Result) string { return fmt.Sprintf("%d", r.RendezvousTimeouts) })
	row("round latency p50 / p99 / max", sidecar(func(r Result) string {
		return fmt.Sprintf("%s / %s / %s (%d rounds)", ms(r.RoundP50), ms(r.RoundP99), ms(r.RoundMax), r.Rounds)
	}))
	row("any cycle (fills too) p50 / p99", sidecar(func(r Result) string { return ms(r.CycleP50) + " / " + ms(r.CycleP99) }))
	row("writes going out in the background p50 / p99 / max", sidecar(func(r Result) string {
		return ms(r.WritesOutP50) + " / " + ms(r.WritesOutP99) + " / " + ms(r.WritesOutMax)
	}))
	row("submit to placed p50 / p99 (p99 in rounds)", func(r Result) string {
		round := roundSim.Seconds() / r.Compression
		return fmt.Sprintf("%s / %s (%.1f)", secs(r.PlacedP50), secs(r.PlacedP99), r.PlacedP99.Seconds()/round)
	})
	row("of which the sidecar: submit to decided / to written p50 / p99", sidecar(func(r Result) string {
		return fmt.Sprintf("%s / %s, %s / %s (%d jobs)", secs(r.DecidedP50), secs(r.DecidedP99), secs(r.WrittenP50), secs(r.WrittenP99), r.DecidedJobs)
	}))
	row("arrival to first start, `hadar sim` p50 / p99 (wall)", sidecar(func(r Result) string { return secs(r.PredWaitP50) + " / " + secs(r.PredWaitP99) }))
	row("submit to running p50 / p99", func(r Result) string { return secs(r.RunningP50) + " / " + secs(r.RunningP99) })
	row("job writes per round, mean / max (total)", sidecar(func(r Result) string {
		return fmt.Sprintf("%.1f / %.0f (%.0f)", r.WritesPerRound, r.WritesPerRoundMax, r.WritesTotal)
	}))
	row("Nomad API requests per round", sidecar(func(r Result) string { return fmt.Sprintf("%.0f", r.RequestsPerRound) }))
	row("connections opened to Nomad", sidecar(func(r Result) string { return fmt.Sprintf("%d", r.Connections) }))
	row("mean latency: progress read / plan / register", sidecar(func(r Result) string {
		return ms(r.ProgressLatency) + " / " + ms(r.PlanLatency) + " / " + ms(r.RegisterLatency)
	}))
	row("progress reads (errors)", sidecar(func(r Result) string { return fmt.Sprintf("%d (%d)", r.ProgressReads, r.ProgressErrors) }))
	row("sidecar CPU (cores) / peak RSS / peak heap", sidecar(func(r Result) string {
		return fmt.Sprintf("%.2f / %s / %s", r.SidecarCPU, mib(r.SidecarPeakRSS), mib(r.SidecarPeakHeap))
	}))
	row("Nomad server CPU (cores) / peak RSS", func(r Result) string { return fmt.Sprintf("%.2f / %s", r.ServerCPU, mib(r.ServerPeakRSS)) })
	row("node simulator CPU (cores) / peak RSS", func(r Result) string { return fmt.Sprintf("%.2f / %s", r.NodesimCPU, mib(r.NodesimRSS)) })
	row("wall time of the arm (compression)", func(r Result) string {
		return fmt.Sprintf("%v (%gx)", r.Wall.Round(time.Second), r.Compression)
	})
	return b.String()
}

func arms(rs []Result) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Arm
		if r.Arm == "nomad" {
			out[i] = "Nomad's placement"
		}
	}
	return out
}

func hours(s float64) string {
	if s == 0 || math.IsNaN(s) {
		return "-"
	}
	return fmt.Sprintf("%.2f", s/3600)
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

func secs(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f s", d.Seconds())
}

func mib(b int64) string { return fmt.Sprintf("%d MiB", b>>20) }
