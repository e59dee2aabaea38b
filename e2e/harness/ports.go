package harness

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Agents get their ports from a range the kernel never hands out for port
// 0 or outgoing connections (ip_local_port_range is 32768-60999 by
// default) and below Nomad's dynamic task ports (20000-32000), so the only
// competitors are other test processes, and those are coordinated through
// a registry file under a lock: probing a free port and closing it, as
// net.Listen(":0") does, races with every other package starting agents in
// parallel.
var (
	portLow  = 15000
	portHigh = 20000
)

// portRegistry is the file holding "port pid" lines of ports reserved by
// live test processes, and the lock that serializes its readers and
// writers. Their names do not match the agents' hadar-e2e-* directories,
// which people clean up by pattern.
func portRegistry() (path, lock string) {
	dir := os.TempDir()
	return filepath.Join(dir, "hadar-test-ports"), filepath.Join(dir, "hadar-test-ports.lock")
}

// withPortRegistry runs f on the registry's live entries under the lock
// and writes back what f returns.
func withPortRegistry(f func(map[int]int) (map[int]int, error)) error {
	path, lockPath := portRegistry()
	lf, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return fmt.Errorf("port registry lock %s: %w", lockPath, err)
	}
	defer lf.Close()
	// Shared by test processes of every user: undo the umask (only the
	// owner can, and once is enough).
	_ = lf.Chmod(0o666)
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("port registry lock %s: %w", lockPath, err)
	}
	defer func() { _ = syscall.Flock(int(lf.Fd()), syscall.LOCK_UN) }()
	entries := map[int]int{}
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("port registry %s: %w", path, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		port, err1 := strconv.Atoi(f[0])
		pid, err2 := strconv.Atoi(f[1])
		// A reservation lives as long as the process that made it.
		if err1 == nil && err2 == nil && processAlive(pid) {
			entries[port] = pid
		}
	}
	entries, err = f(entries)
	if err != nil {
		return err
	}
	var out strings.Builder
	for port, pid := range entries {
		fmt.Fprintf(&out, "%d %d\n", port, pid)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(out.String()), 0o666); err != nil {
		return fmt.Errorf("port registry %s: %w", path, err)
	}
	_ = os.Chmod(tmp, 0o666)
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("port registry %s: %w", path, err)
	}
	return nil
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// reservePorts reserves n distinct ports on 127.0.0.1 for this process:
// not reserved by another live test process and bindable now.
func reservePorts(n int) ([]int, error) {
	var got []int
	err := withPortRegistry(func(entries map[int]int) (map[int]int, error) {
		span := portHigh - portLow
		start := rand.IntN(span)
		for i := 0; i < span && len(got) < n; i++ {
			port := portLow + (start+i)%span
			if _, taken := entries[port]; taken || !bindable(port) {
				continue
			}
			got = append(got, port)
			entries[port] = os.Getpid()
		}
		if len(got) < n {
			return nil, fmt.Errorf("reserve %d ports: only %d free in %d-%d", n, len(got), portLow, portHigh-1)
		}
		return entries, nil
	})
	if err != nil {
		return nil, err
	}
	registerPorts(got)
	return got, nil
}

// PortRange reserves n consecutive free ports on 127.0.0.1 for this
// process, for a range setting such as the sidecar's rendezvous_ports: the
// training processes of one test then never bind a port another test
// process (or an earlier test's worker still stopping) uses. release gives
// them back.
func PortRange(n int) (low, high int, release func() error, err error) {
	var got []int
	err = withPortRegistry(func(entries map[int]int) (map[int]int, error) {
		span := portHigh - portLow - n + 1
		if span < 1 {
			return nil, fmt.Errorf("reserve %d consecutive ports: wider than %d-%d", n, portLow, portHigh-1)
		}
		start := rand.IntN(span)
		for i := 0; i < span; i++ {
			first := portLow + (start+i)%span
			ok := true
			for p := first; p < first+n && ok; p++ {
				_, taken := entries[p]
				ok = !taken && bindable(p)
			}
			if !ok {
				continue
			}
			for p := first; p < first+n; p++ {
				got = append(got, p)
				entries[p] = os.Getpid()
			}
			return entries, nil
		}
		return nil, fmt.Errorf("reserve %d consecutive ports: none free in %d-%d", n, portLow, portHigh-1)
	})
	if err != nil {
		return 0, 0, nil, err
	}
	registerPorts(got)
	return got[0], got[len(got)-1], func() error { return releasePorts(got) }, nil
}

// releasePorts gives ports back once their agent stopped.
func releasePorts(ports []int) error {
	return withPortRegistry(func(entries map[int]int) (map[int]int, error) {
		for _, p := range ports {
			if entries[p] == os.Getpid() {
				delete(entries, p)
			}
		}
		return entries, nil
	})
}

// bindable tells whether port is free on 127.0.0.1 for TCP and UDP (serf
// listens on both).
func bindable(port int) bool {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
