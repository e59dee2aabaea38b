package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
)

// templateQueued is the template group's Queued count in Nomad's job
// summary: what `nomad job status` shows.
func (c *sidecarCluster) templateQueued(id string) (int, error) {
	s, _, err := c.api.Jobs().Summary(id, nil)
	if err != nil {
		return 0, err
	}
	tg, ok := s.Summary["train"]
	if !ok {
		return 0, fmt.Errorf("no summary of the template group: %v", s.Summary)
	}
	return tg.Queued, nil
}

// lastAlloc is the job's newest allocation of a generated group.
func (c *sidecarCluster) lastAlloc(id string) *api.AllocationListStub {
	var last *api.AllocationListStub
	for _, al := range c.allocs(id) {
		if _, gen := groupname.Parse(al.TaskGroup); gen && (last == nil || al.CreateIndex > last.CreateIndex) {
			last = al
		}
	}
	return last
}

// finalProgress reads a finished allocation's progress file.
func (c *sidecarCluster) finalProgress(stub *api.AllocationListStub) (*contract.Progress, error) {
	al, _, err := c.api.Allocations().Info(stub.ID, nil)
	if err != nil {
		return nil, err
	}
	r, err := c.api.AllocFS().Cat(al, "trainer/local/"+contract.ProgressFileName, nil)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return contract.ParseProgress(b)
}

// TestSidecarRerunStartsFresh: issue 33 items 7, 8 and 9 on a live
// cluster. With a round longer than the job's life, the plan shows its
// progress a few seconds old (read between boundaries) with its age;
// `nomad job status` shows the template group not queued once the job is
// placed and after it finished; the job registered again with fewer steps
// starts fresh (does not end at once "done" past its steps); and a rerun
// that asks to resume from a checkpoint holding more steps than it asks
// for is refused with the reason.
func TestSidecarRerunStartsFresh(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	c.submit(scJob{id: "re", steps: 1200, gated: true})
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Round: "10m"}})
	c.waitFor("job re runs", 90*time.Second, func() error {
		if len(c.running("re")) != 1 {
			return errNotYet
		}
		return nil
	})
	c.waitFor("the template group is not queued once placed (item 9)", time.Minute, func() error {
		if q, err := c.templateQueued("re"); err != nil || q != 0 {
			return fmt.Errorf("queued %d, %v", q, err)
		}
		return nil
	})
	// Item 8: the next boundary is 10 minutes away; progress still moves,
	// and the view says how old it is.
	var seen []string
	c.waitFor("the plan shows fresh progress between boundaries (item 8)", time.Minute, func() error {
		jv := c.planOf(a, "re")
		if jv.ProgressAgeS != nil {
			seen = append(seen, fmt.Sprintf("%.0f steps %.1fs old", jv.StepsDone, *jv.ProgressAgeS))
		}
		if jv.StepsDone > 0 && jv.ProgressAgeS != nil && *jv.ProgressAgeS < 10 {
			return nil
		}
		return fmt.Errorf("plan view %+v", jv)
	})
	t.Logf("progress seen between boundaries: %s", strings.Join(seen, "; "))
	c.waitFor("job re completes", 3*time.Minute, func() error {
		if st := c.jobStatus("re"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	if q, err := c.templateQueued("re"); err != nil || q != 0 {
		t.Fatalf("after the job finished, the template group is queued %d (%v)", q, err)
	}
	dir := filepath.Join(c.ckpt, "default", "re", "train", "trainer")
	if b, err := os.ReadFile(filepath.Join(dir, ".hadar-run")); err != nil || !strings.Contains(string(b), `"finished":true`) {
		t.Fatalf("run record %q (%v)", b, err)
	}
	first := c.lastAlloc("re")

	// Item 7: registered again with fewer steps, it starts fresh.
	c.submit(scJob{id: "re", steps: 300, gated: true})
	c.waitFor("the rerun completes", 3*time.Minute, func() error {
		last := c.lastAlloc("re")
		if last == nil || last.ID == first.ID || last.ClientStatus != api.AllocClientStatusComplete {
			return errNotYet
		}
		if st := c.jobStatus("re"); st != "dead" {
			return fmt.Errorf("status %s", st)
		}
		return nil
	})
	rerun := c.lastAlloc("re")
	p, err := c.finalProgress(rerun)
	if err != nil {
		t.Fatal(err)
	}
	if p.StepsDone != 300 || p.TotalSteps != 300 {
		t.Fatalf("the rerun ended at step %d/%d: want 300/300, from scratch", p.StepsDone, p.TotalSteps)
	}
	if q, err := c.templateQueued("re"); err != nil || q != 0 {
		t.Fatalf("after the rerun, the template group is queued %d (%v)", q, err)
	}

	// A rerun asking to resume from the 300-step checkpoint with 200 steps
	// is refused, and says why.
	c.submit(scJob{id: "re", steps: 200, gated: true, extra: `    "hadar.resume" = "true"`})
	c.waitFor("the resumed rerun is refused with the reason", 3*time.Minute, func() error {
		last := c.lastAlloc("re")
		if last == nil || last.ID == rerun.ID {
			return errNotYet
		}
		al, _, err := c.api.Allocations().Info(last.ID, nil)
		if err != nil {
			return err
		}
		var msgs []string
		for _, ts := range al.TaskStates {
			for _, ev := range ts.Events {
				msgs = append(msgs, ev.DisplayMessage+" "+ev.DriverError)
				if strings.Contains(ev.DisplayMessage+ev.DriverError, "more than the 200 this run asks for") {
					return nil
				}
			}
		}
		b, _ := json.Marshal(msgs)
		return fmt.Errorf("events %s", b)
	})
	refused := c.lastAlloc("re")

	// Purged and registered again (a new Nomad job: a new create index),
	// with more steps than the checkpoint holds and no hadar.resume: it
	// starts fresh rather than resume from the purged job's checkpoint.
	if _, _, err := c.api.Jobs().Deregister("re", true, nil); err != nil {
		t.Fatal(err)
	}
	c.submit(scJob{id: "re", steps: 400, gated: true})
	c.waitFor("the job registered again after a purge completes", 3*time.Minute, func() error {
		last := c.lastAlloc("re")
		if last == nil || last.ID == refused.ID || last.ClientStatus != api.AllocClientStatusComplete {
			return errNotYet
		}
		return nil
	})
	last := c.lastAlloc("re")
	al, _, err := c.api.Allocations().Info(last.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range al.TaskStates {
		for _, ev := range ts.Events {
			if strings.Contains(ev.DisplayMessage, "resumed from checkpoint") {
				t.Fatalf("the job run again after a purge resumed the purged job's checkpoint: %q", ev.DisplayMessage)
			}
		}
	}
	if p, err := c.finalProgress(last); err != nil || p.StepsDone != 400 {
		t.Fatalf("after the purge the job ended with %+v (%v), want 400 steps", p, err)
	}
}
