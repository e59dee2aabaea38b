package train

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hadar-sched/hadar/driver/plugin"
)

// legacyGrace is how long a task of v0.2 gets to checkpoint and exit
// before it is killed.
const legacyGrace = 10 * time.Second

// stopLegacyTask ends what a task started by hadar-train v0.2 left
// running, which this release cannot reattach to: Nomad's client, when
// RecoverTask fails, starts the task again, and the old process would go
// on beside the new one on the same GPUs and checkpoints. Its processes
// are those whose environment names its allocation and task (Nomad sets
// NOMAD_ALLOC_ID and NOMAD_TASK_NAME in every task's); each gets SIGTERM
// (the contract: checkpoint and exit), then SIGKILL after legacyGrace.
// The task's Nomad executor ("<binary> executor <config>", its log file
// in the task directory) is killed too: it would wait forever. It returns
// how many processes it stopped.
func stopLegacyTask(ctx context.Context, cfg *plugin.TaskConfig) int {
	if cfg.AllocID == "" || cfg.Name == "" || cfg.AllocDir == "" {
		return 0
	}
	tasks := findProcs(func(pid int) bool { return legacyTaskProc(pid, cfg) })
	for _, pid := range tasks {
		_ = unix.Kill(pid, unix.SIGTERM)
	}
	deadline := time.Now().Add(legacyGrace)
	for len(alive(tasks)) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	for _, pid := range alive(tasks) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	logFile := filepath.Join(cfg.TaskDir().Dir, "executor.out")
	executors := findProcs(func(pid int) bool { return legacyExecutor(pid, logFile) })
	for _, pid := range executors {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	return len(tasks) + len(executors)
}

// findProcs lists the pids for which match holds.
func findProcs(match func(pid int) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if match(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// legacyTaskProc tells whether pid is a process of the task: its
// environment names the allocation and the task.
func legacyTaskProc(pid int, cfg *plugin.TaskConfig) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	var alloc, task bool
	for _, kv := range bytes.Split(b, []byte{0}) {
		switch string(kv) {
		case "NOMAD_ALLOC_ID=" + cfg.AllocID:
			alloc = true
		case "NOMAD_TASK_NAME=" + cfg.Name:
			task = true
		}
	}
	return alloc && task
}

// legacyExecutor tells whether pid is a Nomad executor logging to
// logFile: "<binary> executor <json config naming LogFile>".
func legacyExecutor(pid int, logFile string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return len(args) == 3 && args[1] == "executor" && strings.Contains(args[2], strconv.Quote(logFile))
}

// alive are the pids still running (zombies are not).
func alive(pids []int) []int {
	var out []int
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X' {
			out = append(out, pid)
		}
	}
	return out
}
