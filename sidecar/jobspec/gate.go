package jobspec

import (
	"fmt"

	"github.com/hashicorp/nomad/api"
)

// The gate: a constraint on a node meta key no node sets, so Nomad finds no
// feasible node, keeps the job's evaluation blocked and the job pending
// (never garbage-collected), and `nomad job status` shows the constraint as
// the reason. The sidecar replaces it when it places the job. Never set the
// node meta key hadar.gate on a node.
const (
	GateAttribute = "${meta.hadar.gate}"
	GateValue     = "waiting-for-hadar"
)

// GateConstraint returns a new gate constraint, as a jobspec writes it:
//
//	constraint {
//	  attribute = "${meta.hadar.gate}"
//	  value     = "waiting-for-hadar"
//	}
func GateConstraint() *api.Constraint {
	return api.NewConstraint(GateAttribute, "=", GateValue)
}

// GateHCL is the constraint block error messages ask authors to add. It
// spans lines: HCL2 refuses a one-line block with two arguments.
const GateHCL = `constraint {
  attribute = "${meta.hadar.gate}"
  value     = "waiting-for-hadar"
}`

// Gate is where a job carries a gate constraint.
type Gate struct {
	// Group is the task group whose constraints hold it; "" for the job's
	// own constraints.
	Group string
	// Index is the constraint's position in that Constraints slice.
	Index int
}

func (g Gate) String() string {
	if g.Group == "" {
		return fmt.Sprintf("job constraint %d", g.Index)
	}
	return fmt.Sprintf("group %q constraint %d", g.Group, g.Index)
}

// IsGate reports whether c is a well-formed gate constraint: the gate
// attribute with an equality operator ("=", "==", "is" or empty, which
// Nomad reads as "=") and the gate value.
func IsGate(c *api.Constraint) bool {
	return c != nil && c.LTarget == GateAttribute && isEquality(c.Operand) && c.RTarget == GateValue
}

func isEquality(op string) bool {
	return op == "" || op == "=" || op == "==" || op == "is"
}

// FindGates returns every well-formed gate constraint of job, at job level
// then per group in group order.
func FindGates(job *api.Job) []Gate {
	if job == nil {
		return nil
	}
	var out []Gate
	for i, c := range job.Constraints {
		if IsGate(c) {
			out = append(out, Gate{Index: i})
		}
	}
	for _, g := range job.TaskGroups {
		if g == nil {
			continue
		}
		for i, c := range g.Constraints {
			if IsGate(c) {
				out = append(out, Gate{Group: deref(g.Name), Index: i})
			}
		}
	}
	return out
}

// HasGate reports whether job carries a gate at job or group level, i.e.
// Nomad cannot place it before the sidecar removes the gate.
func HasGate(job *api.Job) bool { return len(FindGates(job)) > 0 }

// gate checks that the job is gated, and that no constraint on the gate
// attribute is malformed (a wrong operator or value would let the job run,
// or never run, unplanned).
func (p *parser) gate(job *api.Job) error {
	check := func(where string, cs []*api.Constraint) error {
		for i, c := range cs {
			if c == nil || c.LTarget != GateAttribute || IsGate(c) {
				continue
			}
			return p.fail(fmt.Sprintf("%s constraint %d", where, i), fmt.Sprintf("%s %s %s", c.LTarget, c.Operand, c.RTarget),
				fmt.Sprintf("want the gate exactly as %s (operator \"=\")", GateHCL))
		}
		return nil
	}
	if err := check("job", job.Constraints); err != nil {
		return err
	}
	for _, g := range job.TaskGroups {
		where := fmt.Sprintf("group %q", deref(g.Name))
		if err := check(where, g.Constraints); err != nil {
			return err
		}
		for _, t := range g.Tasks {
			if t == nil {
				continue
			}
			for i, c := range t.Constraints {
				if c != nil && c.LTarget == GateAttribute {
					return p.fail(fmt.Sprintf("%s task %q constraint %d", where, t.Name, i), "",
						"want the gate at job or group level, where the sidecar looks for it and replaces it: move the constraint block up")
				}
			}
		}
	}
	p.spec.Gates = FindGates(job)
	if len(p.spec.Gates) == 0 {
		return p.fail("gate", "", "missing: a managed job must wait for hadar's placement; add this constraint block to the job: "+GateHCL)
	}
	return nil
}
