package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/internal/hostpath"
)

// SocketsOutside lists the named unix sockets that the processes pids
// have bound (or accepted on) outside dir, each with its process. A
// socket file outlives a process that is killed: go-plugin's in the
// system's /tmp pile up there run after run.
func SocketsOutside(dir string, pids ...int) []string {
	owner := map[string]int{} // socket inode -> pid
	for _, pid := range pids {
		fds, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
		for _, fd := range fds {
			l, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
			if n, ok := strings.CutPrefix(l, "socket:["); ok {
				owner[strings.TrimSuffix(n, "]")] = pid
			}
		}
	}
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return []string{fmt.Sprintf("read /proc/net/unix: %v", err)}
	}
	var out []string
	seen := map[string]bool{} // a listener and its accepted connections share a path
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(line)
		if len(f) < 8 || strings.HasPrefix(f[7], "@") {
			continue // unnamed or abstract: no file
		}
		if pid, ok := owner[f[6]]; ok && !seen[f[7]] && !hostpath.Under(f[7], []string{dir}) {
			seen[f[7]] = true
			cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			out = append(out, fmt.Sprintf("%s (pid %d: %s)", f[7], pid, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))))
		}
	}
	return out
}

// SocketsOutside lists the named unix sockets that the agent and the
// processes that inherit its environment (plugins, executors, logmon)
// have bound outside its directory.
func (a *Agent) SocketsOutside() []string {
	var pids []int
	for _, l := range scanProcesses(func(pi procInfo) string {
		if pi.env[agentDirEnv] == a.Dir {
			return "started by the agent"
		}
		return ""
	}) {
		pids = append(pids, l.pid)
	}
	return SocketsOutside(a.Dir, pids...)
}
