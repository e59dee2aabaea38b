package trainer

import (
	"encoding/json"
	"fmt"

	"github.com/hadar-sched/hadar/contract"
)

// EncodeParams serializes p as JSON. float64 values round-trip exactly
// (encoding/json writes the shortest representation that parses back to the
// same value), so a resumed run continues bit for bit.
func EncodeParams(p Params) ([]byte, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode params: %w", err)
	}
	return b, nil
}

// DecodeParams parses and validates parameters written by EncodeParams.
// Unknown fields are rejected so that a file of another kind is not mistaken
// for parameters.
func DecodeParams(b []byte) (Params, error) {
	var p Params
	if err := contract.DecodeStrict(b, &p); err != nil {
		return Params{}, fmt.Errorf("params: %w", err)
	}
	if err := p.Validate(); err != nil {
		return Params{}, fmt.Errorf("params: %w", err)
	}
	return p, nil
}
