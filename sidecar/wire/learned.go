package wire

import (
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/engine"
)

// Learned is GET /v1/learned: what the sidecar's estimates learned from
// the progress jobs reported (docs/engine.md, "Estimates, not oracles"),
// for the status API and `hadar profile export`.
type Learned struct {
	Time time.Time `json:"time"`
	// Learning is false when the sidecar does not learn (learn = false):
	// then nothing below changes.
	Learning bool `json:"learning"`
	// Figures are the keys jobs ran on: the profile's figure and its
	// correction, or the rate measured where no profile had one.
	Figures []engine.Learned `json:"figures"`
	// Reference is the type TypeSpeeds are relative to; TypeSpeeds each
	// GPU type's speed against it learned across every model (what a new
	// model is first estimated with).
	Reference  planner.GPUType             `json:"reference,omitempty"`
	TypeSpeeds map[planner.GPUType]float64 `json:"type_speeds,omitempty"`
	// Gaps are the (model, GPU type) pairs planned without any estimate:
	// no figure of the type, no job measured it, no operator's relative
	// speed. Each is named in its jobs' reason and warned of once.
	Gaps []engine.Gap `json:"gaps"`
}
