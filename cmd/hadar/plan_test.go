package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// `hadar plan` against a real Nomad server with ACLs, the connection from
// flags over the environment: -address and -token win over NOMAD_ADDR and
// NOMAD_TOKEN; a token without node read is refused by the version check
// with the capability named; -json prints the plan.
func TestPlanAgainstNomad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Nomad agent; skipped with -short")
	}
	srv := harness.StartAgent(t, harness.Options{Mode: harness.ModeServer, ACL: true})
	mgmt := srv.Client
	if _, err := mgmt.ACLPolicies().Upsert(&api.ACLPolicy{Name: "jobs-only", Rules: `namespace "*" { policy = "read" }`}, nil); err != nil {
		t.Fatal(err)
	}
	weak, _, err := mgmt.ACLTokens().Create(&api.ACLToken{Type: "client", Policies: []string{"jobs-only"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOMAD_ADDR", "http://127.0.0.1:1")
	t.Setenv("NOMAD_TOKEN", weak.SecretID)
	for _, k := range []string{"HADAR_NAMESPACE", "NOMAD_NAMESPACE"} {
		t.Setenv(k, "")
	}
	code, out, errs := runHadar("plan", "-address", srv.Addr, "-json", "-namespace", "training")
	if code != 1 || !strings.Contains(errs, "node read") {
		t.Fatalf("a token without node read: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = runHadar("plan", "-address", srv.Addr, "-token", srv.Token, "-json", "-namespace", "training")
	if code != 0 {
		t.Fatalf("hadar plan: exit %d\n%s%s", code, out, errs)
	}
	var p wire.PlanView
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.Policy != config.DefaultPolicy {
		t.Fatalf("hadar plan -json: %v\n%s", err, out)
	}
}
