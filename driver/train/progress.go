package train

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Progress is the progress file of docs/training-contract.md.
type Progress struct {
	StepsDone   int64     `json:"steps_done"`
	TotalSteps  int64     `json:"total_steps"`
	StepsPerSec float64   `json:"steps_per_sec"`
	Loss        float64   `json:"loss"`
	Checkpoint  string    `json:"checkpoint"`
	Updated     time.Time `json:"updated"`
}

// ReadProgress reads a progress file. The process replaces it atomically,
// so a read never sees half a file.
func ReadProgress(path string) (*Progress, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var p Progress
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("progress file %s: %w", path, err)
	}
	return &p, nil
}

// Annotations renders p as task-event details, the keys the sidecar reads
// (docs/driver.md, "Where progress is published").
func (p *Progress) Annotations() map[string]string {
	return map[string]string{
		"hadar.steps_done":    strconv.FormatInt(p.StepsDone, 10),
		"hadar.total_steps":   strconv.FormatInt(p.TotalSteps, 10),
		"hadar.steps_per_sec": strconv.FormatFloat(p.StepsPerSec, 'g', 6, 64),
		"hadar.loss":          strconv.FormatFloat(p.Loss, 'g', 6, 64),
		"hadar.checkpoint":    p.Checkpoint,
		"hadar.updated":       p.Updated.UTC().Format(time.RFC3339),
	}
}

func (p *Progress) message(prefix string) string {
	return fmt.Sprintf("%s: step %d/%d, %.3g steps/s, loss %.4g", prefix, p.StepsDone, p.TotalSteps, p.StepsPerSec, p.Loss)
}
