package jobform

import (
	"strconv"
	"testing"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
	"github.com/hadar-sched/hadar/sidecar/jobspec"
)

// A resize of an elastic job (issue 35 item 4): the job placed on a unit
// of 2 GPUs, then rewritten on a new unit of 1, then of 3. Each placement
// writes one worker group per GPU with WORLD_SIZE its width and ranks
// 0..w-1, drops the old unit's groups, and keeps what the library resumes
// by: the checkpoint directory (keyed by template group and task, on
// every driver), the run and the total steps.
func TestResizeKeepsTheCheckpointKey(t *testing.T) {
	for _, driver := range []string{TrainDriver, RawExecDriver, "docker"} {
		t.Run(driver, func(t *testing.T) {
			j, _ := submitted(t)
			j.Meta["hadar.workers"] = "1-3"
			j.TaskGroups[0].Tasks[0].Driver = driver
			create := uint64(7)
			j.CreateIndex = &create
			spec, err := jobspec.Parse(j)
			if err != nil {
				t.Fatal(err)
			}
			if spec.Workers != 1 || len(spec.Widths) != 3 {
				t.Fatalf("spec %+v", spec)
			}
			w := func(node string) Worker {
				return Worker{Node: node, Type: "v100", Models: []string{"Tesla V100-SXM2-16GB"}, Addr: "10.0.0.1"}
			}
			steps := []Unit{
				{ID: 0, Port: 29500, Workers: []Worker{w("n1"), w("n1")}},
				{ID: 1, Port: 29501, Workers: []Worker{w("n2")}},
				{ID: 2, Port: 29502, Workers: []Worker{w("n1"), w("n1"), w("n2")}},
			}
			var keep map[string]string
			for _, u := range steps {
				placed, err := Placed(j, spec, []Unit{u})
				if err != nil {
					t.Fatal(err)
				}
				gen := 0
				for _, g := range placed.TaskGroups {
					wk, ok := groupname.Parse(*g.Name)
					if !ok {
						continue
					}
					gen++
					if wk.Unit != u.ID {
						t.Fatalf("width %d: group %s of an old unit left in", len(u.Workers), *g.Name)
					}
					env := g.Tasks[0].Env
					if env[contract.EnvWorldSize] != strconv.Itoa(len(u.Workers)) || env[contract.EnvRank] != strconv.Itoa(wk.Rank) {
						t.Fatalf("width %d: %s has WORLD_SIZE %s RANK %s", len(u.Workers), *g.Name, env[contract.EnvWorldSize], env[contract.EnvRank])
					}
					key := map[string]string{}
					for _, k := range []string{contract.EnvCheckpointDir, contract.EnvJobRun, contract.EnvTotalSteps, contract.EnvTemplate, contract.EnvJobID} {
						key[k] = env[k]
					}
					if key[contract.EnvJobRun] != "7" || key[contract.EnvTotalSteps] != "5000" || key[contract.EnvTemplate] != "train" {
						t.Fatalf("width %d: %v", len(u.Workers), key)
					}
					if driver != TrainDriver && key[contract.EnvCheckpointDir] == "" {
						t.Fatalf("width %d: no checkpoint directory on %s", len(u.Workers), driver)
					}
					if keep == nil {
						keep = key
					} else if !mapsEqual(keep, key) {
						t.Fatalf("width %d: %v, was %v", len(u.Workers), key, keep)
					}
				}
				if gen != len(u.Workers) {
					t.Fatalf("width %d: %d worker groups", len(u.Workers), gen)
				}
				got, err := Units(placed, spec)
				if err != nil || len(got) != 1 || len(got[0].Workers) != len(u.Workers) {
					t.Fatalf("width %d: read back %+v, %v", len(u.Workers), got, err)
				}
				j = placed
				j.JobModifyIndex = ptrU(uint64(len(u.Workers)))
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func ptrU(v uint64) *uint64 { return &v }
