package trainer

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// TrainConfig is what a training run needs besides the data.
type TrainConfig struct {
	Model    Model
	Hidden   int     // hidden units (mlp only)
	Batch    int     // minibatch size
	LR       float64 // learning rate
	Momentum float64 // heavy-ball momentum in [0, 1); 0 disables it
	Seed     uint64  // seeds the initial parameters and the minibatch order
}

// DefaultTrainConfig is what the CLI and the report use.
func DefaultTrainConfig(m Model, seed uint64) TrainConfig {
	return TrainConfig{Model: m, Hidden: 32, Batch: 32, LR: 0.05, Momentum: 0.9, Seed: seed}
}

// Validate reports the first bad field.
func (c TrainConfig) Validate() error {
	if _, err := ParseModel(string(c.Model)); err != nil {
		return fmt.Errorf("train config: field \"model\": %w", err)
	}
	switch {
	case c.Model == MLP && c.Hidden < 1:
		return fmt.Errorf("train config: field \"hidden\": want >= 1 for model mlp, got %d", c.Hidden)
	case c.Batch < 1:
		return fmt.Errorf("train config: field \"batch\": want >= 1, got %d", c.Batch)
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		return fmt.Errorf("train config: field \"lr\": want a finite value > 0, got %g", c.LR)
	case !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("train config: field \"momentum\": want in [0, 1), got %g", c.Momentum)
	}
	return nil
}

// SGD is one model being trained by minibatch SGD on one dataset (a copy's
// shard). The minibatch of local step s is a pure function of (seed, stream,
// s): sample positions s*batch ... s*batch+batch-1 of an endless sequence of
// per-epoch permutations. Restoring the step count therefore continues the
// data order exactly.
type SGD struct {
	cfg    TrainConfig
	data   *Dataset
	stream uint64
	params Params
	vel    []float64
	grad   []float64
	steps  int64
	ws     *workspace

	permEpoch int64
	perm      []int
}

// NewSGD starts training init on data. stream separates the minibatch orders
// of a job's copies (use the copy index).
func NewSGD(cfg TrainConfig, data *Dataset, stream uint64, init Params) (*SGD, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := init.Validate(); err != nil {
		return nil, fmt.Errorf("sgd: initial %w", err)
	}
	if err := checkFit(init, data); err != nil {
		return nil, fmt.Errorf("sgd: %w", err)
	}
	if data.Len() == 0 {
		return nil, fmt.Errorf("sgd: empty dataset")
	}
	return &SGD{
		cfg: cfg, data: data, stream: stream, params: init.Clone(),
		vel: make([]float64, len(init.W)), grad: make([]float64, len(init.W)),
		ws: newWorkspace(init), permEpoch: -1,
	}, nil
}

// Steps is the number of local steps taken (including restored ones).
func (s *SGD) Steps() int64 { return s.steps }

// Params returns a copy of the current parameters.
func (s *SGD) Params() Params { return s.params.Clone() }

// Velocity returns a copy of the momentum buffer.
func (s *SGD) Velocity() []float64 { return append([]float64(nil), s.vel...) }

// SetParams replaces the parameters (after a merge). The momentum buffer is
// kept: it is this copy's recent direction of descent, which local-SGD keeps
// across averaging.
func (s *SGD) SetParams(p Params) error {
	if !p.SameShape(s.params) {
		return fmt.Errorf("sgd: set params: shape %s/%d/%d/%d differs from the model's %s/%d/%d/%d",
			p.Model, p.Dim, p.Hidden, p.Classes, s.params.Model, s.params.Dim, s.params.Hidden, s.params.Classes)
	}
	copy(s.params.W, p.W)
	return nil
}

// Restore sets the step count and momentum buffer from a checkpoint.
func (s *SGD) Restore(steps int64, vel []float64) error {
	if steps < 0 {
		return fmt.Errorf("sgd: restore: steps %d; want >= 0", steps)
	}
	if vel != nil && len(vel) != len(s.vel) {
		return fmt.Errorf("sgd: restore: field \"velocity\": want %d values, got %d", len(s.vel), len(vel))
	}
	s.steps = steps
	if vel == nil {
		clear(s.vel)
	} else {
		copy(s.vel, vel)
	}
	return nil
}

// sample returns the dataset index at position pos of the data order.
func (s *SGD) sample(pos int64) int {
	n := int64(s.data.Len())
	epoch := pos / n
	if epoch != s.permEpoch {
		rng := rand.New(rand.NewPCG(s.cfg.Seed^0xa0761d6478bd642f, s.stream*0x9e3779b97f4a7c15+uint64(epoch)))
		s.perm = rng.Perm(int(n))
		s.permEpoch = epoch
	}
	return s.perm[pos%n]
}

// Step takes one SGD step and returns the minibatch's mean loss.
func (s *SGD) Step() float64 {
	clear(s.grad)
	b := s.cfg.Batch
	scale := 1 / float64(b)
	var loss float64
	base := s.steps * int64(b)
	for j := range b {
		i := s.sample(base + int64(j))
		x := s.data.Row(i)
		loss += forward(s.params, x, s.data.Y[i], s.ws)
		backward(s.params, x, s.data.Y[i], s.ws, s.grad, scale)
	}
	lr, mu := s.cfg.LR, s.cfg.Momentum
	for k, g := range s.grad {
		s.vel[k] = mu*s.vel[k] + g
		s.params.W[k] -= lr * s.vel[k]
	}
	s.steps++
	return loss * scale
}
