package telemetry

import (
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/internal/observability"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// The dashboard and the alert rules read only metrics the sidecar serves
// (hadar's families, with a histogram's _bucket, _sum and _count, and
// the Go runtime's and the process's), so a renamed metric fails here
// rather than as an empty panel; and every hadar family is on the
// dashboard.
func TestDashboardAndRulesReadServedMetrics(t *testing.T) {
	f := &fake{h: wire.Health{Writes: map[string]int{}}, obs: cluster(t0, running("default/a", unit("n1", "v100", 2)))}
	tel, err := New(f, Options{Policy: "hadar"})
	if err != nil {
		t.Fatal(err)
	}
	tel.Sample()
	served := map[string]bool{}
	for _, mf := range gathered(t, tel) {
		served[mf.GetName()] = true
	}
	known := map[string]string{} // series name: its family
	for _, d := range append(append([]Def(nil), Defs...), QueueDefs...) {
		known[d.Name] = d.Name
		if d.Type == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[d.Name+s] = d.Name
			}
		}
	}
	d, err := observability.LoadDashboard("../../" + observability.DashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	panels, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := observability.LoadRules("../../" + observability.RulesFile)
	if err != nil {
		t.Fatal(err)
	}
	onDashboard := map[string]bool{}
	for _, q := range append(panels, observability.RuleQueries(rules)...) {
		names := observability.MetricNames(q.Expr)
		if len(names) == 0 {
			t.Errorf("%s reads no metric: %s", q.Where, q.Expr)
		}
		for _, n := range names {
			fam, ok := known[n]
			switch {
			case ok:
				if strings.HasPrefix(q.Where, "panel") {
					onDashboard[fam] = true
				}
			case !strings.HasPrefix(n, "hadar_") && served[n]:
				// go_* and process_*: the client library's, served too.
			default:
				t.Errorf("%s reads %s, which the sidecar does not serve: %s", q.Where, n, q.Expr)
			}
		}
	}
	for _, d := range append(append([]Def(nil), Defs...), QueueDefs...) {
		if !onDashboard[d.Name] {
			t.Errorf("%s is on no panel of %s", d.Name, observability.DashboardFile)
		}
	}
}
