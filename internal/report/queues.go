package report

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/hadar-sched/hadar/planner/sim"
)

// QueueSummary is one queue's line of a result; its JSON names are part
// of the `hadar sim --format json` contract.
type QueueSummary struct {
	Queue                string  `json:"queue"`
	Jobs                 int     `json:"jobs"`
	Completed            int     `json:"jobs_completed"`
	AvgJCTS              float64 `json:"avg_jct_s"`
	GPUSeconds           float64 `json:"gpu_s"`
	GuaranteedGPUSeconds float64 `json:"guaranteed_gpu_s"`
	FairGPUSeconds       float64 `json:"fair_gpu_s"`
	BelowGuaranteeS      float64 `json:"below_guarantee_s"`
	LongestBelowS        float64 `json:"longest_below_guarantee_s"`
	ReclaimWaitS         float64 `json:"reclaim_wait_s"`
	LongestReclaimWaitS  float64 `json:"longest_reclaim_wait_s"`
}

func queueSummaries(r sim.Result) []QueueSummary {
	var out []QueueSummary
	for _, q := range r.Queues {
		out = append(out, QueueSummary{Queue: q.Queue, Jobs: q.Jobs, Completed: q.Completed, AvgJCTS: q.AvgJCT, GPUSeconds: q.GPUSeconds,
			GuaranteedGPUSeconds: q.GuaranteedGPUSeconds, FairGPUSeconds: q.FairGPUSeconds, BelowGuaranteeS: q.BelowGuaranteeS, LongestBelowS: q.LongestBelowS,
			ReclaimWaitS: q.ReclaimWaitS, LongestReclaimWaitS: q.LongestReclaimWaitS})
	}
	return out
}

// WriteQueueTable writes one line per policy and queue (nothing when no
// result has queues): average JCT, GPU time used against guaranteed and
// against a fair division, the time below the guarantee with demand the
// guarantee covers, the part of it waiting on GPUs lent to other queues
// and its longest stretch, and per policy Jain's index across queues of
// GPU time over fair GPU time, and the share of the GPUs held while some
// job waited.
func WriteQueueTable(w io.Writer, rs []sim.Result) error {
	has := false
	for _, r := range rs {
		has = has || len(r.Queues) > 0
	}
	if !has {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tqueue\tjobs\tavg JCT (h)\tGPU time (h)\tguaranteed (h)\tused/fair\tbelow guarantee (s)\twaits on lent (s)\tlongest wait (s)\tJain\tbusy while jobs wait\t")
	for _, r := range rs {
		for k, q := range r.Queues {
			fair := "-"
			if q.FairGPUSeconds > 0 {
				fair = fmt.Sprintf("%.2f", q.GPUSeconds/q.FairGPUSeconds)
			}
			jain, busy := "", ""
			if k == 0 {
				jain, busy = fmt.Sprintf("%.3f", r.QueueFairness), fmt.Sprintf("%.1f%%", 100*r.BusyWhileWaiting)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%.2f\t%.1f\t%.1f\t%s\t%.0f\t%.0f\t%.0f\t%s\t%s\t\n", r.Scheduler, q.Queue, q.Completed, q.Jobs, q.AvgJCT/3600,
				q.GPUSeconds/3600, q.GuaranteedGPUSeconds/3600, fair, q.BelowGuaranteeS, q.ReclaimWaitS, q.LongestReclaimWaitS, jain, busy)
		}
	}
	return tw.Flush()
}
