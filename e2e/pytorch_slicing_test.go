package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
)

// TestPyTorchDDPTimeSlicing (issue 32, item 8a): three 2-worker DDP jobs
// of the plain ddp example (real torch, gloo, no emulated pace) on
// hadar-train share one dev agent with 2 V100 and 2 K80 declared, under
// gavel-maxmin in 30 s rounds with the sidecar's default min_run_time:
// two units run at a time, co-located on one node, the third starts on
// the GPUs the first two leave. Every job completes within 15 minutes and
// no allocation fails; failed allocations' logs are kept (LogDir), and
// the plan is logged every 20 s. HADAR_TS_ROUND and HADAR_TS_MIN_RUN
// change the round and min_run_time for exploring: with min_run_time 1s
// every job is moved every round, and on a machine where a worker's
// start-up (torch's import) takes longer than the round no job ever
// trains a step. HADAR_TS_EMULATE=V,K paces the jobs at V steps/s on the
// V100s and K on the K80s (hadar-train's emulate): unpaced, every job
// ends within its first round or two and the rounds never matter. At
// 8,4 or 4,2 the third job waits for the first to end. On e516909, when
// the plan that first saw that end was a round boundary (not a fill), it
// then waited, the V100s idle, until the job on the K80s ended too (once
// in two paced runs there, 2.5 minutes), which 6c07d2c fixed
// (TestWaitingJobTakesTheGPUsAFinishedJobLeft in planner/engine).
func TestPyTorchDDPTimeSlicing(t *testing.T) {
	skipShort(t)
	c, p := startTorchDev(t, "ts-dev", []torchNode{
		{"", "tv", modelV100, "16GiB", 2},
		{"", "tk", modelK80, "12GiB", 2},
	})
	round := "30s"
	if r := os.Getenv("HADAR_TS_ROUND"); r != "" {
		round = r
	}
	mrt := "30m" // the sidecar's default
	if m := os.Getenv("HADAR_TS_MIN_RUN"); m != "" {
		mrt = m
	}
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Round: config.Duration(round)}, RunLimits: config.RunLimits{GangTimeout: "2m", StopTimeout: "2m", MinRunTime: config.Duration(mrt)}})
	ids := []string{"ddp-a", "ddp-b", "ddp-c"}
	emu := ""
	if e := os.Getenv("HADAR_TS_EMULATE"); e != "" {
		var v, k float64
		fmt.Sscanf(e, "%g,%g", &v, &k)
		emu = fmt.Sprintf("        emulate {\n          steps_per_sec = {\n            %q = %g\n            %q = %g\n          }\n        }\n", modelV100, v, modelK80, k)
	}
	for _, id := range ids {
		c.submitTorch(p, torchJob{id: id, driver: "hadar-train", steps: 1200, workers: 2, throughput: "v100=8,k80=4", module: "ddp", config: emu})
	}
	kept := map[string]bool{}
	keep := func(al *api.AllocationListStub) {
		if kept[al.ID] {
			return
		}
		kept[al.ID] = true
		for _, stream := range []string{"stderr", "stdout"} {
			harness.KeepLog(t, filepath.Join("allocs", al.JobID+"-"+al.TaskGroup+"-"+al.ID[:8]+"."+stream), []byte(c.logOf(al.ID, stream)))
		}
	}
	// What each job's allocations did, for the log when a job stalls.
	summary := func() string {
		var b strings.Builder
		for _, id := range ids {
			as := c.allocs(id)
			sort.Slice(as, func(i, j int) bool { return as[i].CreateIndex < as[j].CreateIndex })
			fmt.Fprintf(&b, "job %s: %s, plan %+v\n", id, c.jobStatus(id), c.planOf(a, id))
			for _, al := range as {
				_, gen := groupname.Parse(al.TaskGroup)
				fmt.Fprintf(&b, "  %s %s %s/%s gen=%v %s\n", al.ID[:8], al.TaskGroup, al.DesiredStatus, al.ClientStatus, gen, taskEvents(al.TaskStates))
			}
		}
		return b.String()
	}
	start := time.Now()
	done := map[string]time.Duration{}
	var failed []string
	var logged time.Time
	err := harness.Eventually(t.Context(), 15*time.Minute, 2*time.Second, func() error {
		if time.Since(logged) > 20*time.Second {
			logged = time.Now()
			for _, id := range ids {
				jv := c.planOf(a, id)
				t.Logf("PLAN %s: state %s action %s done %.0f/%.0f rate %.2f units %v reason %+v", id, jv.State, jv.Action, jv.StepsDone, jv.Steps, jv.Rate, jv.Units, jv.Reason)
			}
		}
		for _, id := range ids {
			for _, al := range c.allocs(id) {
				if al.ClientStatus == api.AllocClientStatusFailed && !kept[al.ID] {
					keep(al)
					failed = append(failed, id+"/"+al.TaskGroup+"/"+al.ID[:8]+": "+taskEvents(al.TaskStates))
				}
			}
			if _, ok := done[id]; !ok && c.jobStatus(id) == "dead" {
				done[id] = time.Since(start)
			}
		}
		if len(done) < len(ids) {
			return fmt.Errorf("%d of %d jobs done (%v)", len(done), len(ids), done)
		}
		return nil
	})
	if err != nil || len(failed) > 0 {
		for _, id := range ids {
			for _, al := range c.allocs(id) {
				keep(al)
			}
		}
		t.Fatalf("%v after %s; failed allocations %q\n%s", err, time.Since(start).Round(time.Second), failed, summary())
	}
	t.Logf("all done: %v; writes %v\n%s", done, a.Applier().Writes(), summary())
}
