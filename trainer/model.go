package trainer

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Model names a model architecture.
type Model string

// The models the trainer knows.
const (
	Softmax Model = "softmax" // multinomial logistic regression
	MLP     Model = "mlp"     // one tanh hidden layer, softmax output
)

// ParseModel accepts "softmax" or "mlp".
func ParseModel(s string) (Model, error) {
	switch Model(s) {
	case Softmax, MLP:
		return Model(s), nil
	}
	return "", fmt.Errorf("model %q: want \"softmax\" or \"mlp\"", s)
}

// Params are a model's parameters in one flat vector, so merging and
// serialization treat both models alike. Layout (row-major):
//
//	softmax: W[classes][dim], b[classes]
//	mlp:     W1[hidden][dim], b1[hidden], W2[classes][hidden], b2[classes]
type Params struct {
	Model   Model     `json:"model"`
	Dim     int       `json:"dim"`
	Hidden  int       `json:"hidden,omitempty"`
	Classes int       `json:"classes"`
	W       []float64 `json:"weights"`
}

// NumParams is the length of W for a model of that shape.
func NumParams(m Model, dim, hidden, classes int) int {
	if m == MLP {
		return hidden*dim + hidden + classes*hidden + classes
	}
	return classes*dim + classes
}

// Validate checks that the shape is known and W has the right length and
// only finite values; Params read from outside go through it.
func (p Params) Validate() error {
	if _, err := ParseModel(string(p.Model)); err != nil {
		return fmt.Errorf("field \"model\": %w", err)
	}
	if p.Dim < 1 || p.Dim > 1<<16 {
		return fmt.Errorf("field \"dim\": want 1..65536, got %d", p.Dim)
	}
	if p.Classes < 2 || p.Classes > 1<<16 {
		return fmt.Errorf("field \"classes\": want 2..65536, got %d", p.Classes)
	}
	if p.Model == MLP && (p.Hidden < 1 || p.Hidden > 1<<16) {
		return fmt.Errorf("field \"hidden\": want 1..65536 for model mlp, got %d", p.Hidden)
	}
	if p.Model == Softmax && p.Hidden != 0 {
		return fmt.Errorf("field \"hidden\": want 0 for model softmax, got %d", p.Hidden)
	}
	if want := NumParams(p.Model, p.Dim, p.Hidden, p.Classes); len(p.W) != want {
		return fmt.Errorf("field \"weights\": want %d values, got %d", want, len(p.W))
	}
	for i, w := range p.W {
		if math.IsNaN(w) || math.IsInf(w, 0) {
			return fmt.Errorf("field \"weights\": value %d is %g; want finite values", i, w)
		}
	}
	return nil
}

// SameShape reports whether q can be merged with p.
func (p Params) SameShape(q Params) bool {
	return p.Model == q.Model && p.Dim == q.Dim && p.Hidden == q.Hidden && p.Classes == q.Classes && len(p.W) == len(q.W)
}

// Clone returns a deep copy.
func (p Params) Clone() Params {
	p.W = append([]float64(nil), p.W...)
	return p
}

// InitParams draws the initial parameters from seed (scaled normal, biases
// zero). Every copy of a job starts from the same parameters because they
// share the seed.
func InitParams(m Model, dim, hidden, classes int, seed uint64) (Params, error) {
	if m == Softmax {
		hidden = 0
	}
	p := Params{Model: m, Dim: dim, Hidden: hidden, Classes: classes, W: make([]float64, NumParams(m, dim, hidden, classes))}
	if m == MLP && hidden < 1 {
		return Params{}, fmt.Errorf("init: field \"hidden\": want >= 1 for model mlp, got %d", hidden)
	}
	if err := p.Validate(); err != nil {
		return Params{}, fmt.Errorf("init: %w", err)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5851f42d4c957f2d))
	fill := func(w []float64, fanIn int) {
		s := 1 / math.Sqrt(float64(fanIn))
		for i := range w {
			w[i] = rng.NormFloat64() * s
		}
	}
	if m == MLP {
		fill(p.W[:hidden*dim], dim)
		off := hidden*dim + hidden
		fill(p.W[off:off+classes*hidden], hidden)
	} else {
		fill(p.W[:classes*dim], dim)
	}
	return p, nil
}

// workspace holds per-sample buffers so the hot loop does not allocate.
type workspace struct {
	hidden []float64 // tanh activations
	logits []float64 // then softmax probabilities
	dh     []float64 // gradient w.r.t. hidden pre-activations
}

func newWorkspace(p Params) *workspace {
	return &workspace{hidden: make([]float64, p.Hidden), logits: make([]float64, p.Classes), dh: make([]float64, p.Hidden)}
}

// forward computes class probabilities for x into ws.logits and returns the
// cross-entropy loss for label y.
func forward(p Params, x []float64, y int, ws *workspace) float64 {
	d, c := p.Dim, p.Classes
	in := x
	wOut, bOut := p.W[:c*d], p.W[c*d:c*d+c]
	if p.Model == MLP {
		h := p.Hidden
		w1, b1 := p.W[:h*d], p.W[h*d:h*d+h]
		for j := range h {
			s := b1[j]
			row := w1[j*d : (j+1)*d]
			for k, v := range x {
				s += row[k] * v
			}
			ws.hidden[j] = math.Tanh(s)
		}
		in = ws.hidden
		off := h*d + h
		wOut, bOut = p.W[off:off+c*h], p.W[off+c*h:off+c*h+c]
	}
	n := len(in)
	maxL := math.Inf(-1)
	for j := range c {
		s := bOut[j]
		row := wOut[j*n : (j+1)*n]
		for k, v := range in {
			s += row[k] * v
		}
		ws.logits[j] = s
		maxL = max(maxL, s)
	}
	var z float64
	for j := range c {
		ws.logits[j] = math.Exp(ws.logits[j] - maxL)
		z += ws.logits[j]
	}
	for j := range c {
		ws.logits[j] /= z
	}
	return -math.Log(max(ws.logits[y], 1e-300))
}

// backward adds the gradient of the loss of the last forward call to grad,
// scaled by scale.
func backward(p Params, x []float64, y int, ws *workspace, grad []float64, scale float64) {
	d, c := p.Dim, p.Classes
	// dL/dlogit = prob - onehot
	ws.logits[y] -= 1
	if p.Model == Softmax {
		for j := range c {
			g := ws.logits[j] * scale
			row := grad[j*d : (j+1)*d]
			for k, v := range x {
				row[k] += g * v
			}
			grad[c*d+j] += g
		}
		return
	}
	h := p.Hidden
	off := h*d + h
	w2 := p.W[off : off+c*h]
	clear(ws.dh)
	for j := range c {
		g := ws.logits[j] * scale
		row := grad[off+j*h : off+(j+1)*h]
		w2row := w2[j*h : (j+1)*h]
		for k, a := range ws.hidden {
			row[k] += g * a
			ws.dh[k] += g * w2row[k]
		}
		grad[off+c*h+j] += g
	}
	for k := range h {
		g := ws.dh[k] * (1 - ws.hidden[k]*ws.hidden[k])
		row := grad[k*d : (k+1)*d]
		for i, v := range x {
			row[i] += g * v
		}
		grad[h*d+k] += g
	}
}

// Eval holds the loss and accuracy of parameters on a dataset.
type Eval struct {
	Loss     float64 // mean cross-entropy
	Accuracy float64 // share of samples whose most probable class is the label
}

// Evaluate computes the mean loss and the accuracy of p on d.
func Evaluate(p Params, d *Dataset) (Eval, error) {
	if err := checkFit(p, d); err != nil {
		return Eval{}, err
	}
	if d.Len() == 0 {
		return Eval{}, fmt.Errorf("evaluate: empty dataset")
	}
	ws := newWorkspace(p)
	var loss float64
	correct := 0
	for i := range d.Len() {
		loss += forward(p, d.Row(i), d.Y[i], ws)
		best := 0
		for j, v := range ws.logits {
			if v > ws.logits[best] {
				best = j
			}
		}
		if best == d.Y[i] {
			correct++
		}
	}
	n := float64(d.Len())
	return Eval{Loss: loss / n, Accuracy: float64(correct) / n}, nil
}

func checkFit(p Params, d *Dataset) error {
	if p.Dim != d.Dim || p.Classes != d.Classes {
		return fmt.Errorf("params are for dim %d, %d classes; dataset has dim %d, %d classes: use the same --dim and --classes", p.Dim, p.Classes, d.Dim, d.Classes)
	}
	return nil
}

// Merge returns the average of params weighted by weights (HadarE: the steps
// each copy did since the last merge). A copy with weight 0 contributes
// nothing; if all weights are 0 the copies are averaged equally, since none
// has moved more than the others. It is an error for the shapes to differ or
// a weight to be negative or not finite.
func Merge(params []Params, weights []float64) (Params, error) {
	if len(params) == 0 {
		return Params{}, fmt.Errorf("merge: no parameters")
	}
	if len(weights) != len(params) {
		return Params{}, fmt.Errorf("merge: %d parameter sets but %d weights; pass one weight per copy", len(params), len(weights))
	}
	var total float64
	for i, w := range weights {
		if !(w >= 0) || math.IsInf(w, 0) {
			return Params{}, fmt.Errorf("merge: weight %d is %g; want a finite value >= 0 (steps done)", i, w)
		}
		if !params[i].SameShape(params[0]) {
			return Params{}, fmt.Errorf("merge: copy %d has shape %s/%d/%d/%d, copy 0 has %s/%d/%d/%d; all copies must run the same model",
				i, params[i].Model, params[i].Dim, params[i].Hidden, params[i].Classes,
				params[0].Model, params[0].Dim, params[0].Hidden, params[0].Classes)
		}
		total += w
	}
	out := params[0].Clone()
	if len(params) == 1 {
		return out, nil
	}
	clear(out.W)
	for i, p := range params {
		f := 1 / float64(len(params))
		if total > 0 {
			f = weights[i] / total
		}
		if f == 0 {
			continue
		}
		for j, v := range p.W {
			out.W[j] += f * v
		}
	}
	return out, nil
}
