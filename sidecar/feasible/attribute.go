package feasible

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

// Device attributes compare with their units, as Nomad's
// plugins/shared/structs does (attribute.go, units.go): "12 GiB" is a
// number of bytes and compares with "16384 MiB", not with "12 W" nor with
// a bare "12".

type baseUnit uint8

const (
	baseByte baseUnit = iota + 1
	baseByteRate
	baseHertz
	baseWatt
)

type unit struct {
	base baseUnit
	// mult is how many base units one of this unit is, or, with inverse,
	// how many of this unit make one base unit (a mW is W/1000).
	mult    int64
	inverse bool
}

// units are the unit names Nomad knows.
var units = map[string]unit{
	"KiB": {baseByte, 1 << 10, false}, "MiB": {baseByte, 1 << 20, false}, "GiB": {baseByte, 1 << 30, false},
	"TiB": {baseByte, 1 << 40, false}, "PiB": {baseByte, 1 << 50, false}, "EiB": {baseByte, 1 << 60, false},
	"kB": {baseByte, 1e3, false}, "KB": {baseByte, 1e3, false}, "MB": {baseByte, 1e6, false}, "GB": {baseByte, 1e9, false},
	"TB": {baseByte, 1e12, false}, "PB": {baseByte, 1e15, false}, "EB": {baseByte, 1e18, false},
	"KiB/s": {baseByteRate, 1 << 10, false}, "MiB/s": {baseByteRate, 1 << 20, false}, "GiB/s": {baseByteRate, 1 << 30, false},
	"TiB/s": {baseByteRate, 1 << 40, false}, "PiB/s": {baseByteRate, 1 << 50, false}, "EiB/s": {baseByteRate, 1 << 60, false},
	"kB/s": {baseByteRate, 1e3, false}, "KB/s": {baseByteRate, 1e3, false}, "MB/s": {baseByteRate, 1e6, false},
	"GB/s": {baseByteRate, 1e9, false}, "TB/s": {baseByteRate, 1e12, false}, "PB/s": {baseByteRate, 1e15, false},
	"EB/s": {baseByteRate, 1e18, false},
	"MHz":  {baseHertz, 1e6, false}, "GHz": {baseHertz, 1e9, false},
	"mW": {baseWatt, 1e3, true}, "W": {baseWatt, 1, false}, "kW": {baseWatt, 1e3, false}, "MW": {baseWatt, 1e6, false},
	"GW": {baseWatt, 1e9, false},
}

// unitSuffixes are the unit names, longest first, so "MiB/s" wins over a
// shorter name it ends with. Two names of one length never both end one
// string, so the order among them does not matter.
var unitSuffixes = func() []string {
	out := make([]string, 0, len(units))
	for u := range units {
		out = append(out, u)
	}
	// Longest first; ties by name for a fixed order.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && (len(out[j]) > len(out[j-1]) || len(out[j]) == len(out[j-1]) && out[j] < out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}()

// parseAttribute reads a literal of a device constraint as Nomad's
// ParseAttribute does: a number with an optional known unit suffix ("12
// GiB", "1.5GHz"), else a boolean, else the string itself.
func parseAttribute(s string) watch.Attribute {
	if s == "" {
		return watch.Attribute{Kind: watch.AttrString}
	}
	numeric, u := s, ""
	if r := rune(s[len(s)-1]); unicode.IsLetter(r) {
		for _, name := range unitSuffixes {
			if strings.HasSuffix(s, name) {
				u = name
				numeric = strings.TrimSpace(strings.TrimSuffix(s, name))
				break
			}
		}
	}
	if i, err := strconv.ParseInt(numeric, 10, 64); err == nil {
		return watch.Attribute{Kind: watch.AttrInt, Int: i, Unit: u}
	}
	if f, err := strconv.ParseFloat(numeric, 64); err == nil {
		return watch.Attribute{Kind: watch.AttrFloat, Float: f, Unit: u}
	}
	if b, err := strconv.ParseBool(s); err == nil {
		return watch.Attribute{Kind: watch.AttrBool, Bool: b}
	}
	return watch.Attribute{Kind: watch.AttrString, Str: s}
}

func isNumber(a watch.Attribute) bool { return a.Kind == watch.AttrInt || a.Kind == watch.AttrFloat }

// unitOf is a's unit, ok false when it has none Nomad knows. A unit only
// counts on a number.
func unitOf(a watch.Attribute) (unit, bool) {
	if !isNumber(a) {
		return unit{}, false
	}
	u, ok := units[a.Unit]
	return u, ok
}

// compareAttributes orders a and b: -1, 0 or 1, and false when they do not
// compare (different kinds, incompatible or missing units). Booleans are
// only equal (0) or not (1). Nomad's Attribute.Compare.
func compareAttributes(a, b watch.Attribute) (int, bool) {
	ua, aHas := unitOf(a)
	ub, bHas := unitOf(b)
	switch {
	case aHas && bHas:
		if ua.base != ub.base {
			return 0, false
		}
	case aHas != bHas:
		return 0, false
	case a.Kind == watch.AttrString:
		if b.Kind != watch.AttrString {
			return 0, false
		}
		return strings.Compare(a.Str, b.Str), true
	case a.Kind == watch.AttrBool:
		if b.Kind != watch.AttrBool {
			return 0, false
		}
		if a.Bool == b.Bool {
			return 0, true
		}
		return 1, true
	}
	// a is a number (a unit implies one); b must be one too.
	if !isNumber(a) || !isNumber(b) {
		return 0, false
	}
	if a.Kind == watch.AttrInt && b.Kind == watch.AttrInt {
		x, y := scaledInt(a), scaledInt(b)
		return cmpInt(x, y), true
	}
	x, okx := scaledFloat(a)
	y, oky := scaledFloat(b)
	if !okx || !oky {
		return 0, false
	}
	return x.Cmp(y), true
}

func cmpInt(x, y int64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// scaledInt is an integer in its base unit. Like Nomad's getInt, the
// product wraps around past 2^63 (exabytes of exabytes), and an inverse
// unit divides.
func scaledInt(a watch.Attribute) int64 {
	u, ok := unitOf(a)
	if !ok {
		return a.Int
	}
	if u.inverse {
		return a.Int / u.mult
	}
	return a.Int * u.mult
}

// scaledFloat is a number in its base unit at high precision; false for
// NaN, which orders with nothing.
func scaledFloat(a watch.Attribute) (*big.Float, bool) {
	f := new(big.Float).SetPrec(256)
	if a.Kind == watch.AttrInt {
		f.SetInt64(a.Int)
	} else {
		if math.IsNaN(a.Float) {
			return nil, false
		}
		f.SetFloat64(a.Float)
	}
	u, ok := unitOf(a)
	if !ok {
		return f, true
	}
	m := new(big.Float).SetPrec(256).SetInt64(u.mult)
	if u.inverse {
		// Nomad multiplies by the rounded reciprocal rather than divide;
		// done the same way, equal values stay equal to it.
		m.Quo(new(big.Float).SetPrec(256).SetInt64(1), m)
	}
	return f.Mul(f, m), true
}

// checkDevice is Nomad's checkAttributeConstraint: a device constraint's
// targets are typed attributes (scheduler/feasible/feasible.go).
func (m *matchers) checkDevice(op string, l, r watch.Attribute, lOK, rOK bool) bool {
	switch operand(op) {
	case opDistinctHosts, opDistinctProperty:
		return true
	case "!=", "not":
		if !lOK && !rOK {
			return false
		}
		if lOK != rOK {
			return true
		}
		c, ok := compareAttributes(l, r)
		return ok && c != 0
	case "<", "<=", ">", ">=", "=", "==", "is":
		if !lOK || !rOK {
			return false
		}
		c, ok := compareAttributes(l, r)
		if !ok {
			return false
		}
		switch operand(op) {
		case "<":
			return c == -1
		case "<=":
			return c != 1
		case ">":
			return c == 1
		case ">=":
			return c != -1
		}
		return c == 0
	case opVersion, opSemver:
		if !lOK || !rOK || r.Kind != watch.AttrString {
			return false
		}
		var v string
		switch l.Kind {
		case watch.AttrString:
			v = l.Str
		case watch.AttrInt:
			v = strconv.FormatInt(l.Int, 10)
		default:
			return false
		}
		if operand(op) == opVersion {
			return m.versionMatch(v, r.Str)
		}
		return m.semverMatch(v, r.Str)
	case opRegexp, opSetContains, opSetContainsAll, opSetContainsAny:
		if !lOK || !rOK || l.Kind != watch.AttrString || r.Kind != watch.AttrString {
			return false
		}
		switch operand(op) {
		case opRegexp:
			re := m.regexp(r.Str)
			return re != nil && re.MatchString(l.Str)
		case opSetContainsAny:
			return setContainsAny(l.Str, r.Str)
		}
		return setContainsAll(l.Str, r.Str)
	case opIsSet:
		return lOK
	case opIsNotSet:
		return !lOK
	}
	return false
}

// resolveDevice resolves a device constraint's target against a GPU group
// (Nomad's resolveDeviceTarget). hadar sees NVIDIA GPUs only, so vendor
// and type are fixed.
func resolveDevice(target string, g *watch.GPUGroup) (watch.Attribute, bool) {
	if !strings.HasPrefix(target, "${") {
		return parseAttribute(target), true
	}
	str := func(s string) (watch.Attribute, bool) { return watch.Attribute{Kind: watch.AttrString, Str: s}, true }
	switch {
	case target == "${device.ids}":
		ids := make([]string, len(g.Instances))
		for i, d := range g.Instances {
			ids[i] = d.ID
		}
		return str(strings.Join(ids, ","))
	case target == "${device.model}":
		return str(g.Model)
	case target == "${device.vendor}":
		return str(gpuVendor)
	case target == "${device.type}":
		return str(gpuType)
	case strings.HasPrefix(target, "${device.attr."):
		a, ok := g.Typed[strings.TrimSuffix(strings.TrimPrefix(target, "${device.attr."), "}")]
		return a, ok
	}
	return watch.Attribute{}, false
}
