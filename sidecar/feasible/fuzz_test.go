package feasible

import (
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/sidecar/jobspec"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// FuzzConstraint: whatever a job author writes as a constraint (at job
// level and on the GPU request), and whatever a node reports, Evaluate
// never panics, accounts for every node, and explains an empty result;
// attribute comparisons are antisymmetric and = and != disagree.
func FuzzConstraint(f *testing.F) {
	for _, s := range [][5]string{
		{"${attr.x}", "=", "linux", "linux", "16 GiB"},
		{"${device.attr.x}", ">=", "12 GiB", "7", "16384 MiB"},
		{"${meta.y}", "regexp", "^(a|b)+$", "abab", "true"},
		{"${attr.x}", "version", ">= 1.2, < 2", "1.5.0-beta", "1.5"},
		{"${attr.x}", "semver", ">= 1.2.0", "1.3.0", "1.3.0"},
		{"${device.attr.x}", "<", "1.5 GHz", "x", "1400 MHz"},
		{"${attr.x}", "set_contains_any", "a, b", "b,c", "NaN"},
		{"${device.model}", "set_contains", "Tesla K80", "", "9223372036854775807 EiB"},
		{"${node.unique.id}", "!=", "${attr.x}", "n1", "-1 mW"},
		{"${attr.x", "is_set", "", "", "1e308 GB"},
		{"", "distinct_hosts", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	f.Fuzz(func(t *testing.T, l, op, r, nodeValue, deviceValue string) {
		n := node("n1", func(n *watch.Node) {
			n.Attributes["x"], n.Meta["y"] = nodeValue, nodeValue
			n.GPUs[0].Typed["x"] = parseAttribute(deviceValue)
		})
		other := node("n2")
		j := trainJob("j", "nvidia/gpu", func(j *api.Job) {
			c := &api.Constraint{LTarget: l, Operand: op, RTarget: r}
			j.Constraints = append(j.Constraints, c)
			d := gpuTask(j).Resources.Devices[0]
			d.Constraints = append(d.Constraints, c)
		})
		wj := &watch.Job{Namespace: "default", ID: "j", Managed: true, Raw: j}
		spec, err := jobspec.Parse(j)
		if err != nil {
			t.Skip() // a gate-attribute constraint, say: the job is refused before it is evaluated
		}
		wj.Spec = &spec
		r1 := Evaluate(j, spec, snapshot([]*watch.Node{n, other}, wj), typeOf)
		counted := len(r1.Nodes)
		for _, c := range r1.Excluded {
			counted += c
		}
		if counted != 2 || (r1.Why == "") != (len(r1.Nodes) > 0) {
			t.Fatalf("result %+v", r1)
		}

		m := newMatchers()
		lv, lOK := resolveNode(l, n)
		rv, rOK := resolveNode(r, n)
		if lOK && rOK && m.checkNode("=", lv, rv, true, true) == m.checkNode("!=", lv, rv, true, true) {
			t.Fatalf("= and != agree on %q, %q", lv, rv)
		}
		a, b := parseAttribute(nodeValue), parseAttribute(deviceValue)
		if a.Kind != watch.AttrBool && b.Kind != watch.AttrBool {
			c1, ok1 := compareAttributes(a, b)
			c2, ok2 := compareAttributes(b, a)
			if ok1 != ok2 || ok1 && c1 != -c2 {
				t.Fatalf("compare(%+v, %+v) = %d, %v but the other way %d, %v", a, b, c1, ok1, c2, ok2)
			}
		}
	})
}
