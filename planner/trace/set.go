package trace

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
)

// LoadSet reads the traces of spec, a comma-separated list of FILE or
// FILE@QUEUE: each file in its own format (Load), its jobs put in QUEUE
// when one is given. Gavel's formats carry no queue, so this is how their
// per-virtual-cluster traces become teams (2869ce.trace@team-a,...); a
// hadar CSV row that names another queue than its file's is an error.
// With several files, every job ID is prefixed with its file's name
// without the extension and a '/' (Gavel's IDs repeat from file to
// file), and arrivals stay as each file gives them (seconds from its own
// start). Jobs come sorted by arrival, files in spec order on ties.
func LoadSet(spec string) ([]planner.Job, *Lines, error) {
	type item struct{ path, queue string }
	var items []item
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		path, q, _ := strings.Cut(part, "@")
		if path == "" {
			return nil, nil, fmt.Errorf("trace %q: entry %q has no file: want FILE or FILE@QUEUE", spec, part)
		}
		if strings.Contains(part, "@") && !queue.ValidName(q) {
			return nil, nil, fmt.Errorf("trace %q: queue %q of %s: want a queue name of letters, digits, '-', '_' or '.'", spec, q, path)
		}
		items = append(items, item{path, q})
	}
	if len(items) == 0 {
		return nil, nil, fmt.Errorf("trace %q: no file: want FILE[@QUEUE][,FILE[@QUEUE]...]", spec)
	}
	all := &Lines{Path: items[0].path, line: map[string]int{}}
	if len(items) > 1 {
		all.path = map[string]string{}
	}
	var jobs []planner.Job
	formats := map[string]bool{}
	for _, it := range items {
		js, lines, err := LoadWithLines(it.path)
		if err != nil {
			return nil, nil, err
		}
		formats[lines.Format] = true
		all.Format = lines.Format
		prefix := ""
		if len(items) > 1 {
			prefix = strings.TrimSuffix(filepath.Base(it.path), filepath.Ext(it.path)) + "/"
		}
		for _, j := range js {
			if it.queue != "" {
				if j.Queue != "" && j.Queue != it.queue {
					return nil, nil, fmt.Errorf("trace %s:%d: job %s is in queue %q, but %q maps the file to queue %q: drop one of them", it.path, lines.Line(j.ID), j.ID, j.Queue, spec, it.queue)
				}
				j.Queue = it.queue
			}
			line := lines.Line(j.ID)
			j.ID = prefix + j.ID
			if all.line[j.ID] != 0 {
				return nil, nil, fmt.Errorf("trace %s:%d: job ID %s is also in an earlier file: want files of different names", it.path, line, j.ID)
			}
			all.line[j.ID] = line
			if all.path != nil {
				all.path[j.ID] = it.path
			}
			jobs = append(jobs, j)
		}
	}
	if len(formats) > 1 {
		all.Format = "mixed"
	}
	sortByArrival(jobs)
	return jobs, all, nil
}
