package agent

import "time"

// monoClock is the engine's time in Unix seconds: read from the wall
// clock once, when the process starts, then advanced by the process's
// monotonic clock. A wall clock stepped forward and corrected back (NTP,
// an operator) then neither jumps the engine ahead nor, since the
// engine's time never goes back, freezes it until the wall clock catches
// up: minimum run times elapse, time-slicing and learning go on.
type monoClock struct {
	// base is the engine time when elapsed read 0.
	base float64
	// elapsed is the monotonic time since then.
	elapsed func() time.Duration
}

func newMonoClock(wall time.Time) *monoClock {
	start := time.Now() // carries the monotonic reading elapsed counts from
	return &monoClock{base: float64(wall.UnixNano()) / 1e9, elapsed: func() time.Duration { return time.Since(start) }}
}

func (c *monoClock) now() float64 { return c.base + c.elapsed().Seconds() }

// runFrom moves the clock on to t when t is ahead of it (a restored
// engine saved while the wall clock was ahead): engine time runs on from
// there at the monotonic clock's pace instead of standing still until the
// wall clock reaches it. It returns how far the clock moved (0: not).
func (c *monoClock) runFrom(t float64) float64 {
	if n := c.now(); t > n {
		c.base += t - n
		return t - n
	}
	return 0
}
