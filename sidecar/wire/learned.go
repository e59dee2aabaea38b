package wire

import "time"

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
	Figures []LearnedFigure `json:"figures"`
	// Reference is the type TypeSpeeds are relative to; TypeSpeeds each
	// GPU type's speed against it learned across every model (what a new
	// model is first estimated with).
	Reference  string             `json:"reference,omitempty"`
	TypeSpeeds map[string]float64 `json:"type_speeds,omitempty"`
	// Gaps are the (model, GPU type) pairs planned without any estimate:
	// no figure of the type, no job measured it, no operator's relative
	// speed. Each is named in its jobs' reason and warned of once.
	Gaps []Gap `json:"gaps"`
}

// LearnedFigure is what was learned of one (model, workers, GPU type).
type LearnedFigure struct {
	Model string `json:"model"`
	SF    int    `json:"sf"`
	Type  string `json:"type"`
	// Profile is the declared figure (0: none, the key was learned from
	// scratch); Factor the correction over it (1 until applied).
	Profile float64 `json:"profile,omitempty"`
	Factor  float64 `json:"factor,omitempty"`
	// Rate is the consolidated steps/s learned (the profile's figure
	// times the factor, or the measured rate); 0 until applied.
	Rate float64 `json:"rate"`
	// Applied is true once enough was observed for it to count.
	Applied bool    `json:"applied"`
	Seconds float64 `json:"seconds"`
	// Jobs is how many jobs' ledgers it is the median of.
	Jobs int `json:"jobs"`
}

// Gap is a (model, GPU type) pair planned without any estimate, and why.
type Gap struct {
	Model string `json:"model"`
	Type  string `json:"type"`
	Why   string `json:"why"`
}
