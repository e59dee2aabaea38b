package feasible

import (
	"cmp"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	version "github.com/hashicorp/go-version"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

// Constraint operators Nomad knows (nomad/structs/structs.go,
// Constraint*; the scheduler's checkConstraint in
// scheduler/feasible/feasible.go).
const (
	opDistinctHosts    = "distinct_hosts"
	opDistinctProperty = "distinct_property"
	opRegexp           = "regexp"
	opVersion          = "version"
	opSemver           = "semver"
	opSetContains      = "set_contains"
	opSetContainsAll   = "set_contains_all"
	opSetContainsAny   = "set_contains_any"
	opIsSet            = "is_set"
	opIsNotSet         = "is_not_set"
)

// operand returns op, reading "" as "=": HCL's default, which Nomad fills
// in when it parses a jobspec (jobspec2/hcl_conversions.go) and requires
// of any job it stores (structs.Constraint.Validate).
func operand(op string) string {
	if op == "" {
		return "="
	}
	return op
}

// resolveNode resolves a constraint target against a node the way
// Nomad's resolveTarget does (scheduler/feasible/feasible.go): a target
// without "${" is a literal; an unknown interpolation or a missing
// attribute or meta key is "" and not found.
func resolveNode(target string, n *watch.Node) (string, bool) {
	if !strings.HasPrefix(target, "${") {
		return target, true
	}
	switch {
	case target == "${node.unique.id}":
		return n.ID, true
	case target == "${node.datacenter}":
		return n.Datacenter, true
	case target == "${node.unique.name}":
		return n.Name, true
	case target == "${node.class}":
		return n.NodeClass, true
	case target == "${node.pool}":
		return nodePool(n), true
	case strings.HasPrefix(target, "${attr."):
		v, ok := n.Attributes[strings.TrimSuffix(strings.TrimPrefix(target, "${attr."), "}")]
		return v, ok
	case strings.HasPrefix(target, "${meta."):
		v, ok := n.Meta[strings.TrimSuffix(strings.TrimPrefix(target, "${meta."), "}")]
		return v, ok
	}
	return "", false
}

// nodePool is the node's pool; Nomad stores "" as "default"
// (structs.Node.Canonicalize).
func nodePool(n *watch.Node) string {
	if n.NodePool == "" {
		return poolDefault
	}
	return n.NodePool
}

// matchers caches compiled regular expressions and version constraints:
// one job's constraints are checked against every node. A matcher is
// used under its Evaluator's lock.
type matchers struct {
	regexps  map[string]*regexp.Regexp
	versions map[string]version.Constraints
	semvers  map[string]semverConstraints
}

func newMatchers() *matchers {
	return &matchers{regexps: map[string]*regexp.Regexp{}, versions: map[string]version.Constraints{}, semvers: map[string]semverConstraints{}}
}

// maxCached bounds each cache: the expressions come from job authors, and
// through ${attr.*} right-hand sides from nodes too.
const maxCached = 256

func (m *matchers) regexp(expr string) *regexp.Regexp {
	if re, ok := m.regexps[expr]; ok {
		return re
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		re = nil // remembered as invalid: it never matches
	}
	if len(m.regexps) < maxCached {
		m.regexps[expr] = re
	}
	return re
}

func (m *matchers) version(expr string) version.Constraints {
	if c, ok := m.versions[expr]; ok {
		return c
	}
	c, err := version.NewConstraint(expr)
	if err != nil {
		c = nil
	}
	if len(m.versions) < maxCached {
		m.versions[expr] = c
	}
	return c
}

func (m *matchers) semver(expr string) semverConstraints {
	if c, ok := m.semvers[expr]; ok {
		return c
	}
	c, err := parseSemverConstraints(expr)
	if err != nil {
		c = nil
	}
	if len(m.semvers) < maxCached {
		m.semvers[expr] = c
	}
	return c
}

// checkNode is Nomad's checkConstraint for node targets: both values are
// strings, found or not (scheduler/feasible/feasible.go).
func (m *matchers) checkNode(op, l, r string, lOK, rOK bool) bool {
	switch operand(op) {
	case opDistinctHosts, opDistinctProperty:
		return true // they concern several allocations: see Result.DistinctHosts
	case "=", "==", "is":
		return lOK && rOK && l == r
	case "!=", "not":
		// Nomad compares the values alone: a missing target is "", so
		// ${meta.x} != "" holds only where x is set to something else.
		return l != r
	case "<", "<=", ">", ">=":
		return lOK && rOK && checkOrder(op, l, r)
	case opIsSet:
		return lOK
	case opIsNotSet:
		return !lOK
	case opVersion:
		return lOK && rOK && m.versionMatch(l, r)
	case opSemver:
		return lOK && rOK && m.semverMatch(l, r)
	case opRegexp:
		if !lOK || !rOK {
			return false
		}
		re := m.regexp(r)
		return re != nil && re.MatchString(l)
	case opSetContains, opSetContainsAll:
		return lOK && rOK && setContainsAll(l, r)
	case opSetContainsAny:
		return lOK && rOK && setContainsAny(l, r)
	}
	return false // an operator Nomad does not know: Nomad refuses the node too
}

func (m *matchers) versionMatch(l, r string) bool {
	v, err := version.NewVersion(l)
	if err != nil {
		return false
	}
	c := m.version(r)
	return c != nil && c.Check(v)
}

func (m *matchers) semverMatch(l, r string) bool {
	v, err := version.NewVersion(l)
	if err != nil {
		return false
	}
	c := m.semver(r)
	return c != nil && c.check(v)
}

// checkOrder compares as integers when both parse as integers, else as
// floats when both parse as floats, else lexically (Nomad's checkOrder).
func checkOrder(op, l, r string) bool {
	if a, err := strconv.ParseInt(l, 10, 64); err == nil {
		if b, err := strconv.ParseInt(r, 10, 64); err == nil {
			return compareOrder(op, a, b)
		}
	}
	if a, err := strconv.ParseFloat(l, 64); err == nil {
		if b, err := strconv.ParseFloat(r, 64); err == nil {
			return compareOrder(op, a, b)
		}
	}
	return compareOrder(op, l, r)
}

func compareOrder[T cmp.Ordered](op string, a, b T) bool {
	switch op {
	case "<":
		return a < b
	case "<=":
		return a <= b
	case ">":
		return a > b
	case ">=":
		return a >= b
	}
	return false
}

// setContainsAll reports whether every comma-separated item of r is one of
// l's (items trimmed of spaces).
func setContainsAll(l, r string) bool {
	have := setOf(l)
	for _, x := range strings.Split(r, ",") {
		if _, ok := have[strings.TrimSpace(x)]; !ok {
			return false
		}
	}
	return true
}

// setContainsAny reports whether some item of r is one of l's.
func setContainsAny(l, r string) bool {
	have := setOf(l)
	for _, x := range strings.Split(r, ",") {
		if _, ok := have[strings.TrimSpace(x)]; ok {
			return true
		}
	}
	return false
}

func setOf(s string) map[string]struct{} {
	items := strings.Split(s, ",")
	out := make(map[string]struct{}, len(items))
	for _, x := range items {
		out[strings.TrimSpace(x)] = struct{}{}
	}
	return out
}

// globPattern matches a subject where "*" stands for any run of
// characters and nothing else is special: how Nomad matches a job's
// datacenters (structs.Node.IsInAnyDC with github.com/ryanuber/go-glob).
type globPattern struct {
	parts []string // the pattern split at each "*"
}

func newGlob(pattern string) globPattern { return globPattern{strings.Split(pattern, "*")} }

func (g globPattern) match(subject string) bool {
	if len(g.parts) == 1 {
		return g.parts[0] == subject
	}
	first, last := g.parts[0], g.parts[len(g.parts)-1]
	if !strings.HasPrefix(subject, first) {
		return false
	}
	subject = subject[len(first):]
	// Each middle part at its earliest place leaves the most room for the
	// rest.
	for _, p := range g.parts[1 : len(g.parts)-1] {
		i := strings.Index(subject, p)
		if i < 0 {
			return false
		}
		subject = subject[i+len(p):]
	}
	return strings.HasSuffix(subject, last)
}

// semverConstraints is a comma-separated list of semver constraints, all
// of which must hold: what Nomad's "semver" operator takes. Unlike
// go-version's constraints, versions are compared by plain Semver 2.0
// precedence (a prerelease is below its release and may match ">="), and
// the versions on the right must be well-formed semver
// (helper/constraints/semver in Nomad).
type semverConstraints []semverConstraint

type semverConstraint struct {
	op string
	v  *version.Version
}

var semverConstraintRE = regexp.MustCompile(`^\s*(!=|>=|<=|=|>|<)?\s*(` + version.SemverRegexpRaw + `)\s*$`)

func parseSemverConstraints(s string) (semverConstraints, error) {
	var out semverConstraints
	for _, one := range strings.Split(s, ",") {
		m := semverConstraintRE.FindStringSubmatch(one)
		if m == nil {
			return nil, fmt.Errorf("semver constraint %q: want an operator (=, !=, >, >=, <, <=) and a version such as 1.2.3", one)
		}
		v, err := version.NewSemver(m[2])
		if err != nil {
			return nil, fmt.Errorf("semver constraint %q: %w", one, err)
		}
		out = append(out, semverConstraint{op: m[1], v: v})
	}
	return out, nil
}

func (cs semverConstraints) check(v *version.Version) bool {
	for _, c := range cs {
		var ok bool
		switch c.op {
		case "", "=":
			ok = v.Equal(c.v)
		case "!=":
			ok = !v.Equal(c.v)
		case ">":
			ok = v.Compare(c.v) > 0
		case "<":
			ok = v.Compare(c.v) < 0
		case ">=":
			ok = v.Compare(c.v) >= 0
		case "<=":
			ok = v.Compare(c.v) <= 0
		}
		if !ok {
			return false
		}
	}
	return true
}
