package trace

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// The formats Load reads, as Lines.Format names them.
const (
	FormatHadar       = "hadar CSV"
	FormatGavel       = "Gavel 10-column"
	FormatGavelLegacy = "Gavel legacy 7-column"
)

// Lines says where each job of a loaded trace came from: the file and the
// line of its row. Errors about a job found after loading (a model the
// profile lacks, say) name the line with Where. The zero value and nil
// know no file: Where then names the job ID, as for synthetic jobs.
type Lines struct {
	Path   string // the file as given to LoadWithLines
	Format string // FormatHadar, FormatGavel or FormatGavelLegacy
	line   map[string]int
	// path is each job's file when LoadSet read several (else Path).
	path map[string]string
}

// Line returns the line of job id in the file, or 0 when unknown.
func (l *Lines) Line(id string) int {
	if l == nil {
		return 0
	}
	return l.line[id]
}

// Where names job id's place as "FILE:LINE", or "job ID" when the line is
// unknown. It fits profile.Resolve's where argument.
func (l *Lines) Where(id string) string {
	if n := l.Line(id); n > 0 {
		if p := l.path[id]; p != "" {
			return fmt.Sprintf("%s:%d", p, n)
		}
		return fmt.Sprintf("%s:%d", l.Path, n)
	}
	return "job " + id
}

// Load reads a trace file: ".trace" or ".tsv" is Gavel's format (either
// layout, see ParseGavel), ".csv" hadar's; any other name is told apart by
// content (a first line starting with "id," is hadar's, a tab-separated one
// Gavel's).
func Load(path string) ([]planner.Job, error) {
	jobs, _, err := LoadWithLines(path)
	return jobs, err
}

// LoadWithLines is Load that also returns where each job came from.
func LoadWithLines(path string) ([]planner.Job, *Lines, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("load trace: %w", err)
	}
	gavel := func(r io.Reader) ([]planner.Job, map[string]int, string, error) { return parseGavel(r) }
	hadar := func(r io.Reader) ([]planner.Job, map[string]int, string, error) {
		jobs, lines, err := parseCSV(r)
		return jobs, lines, FormatHadar, err
	}
	var parse func(io.Reader) ([]planner.Job, map[string]int, string, error)
	switch strings.ToLower(filepath.Ext(path)) {
	case ".trace", ".tsv":
		parse = gavel
	case ".csv":
		parse = hadar
	default:
		first := firstLine(data)
		switch {
		case strings.HasPrefix(first, "id,"):
			parse = hadar
		case strings.Contains(first, "\t"):
			parse = gavel
		default:
			return nil, nil, fmt.Errorf("load trace %s: cannot tell the format: want a .trace file (Gavel's tab-separated) or a .csv file with the header %q", path, strings.Join(Header, ","))
		}
	}
	jobs, lines, format, err := parse(bytes.NewReader(data))
	if err != nil {
		return nil, nil, fmt.Errorf("load trace %s: %w", path, err)
	}
	return jobs, &Lines{Path: path, Format: format, line: lines}, nil
}

// firstLine returns the first line that is neither blank nor a comment.
func firstLine(data []byte) string {
	for line := range strings.Lines(string(data)) {
		t := strings.TrimSpace(line)
		if t != "" && !strings.HasPrefix(t, "#") {
			return t
		}
	}
	return ""
}
