package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/config"
)

// TestSidecarLeavesLaunchersAlone: Nomad cannot rewrite a dispatched job
// (its API drops Dispatched: "field 'Dispatched' is read-only"), and hadar
// places by rewriting. So a parameterized job with hadar.* meta and the
// gate is neither written nor refused; each dispatch of it is refused
// with its reason in the API, never written, and never runs unplanned;
// an unmanaged parameterized job's dispatches run under Nomad's own
// placement beside a managed job the sidecar places.
func TestSidecarLeavesLaunchersAlone(t *testing.T) {
	skipShort(t)
	c := startSidecarCluster(t)
	parameterized := func(id string, managed bool) {
		t.Helper()
		hcl := c.hcl(scJob{id: id, steps: 1, gated: managed})
		var kept []string
		for _, l := range strings.Split(hcl, "\n") {
			if !managed && strings.Contains(l, `"hadar.`) {
				continue
			}
			kept = append(kept, l)
		}
		hcl = strings.Replace(strings.Join(kept, "\n"), `type = "batch"`, "type = \"batch\"\n  parameterized {\n    payload       = \"forbidden\"\n    meta_optional = [\"hadar.steps\"]\n  }", 1)
		job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: hcl, Canonicalize: true})
		if err != nil {
			t.Fatalf("parse %s: %v\n%s", id, err, hcl)
		}
		if _, _, err := c.api.Jobs().Register(job, nil); err != nil {
			t.Fatal(err)
		}
	}
	parameterized("queue", true)
	parameterized("plainq", false)
	before, _, err := c.api.Jobs().Info("queue", nil)
	if err != nil {
		t.Fatal(err)
	}
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin"}})
	c.submit(scJob{id: "own", steps: 200, gated: true})

	dispatch := func(parent string, meta map[string]string) string {
		t.Helper()
		resp, _, err := c.api.Jobs().Dispatch(parent, meta, nil, "", nil)
		if err != nil {
			t.Fatalf("dispatch %s: %v", parent, err)
		}
		return resp.DispatchedJobID
	}
	child, plainChild := dispatch("queue", map[string]string{"hadar.steps": "200"}), dispatch("plainq", nil)
	childBefore, _, err := c.api.Jobs().Info(child, nil)
	if err != nil {
		t.Fatal(err)
	}

	c.waitFor("the dispatched job is refused with the reason", 30*time.Second, func() error {
		for _, r := range a.Plan().Refused {
			if r.Job == "default/"+child && strings.Contains(r.Error, "Dispatched field is read-only") && strings.Contains(r.Error, "own job") {
				return nil
			}
		}
		return fmt.Errorf("refused %+v", a.Plan().Refused)
	})
	for _, id := range []string{"own", plainChild} {
		c.waitFor(id+" completes", 3*time.Minute, func() error {
			if st := c.jobStatus(id); st != "dead" {
				return fmt.Errorf("status %s", st)
			}
			return nil
		})
	}
	for _, r := range a.Plan().Refused {
		if r.Job != "default/"+child {
			t.Fatalf("only the managed dispatch is refused, not %+v", r)
		}
	}
	if n := len(c.allocs(child)); n != 0 {
		t.Fatalf("the refused dispatch has %d allocations", n)
	}
	if st := c.jobStatus(child); st != "pending" {
		t.Fatalf("the refused dispatch is %s, want pending", st)
	}
	for id, b := range map[string]*api.Job{"queue": before, child: childBefore} {
		after, _, err := c.api.Jobs().Info(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		if *after.Version != *b.Version || *after.JobModifyIndex != *b.JobModifyIndex {
			t.Fatalf("%s was written: version %d -> %d, index %d -> %d", id, *b.Version, *after.Version, *b.JobModifyIndex, *after.JobModifyIndex)
		}
	}
}
