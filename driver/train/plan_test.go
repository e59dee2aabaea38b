package train

import (
	"fmt"
	"testing"
)

// A worker placed by a sidecar of contract version 1 (rank 1 of two
// co-located workers: LOCAL_RANK 1 while it sees one GPU) starts with the
// contract's torchrun environment; a current sidecar's worker, and a task
// no sidecar placed, keep theirs.
func TestUpgradeTorchrunEnv(t *testing.T) {
	old := map[string]string{"HADAR_MANAGED_BY": "hadar-sidecar", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"GROUP_RANK": "0", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "HADAR_UNIT": "3", "NCCL_ASYNC_ERROR_HANDLING": "0"}
	if !upgradeTorchrunEnv(old, "lm") {
		t.Fatal("not rewritten")
	}
	want := map[string]string{"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "1",
		"ROLE_WORLD_SIZE": "2", "ROLE_NAME": "default", "NODE_RANK": "0", "TORCHELASTIC_RUN_ID": "lm-u3", "TORCHELASTIC_USE_AGENT_STORE": "False",
		"NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
	for k, v := range want {
		if old[k] != v {
			t.Errorf("%s = %q, want %q", k, old[k], v)
		}
	}
	for _, env := range []map[string]string{
		{"HADAR_MANAGED_BY": "hadar-sidecar", "RANK": "1", "WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "0"},
		{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "NODE_RANK": "0", "MASTER_PORT": "1", "HADAR_UNIT": "0"},
	} {
		before := fmt.Sprint(env)
		if upgradeTorchrunEnv(env, "lm") || fmt.Sprint(env) != before {
			t.Errorf("rewrote %s", before)
		}
	}
}
