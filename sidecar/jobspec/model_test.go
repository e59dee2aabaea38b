package jobspec

import (
	"strconv"
	"testing"
)

// hadar.model is a free name (issue 21): a model no profile names, at any
// width, is accepted; its throughputs are estimated and learned.
func TestAnyModelAtAnyWidthIsAccepted(t *testing.T) {
	for _, c := range []struct {
		model   string
		workers int
	}{
		{"ResNet-18 (batch size 16)", 3},
		{"my-llm-7b", 1},
		{"my-llm-7b", 3},
		{"team/vision: ViT-L (bs 64)", 8},
	} {
		j := validJob(with(KeyModel, c.model, KeyWorkers, strconv.Itoa(c.workers)))
		s, err := Parse(j)
		if err != nil {
			t.Errorf("%q at %d workers: %v", c.model, c.workers, err)
			continue
		}
		if s.Model != c.model || s.Workers != c.workers || s.ModelKey() != c.model {
			t.Errorf("%q at %d: parsed %q at %d, planned as %q", c.model, c.workers, s.Model, s.Workers, s.ModelKey())
		}
	}
}
