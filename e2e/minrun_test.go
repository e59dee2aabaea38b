package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// TestMinRunTimeCountsFromTheFirstStep: on one node of four V100s, two
// 4-worker jobs share the GPUs under gavel-maxmin (10 s rounds, a 10 s
// minimum run time). One job's workers take 40 s to start (a shell sleeps
// before the trainer: what importing torch and gathering a unit take on a
// loaded node). Counted from when its workers ran, its minimum run time
// would end before its first step, and every round would stop it before
// it trained: it would never finish. Counted from its first step, it keeps
// its GPUs while it starts, saying so, trains, and both jobs complete; no
// decision stops or moves a job before it started or trained.
func TestMinRunTimeCountsFromTheFirstStep(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	for _, n := range []string{"v100-b", "mix-a", "k80-a"} {
		if _, err := c.api.Nodes().ToggleEligibility(c.ids[n], false, nil); err != nil {
			t.Fatal(err)
		}
	}
	a := c.startSidecar(config.Config{
		Scheduling: config.Scheduling{Policy: "gavel-maxmin", Round: "10s"},
		RunLimits:  config.RunLimits{MinRunTime: "10s", GangTimeout: "2m", StopTimeout: "1m"},
	})
	// About 25 s of training each at the V100s' pace (4 x 40 steps/s).
	const steps = 4000
	trainerCmd := fmt.Sprintf("command     = %q\n        args        = [\"--model\", \"mlp\", \"--progress-interval\", \"500ms\"]", c.trainer)
	slow := c.hcl(scJob{id: "slow-start", steps: steps, workers: 4, gated: true})
	if !strings.Contains(slow, trainerCmd) {
		t.Fatalf("the job's command is not the trainer's:\n%s", slow)
	}
	slow = strings.Replace(slow, trainerCmd, fmt.Sprintf("command     = \"/bin/sh\"\n        args        = [\"-c\", \"sleep 40 && exec \\\"$0\\\" \\\"$@\\\"\", %q, \"--model\", \"mlp\", \"--progress-interval\", \"500ms\"]", c.trainer), 1)
	job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: slow, Canonicalize: true})
	if err != nil {
		t.Fatalf("parse the slow-starting job: %v\n%s", err, slow)
	}
	if _, _, err := c.api.Jobs().Register(job, nil); err != nil {
		t.Fatal(err)
	}
	c.submit(scJob{id: "quick-start", steps: steps, workers: 4, gated: true})

	ids := []string{"slow-start", "quick-start"}
	c.waitFor("both jobs complete", 8*time.Minute, func() error {
		for _, ev := range a.History() {
			if strings.Contains(ev.Why, "stopped before it") {
				t.Fatalf("%s at %s: %s: %s", ev.Job, ev.Time.Format(time.TimeOnly), ev.Action, ev.Why)
			}
		}
		for _, id := range ids {
			if st := c.jobStatus(id); st != "dead" {
				return fmt.Errorf("job %s is %s (plan: %s)", id, st, c.planOf(a, id).Reason.Why)
			}
		}
		return nil
	})
	// The slow job's first stint: from its start to its first stop, at
	// least its 40 s of start-up (counted from when its workers ran, the
	// 10 s minimum ended at the first round 10 s after that).
	var started, stopped time.Time
	for _, ev := range a.History() {
		if ev.Job != "default/slow-start" {
			continue
		}
		switch {
		case ev.Action == wire.ActionStart && started.IsZero():
			started = ev.Time
		case (ev.Action == wire.ActionStop || ev.Action == wire.ActionMove) && !started.IsZero() && stopped.IsZero():
			stopped = ev.Time
		}
	}
	if started.IsZero() || stopped.IsZero() {
		t.Fatalf("the slow-starting job was started at %v and first stopped at %v: it never gave its GPUs to the other job", started, stopped)
	}
	if ran := stopped.Sub(started); ran < 40*time.Second {
		t.Fatalf("the slow-starting job was stopped %s after its start, within its 40 s start-up", ran)
	} else {
		t.Logf("the slow-starting job's first stint: %s (40 s of start-up)", ran.Round(time.Second))
	}
}
