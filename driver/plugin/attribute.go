package plugin

import (
	"fmt"
	"strconv"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hadar-sched/hadar/driver/plugin/proto/structspb"
)

// Attribute is a typed node or device attribute, with an optional unit,
// as jobspecs constrain on it. Build one with StringAttr, IntAttr,
// FloatAttr or BoolAttr.
type Attribute struct {
	kind attrKind
	s    string
	i    int64
	f    float64
	b    bool
	// Unit must be one Nomad knows ("MiB", "MHz", "W", ...) or "": the
	// client rejects a device group with an unknown unit.
	Unit string
}

type attrKind int

const (
	attrNone attrKind = iota
	attrString
	attrInt
	attrFloat
	attrBool
)

// StringAttr is a string attribute.
func StringAttr(s string) Attribute { return Attribute{kind: attrString, s: s} }

// IntAttr is an integer attribute in unit ("" for none).
func IntAttr(i int64, unit string) Attribute { return Attribute{kind: attrInt, i: i, Unit: unit} }

// FloatAttr is a float attribute in unit ("" for none).
func FloatAttr(f float64, unit string) Attribute {
	return Attribute{kind: attrFloat, f: f, Unit: unit}
}

// BoolAttr is a bool attribute; Nomad renders true as "1" in node
// attributes.
func BoolAttr(b bool) Attribute { return Attribute{kind: attrBool, b: b} }

// Value is the attribute's value: a string, int64, float64 or bool; nil
// for the zero Attribute.
func (a Attribute) Value() any {
	switch a.kind {
	case attrString:
		return a.s
	case attrInt:
		return a.i
	case attrFloat:
		return a.f
	case attrBool:
		return a.b
	}
	return nil
}

// String renders the value and unit as Nomad's plugin SDK does
// ("16384MiB", "7.0", "true").
func (a Attribute) String() string {
	var v string
	switch a.kind {
	case attrString:
		v = a.s
	case attrInt:
		v = strconv.FormatInt(a.i, 10)
	case attrFloat:
		v = fmt.Sprint(a.f)
	case attrBool:
		v = strconv.FormatBool(a.b)
	}
	return v + a.Unit
}

func (a Attribute) proto() *structspb.Attribute {
	pb := &structspb.Attribute{Unit: a.Unit}
	switch a.kind {
	case attrString:
		pb.Value = &structspb.Attribute_StringVal{StringVal: a.s}
	case attrInt:
		pb.Value = &structspb.Attribute_IntVal{IntVal: a.i}
	case attrFloat:
		pb.Value = &structspb.Attribute_FloatVal{FloatVal: a.f}
	case attrBool:
		pb.Value = &structspb.Attribute_BoolVal{BoolVal: a.b}
	}
	return pb
}

func attributesProto(m map[string]Attribute) map[string]*structspb.Attribute {
	if m == nil {
		return nil
	}
	out := make(map[string]*structspb.Attribute, len(m))
	for k, a := range m {
		out[k] = a.proto()
	}
	return out
}

// StatValue is one statistic of a device: a number (with an optional
// denominator, e.g. memory used of total), a string or a bool. Build
// numbers with FloatStat and IntRatioStat.
type StatValue struct {
	FloatNumerator, FloatDenominator *float64
	IntNumerator, IntDenominator     *int64
	String                           *string
	Bool                             *bool
	Unit                             string
	// Desc says what the statistic is, for operators.
	Desc string
}

// FloatStat is a float statistic.
func FloatStat(v float64, unit, desc string) *StatValue {
	return &StatValue{FloatNumerator: &v, Unit: unit, Desc: desc}
}

// IntRatioStat is num out of den, e.g. memory used of total.
func IntRatioStat(num, den int64, unit, desc string) *StatValue {
	return &StatValue{IntNumerator: &num, IntDenominator: &den, Unit: unit, Desc: desc}
}

func (v *StatValue) proto() *structspb.StatValue {
	if v == nil {
		return nil
	}
	pb := &structspb.StatValue{Unit: v.Unit, Desc: v.Desc}
	if v.FloatNumerator != nil {
		pb.FloatNumeratorVal = wrapperspb.Double(*v.FloatNumerator)
	}
	if v.FloatDenominator != nil {
		pb.FloatDenominatorVal = wrapperspb.Double(*v.FloatDenominator)
	}
	if v.IntNumerator != nil {
		pb.IntNumeratorVal = wrapperspb.Int64(*v.IntNumerator)
	}
	if v.IntDenominator != nil {
		pb.IntDenominatorVal = wrapperspb.Int64(*v.IntDenominator)
	}
	if v.String != nil {
		pb.StringVal = wrapperspb.String(*v.String)
	}
	if v.Bool != nil {
		pb.BoolVal = wrapperspb.Bool(*v.Bool)
	}
	return pb
}
