package e2e

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/status"
)

const h100Model = "NVIDIA H100 80GB HBM3"

// unprofiledJob submits a managed job of a model no profile names, with no
// figures: its true speed per GPU model is only in the task's emulate
// block (paces), which the sidecar never reads.
func (c *sidecarCluster) unprofiledJob(id, model string, steps int, paces map[string]float64) *api.Job {
	c.t.Helper()
	var rates strings.Builder
	for _, m := range slices.Sorted(maps.Keys(paces)) {
		fmt.Fprintf(&rates, "            %q = %g\n", m, paces[m])
	}
	hcl := fmt.Sprintf(`job %q {
  type = "batch"
  meta = {
    "hadar.model" = %q
    "hadar.steps" = "%d"
  }
  %s
  group "train" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "trainer" {
      driver       = "hadar-train"
      kill_timeout = "15s"
      config {
        command     = %q
        args        = ["--model", "mlp", "--progress-interval", "500ms"]
        total_steps = %d
        emulate {
          steps_per_sec = {
%s          }
        }
      }
      resources {
        cpu    = 100
        memory = 128
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
`, id, model, steps, jobspec.GateHCL, c.trainer, steps, rates.String())
	job, err := c.api.Jobs().ParseHCLOpts(&api.JobsParseRequest{JobHCL: hcl, Canonicalize: true})
	if err != nil {
		c.t.Fatalf("parse job %s: %v\n%s", id, err, hcl)
	}
	if _, _, err := c.api.Jobs().Register(job, nil); err != nil {
		c.t.Fatalf("register job %s: %v", id, err)
	}
	return job
}

// Issue 21 on a real Nomad cluster: a cluster of H100s, a type no profile
// names, runs a job of a model no profile names; the sidecar learns its
// speed there from its progress, shows it in the status API and exports
// it as a profile; a resubmitted job of the model is planned with it.
func TestSidecarLearnsANewTypeAndModel(t *testing.T) {
	skipShort(t)
	c := &sidecarCluster{t: t, nodes: map[string]string{}, ids: map[string]string{}}
	c.trainer = harness.GoBinary(t, "./cmd/hadar-trainer", "hadar-trainer")
	c.ckpt, c.merge, c.stateDir = harness.SharedDir(t), harness.SharedDir(t), t.TempDir()
	c.server = harness.StartAgent(t, harness.Options{Name: "learn-srv", Mode: harness.ModeServer})
	c.api = c.server.Client
	train := fmt.Sprintf("checkpoint_root = %q\nmerge_root = %q\nprogress_poll_interval = \"500ms\"", c.ckpt, c.merge)
	node := harness.StartAgent(t, harness.Options{Name: "h100-a", Mode: harness.ModeClient, Servers: []string{c.server.RPCAddr},
		Meta: map[string]string{"rack": "r1"}, Plugins: map[string]string{"hadar-gpu": declare("ha", h100Model, "80GiB", 2), "hadar-train": train}})
	c.nodes[node.NodeID], c.ids["h100-a"] = "h100-a", node.NodeID
	t.Cleanup(c.stopSidecar)
	a := c.startSidecar(config.Config{Scheduling: config.Scheduling{Policy: "gavel-maxmin", Placement: "pack"}})
	srv := httptest.NewServer(status.New(a, status.Options{}).Handler())
	t.Cleanup(srv.Close)

	// 50 steps/s for about 4 minutes: past the 60 s warm-up, and the 60 s
	// of running a figure no profile had needs.
	const pace = 50.0
	c.unprofiledJob("llm-1", "my-new-llm", 12000, map[string]float64{h100Model: pace})
	c.waitFor("llm-1 running on the H100s", 3*time.Minute, func() error {
		if len(c.running("llm-1")) == 0 {
			return errNotYet
		}
		return nil
	})
	c.waitFor("my-new-llm learned on h100", 5*time.Minute, func() error {
		for _, f := range a.Learned("").Figures {
			if f.Model == "my-new-llm" && f.SF == 1 && f.Type == "h100" && f.Applied {
				if f.Rate < 0.8*pace || f.Rate > 1.2*pace {
					return fmt.Errorf("learned %.1f steps/s, the truth is %g", f.Rate, pace)
				}
				return nil
			}
		}
		return fmt.Errorf("learned %+v", a.Learned("").Figures)
	})

	// The status API exports it as a profile that loads.
	resp, err := http.Get(srv.URL + "/v1/profile/export?reference=h100")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/profile/export: %d %s", resp.StatusCode, body)
	}
	p, err := profile.Parse(body)
	if err != nil {
		t.Fatalf("the export does not load: %v\n%s", err, body)
	}
	if v, err := p.Throughput("my-new-llm", 1, "h100", false); err != nil || v < 0.8*pace || v > 1.2*pace {
		t.Fatalf("exported my-new-llm on h100: %v, %v", v, err)
	}

	// A resubmitted job of the model is planned at what the first taught.
	c.unprofiledJob("llm-2", "my-new-llm", 3000, map[string]float64{h100Model: pace})
	c.waitFor("llm-2 planned at the learned rate", 3*time.Minute, func() error {
		jv := c.planOf(a, "llm-2")
		if jv.Job == "" || jv.Rate == 0 {
			return errNotYet
		}
		if jv.Rate < 0.8*pace || jv.Rate > 1.2*pace {
			return fmt.Errorf("llm-2 planned at %.1f steps/s, want what llm-1 taught (about %g)", jv.Rate, pace)
		}
		return nil
	})
}
