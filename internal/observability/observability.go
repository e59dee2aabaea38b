// Package observability reads the Grafana dashboard and the Prometheus
// alert rules hadar ships (deploy/grafana, deploy/prometheus): their
// queries, the metric names each one reads, and the dashboard's queries
// with its variables filled in, for the tests that hold both to the
// metrics the sidecar serves (docs/observability.md).
package observability

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	yaml "go.yaml.in/yaml/v2"
)

// The files, relative to the repository's root.
const (
	DashboardFile = "deploy/grafana/hadar.json"
	RulesFile     = "deploy/prometheus/hadar-alerts.yml"
	// PrometheusJobFile runs Prometheus as a Nomad job, its token read
	// from the job's Nomad Variable.
	PrometheusJobFile = "deploy/prometheus/prometheus.nomad.hcl"
)

// Query is one PromQL expression of the dashboard or the rules.
type Query struct {
	// Where names it for a message: the panel and its refId, or the rule.
	Where string
	Expr  string
}

// panel is the part of a Grafana panel the checks read; a row holds its
// panels in Panels when it is collapsed.
type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// Dashboard is the dashboard's JSON, as far as the checks need it.
type Dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
}

// LoadDashboard parses the dashboard at path.
func LoadDashboard(path string) (Dashboard, error) {
	var d Dashboard
	b, err := os.ReadFile(path)
	if err != nil {
		return d, fmt.Errorf("reading the dashboard: %w", err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("parsing the dashboard %s: %w", path, err)
	}
	return d, nil
}

// Queries returns every panel's targets, rows' nested panels included;
// it fails on a panel (not a row) without a query, or a target without an
// expression, which Grafana would show empty.
func (d Dashboard) Queries() ([]Query, error) {
	var out []Query
	seen := map[int]string{}
	var walk func(ps []panel) error
	walk = func(ps []panel) error {
		for _, p := range ps {
			if prev, dup := seen[p.ID]; dup {
				return fmt.Errorf("panels %q and %q share the id %d", prev, p.Title, p.ID)
			}
			seen[p.ID] = p.Title
			if p.Type == "row" {
				if err := walk(p.Panels); err != nil {
					return err
				}
				continue
			}
			if len(p.Targets) == 0 {
				return fmt.Errorf("panel %q has no query", p.Title)
			}
			for _, t := range p.Targets {
				if strings.TrimSpace(t.Expr) == "" {
					return fmt.Errorf("panel %q, target %s: no expression", p.Title, t.RefID)
				}
				out = append(out, Query{Where: fmt.Sprintf("panel %q target %s", p.Title, t.RefID), Expr: t.Expr})
			}
		}
		return nil
	}
	return out, walk(d.Panels)
}

// Rule is one alerting or recording rule.
type Rule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

// LoadRules parses a Prometheus rule file (its groups' rules), strictly:
// a misspelt key fails here, not silently in Prometheus.
func LoadRules(path string) ([]Rule, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the rules: %w", err)
	}
	var f struct {
		Groups []struct {
			Name     string `yaml:"name"`
			Interval string `yaml:"interval"`
			Rules    []Rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("parsing the rules %s: %w", path, err)
	}
	var out []Rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// RuleQueries returns the rules' expressions.
func RuleQueries(rules []Rule) []Query {
	out := make([]Query, 0, len(rules))
	for _, r := range rules {
		name := r.Alert
		if name == "" {
			name = r.Record
		}
		out = append(out, Query{Where: "rule " + name, Expr: r.Expr})
	}
	return out
}

var (
	strLit   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	matchers = regexp.MustCompile(`\{[^}]*\}`)
	ranges   = regexp.MustCompile(`\[[^\]]*\]`)
	numbers  = regexp.MustCompile(`\b[0-9][0-9A-Za-z_.]*`) // 0.95, 1e3, 5m
	grouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	ident    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
		"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// MetricNames returns the metric names a PromQL expression reads, sorted:
// the identifiers that are neither functions, aggregations, keywords nor
// label names (in matchers and grouping clauses). Good enough for the
// expressions hadar ships; not a PromQL parser.
func MetricNames(expr string) []string {
	e := strLit.ReplaceAllString(expr, `""`)
	e = matchers.ReplaceAllString(e, "{}")
	e = ranges.ReplaceAllString(e, "[]")
	e = numbers.ReplaceAllString(e, "0")
	e = grouping.ReplaceAllString(e, " ")
	set := map[string]bool{}
	for _, m := range ident.FindAllStringSubmatch(e, -1) {
		name := strings.TrimRight(m[0], " \t\n(")
		if m[1] != "" || keywords[strings.ToLower(name)] {
			continue // a function or an aggregation, or a keyword
		}
		set[name] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Instantiate fills in the Grafana variables the dashboard uses, as
// Grafana would for "All" policies over a range: $__rate_interval and
// $__interval become rate, $policy and ${policy} match any policy.
func Instantiate(expr, rate string) string {
	r := strings.NewReplacer("$__rate_interval", rate, "${__rate_interval}", rate, "$__interval", rate,
		"${policy}", ".*", "$policy", ".*")
	return r.Replace(expr)
}
