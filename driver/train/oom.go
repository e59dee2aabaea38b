package train

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hashicorp/nomad/client/lib/cgroupslib"
	"github.com/hashicorp/nomad/plugins/drivers"
)

// oomKilled tells whether the kernel's OOM killer killed a process of the
// task's cgroup (the one Nomad's client made for it): the memory limit
// was hit. Read as the task ends, before the client removes the cgroup.
func oomKilled(cfg *drivers.TaskConfig) bool {
	var file string
	switch cgroupslib.GetMode() {
	case cgroupslib.CG1:
		file = filepath.Join(cgroupslib.PathCG1(cfg.AllocID, cfg.Name, "memory"), "memory.oom_control")
	case cgroupslib.CG2:
		if cfg.Resources == nil || cfg.Resources.LinuxResources == nil || cfg.Resources.LinuxResources.CpusetCgroupPath == "" {
			return false
		}
		file = filepath.Join(cfg.Resources.LinuxResources.CpusetCgroupPath, "memory.events")
	default:
		return false
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	return oomKillCount(b) > 0
}

// oomKillCount reads the "oom_kill N" line of memory.oom_control (v1) or
// memory.events (v2).
func oomKillCount(b []byte) int {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := bytes.Cut(sc.Bytes(), []byte(" ")); ok && string(k) == "oom_kill" {
			n, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
			return n
		}
	}
	return 0
}
