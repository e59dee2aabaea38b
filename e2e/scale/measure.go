package scale

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProcUsage is a process's CPU time so far and its memory, from /proc.
type ProcUsage struct {
	CPU time.Duration // user + system
	RSS int64         // resident bytes now
	HWM int64         // peak resident bytes
}

// clockTicks is the kernel's USER_HZ (the unit of /proc/<pid>/stat times),
// read from the auxiliary vector (AT_CLKTCK); 100 when it cannot be read.
var clockTicks = sync.OnceValue(func() int64 {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	const atClkTck = 17
	for i := 0; i+16 <= len(b); i += 16 {
		if binary.LittleEndian.Uint64(b[i:]) == atClkTck {
			if v := int64(binary.LittleEndian.Uint64(b[i+8:])); v > 0 {
				return v
			}
		}
	}
	return 100
})

// Usage reads pid's CPU time and memory.
func Usage(pid int) (ProcUsage, error) {
	var u ProcUsage
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return u, fmt.Errorf("usage of process %d: %w", pid, err)
	}
	// The command (field 2) may hold spaces: count from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return u, fmt.Errorf("usage of process %d: /proc/%d/stat is short", pid, pid)
	}
	// Fields 14 and 15 (utime, stime) are f[11] and f[12] after the command.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return u, fmt.Errorf("usage of process %d: utime %q stime %q", pid, f[11], f[12])
	}
	u.CPU = time.Duration((ut + st) * int64(time.Second) / clockTicks())
	s, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return u, fmt.Errorf("usage of process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return u, fmt.Errorf("usage of process %d: %s %q", pid, k, v)
		}
		if k == "VmRSS" {
			u.RSS = kb << 10
		} else {
			u.HWM = kb << 10
		}
	}
	return u, nil
}

// FindProcess returns the one live process whose command line contains
// every one of parts.
func FindProcess(parts ...string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && bytes.Contains(cmd, []byte(p))
		}
		if all {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("want one process with %q in its command line, found %d", parts, len(found))
	}
	return found[0], nil
}

// Quantile is the q-quantile (0..1) of xs by the nearest-rank method; NaN
// for none.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Mean of xs; NaN for none.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// CountingTransport counts the HTTP requests a Nomad API client makes, by
// kind (RequestKind), so a run can say what the sidecar asked of Nomad.
type CountingTransport struct {
	Base  http.RoundTripper
	mu    sync.Mutex
	n     map[string]int
	took  map[string]time.Duration
	dials int
}

// CountDials counts the connections tr opens from now on (Dials): tr is
// Base's transport, or the one under it.
func (c *CountingTransport) CountDials(tr *http.Transport) {
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.mu.Lock()
		c.dials++
		c.mu.Unlock()
		return dial(ctx, network, addr)
	}
}

// Dials is how many connections were opened since CountDials.
func (c *CountingTransport) Dials() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials
}

// RoundTrip implements http.RoundTripper. The time counted is until the
// response's headers: a blocking query or the event stream counts its
// wait, so their latencies are not shown (Latency).
func (c *CountingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	k := RequestKind(r.Method, r.URL.Path)
	start := time.Now()
	resp, err := c.Base.RoundTrip(r)
	took := time.Since(start)
	c.mu.Lock()
	if c.n == nil {
		c.n, c.took = map[string]int{}, map[string]time.Duration{}
	}
	c.n[k]++
	c.took[k] += took
	c.mu.Unlock()
	return resp, err
}

// Latency is the mean time to a response of the requests of kind k.
func (c *CountingTransport) Latency(k string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[k] == 0 {
		return 0
	}
	return c.took[k] / time.Duration(c.n[k])
}

// Counts returns the requests so far by kind.
func (c *CountingTransport) Counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// RequestKind names a Nomad API request: "register", "plan" and the other
// writes by what they do, reads by their endpoint.
func RequestKind(method, path string) string {
	p := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(p) >= 3 && p[1] == "job" && p[len(p)-1] == "plan":
		return "plan"
	case (len(p) == 3 && p[1] == "job" || len(p) == 2 && p[1] == "jobs") && (method == http.MethodPut || method == http.MethodPost):
		return "register"
	case len(p) >= 3 && p[1] == "client" && p[2] == "fs":
		return "progress read"
	case len(p) >= 3 && p[1] == "event" && p[2] == "stream":
		return "event stream"
	case len(p) == 3 && p[1] == "job" && method == http.MethodGet:
		return "job read"
	case method != http.MethodGet:
		return "other write " + method + " /" + strings.Join(p[:min(len(p), 2)], "/")
	case len(p) >= 2:
		return "list /" + strings.Join(p[:2], "/")
	}
	return "other " + path
}
