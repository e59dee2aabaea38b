package run

import (
	"fmt"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/trainer"
)

// The trainer's parameters as the contract's model state: the tensors a
// PyTorch module of the same shape has, under the names its state_dict
// gives them, so a copy of hadar-trainer and one of a PyTorch script with
// that module merge with each other:
//
//	softmax: nn.Linear(dim, classes)                                 weight, bias
//	mlp:     nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(),
//	                       nn.Linear(hidden, classes))               0.weight, 0.bias, 2.weight, 2.bias
//
// Params' flat layout is row-major in that order (trainer.Params), which
// is how torch stores a Linear's weight ([out, in]).

// tensorSpan is one tensor of a model: its name, shape and where its
// elements are in Params.W.
type tensorSpan struct {
	name  string
	shape []int
	off   int
}

func layout(model trainer.Model, dim, hidden, classes int) []tensorSpan {
	if model == trainer.MLP {
		return []tensorSpan{
			{"0.weight", []int{hidden, dim}, 0},
			{"0.bias", []int{hidden}, hidden * dim},
			{"2.weight", []int{classes, hidden}, hidden*dim + hidden},
			{"2.bias", []int{classes}, hidden*dim + hidden + classes*hidden},
		}
	}
	return []tensorSpan{{"weight", []int{classes, dim}, 0}, {"bias", []int{classes}, classes * dim}}
}

// StateOf returns p as the contract's state, in float64.
func StateOf(p trainer.Params) (contract.State, error) {
	s := contract.State{}
	for _, ts := range layout(p.Model, p.Dim, p.Hidden, p.Classes) {
		n := 1
		for _, d := range ts.shape {
			n *= d
		}
		if ts.off+n > len(p.W) {
			return nil, fmt.Errorf("params of model %s: %d weights, too few for dim %d hidden %d classes %d", p.Model, len(p.W), p.Dim, p.Hidden, p.Classes)
		}
		t, err := contract.FloatTensor("float64", ts.shape, p.W[ts.off:ts.off+n])
		if err != nil {
			return nil, err
		}
		s[ts.name] = t
	}
	return s, nil
}

// ParamsOf reads a state into parameters shaped like like (the model this
// process runs): the state must have exactly like's tensors, of its
// shapes, floating (any width).
func ParamsOf(s contract.State, like trainer.Params) (trainer.Params, error) {
	want, err := StateOf(like)
	if err != nil {
		return trainer.Params{}, err
	}
	if err := want.SameLayout(s); err != nil {
		return trainer.Params{}, fmt.Errorf("model state: %w; this process runs model %s with dim %d hidden %d classes %d (all copies must run the same model)",
			err, like.Model, like.Dim, like.Hidden, like.Classes)
	}
	out := like.Clone()
	for _, ts := range layout(like.Model, like.Dim, like.Hidden, like.Classes) {
		t := s[ts.name]
		if !contract.IsFloat(t.DType) {
			return trainer.Params{}, fmt.Errorf("model state: tensor %q is %s; want a floating type", ts.name, t.DType)
		}
		vs, err := t.Floats()
		if err != nil {
			return trainer.Params{}, fmt.Errorf("model state: tensor %q: %w", ts.name, err)
		}
		copy(out.W[ts.off:], vs)
	}
	if err := out.Validate(); err != nil {
		return trainer.Params{}, fmt.Errorf("model state: %w", err)
	}
	return out, nil
}
