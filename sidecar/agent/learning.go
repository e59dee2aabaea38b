package agent

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hadar-sched/hadar/planner/engine"
)

// learnConfig is the engine's learning configuration from the sidecar's
// (zero durations: the engine's defaults).
func (a *Agent) learnConfig() engine.LearnConfig {
	return engine.LearnConfig{On: *a.cfg.Learn, Warmup: a.cfg.LearnWarmup.Duration().Seconds(), MinEvidence: a.cfg.LearnEvidence.Duration().Seconds()}
}

// sameLearning checks that a saved engine snapshot was learned with this
// configuration's learning timing: the engine restores its estimates only
// into the settings that took them, and an error naming the config fields
// says more than the engine's. A snapshot it cannot read is left to
// Restore to refuse.
func (a *Agent) sameLearning(snapshot []byte) error {
	raw, _, err := engine.OpenVersion(snapshot, engine.SnapshotFormat, engine.SnapshotVersion)
	if err != nil {
		return nil
	}
	var st struct {
		Estimates *struct {
			Learn engine.LearnConfig `json:"learn"`
		} `json:"estimates"`
	}
	if json.Unmarshal(raw, &st) != nil || st.Estimates == nil {
		return nil
	}
	// Both with the engine's defaults filled in, as Restore compares them
	// (an older snapshot leaves first evidence out).
	est, err := engine.NewEstimates(a.prof, a.learnConfig())
	if err != nil {
		return err
	}
	old, err := engine.NewEstimates(a.prof, st.Estimates.Learn)
	if err != nil {
		return nil
	}
	saved, now := old.Learning(), est.Learning()
	if saved.Warmup == now.Warmup && saved.MinEvidence == now.MinEvidence && saved.FirstEvidence == now.FirstEvidence {
		return nil
	}
	secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	return fmt.Errorf("the saved state was learned with learn_warmup = %q and learn_evidence = %q (first evidence %v), the config now sets %q and %q (first evidence %v): "+
		"set them back to restore what was learned, or move the state aside to start afresh from Nomad with the new timing (learned throughputs are lost then)",
		secs(saved.Warmup).String(), secs(saved.MinEvidence).String(), secs(saved.FirstEvidence), secs(now.Warmup).String(), secs(now.MinEvidence).String(), secs(now.FirstEvidence))
}
