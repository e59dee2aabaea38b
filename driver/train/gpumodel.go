package train

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/driver/device/nvml"
)

// Where a task's GPU model came from (the hadar.gpu_model_source detail
// of the start event).
const (
	modelFromTaskEnv     = "task env HADAR_GPU_MODEL"
	modelFromReservation = "hadar-gpu reservation"
	modelFromNVML        = "NVML lookup of NVIDIA_VISIBLE_DEVICES"
)

// gpuModels works out the GPU model(s) a task was given, for emulation
// and for HADAR_GPU_MODEL. Nomad does not pass allocated devices to
// drivers, so, first found wins:
//
//  1. HADAR_GPU_MODEL in the task's own env (the hadar sidecar sets it on
//     every task group it generates, to the device group it pinned);
//  2. HADAR_GPU_RESERVED_MODEL from hadar-gpu's reservation;
//  3. the GPU UUIDs in NVIDIA_VISIBLE_DEVICES from the device plugin's
//     reservation (Nomad's nvidia plugin sets only that), looked up in
//     NVML.
//
// It returns no models and no error when the task got no GPU.
func gpuModels(env, deviceEnv map[string]string, openNVML func() nvml.Library) (models []string, source string, err error) {
	if m := splitList(env[contract.EnvGPUModel]); len(m) > 0 {
		return m, modelFromTaskEnv, nil
	}
	if m := splitList(deviceEnv[contract.EnvGPUReservedModel]); len(m) > 0 {
		return m, modelFromReservation, nil
	}
	var uuids []string
	for _, id := range splitList(deviceEnv["NVIDIA_VISIBLE_DEVICES"]) {
		// "all", "none", "void" and indexes name no particular GPU.
		if strings.HasPrefix(id, "GPU-") || strings.HasPrefix(id, "MIG-") {
			uuids = append(uuids, id)
		}
	}
	if len(uuids) == 0 {
		return nil, "", nil
	}
	lib := openNVML()
	if err := lib.Init(); err != nil {
		return nil, "", fmt.Errorf("GPU model of %s: %w", strings.Join(uuids, ","), err)
	}
	defer func() { _ = lib.Shutdown() }()
	byID, err := nvml.Models(lib, uuids)
	if err != nil {
		return nil, "", fmt.Errorf("GPU model of %s: %w", strings.Join(uuids, ","), err)
	}
	seen := map[string]bool{}
	for _, id := range uuids {
		if m := byID[id]; !seen[m] {
			seen[m] = true
			models = append(models, m)
		}
	}
	sort.Strings(models)
	return models, modelFromNVML, nil
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(v string) []string {
	var out []string
	for _, x := range strings.Split(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
