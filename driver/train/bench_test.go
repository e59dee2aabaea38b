package train

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/helper/uuid"
	"github.com/hashicorp/nomad/nomad/structs"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/fsisolation"

	"github.com/hadar-sched/hadar/driver/device/nvml"
)

// BenchmarkStartTask measures what a task costs to start through Nomad's
// executor (docs/driver.md, "Isolation": the measurement behind using it):
// the time StartTask takes until the program runs, and the resident
// memory of the executor process that stays beside each task.
//
//	go test -run '^$' -bench StartTask -benchtime 20x ./driver/train/
func BenchmarkStartTask(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("starts tasks as nobody: needs root")
	}
	for _, as := range []string{"nobody", "root"} {
		b.Run("user="+as, func(b *testing.B) {
			d := NewWithNVML(log.NewNullLogger(), nvml.NewLibraryUnavailable)
			defer d.Shutdown()
			if err := d.SetConfig(&base.Config{}); err != nil {
				b.Fatal(err)
			}
			d.settings.allowRoot = as == "root"
			var rssKiB float64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				cfg, cleanup := benchTask(b, as)
				b.StartTimer()
				th, _, err := d.StartTask(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				var ts TaskState
				if err := th.GetDriverState(&ts); err != nil {
					b.Fatal(err)
				}
				rssKiB += vmRSSKiB(b, ts.ReattachConfig.Pid)
				if err := d.DestroyTask(cfg.ID, true); err != nil {
					b.Fatal(err)
				}
				cleanup()
			}
			b.ReportMetric(rssKiB/float64(b.N), "executor-RSS-KiB")
		})
	}
}

// benchTask makes an alloc dir and a task running sleep, as the client
// would (what MkAllocDir of the driver harness does, without logmon).
func benchTask(b *testing.B, user string) (*drivers.TaskConfig, func()) {
	dir, err := os.MkdirTemp("", "hadar-train-bench-")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	cfg := &drivers.TaskConfig{ID: uuid.Generate(), AllocID: uuid.Generate(), JobID: "bench", TaskGroupName: "g", Name: "trainer",
		Namespace: "default", User: user, Env: map[string]string{"PATH": os.Getenv("PATH")}, StdoutPath: os.DevNull, StderrPath: os.DevNull}
	ad := allocdir.NewAllocDir(log.NewNullLogger(), dir, filepath.Join(dir, "mounts"), cfg.AllocID)
	if err := ad.Build(); err != nil {
		b.Fatal(err)
	}
	if err := ad.NewTaskDir(&structs.Task{Name: cfg.Name}).Build(fsisolation.None, nil, user); err != nil {
		b.Fatal(err)
	}
	cfg.AllocDir = ad.AllocDir
	if err := cfg.EncodeConcreteDriverConfig(&TaskConfig{Command: "/bin/sleep", Args: []string{"60"}}); err != nil {
		b.Fatal(err)
	}
	taskCgroup(b, cfg, 64)
	return cfg, func() {
		_ = ad.Destroy()
		_ = os.RemoveAll(dir)
	}
}

func vmRSSKiB(b *testing.B, pid int) float64 {
	// Let the executor settle after the launch.
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
