package demo

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/hadar-sched/hadar/planner"
)

// screen shows snapshots: redrawn in place on a terminal, as periodic
// status lines and one line per event otherwise (a log file, CI).
type screen struct {
	w        io.Writer
	tty      bool
	fd       int
	utf8     bool
	lines    int // lines drawn last time (terminal)
	events   int // events already printed (plain)
	lastLine time.Time
	every    time.Duration
	capacity map[planner.GPUType]int
}

func newScreen(w io.Writer, capacity map[planner.GPUType]int) *screen {
	s := &screen{w: w, every: 10 * time.Second, capacity: capacity}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		s.tty, s.fd = true, int(f.Fd())
	}
	loc := os.Getenv("LC_ALL") + os.Getenv("LC_CTYPE") + os.Getenv("LANG")
	s.utf8 = strings.Contains(strings.ToUpper(strings.ReplaceAll(loc, "-", "")), "UTF8")
	return s
}

// show draws one snapshot under a title line.
func (s *screen) show(title string, snap Snapshot) {
	if !s.tty {
		s.plain(title, snap)
		return
	}
	width := 120
	if w, _, err := term.GetSize(s.fd); err == nil && w > 20 {
		width = w
	}
	lines := s.frame(title, snap)
	var b strings.Builder
	if s.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", s.lines) // back to the frame's first line
	}
	for _, l := range lines {
		// Never wrap: a wrapped line would break the count of lines to
		// go back up next time.
		b.WriteString("\x1b[2K" + clip(l, width-1) + "\n")
	}
	for range max(0, s.lines-len(lines)) {
		b.WriteString("\x1b[2K\n")
	}
	if extra := s.lines - len(lines); extra > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", extra)
	}
	s.lines = len(lines)
	fmt.Fprint(s.w, b.String())
}

// done ends a terminal frame: the next output goes below it.
func (s *screen) done() { s.lines = 0 }

// frame renders the snapshot as lines.
func (s *screen) frame(title string, snap Snapshot) []string {
	out := []string{title + "  " + clock(snap.Elapsed) + roundText(snap)}
	out = append(out, fmt.Sprintf("  %-10s %-20s %-12s %-10s %-14s %-6s %13s  %s", "JOB", "KIND", "STATE", "GPU", "NODE", "RACK", "STEPS", "PROGRESS"))
	for _, r := range snap.Jobs {
		frac := 0.0
		if r.Total > 0 {
			frac = min(1, r.Done/r.Total)
		}
		if r.State == "done" {
			frac = 1
		}
		line := fmt.Sprintf("  %-10s %-20s %-12s %-10s %-14s %-6s %13s  %s %3.0f%%", r.ID, r.Kind, stateText(r), dash(strings.Join(r.Types, ",")),
			dash(strings.Join(r.Nodes, ",")), dash(strings.Join(r.Racks, ",")), fmt.Sprintf("%.0f/%.0f", min(r.Done, r.Total), r.Total), s.bar(frac, 20), 100*frac)
		switch {
		case r.State == "done":
			line += fmt.Sprintf("  in %s", r.JCT.Round(time.Second))
		case r.Why != "":
			line += "  " + r.Why
		case r.Merges > 0:
			line += fmt.Sprintf("  %d merges", r.Merges)
		}
		out = append(out, line)
	}
	out = append(out, "  GPUs busy  "+s.busyText(snap.Busy, true))
	ev := snap.Events
	if len(ev) > 8 {
		ev = ev[len(ev)-8:]
	}
	if len(ev) > 0 {
		out = append(out, "  events (newest last):")
		for _, e := range ev {
			out = append(out, "    "+e)
		}
	}
	return out
}

// plain prints the new events, and a status line every s.every.
func (s *screen) plain(title string, snap Snapshot) {
	for _, e := range snap.Events[min(s.events, len(snap.Events)):] {
		fmt.Fprintf(s.w, "  %s\n", e)
	}
	s.events = len(snap.Events)
	if time.Since(s.lastLine) < s.every && !snap.AllDone {
		return
	}
	s.lastLine = time.Now()
	var parts []string
	for _, r := range snap.Jobs {
		frac := 0.0
		if r.Total > 0 {
			frac = min(1, r.Done/r.Total)
		}
		where := ""
		if len(r.Types) > 0 {
			where = "@" + strings.Join(r.Types, "+")
		}
		parts = append(parts, fmt.Sprintf("%s %s%s %.0f%%", r.ID, stateText(r), where, 100*frac))
	}
	fmt.Fprintf(s.w, "[%s] %s%s | %s | GPUs busy %s\n", clock(snap.Elapsed), title, roundText(snap), strings.Join(parts, ", "), s.busyText(snap.Busy, false))
}

func roundText(snap Snapshot) string {
	if snap.Round == 0 {
		return ""
	}
	next := ""
	if d := time.Until(snap.NextRound); d > 0 {
		next = fmt.Sprintf(", next in %.0f s", d.Seconds())
	}
	return fmt.Sprintf("  round %d%s", snap.Round, next)
}

func stateText(r JobRow) string {
	switch {
	case r.State == "waiting" && r.Position >= 0:
		return fmt.Sprintf("waiting #%d", r.Position+1)
	case r.State == "running" && r.Units > 1:
		return fmt.Sprintf("running x%d", r.Units)
	case r.State == "running" && r.Workers > 1 && r.Running < r.Workers && r.Units == 0:
		// Nomad's own placement: some workers run, the others wait for
		// GPUs (no gang scheduling).
		return fmt.Sprintf("partial %d/%d", r.Running, r.Workers)
	}
	return r.State
}

func (s *screen) busyText(busy map[planner.GPUType]int, bars bool) string {
	var parts []string
	for _, t := range []planner.GPUType{"v100", "p100", "k80"} {
		c := s.capacity[t]
		if c == 0 {
			continue
		}
		p := fmt.Sprintf("%s %d/%d", t, busy[t], c)
		if bars {
			p += " " + s.bar(float64(busy[t])/float64(c), c)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "   ")
}

func (s *screen) bar(frac float64, width int) string {
	full, empty := "#", "."
	if s.utf8 {
		full, empty = "█", "░"
	}
	n := int(frac*float64(width) + 0.5)
	n = max(0, min(width, n))
	return strings.Repeat(full, n) + strings.Repeat(empty, width-n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clip cuts a line to n display columns (runes: the demo's lines hold no
// wide characters).
func clip(l string, n int) string {
	r := []rune(l)
	if len(r) <= n {
		return l
	}
	return string(r[:n])
}
