package feasible

import (
	"math"
	"testing"

	"github.com/hadar-sched/hadar/sidecar/watch"
)

func TestParseAttribute(t *testing.T) {
	i := func(v int64, u string) watch.Attribute { return watch.Attribute{Kind: watch.AttrInt, Int: v, Unit: u} }
	f := func(v float64, u string) watch.Attribute {
		return watch.Attribute{Kind: watch.AttrFloat, Float: v, Unit: u}
	}
	s := func(v string) watch.Attribute { return watch.Attribute{Kind: watch.AttrString, Str: v} }
	for _, c := range []struct {
		in   string
		want watch.Attribute
	}{
		{"", s("")},
		{"12", i(12, "")},
		{"-3", i(-3, "")},
		{"12 GiB", i(12, "GiB")},
		{"12GiB", i(12, "GiB")},
		{"1.5 GHz", f(1.5, "GHz")},
		{"300 MiB/s", i(300, "MiB/s")},
		{"5 mW", i(5, "mW")},
		{"5 MW", i(5, "MW")},
		{"7 kB", i(7, "kB")},
		{"2.5", f(2.5, "")},
		{"true", watch.Attribute{Kind: watch.AttrBool, Bool: true}},
		{"F", watch.Attribute{Kind: watch.AttrBool, Bool: false}},
		{"Tesla V100", s("Tesla V100")},
		{"16 GB of memory", s("16 GB of memory")},
		{"fast GiB", s("fast GiB")}, // a unit without a number stays a string
		{"12 parsecs", s("12 parsecs")},
		{"7.0", f(7, "")},
	} {
		if got := parseAttribute(c.in); got != c.want {
			t.Errorf("parseAttribute(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

func TestCompareAttributes(t *testing.T) {
	i := func(v int64, u string) watch.Attribute { return watch.Attribute{Kind: watch.AttrInt, Int: v, Unit: u} }
	f := func(v float64, u string) watch.Attribute {
		return watch.Attribute{Kind: watch.AttrFloat, Float: v, Unit: u}
	}
	s := func(v string) watch.Attribute { return watch.Attribute{Kind: watch.AttrString, Str: v} }
	b := func(v bool) watch.Attribute { return watch.Attribute{Kind: watch.AttrBool, Bool: v} }
	for _, c := range []struct {
		name string
		a, b watch.Attribute
		want int
		ok   bool
	}{
		{"ints", i(1, ""), i(2, ""), -1, true},
		{"MiB and GiB", i(16384, "MiB"), i(16, "GiB"), 0, true},
		{"MiB and GB", i(16384, "MiB"), i(17, "GB"), 1, true},
		{"float and int with units", f(1.5, "GiB"), i(1536, "MiB"), 0, true},
		{"float below", f(1.49, "GiB"), i(1536, "MiB"), -1, true},
		{"rates", i(1, "GB/s"), i(999, "MB/s"), 1, true},
		{"bytes and rates", i(1, "GB/s"), i(1, "GB"), 0, false},
		{"unit and none", i(1, "GB"), i(1, ""), 0, false},
		{"milliwatts as ints divide, truncating", i(1500, "mW"), i(1, "W"), 0, true}, // Nomad's getInt
		{"milliwatts as floats", f(1500, "mW"), i(1, "W"), 1, true},
		{"milliwatts equal", f(1000, "mW"), i(1, "W"), 0, true},
		{"megahertz", i(1500, "MHz"), f(1.5, "GHz"), 0, true},
		{"strings", s("a"), s("b"), -1, true},
		{"string and int", s("1"), i(1, ""), 0, false},
		{"int and string", i(1, ""), s("1"), 0, false},
		{"bools equal", b(true), b(true), 0, true},
		{"bools differ", b(false), b(true), 1, true},
		{"bool and string", b(true), s("true"), 0, false},
		{"NaN", f(math.NaN(), ""), i(1, ""), 0, false},
		{"infinity", f(math.Inf(1), "GiB"), i(math.MaxInt64, "EiB"), 1, true},
		{"unknown unit is none", i(1, "parsec"), i(1, ""), 0, true},
	} {
		got, ok := compareAttributes(c.a, c.b)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: compare = %d, %v; want %d, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestSemverConstraints(t *testing.T) {
	for _, c := range []struct {
		expr string
		ok   bool
	}{
		{"1.2.3", true}, {"= 1.2.3", true}, {">=1.2.3, <2.0.0", true}, {"!= v1.2.3-rc.1+build.5", true}, {" > 1 ", true},
		{"~> 1.2", false}, {">= banana", false}, {"1.2.3beta", false}, {"", false}, {"1.2,", false},
	} {
		if _, err := parseSemverConstraints(c.expr); (err == nil) != c.ok {
			t.Errorf("parseSemverConstraints(%q): error %v, want ok=%v", c.expr, err, c.ok)
		}
	}
}
