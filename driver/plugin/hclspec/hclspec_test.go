package hclspec_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/zclconf/go-cty/cty"

	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
	"github.com/hadar-sched/hadar/driver/plugin/plugintest"
)

// schema uses every spec kind and every type hadar's plugins use.
var schema = hclspec.Object(map[string]*hclspec.Spec{
	"enabled": hclspec.Default(hclspec.Attr("enabled", "bool", false), hclspec.Literal("true")),
	"period":  hclspec.Default(hclspec.Attr("period", "string", false), hclspec.Literal(`"1m"`)),
	"ids":     hclspec.Default(hclspec.Attr("ids", "list(string)", false), hclspec.Literal("[]")),
	"file":    hclspec.Attr("file", "string", false),
	"steps":   hclspec.Attr("steps", "number", false),
	"rate":    hclspec.Attr("rate", "number", false),
	"rates":   hclspec.Attr("rates", "list(map(number))", false),
	"emulate": hclspec.Block("emulate", false, hclspec.Object(map[string]*hclspec.Spec{
		"speed": hclspec.Attr("speed", "map(number)", true),
	})),
	"gpu": hclspec.BlockList("gpu", hclspec.Object(map[string]*hclspec.Spec{
		"id":      hclspec.Attr("id", "string", true),
		"healthy": hclspec.Default(hclspec.Attr("healthy", "bool", false), hclspec.Literal("true")),
	})),
})

type config struct {
	Enabled bool                 `cty:"enabled"`
	Period  string               `cty:"period"`
	IDs     []string             `cty:"ids"`
	File    string               `cty:"file"`
	Steps   int64                `cty:"steps"`
	Rate    float64              `cty:"rate"`
	Rates   []map[string]float64 `cty:"rates"`
	Emulate *emulate             `cty:"emulate"`
	GPUs    []gpu                `cty:"gpu"`
}

type emulate struct {
	Speed map[string]float64 `cty:"speed"`
}

type gpu struct {
	ID      string `cty:"id"`
	Healthy bool   `cty:"healthy"`
}

// The implied type is hcldec's, for the spec the client builds from the
// wire form: what the client encodes is what Decode reads.
func TestTypeIsHCLDecImpliedType(t *testing.T) {
	dec, err := plugintest.HCLDec(schema.Proto())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := schema.Type(), hcldec.ImpliedType(dec); !got.Equals(want) {
		t.Fatalf("type %s, hcldec's %s", got.GoString(), want.GoString())
	}
}

func TestDecodeAsNomadEncodes(t *testing.T) {
	tests := []struct {
		name string
		body string
		want config
		err  string
	}{
		{
			name: "defaults",
			body: ``,
			// An absent block list is empty, an absent attribute nil.
			want: config{Enabled: true, Period: "1m", IDs: []string{}, GPUs: []gpu{}},
		},
		{
			name: "everything",
			body: `
enabled = false
period  = "30s"
ids     = ["a", "b"]
file    = "/etc/x"
steps   = 1200
rate    = 0.8
rates   = [{"Tesla V100" = 12.5, k80 = 3}, {}]
gpu {
  id = "g0"
}
gpu {
  id = "g1"
  healthy = false
}`,
			want: config{
				Enabled: false, Period: "30s", IDs: []string{"a", "b"}, File: "/etc/x", Steps: 1200, Rate: 0.8,
				Rates: []map[string]float64{{"Tesla V100": 12.5, "k80": 3}, {}},
				GPUs:  []gpu{{ID: "g0", Healthy: true}, {ID: "g1", Healthy: false}},
			},
		},
		{
			name: "HCL v1 converts what it can",
			body: `steps = "7"
enabled = "false"`,
			want: config{Enabled: false, Period: "1m", IDs: []string{}, Steps: 7, GPUs: []gpu{}},
		},
		{
			// The agent's HCL v1 makes a map inside a block a list of
			// maps, which a map type refuses (a fact of Nomad's agent
			// config, not of hadar's decoding).
			name: "map attribute in a block",
			body: "emulate {\n speed = { v100 = 2 }\n}",
			err:  `"speed": map of number required`,
		},
		{
			name: "fractional number into an integer",
			body: `steps = 1.5`,
			err:  "steps: value must be a whole number",
		},
		{
			name: "number out of range",
			body: `steps = 1e30`,
			err:  "steps: value must be a whole number, between -9223372036854775808 and 9223372036854775807",
		},
		{
			name: "wrong element type",
			body: "gpu {\n id = \"g\"\n}\ngpu {\n id = \"h\"\n healthy = \"maybe\"\n}",
			err:  "a bool is required",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := plugintest.PluginConfig(schema.Proto(), tc.body)
			var got config
			if err == nil {
				err = schema.Decode(b, &got)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// A task config reaches the client as a map (the job's), not HCL.
func TestDecodeTaskConfigMap(t *testing.T) {
	b, err := plugintest.DriverConfig(schema.Proto(), map[string]interface{}{
		"steps": 10, "gpu": []map[string]interface{}{{"id": "x"}}, "rates": []interface{}{map[string]interface{}{"a": 1.25}},
		"emulate": []map[string]interface{}{{"speed": map[string]interface{}{"v100": 2}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got config
	if err := schema.Decode(b, &got); err != nil {
		t.Fatal(err)
	}
	want := config{Enabled: true, Period: "1m", IDs: []string{}, Steps: 10, Rates: []map[string]float64{{"a": 1.25}},
		Emulate: &emulate{Speed: map[string]float64{"v100": 2}}, GPUs: []gpu{{ID: "x", Healthy: true}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestDecodeErrors(t *testing.T) {
	good, err := plugintest.PluginConfig(schema.Proto(), "gpu {\n id = \"a\"\n}")
	if err != nil {
		t.Fatal(err)
	}
	type missingField struct {
		Enabled bool `cty:"enabled"`
	}
	// A block must decode into a pointer: absent, it is null.
	type blockByValue struct {
		Enabled bool                 `cty:"enabled"`
		Period  string               `cty:"period"`
		IDs     []string             `cty:"ids"`
		File    string               `cty:"file"`
		Steps   int64                `cty:"steps"`
		Rate    float64              `cty:"rate"`
		Rates   []map[string]float64 `cty:"rates"`
		Emulate emulate              `cty:"emulate"`
		GPUs    []gpu                `cty:"gpu"`
	}
	tests := []struct {
		name string
		b    []byte
		out  any
		want string
	}{
		{"not msgpack", []byte{0xc1}, &config{}, "config is not msgpack of object"},
		{"empty map", []byte{0x80}, &config{}, "config is an object of {}, want an object of {emulate, enabled, file, gpu, ids, period, rate, rates, steps}"},
		{"attribute without a field", good, &missingField{}, `unsupported attribute`},
		{"field without an attribute", good, &struct {
			Extra string `cty:"extra"`
		}{}, `missing required attribute "extra"`},
		{"absent block into a non-pointer", good, &blockByValue{}, "emulate: null value is not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := schema.Decode(tc.b, tc.out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	in := config{Enabled: true, Period: "5s", IDs: []string{"x"}, Steps: 3, Rate: 0.25,
		Rates: []map[string]float64{{"a": 1}}, Emulate: &emulate{Speed: map[string]float64{"b": 2}}, GPUs: []gpu{{ID: "g"}}}
	b, err := schema.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	var out config
	if err := schema.Decode(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("in  %+v\nout %+v", in, out)
	}
	if _, err := schema.Encode(42); err == nil {
		t.Fatal("encoded a number as an object")
	}
}

func TestBuilderPanics(t *testing.T) {
	tests := []struct {
		name  string
		build func()
		want  string
	}{
		{"any", func() { hclspec.Attr("a", "any", false) }, `"any" cannot be decoded`},
		{"bad type", func() { hclspec.Attr("a", "lisst(string)", false) }, `hclspec.Attr("a")`},
		{"no name", func() { hclspec.Attr("", "string", false) }, "empty name"},
		{"bad literal", func() { hclspec.Literal(`"unterminated`) }, "hclspec.Literal"},
		{"literal of another type", func() {
			hclspec.Default(hclspec.Attr("a", "bool", false), hclspec.Literal(`"yes"`))
		}, "does not fit bool"},
		{"nil nested", func() { hclspec.BlockList("b", nil) }, "want a name and a nested spec"},
		{"nil attribute", func() { hclspec.Object(map[string]*hclspec.Spec{"a": nil}) }, `attribute "a" has a nil spec`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), tc.want) {
					t.Fatalf("panic %v, want %q", r, tc.want)
				}
			}()
			tc.build()
		})
	}
}

func TestProtoIsACopy(t *testing.T) {
	p := schema.Proto()
	p.GetObject().GetAttributes()["enabled"] = nil
	if schema.Proto().GetObject().GetAttributes()["enabled"] == nil {
		t.Fatal("changing Proto's result changed the spec")
	}
}

func TestFormatPath(t *testing.T) {
	p := cty.GetAttrPath("gpu").Index(cty.NumberIntVal(2)).GetAttr("memory").Index(cty.StringVal("k"))
	if got := hclspec.FormatPath(p); got != "gpu[2].memory.k" {
		t.Fatalf("got %q", got)
	}
}

// FuzzDecode feeds arbitrary bytes to Decode: it must never panic, and
// what it accepts must survive Encode and Decode unchanged.
func FuzzDecode(f *testing.F) {
	for _, m := range []map[string]interface{}{nil, {
		"steps": 3, "rates": []interface{}{map[string]interface{}{"a": 1}}, "gpu": []interface{}{map[string]interface{}{"id": "a"}},
		"emulate": []interface{}{map[string]interface{}{"speed": map[string]interface{}{"x": 1.5}}},
	}} {
		b, err := plugintest.DriverConfig(schema.Proto(), m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got config
		if err := schema.Decode(b, &got); err != nil {
			return
		}
		again, err := schema.Encode(got)
		if err != nil {
			t.Fatalf("decoded %+v but cannot encode it: %v", got, err)
		}
		var back config
		if err := schema.Decode(again, &back); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(got, back) {
			t.Fatalf("round trip changed %+v into %+v", got, back)
		}
	})
}
