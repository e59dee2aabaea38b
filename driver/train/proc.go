package train

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// procStat is the part of /proc/<pid>/stat the driver needs.
type procStat struct {
	state      byte
	pgid       int
	utime      uint64 // clock ticks
	stime      uint64
	startTicks uint64 // since boot; with the pid, identifies a process
	rssPages   int64
}

func readProcStat(procRoot string, pid int) (*procStat, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	return parseProcStat(string(b))
}

// parseProcStat parses a /proc/<pid>/stat line. The command name (field
// 2) may hold spaces and parentheses, so fields are counted from the last
// ')'.
func parseProcStat(s string) (*procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return nil, fmt.Errorf("proc stat %q: no command field", s)
	}
	f := strings.Fields(s[i+2:])
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 22 {
		return nil, fmt.Errorf("proc stat: %d fields after the command, want at least 22", len(f))
	}
	var st procStat
	var err error
	st.state = f[0][0]
	num := func(n int) uint64 {
		if err != nil {
			return 0
		}
		var v uint64
		v, err = strconv.ParseUint(f[n-3], 10, 64)
		return v
	}
	st.pgid = int(num(5))
	st.utime = num(14)
	st.stime = num(15)
	st.startTicks = num(22)
	rss, rerr := strconv.ParseInt(f[24-3], 10, 64)
	if err != nil || rerr != nil {
		return nil, fmt.Errorf("proc stat: bad number: %v %v", err, rerr)
	}
	st.rssPages = rss
	return &st, nil
}

// alive tells whether pid is still the process started at startTicks and
// has not exited (a zombie has exited).
func alive(procRoot string, pid int, startTicks uint64) bool {
	st, err := readProcStat(procRoot, pid)
	if err != nil {
		return false
	}
	return st.startTicks == startTicks && st.state != 'Z' && st.state != 'X'
}

type procUsage struct {
	pid      int
	ticks    uint64
	rssPages int64
}

// groupUsage sums CPU ticks and resident pages over the live processes of
// one process group.
func groupUsage(procRoot string, pgid int) (ticks uint64, rssPages int64, pids []procUsage, err error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, 0, nil, err
	}
	for _, e := range entries {
		pid, convErr := strconv.Atoi(e.Name())
		if convErr != nil {
			continue
		}
		st, statErr := readProcStat(procRoot, pid)
		if statErr != nil || st.pgid != pgid || st.state == 'Z' || st.state == 'X' {
			continue
		}
		ticks += st.utime + st.stime
		rssPages += st.rssPages
		pids = append(pids, procUsage{pid: pid, ticks: st.utime + st.stime, rssPages: st.rssPages})
	}
	return ticks, rssPages, pids, nil
}
