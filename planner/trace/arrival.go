package trace

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MaxArrival is the latest arrival a trace may hold, in seconds from its
// start: five years. Published GPU-cluster traces span weeks to months
// (Gavel's Philly-derived per-VC traces: at most 125 days), and the
// simulator gives up on a run after ten simulated years, so an arrival past
// this is a unit mistake (milliseconds, absolute Unix time) that would
// otherwise surface much later as a scheduler said to starve a job.
const MaxArrival = 5 * year

const (
	day  = 24 * 3600.0
	year = 365 * day
)

// arrival parses an arrival time in seconds from the trace start.
func arrival(field, s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("%s %q: want a number of seconds >= 0", field, s)
	}
	if err := checkArrival(v); err != nil {
		return 0, fmt.Errorf("%s %q: %w", field, s, err)
	}
	return v, nil
}

// checkArrival rejects an arrival past MaxArrival with a guess at the unit
// mistake behind it and the fix.
func checkArrival(v float64) error {
	if v <= MaxArrival {
		return nil
	}
	var hint string
	switch {
	case v >= 9e8 && v < 5e9: // 1998 to 2128 as Unix seconds
		hint = "it looks like a Unix timestamp: subtract the trace's first arrival from every arrival so times count from the trace start"
	case v >= 9e11 && v < 5e12:
		hint = "it looks like a Unix timestamp in milliseconds: subtract the trace's first arrival and divide by 1000"
	case v/1000 <= MaxArrival:
		hint = "if the column is in milliseconds, divide it by 1000"
	case v/1e6 <= MaxArrival:
		hint = "if the column is in microseconds, divide it by 1e6"
	default:
		hint = "want seconds from the trace start"
	}
	return fmt.Errorf("%s after the trace start, past the %.0f-year limit (trace.MaxArrival): %s", span(v), MaxArrival/year, hint)
}

// span writes a duration in seconds in the largest fitting unit.
func span(v float64) string {
	switch {
	case v >= year:
		return fmt.Sprintf("%.3g years", v/year)
	case v >= day:
		return fmt.Sprintf("%.3g days", v/day)
	}
	return fmt.Sprintf("%.3g s", v)
}
