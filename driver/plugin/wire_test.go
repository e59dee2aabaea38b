package plugin

import (
	"testing"

	"github.com/hadar-sched/hadar/driver/plugin/proto/driverpb"
)

// The Go enums are sent by value: each must equal its wire number.
func TestEnumWireNumbers(t *testing.T) {
	tests := []struct {
		name      string
		got, want int32
	}{
		{"FSIsolationNone", int32(FSIsolationNone), int32(driverpb.DriverCapabilities_FS_ISOLATION_NONE)},
		{"FSIsolationChroot", int32(FSIsolationChroot), int32(driverpb.DriverCapabilities_FS_ISOLATION_CHROOT)},
		{"FSIsolationImage", int32(FSIsolationImage), int32(driverpb.DriverCapabilities_FS_ISOLATION_IMAGE)},
		{"FSIsolationUnveil", int32(FSIsolationUnveil), int32(driverpb.DriverCapabilities_FS_ISOLATION_UNVEIL)},
		{"NetIsolationHost", int32(NetIsolationHost), int32(driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_HOST)},
		{"NetIsolationGroup", int32(NetIsolationGroup), int32(driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_GROUP)},
		{"NetIsolationTask", int32(NetIsolationTask), int32(driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_TASK)},
		{"NetIsolationNone", int32(NetIsolationNone), int32(driverpb.NetworkIsolationMode_NETWORK_ISOLATION_MODE_NONE)},
		{"MountsAny", int32(MountsAny), int32(driverpb.DriverCapabilities_MOUNT_CONFIGS_ANY)},
		{"MountsNone", int32(MountsNone), int32(driverpb.DriverCapabilities_MOUNT_CONFIGS_NONE)},
		{"HealthUndetected", int32(HealthUndetected), int32(driverpb.FingerprintResponse_HEALTH_STATE_UNDETECTED)},
		{"HealthUnhealthy", int32(HealthUnhealthy), int32(driverpb.FingerprintResponse_HEALTH_STATE_UNHEALTHY)},
		{"HealthHealthy", int32(HealthHealthy), int32(driverpb.FingerprintResponse_HEALTH_STATE_HEALTHY)},
		{"CPUSystemMode", int32(CPUSystemMode), int32(driverpb.CPUUsage_CPU_FIELD_SYSTEM_MODE)},
		{"CPUUserMode", int32(CPUUserMode), int32(driverpb.CPUUsage_CPU_FIELD_USER_MODE)},
		{"CPUTotalTicks", int32(CPUTotalTicks), int32(driverpb.CPUUsage_CPU_FIELD_TOTAL_TICKS)},
		{"CPUThrottledPeriods", int32(CPUThrottledPeriods), int32(driverpb.CPUUsage_CPU_FIELD_THROTTLED_PERIODS)},
		{"CPUThrottledTime", int32(CPUThrottledTime), int32(driverpb.CPUUsage_CPU_FIELD_THROTTLED_TIME)},
		{"CPUPercent", int32(CPUPercent), int32(driverpb.CPUUsage_CPU_FIELD_PERCENT)},
		{"MemoryRSS", int32(MemoryRSS), int32(driverpb.MemoryUsage_MEMORY_FIELD_RSS)},
		{"MemoryCache", int32(MemoryCache), int32(driverpb.MemoryUsage_MEMORY_FIELD_CACHE)},
		{"MemoryMaxUsage", int32(MemoryMaxUsage), int32(driverpb.MemoryUsage_MEMORY_FIELD_MAX_USAGE)},
		{"MemoryKernelUsage", int32(MemoryKernelUsage), int32(driverpb.MemoryUsage_MEMORY_FIELD_KERNEL_USAGE)},
		{"MemoryKernelMaxUsage", int32(MemoryKernelMaxUsage), int32(driverpb.MemoryUsage_MEMORY_FIELD_KERNEL_MAX_USAGE)},
		{"MemoryUsageBytes", int32(MemoryUsageBytes), int32(driverpb.MemoryUsage_MEMORY_FIELD_USAGE)},
		{"MemorySwap", int32(MemorySwap), int32(driverpb.MemoryUsage_MEMORY_FIELD_SWAP)},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s = %d, wire number %d", tc.name, tc.got, tc.want)
		}
	}
}

func TestTaskDir(t *testing.T) {
	got := (&TaskConfig{AllocDir: "/var/nomad/alloc/a1", Name: "trainer"}).TaskDir()
	want := TaskDir{
		Dir:            "/var/nomad/alloc/a1/trainer",
		LocalDir:       "/var/nomad/alloc/a1/trainer/local",
		SecretsDir:     "/var/nomad/alloc/a1/trainer/secrets",
		PrivateDir:     "/var/nomad/alloc/a1/trainer/private",
		SharedAllocDir: "/var/nomad/alloc/a1/alloc",
		SharedTaskDir:  "/var/nomad/alloc/a1/trainer/alloc",
		LogDir:         "/var/nomad/alloc/a1/alloc/logs",
	}
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}
