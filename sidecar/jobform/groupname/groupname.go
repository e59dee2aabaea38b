// Package groupname is the grammar of the task groups jobform writes when
// it places a job: one per worker, "<template>-hadar-u<unit>-w<rank>". It
// sits under jobform, the writer, as a package of its own because jobspec
// (which jobform imports) must recognise these groups too, to refuse them
// in a template and to find the template among them; watch parses each
// allocation's group once with it (watch.Alloc.Worker).
package groupname

import (
	"fmt"
	"regexp"
	"strconv"
)

// Worker is what a generated group's name says: the worker of rank Rank of
// placement unit Unit, copied from template group Template.
type Worker struct {
	Template string
	Unit     int
	Rank     int
}

// generated matches a generated group's name. Authors must not use such
// names (jobspec refuses them).
var generated = regexp.MustCompile(`^(.+)-hadar-u(\d+)-w(\d+)$`)

// Format is the generated group of worker rank of unit, copied from
// template group template.
func Format(template string, unit, rank int) string {
	return fmt.Sprintf("%s-hadar-u%d-w%d", template, unit, rank)
}

// Name is w's group name.
func (w Worker) Name() string { return Format(w.Template, w.Unit, w.Rank) }

// Parse reads a generated group's name; ok is false for any other group.
func Parse(name string) (w Worker, ok bool) {
	m := generated.FindStringSubmatch(name)
	if m == nil {
		return Worker{}, false
	}
	u, err1 := strconv.Atoi(m[2])
	r, err2 := strconv.Atoi(m[3])
	if err1 != nil || err2 != nil {
		return Worker{}, false
	}
	return Worker{Template: m[1], Unit: u, Rank: r}, true
}
