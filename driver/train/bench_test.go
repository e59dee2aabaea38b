package train

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkStartTask measures what a task costs to start under its
// supervisor (docs/driver.md, "Isolation"): the time StartTask takes
// until the program runs (the job's ids, its directories, the
// supervisor, the cgroup), and the resident memory of the supervisor
// process that stays beside each task.
//
//	go test -run '^$' -bench StartTask -benchtime 20x ./driver/train/
func BenchmarkStartTask(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("starts tasks as a job's uid: needs root")
	}
	r := newRig(b, "checkpoint_root = \""+rootDir(b, 0o755)+"\"")
	var rssKiB float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cfg := r.task("", "", func(tc *TaskConfig) { tc.Command, tc.Args = "/bin/sleep", []string{"60"} })
		b.StartTimer()
		th, err := r.d.StartTask(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		st, err := decodeDriverState(th.Version, th.DriverState)
		if err != nil {
			b.Fatal(err)
		}
		rssKiB += vmRSSKiB(b, st.Supervise.Supervisor.PID)
		if err := r.d.DestroyTask(context.Background(), cfg.ID, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(rssKiB/float64(b.N), "supervisor-RSS-KiB")
}

func vmRSSKiB(b *testing.B, pid int) float64 {
	// Let the supervisor settle after the start.
	time.Sleep(200 * time.Millisecond)
	s, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no VmRSS for pid %d", pid)
	return 0
}
