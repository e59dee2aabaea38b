package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
)

// EventKind is a change of the cluster during a simulation.
type EventKind string

// Cluster events.
const (
	// Drain: the node takes no new work; its jobs move at the next round
	// boundary.
	Drain EventKind = "drain"
	// Undrain: the node is schedulable again.
	Undrain EventKind = "undrain"
	// Lose: the node is gone with its running work; every job with a
	// worker on it restarts from its last checkpoint.
	Lose EventKind = "lose"
	// Join: a node (Event.Node) joins.
	Join EventKind = "join"
)

// Event is one cluster change at Time seconds.
type Event struct {
	Time float64
	Kind EventKind
	// NodeID names the node (drain, undrain, lose).
	NodeID string
	// Node is the joining node (join).
	Node planner.Node
}

// sortEvents checks events against the cluster they start from and sorts
// them by time (ties keep their order).
func sortEvents(events []Event, c planner.Cluster) ([]Event, error) {
	out := slices.Clone(events)
	sort.SliceStable(out, func(a, b int) bool { return out[a].Time < out[b].Time })
	present := map[string]bool{}
	for _, n := range c.Nodes {
		present[n.ID] = true
	}
	for i, ev := range out {
		if math.IsNaN(ev.Time) || math.IsInf(ev.Time, 0) || ev.Time < 0 {
			return nil, fmt.Errorf("cluster event %d (%s): time %v: want seconds >= 0", i+1, ev.Kind, ev.Time)
		}
		switch ev.Kind {
		case Drain, Undrain, Lose:
			if !present[ev.NodeID] {
				return nil, fmt.Errorf("cluster event at %.0f s: %s %q: no such node in the cluster at that time", ev.Time, ev.Kind, ev.NodeID)
			}
			if ev.Kind == Lose {
				delete(present, ev.NodeID)
			}
		case Join:
			if ev.Node.ID == "" || ev.NodeID != "" && ev.NodeID != ev.Node.ID {
				return nil, fmt.Errorf("cluster event at %.0f s: join: the joining node needs an ID", ev.Time)
			}
			if present[ev.Node.ID] {
				return nil, fmt.Errorf("cluster event at %.0f s: join %q: a node of that ID is already in the cluster", ev.Time, ev.Node.ID)
			}
			total := 0
			for t, k := range ev.Node.GPUs {
				if k < 0 || t == "" {
					return nil, fmt.Errorf("cluster event at %.0f s: join %q: %d GPUs of type %q", ev.Time, ev.Node.ID, k, t)
				}
				total += k
			}
			if total == 0 {
				return nil, fmt.Errorf("cluster event at %.0f s: join %q: the node has no GPUs", ev.Time, ev.Node.ID)
			}
			present[ev.Node.ID] = true
		default:
			return nil, fmt.Errorf("cluster event at %.0f s: kind %q: want drain, undrain, lose or join", ev.Time, ev.Kind)
		}
	}
	return out, nil
}

// clusterEvents applies the events due by now; it reports whether any was.
func (s *simulation) clusterEvents(now float64) (bool, error) {
	any := false
	for s.nextEvent < len(s.events) && s.events[s.nextEvent].Time <= now+1e-9 {
		ev := s.events[s.nextEvent]
		s.nextEvent++
		any = true
		switch ev.Kind {
		case Drain, Undrain:
			if err := s.eng.Drain(ev.NodeID, ev.Kind == Drain, now); err != nil {
				return false, fmt.Errorf("simulation: %w", err)
			}
		case Join:
			if _, err := s.eng.SetNode(ev.Node, now); err != nil {
				return false, fmt.Errorf("simulation: %w", err)
			}
			for t, k := range ev.Node.GPUs {
				s.capacity[t] += float64(k)
			}
		case Lose:
			lost := s.nodeGPUs(ev.NodeID)
			hit, err := s.eng.RemoveNode(ev.NodeID, now)
			if err != nil {
				return false, fmt.Errorf("simulation: %w", err)
			}
			for t, k := range lost {
				s.capacity[t] -= float64(k)
			}
			for _, id := range hit {
				js := s.byID[id]
				// Back to the last checkpoint: the work since is lost.
				if err := s.eng.AddProgress(id, js.rem-js.ckptRem, now); err != nil {
					return false, fmt.Errorf("simulation: %w", err)
				}
				js.rem = js.ckptRem
				js.running = false
				js.placement = planner.Placement{}
				js.rates, js.delays, js.comm = nil, nil, nil
			}
		}
	}
	return any, nil
}

// nodeGPUs is the GPUs of node id in the cluster as it is now.
func (s *simulation) nodeGPUs(id string) map[planner.GPUType]int {
	for _, n := range s.cfg.Cluster.Nodes {
		if n.ID == id {
			return n.GPUs
		}
	}
	for _, ev := range s.events[:s.nextEvent] {
		if ev.Kind == Join && ev.Node.ID == id {
			return ev.Node.GPUs
		}
	}
	return nil
}

// ParseEvents reads cluster events, one per line: TIME KIND NODE [GPUS
// [RACK]], fields separated by commas or spaces, TIME in seconds or with a
// unit (90m, 10h), GPUS as TYPE=COUNT[+TYPE=COUNT] for a join. Blank lines
// and lines starting with # are skipped. Example:
//
//	10h  drain v100-3
//	12h  lose  p100-1
//	20h  join  a100-0 a100=8 rack-a
func ParseEvents(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.FieldsFunc(text, func(c rune) bool { return c == ',' || c == ' ' || c == '\t' })
		if len(f) < 3 {
			return nil, fmt.Errorf("events line %d: %q: want TIME KIND NODE [GPUS [RACK]]", line, text)
		}
		t, err := parseTime(f[0])
		if err != nil {
			return nil, fmt.Errorf("events line %d: time %q: %w", line, f[0], err)
		}
		ev := Event{Time: t, Kind: EventKind(strings.ToLower(f[1])), NodeID: f[2]}
		switch ev.Kind {
		case Drain, Undrain, Lose:
			if len(f) != 3 {
				return nil, fmt.Errorf("events line %d: %s takes only a node: %q", line, ev.Kind, text)
			}
		case Join:
			if len(f) < 4 || len(f) > 5 {
				return nil, fmt.Errorf("events line %d: join needs GPUS (TYPE=COUNT[+TYPE=COUNT]) and optionally a rack: %q", line, text)
			}
			ev.Node = planner.Node{ID: f[2], GPUs: map[planner.GPUType]int{}, Rack: "rack-" + f[2]}
			if len(f) == 5 {
				ev.Node.Rack = f[4]
			}
			for _, part := range strings.Split(f[3], "+") {
				name, count, ok := strings.Cut(part, "=")
				k, err := strconv.Atoi(count)
				if !ok || name == "" || err != nil || k <= 0 {
					return nil, fmt.Errorf("events line %d: GPUs %q: want TYPE=COUNT[+TYPE=COUNT] with positive counts, e.g. v100=4", line, f[3])
				}
				ev.Node.GPUs[planner.GPUType(strings.ToLower(name))] += k
			}
		default:
			return nil, fmt.Errorf("events line %d: kind %q: want drain, undrain, lose or join", line, f[1])
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	return out, nil
}

// LoadEvents reads a cluster events file (ParseEvents).
func LoadEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	evs, err := ParseEvents(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return evs, nil
}

func parseTime(s string) (float64, error) {
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "h"):
		mult, s = 3600, strings.TrimSuffix(s, "h")
	case strings.HasSuffix(s, "m"):
		mult, s = 60, strings.TrimSuffix(s, "m")
	case strings.HasSuffix(s, "s"):
		s = strings.TrimSuffix(s, "s")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("want seconds >= 0, or a number with h, m or s")
	}
	return v * mult, nil
}
