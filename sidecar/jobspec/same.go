package jobspec

import "reflect"

// Same reports whether two parses of a job ask the same of hadar: every
// field of Spec counts except Gates (where the gate sits: hadar's own
// placement moves it from the job to the template group). It is the one
// definition both the agent (re-admitting a new version whose contract
// changed) and the applier (writing a decision only on the spec it was
// planned for) use; TestSameCountsEveryField makes a new field count
// unless it is added to sameIgnores.
func (s Spec) Same(o Spec) bool {
	s.Gates, o.Gates = nil, nil
	return reflect.DeepEqual(s, o)
}

// sameIgnores are the fields of Spec that Same does not compare.
var sameIgnores = []string{"Gates"}
