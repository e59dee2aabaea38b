package observability

import (
	"slices"
	"strings"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`sum by (status) (hadar_pending_jobs{policy=~"$policy", status!="x"})`, []string{"hadar_pending_jobs"}},
		{`histogram_quantile(0.95, sum by (le, kind) (rate(hadar_round_duration_seconds_bucket{policy=~"$policy"}[$__rate_interval])))`, []string{"hadar_round_duration_seconds_bucket"}},
		{`time() - max(hadar_last_plan_timestamp_seconds) > 1200`, []string{"hadar_last_plan_timestamp_seconds"}},
		{`sum(a_total) > 0 and on (policy) sum(b{x="and rate(c)"}) > 0`, []string{"a_total", "b"}},
		{`process_resident_memory_bytes and on (instance, job) hadar_leader offset 5m`, []string{"hadar_leader", "process_resident_memory_bytes"}},
		{`absent(hadar_leader)`, []string{"hadar_leader"}},
	} {
		if got := MetricNames(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("MetricNames(%s) = %v, want %v", c.expr, got, c.want)
		}
	}
}

// The shipped files parse, every panel has queries, and the variables
// are filled in.
func TestShippedFilesParse(t *testing.T) {
	d, err := LoadDashboard("../../" + DashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || len(qs) < 20 {
		t.Fatalf("dashboard uid %q, %d queries", d.UID, len(qs))
	}
	for _, q := range qs {
		if e := Instantiate(q.Expr, "1m"); strings.Contains(e, "$") {
			t.Errorf("%s: a variable is left in %s", q.Where, e)
		}
	}
	rules, err := LoadRules("../../" + RulesFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
			t.Errorf("rule %+v: an alert needs a name, an expression, a severity and a summary", r)
		}
	}
}
