// Package plugintest drives hadar's Nomad plugins as the Nomad client
// does, for their tests: a client of the plugin protocol over a real
// go-plugin gRPC connection (Connect, in-process; Launch, a plugin
// process), and the agent's encoding of plugin and task configs
// (PluginConfig, DriverConfig). It is imported by tests only; hadar has
// no use for a client otherwise.
//
// The client converts the wire messages itself, independently of the
// server side in driver/plugin, and fails where Nomad's client would
// (for example on a task status without timestamps), so a test through
// it checks the wire format as well as the plugin.
package plugintest

import (
	"encoding/json"
	"fmt"

	hclv1 "github.com/hashicorp/hcl"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hjson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	"github.com/zclconf/go-cty/cty/msgpack"

	"github.com/hadar-sched/hadar/driver/plugin/proto/hclspecpb"
)

// PluginConfig turns the body of an agent's plugin "<name>" { config {
// body } } block into the msgpack the agent sends to SetConfig, the way
// the agent does: HCL (version 1, the agent config's) into a map, the map
// as JSON through HCL's JSON parser, decoded with the schema's wire form
// converted as the client converts it, the value encoded with go-cty's
// msgpack.
func PluginConfig(spec *hclspecpb.Spec, body string) ([]byte, error) {
	var agent struct {
		Config map[string]interface{} `hcl:"config"`
	}
	if err := hclv1.Decode(&agent, "config {\n"+body+"\n}"); err != nil {
		return nil, fmt.Errorf("plugin config: %w", err)
	}
	if agent.Config == nil {
		agent.Config = map[string]interface{}{}
	}
	return encode(spec, agent.Config)
}

// DriverConfig turns a task's config, as the job holds it (the map the
// jobspec's config block became), into the msgpack the client sends in
// StartTask: JSON, HCL's JSON parser, the schema, go-cty's msgpack.
func DriverConfig(spec *hclspecpb.Spec, config map[string]interface{}) ([]byte, error) {
	if config == nil {
		config = map[string]interface{}{}
	}
	return encode(spec, config)
}

func encode(spec *hclspecpb.Spec, m map[string]interface{}) ([]byte, error) {
	dec, err := HCLDec(spec)
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("config as JSON: %w", err)
	}
	f, diags := hjson.Parse(js, "config")
	if diags.HasErrors() {
		return nil, fmt.Errorf("config: %s", diags.Error())
	}
	val, diags := hcldec.Decode(f.Body, dec, &hcl.EvalContext{Functions: functions()})
	if diags.HasErrors() {
		return nil, fmt.Errorf("config: %s", diags.Error())
	}
	b, err := msgpack.Marshal(val, val.Type())
	if err != nil {
		return nil, fmt.Errorf("config as msgpack: %w", err)
	}
	return b, nil
}

// functions are those the client offers config expressions.
func functions() map[string]function.Function {
	return map[string]function.Function{
		"abs":        stdlib.AbsoluteFunc,
		"coalesce":   stdlib.CoalesceFunc,
		"concat":     stdlib.ConcatFunc,
		"hasindex":   stdlib.HasIndexFunc,
		"int":        stdlib.IntFunc,
		"jsondecode": stdlib.JSONDecodeFunc,
		"jsonencode": stdlib.JSONEncodeFunc,
		"length":     stdlib.LengthFunc,
		"lower":      stdlib.LowerFunc,
		"max":        stdlib.MaxFunc,
		"min":        stdlib.MinFunc,
		"reverse":    stdlib.ReverseFunc,
		"strlen":     stdlib.StrlenFunc,
		"substr":     stdlib.SubstrFunc,
		"upper":      stdlib.UpperFunc,
	}
}

// HCLDec converts a schema's wire form into an hcldec spec, as the client
// does: an attribute's type and a literal are HCL expressions, an
// object's attributes name their nested attrs and blocks when these
// leave their names out.
func HCLDec(spec *hclspecpb.Spec) (hcldec.Spec, error) {
	return convert(spec, "")
}

func convert(s *hclspecpb.Spec, implied string) (hcldec.Spec, error) {
	name := func(n string) string {
		if n != "" {
			return n
		}
		return implied
	}
	switch b := s.GetBlock().(type) {
	case *hclspecpb.Spec_Object:
		obj := hcldec.ObjectSpec{}
		for k, v := range b.Object.GetAttributes() {
			sub, err := convert(v, k)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			obj[k] = sub
		}
		return obj, nil
	case *hclspecpb.Spec_Attr:
		x, diags := hclsyntax.ParseExpression([]byte(b.Attr.GetType()), "type", hcl.InitialPos)
		if diags.HasErrors() {
			return nil, fmt.Errorf("attr type %q: %s", b.Attr.GetType(), diags.Error())
		}
		ty, diags := typeexpr.TypeConstraint(x)
		if diags.HasErrors() {
			return nil, fmt.Errorf("attr type %q: %s", b.Attr.GetType(), diags.Error())
		}
		n := name(b.Attr.GetName())
		if n == "" {
			return nil, fmt.Errorf("attr without a name")
		}
		return &hcldec.AttrSpec{Name: n, Type: ty, Required: b.Attr.GetRequired()}, nil
	case *hclspecpb.Spec_BlockValue:
		nested, err := convertNested(b.BlockValue.GetNested())
		if err != nil {
			return nil, err
		}
		return &hcldec.BlockSpec{TypeName: name(b.BlockValue.GetName()), Required: b.BlockValue.GetRequired(), Nested: nested}, nil
	case *hclspecpb.Spec_BlockList:
		nested, err := convertNested(b.BlockList.GetNested())
		if err != nil {
			return nil, err
		}
		return &hcldec.BlockListSpec{TypeName: name(b.BlockList.GetName()), Nested: nested}, nil
	case *hclspecpb.Spec_Default:
		primary, err := convert(b.Default.GetPrimary(), "")
		if err != nil {
			return nil, err
		}
		def, err := convert(b.Default.GetDefault(), "")
		if err != nil {
			return nil, err
		}
		return &hcldec.DefaultSpec{Primary: primary, Default: def}, nil
	case *hclspecpb.Spec_Literal:
		x, diags := hclsyntax.ParseExpression([]byte(b.Literal.GetValue()), "literal", hcl.InitialPos)
		if diags.HasErrors() {
			return nil, fmt.Errorf("literal %q: %s", b.Literal.GetValue(), diags.Error())
		}
		v, diags := x.Value(&hcl.EvalContext{Functions: functions()})
		if diags.HasErrors() {
			return nil, fmt.Errorf("literal %q: %s", b.Literal.GetValue(), diags.Error())
		}
		return &hcldec.LiteralSpec{Value: v}, nil
	}
	return nil, fmt.Errorf("empty or unknown spec %v", s)
}

// convertNested is a block's nested spec, which the client requires.
func convertNested(s *hclspecpb.Spec) (hcldec.Spec, error) {
	if s == nil {
		return nil, fmt.Errorf("block spec without a nested spec")
	}
	return convert(s, "")
}
