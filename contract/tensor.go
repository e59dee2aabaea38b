package contract

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
)

// Tensor is one named tensor of a model's state (a PyTorch state_dict
// entry) in the merge directory's files: its element type, its shape, and
// its elements in row-major order as little-endian bytes (base64 in JSON).
type Tensor struct {
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	Data  []byte `json:"data"`
}

// State is a model's state: tensors by name, as PyTorch's state_dict
// names them ("0.weight", "fc.bias").
type State map[string]Tensor

// The element types a tensor may have, and their sizes in bytes.
var dtypeSize = map[string]int{
	"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
	"int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}

// IsFloat tells whether a dtype is a floating type: those are averaged
// at a merge; the others (step counters, masks) are not.
func IsFloat(dtype string) bool {
	switch dtype {
	case "float64", "float32", "float16", "bfloat16":
		return true
	}
	return false
}

// MaxTensorElements bounds one tensor (2^31 elements): a shape that
// multiplies past it is refused before anything is allocated for it.
const MaxTensorElements = 1 << 31

// Len is the number of elements the shape holds.
func (t Tensor) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Validate checks the dtype, the shape and the data's length, and that
// floating elements are finite.
func (t Tensor) Validate() error {
	size, ok := dtypeSize[t.DType]
	if !ok {
		return fmt.Errorf("dtype %q: want one of float64, float32, float16, bfloat16, int64, int32, int16, int8, uint8, bool", t.DType)
	}
	n := 1
	for _, d := range t.Shape {
		if d < 0 || (d > 0 && n > MaxTensorElements/d) {
			return fmt.Errorf("shape %v: want dimensions >= 0 and at most %d elements", t.Shape, MaxTensorElements)
		}
		n *= d
	}
	if len(t.Data) != n*size {
		return fmt.Errorf("data: %d bytes, want %d (%d %s elements of shape %v)", len(t.Data), n*size, n, t.DType, t.Shape)
	}
	if IsFloat(t.DType) {
		vs, err := t.Floats()
		if err != nil {
			return err
		}
		if i := slices.IndexFunc(vs, func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }); i >= 0 {
			return fmt.Errorf("element %d is %g; want finite values", i, vs[i])
		}
	}
	return nil
}

// Floats decodes a floating tensor's elements.
func (t Tensor) Floats() ([]float64, error) {
	size := dtypeSize[t.DType]
	if !IsFloat(t.DType) || len(t.Data) != t.Len()*size {
		return nil, fmt.Errorf("dtype %q with %d bytes for shape %v: not a floating tensor of that shape", t.DType, len(t.Data), t.Shape)
	}
	out := make([]float64, t.Len())
	le := binary.LittleEndian
	for i := range out {
		b := t.Data[i*size:]
		switch t.DType {
		case "float64":
			out[i] = math.Float64frombits(le.Uint64(b))
		case "float32":
			out[i] = float64(math.Float32frombits(le.Uint32(b)))
		case "bfloat16":
			out[i] = float64(math.Float32frombits(uint32(le.Uint16(b)) << 16))
		case "float16":
			out[i] = halfToFloat(le.Uint16(b))
		}
	}
	return out, nil
}

// FloatTensor encodes values of shape as dtype (a floating type),
// rounding to nearest.
func FloatTensor(dtype string, shape []int, values []float64) (Tensor, error) {
	t := Tensor{DType: dtype, Shape: slices.Clone(shape)}
	size := dtypeSize[dtype]
	if !IsFloat(dtype) || t.Len() != len(values) {
		return Tensor{}, fmt.Errorf("float tensor: dtype %q, shape %v, %d values; want a floating dtype and one value per element", dtype, shape, len(values))
	}
	t.Data = make([]byte, len(values)*size)
	le := binary.LittleEndian
	for i, v := range values {
		b := t.Data[i*size:]
		switch dtype {
		case "float64":
			le.PutUint64(b, math.Float64bits(v))
		case "float32":
			le.PutUint32(b, math.Float32bits(float32(v)))
		case "bfloat16":
			le.PutUint16(b, floatToBFloat16(float32(v)))
		case "float16":
			le.PutUint16(b, floatToHalf(v))
		}
	}
	return t, nil
}

// halfToFloat decodes an IEEE 754 binary16.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, frac := int(h>>10)&0x1f, float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1024+frac, exp-25)
}

// floatToHalf rounds v to the nearest binary16 (ties to even).
func floatToHalf(v float64) uint16 {
	var sign uint16
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	switch {
	case math.IsNaN(v):
		return 0x7e00
	case v >= 65520: // rounds past the largest half (65504)
		return sign | 0x7c00
	case v < math.Ldexp(1, -14): // subnormal: units of 2^-24
		return sign | uint16(math.RoundToEven(v*math.Ldexp(1, 24)))
	}
	_, e := math.Frexp(v) // v = m * 2^e, m in [0.5, 1)
	exp := e - 1          // v in [2^exp, 2^(exp+1))
	m := math.RoundToEven(math.Ldexp(v, 10-exp))
	if m == 2048 {
		m, exp = 1024, exp+1
	}
	return sign | uint16(exp+15)<<10 | (uint16(m) - 1024)
}

// floatToBFloat16 rounds v to the nearest bfloat16 (ties to even).
func floatToBFloat16(v float32) uint16 {
	b := math.Float32bits(v)
	if v != v {
		return 0x7fc0
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Names returns the state's tensor names, sorted.
func (s State) Names() []string {
	out := make([]string, 0, len(s))
	for n := range s {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Validate checks every tensor.
func (s State) Validate() error {
	if len(s) == 0 {
		return fmt.Errorf("no tensors")
	}
	for _, n := range s.Names() {
		if err := s[n].Validate(); err != nil {
			return fmt.Errorf("tensor %q: %w", n, err)
		}
	}
	return nil
}

// SameLayout tells whether t can be merged with s: the same names, each
// of the same shape and kind (floating or not; the floating types may
// differ).
func (s State) SameLayout(t State) error {
	if len(s) != len(t) {
		return fmt.Errorf("%d tensors, want %d (%v)", len(t), len(s), s.Names())
	}
	for _, n := range s.Names() {
		a, b := s[n], t[n]
		switch _, ok := t[n]; {
		case !ok:
			return fmt.Errorf("tensor %q is missing", n)
		case !slices.Equal(a.Shape, b.Shape):
			return fmt.Errorf("tensor %q: shape %v, want %v", n, b.Shape, a.Shape)
		case IsFloat(a.DType) != IsFloat(b.DType) || !IsFloat(a.DType) && a.DType != b.DType:
			return fmt.Errorf("tensor %q: dtype %s, want %s", n, b.DType, a.DType)
		}
	}
	return nil
}

// MergeStates is the merge of the contract: the states' floating tensors
// averaged, weighted by weights (the steps each copy did in the round),
// in float64 in the order given, written in the widest floating type
// among them (float64, else float32; float16 and bfloat16 together give
// float32); every other tensor is the one of the heaviest state (the
// first of equal weights). All weights 0 average equally.
func MergeStates(states []State, weights []float64) (State, error) {
	if len(states) == 0 || len(weights) != len(states) {
		return nil, fmt.Errorf("merge: %d states, %d weights; want one weight per state, at least one", len(states), len(weights))
	}
	var total float64
	heaviest := 0
	for i, w := range weights {
		if !(w >= 0) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("merge: weight %d is %g; want a finite value >= 0 (steps done)", i, w)
		}
		if err := states[0].SameLayout(states[i]); err != nil {
			return nil, fmt.Errorf("merge: state %d: %w", i, err)
		}
		total += w
		if w > weights[heaviest] {
			heaviest = i
		}
	}
	out := State{}
	for _, name := range states[0].Names() {
		first := states[0][name]
		if !IsFloat(first.DType) {
			t := states[heaviest][name]
			out[name] = Tensor{DType: t.DType, Shape: slices.Clone(t.Shape), Data: slices.Clone(t.Data)}
			continue
		}
		dtype := first.DType
		sum := make([]float64, first.Len())
		for i, s := range states {
			dtype = widest(dtype, s[name].DType)
			f := 1 / float64(len(states))
			if total > 0 {
				f = weights[i] / total
			}
			if f == 0 {
				continue
			}
			vs, err := s[name].Floats()
			if err != nil {
				return nil, fmt.Errorf("merge: state %d tensor %q: %w", i, name, err)
			}
			for j, v := range vs {
				sum[j] += f * v
			}
		}
		t, err := FloatTensor(dtype, first.Shape, sum)
		if err != nil {
			return nil, fmt.Errorf("merge: tensor %q: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// widest is the floating type both a and b fit in.
func widest(a, b string) string {
	switch {
	case a == b:
		return a
	case a == "float64" || b == "float64":
		return "float64"
	}
	return "float32"
}
