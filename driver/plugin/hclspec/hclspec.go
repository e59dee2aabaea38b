// Package hclspec builds the configuration schemas hadar's Nomad plugins
// hand the Nomad client (a plugin block's config, a task's config block)
// and decodes the configuration the client sends back.
//
// A schema is a tree of specs, built once with Object, Attr, Block,
// BlockList, Default and Literal (the hcldec spec kinds hadar uses). The
// client receives its wire form (Proto), turns it into an hcldec spec,
// decodes the operator's or job author's HCL with it and sends the
// resulting cty value encoded with go-cty's msgpack, as
// msgpack.Marshal(val, val.Type()). Decode reverses that with the spec's
// implied type (Type) into a Go struct whose fields carry `cty:"name"`
// tags, one per attribute of the object:
//
//	var schema = hclspec.Object(map[string]*hclspec.Spec{
//		"period": hclspec.Default(hclspec.Attr("period", "string", false), hclspec.Literal(`"1m"`)),
//		"gpu": hclspec.BlockList("gpu", hclspec.Object(map[string]*hclspec.Spec{
//			"id": hclspec.Attr("id", "string", true),
//		})),
//	})
//
//	type config struct {
//		Period string `cty:"period"`
//		GPUs   []struct {
//			ID string `cty:"id"`
//		} `cty:"gpu"`
//	}
//
// An attribute left out of the HCL, without a default, arrives null and
// decodes to its Go zero value (a nil slice or map for a collection); an
// absent Block arrives null and needs a pointer field, which stays nil;
// an absent BlockList is an empty list.
//
// A fact of Nomad's agent worth knowing: it parses its plugin blocks with
// HCL version 1, which reads `x = { ... }` as a list of maps, so a
// map(...) attribute cannot be set in a plugin block's config (it can in
// a task's config, which reaches the client as JSON).
package hclspec

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/gocty"
	"github.com/zclconf/go-cty/cty/msgpack"
	"google.golang.org/protobuf/proto"

	"github.com/hadar-sched/hadar/driver/plugin/proto/hclspecpb"
)

// Spec is one node of a schema. Specs are immutable once built; build
// them at package level and share them.
type Spec struct {
	pb *hclspecpb.Spec
	ty cty.Type
	// lit is a Literal's value, to check a Default against its primary.
	lit *cty.Value
}

// The builders panic on a malformed spec, like regexp.MustCompile: specs
// are constants of the plugin, so a bad one is a bug to fail on at
// startup (and in every test), never input to handle.

// Object makes an object of the values of attrs, by key.
func Object(attrs map[string]*Spec) *Spec {
	pbs := make(map[string]*hclspecpb.Spec, len(attrs))
	tys := make(map[string]cty.Type, len(attrs))
	for k, s := range attrs {
		if s == nil {
			panic(fmt.Sprintf("hclspec.Object: attribute %q has a nil spec", k))
		}
		pbs[k] = s.pb
		tys[k] = s.ty
	}
	return &Spec{
		pb: &hclspecpb.Spec{Block: &hclspecpb.Spec_Object{Object: &hclspecpb.Object{Attributes: pbs}}},
		ty: cty.Object(tys),
	}
}

// Attr reads the attribute name, of the HCL type expression typ: a
// primitive ("string", "number", "bool") or a collection of them
// ("list(string)", "map(number)", "list(map(number))", "set(string)",
// "object({...})"). "any" is refused: a dynamic value has no Go type to
// decode into.
func Attr(name, typ string, required bool) *Spec {
	if name == "" {
		panic("hclspec.Attr: empty name")
	}
	ty, err := ParseType(typ)
	if err != nil {
		panic(fmt.Sprintf("hclspec.Attr(%q): %v", name, err))
	}
	return &Spec{
		pb: &hclspecpb.Spec{Block: &hclspecpb.Spec_Attr{Attr: &hclspecpb.Attr{Name: name, Type: typ, Required: required}}},
		ty: ty,
	}
}

// Block reads zero or one block of type name (exactly one when required)
// with nested; absent, its value is null.
func Block(name string, required bool, nested *Spec) *Spec {
	if name == "" || nested == nil {
		panic(fmt.Sprintf("hclspec.Block(%q): want a name and a nested spec", name))
	}
	return &Spec{
		pb: &hclspecpb.Spec{Block: &hclspecpb.Spec_BlockValue{BlockValue: &hclspecpb.Block{Name: name, Required: required, Nested: nested.pb}}},
		ty: nested.ty,
	}
}

// BlockList reads every block of type name, in order, into a list.
func BlockList(name string, nested *Spec) *Spec {
	if name == "" || nested == nil {
		panic(fmt.Sprintf("hclspec.BlockList(%q): want a name and a nested spec", name))
	}
	return &Spec{
		pb: &hclspecpb.Spec{Block: &hclspecpb.Spec_BlockList{BlockList: &hclspecpb.BlockList{Name: name, Nested: nested.pb}}},
		ty: cty.List(nested.ty),
	}
}

// Default is primary's value, or def's where primary's is null (the
// attribute is absent). A Literal def must convert to primary's type.
func Default(primary, def *Spec) *Spec {
	if primary == nil || def == nil {
		panic("hclspec.Default: nil spec")
	}
	if def.lit != nil {
		if _, err := convert.Convert(*def.lit, primary.ty); err != nil {
			panic(fmt.Sprintf("hclspec.Default: literal %s does not fit %s: %v", def.pb.GetLiteral().GetValue(), primary.ty.FriendlyName(), err))
		}
	} else if !def.ty.Equals(primary.ty) {
		panic(fmt.Sprintf("hclspec.Default: default of type %s for %s", def.ty.FriendlyName(), primary.ty.FriendlyName()))
	}
	return &Spec{
		pb: &hclspecpb.Spec{Block: &hclspecpb.Spec_Default{Default: &hclspecpb.Default{Primary: primary.pb, Default: def.pb}}},
		ty: primary.ty,
	}
}

// Literal is a constant HCL expression: `true`, `[]`, `"1m"` (a string
// needs its quotes).
func Literal(expr string) *Spec {
	x, diags := hclsyntax.ParseExpression([]byte(expr), "literal", hcl.InitialPos)
	if diags.HasErrors() {
		panic(fmt.Sprintf("hclspec.Literal(%s): %s", expr, diags.Error()))
	}
	v, diags := x.Value(nil)
	if diags.HasErrors() {
		panic(fmt.Sprintf("hclspec.Literal(%s): %s", expr, diags.Error()))
	}
	return &Spec{
		pb:  &hclspecpb.Spec{Block: &hclspecpb.Spec_Literal{Literal: &hclspecpb.Literal{Value: expr}}},
		ty:  v.Type(),
		lit: &v,
	}
}

// ParseType reads an HCL type expression as Attr takes it.
func ParseType(typ string) (cty.Type, error) {
	x, diags := hclsyntax.ParseExpression([]byte(typ), "type", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("type %q: %s", typ, diags.Error())
	}
	ty, diags := typeexpr.TypeConstraint(x)
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("type %q: %s", typ, diags.Error())
	}
	if ty.HasDynamicTypes() {
		return cty.NilType, fmt.Errorf("type %q: \"any\" cannot be decoded into a Go struct; name the type", typ)
	}
	return ty, nil
}

// Proto is the spec's wire form, for ConfigSchema and TaskConfigSchema.
// It is a copy: changing it changes nothing here.
func (s *Spec) Proto() *hclspecpb.Spec { return proto.Clone(s.pb).(*hclspecpb.Spec) }

// Type is the type of the values the spec decodes to (hcldec's implied
// type); the client's msgpack is read with it.
func (s *Spec) Type() cty.Type { return s.ty }

// Decode reads b, the msgpack the client sent for this spec, into out, a
// pointer to a struct with a `cty` tag for every attribute. Null
// primitives decode to their zero values, null collections to nil, a
// null object (an absent block) to a nil pointer. Errors name the
// attribute's path, e.g. `gpu[0].memory`.
func (s *Spec) Decode(b []byte, out any) error {
	val, err := unmarshal(b, s.ty)
	if err != nil {
		return err
	}
	if !val.IsWhollyKnown() {
		return fmt.Errorf("config holds unknown values; Nomad sends only known ones")
	}
	if !val.Type().Equals(s.ty) {
		// cty's msgpack reads an empty map as an empty object whatever
		// the type asked for.
		return fmt.Errorf("config is %s, want %s", describe(val.Type()), describe(s.ty))
	}
	if err := gocty.FromCtyValue(zeroNulls(val), out); err != nil {
		return pathError(err)
	}
	return nil
}

// describe names a type, an object by its attributes.
func describe(ty cty.Type) string {
	if !ty.IsObjectType() {
		return ty.FriendlyName()
	}
	names := make([]string, 0, len(ty.AttributeTypes()))
	for k := range ty.AttributeTypes() {
		names = append(names, k)
	}
	sort.Strings(names)
	return "an object of {" + strings.Join(names, ", ") + "}"
}

// unmarshal is cty's msgpack.Unmarshal, with its panics (some malformed
// inputs build lists of mixed types, which cty panics on) turned into
// errors: a plugin must not die on a bad config.
func unmarshal(b []byte, ty cty.Type) (val cty.Value, err error) {
	defer func() {
		if r := recover(); r != nil {
			val, err = cty.NilVal, fmt.Errorf("config is not msgpack of %s: %v", ty.FriendlyName(), r)
		}
	}()
	val, err = msgpack.Unmarshal(b, ty)
	if err != nil {
		return cty.NilVal, fmt.Errorf("config is not msgpack of %s: %w", ty.FriendlyName(), pathError(err))
	}
	return val, nil
}

// Encode is Decode's inverse: in, a struct (or pointer to one) with the
// same tags, encoded as the client would send it. Zero values encode as
// themselves, nil pointers and slices as null.
func (s *Spec) Encode(in any) ([]byte, error) {
	val, err := gocty.ToCtyValue(in, s.ty)
	if err != nil {
		return nil, fmt.Errorf("encode %T as %s: %w", in, s.ty.FriendlyName(), pathError(err))
	}
	b, err := msgpack.Marshal(val, val.Type())
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", in, err)
	}
	return b, nil
}

// zeroNulls replaces null strings, numbers and bools with their zero
// values, as Nomad's own msgpack decoding into Go structs does; gocty
// would refuse them for non-pointer fields.
func zeroNulls(v cty.Value) cty.Value {
	ty := v.Type()
	if v.IsNull() {
		switch ty {
		case cty.String:
			return cty.StringVal("")
		case cty.Number:
			return cty.Zero
		case cty.Bool:
			return cty.False
		}
		return v
	}
	switch {
	case ty.IsObjectType():
		attrs := make(map[string]cty.Value, len(ty.AttributeTypes()))
		for k := range ty.AttributeTypes() {
			attrs[k] = zeroNulls(v.GetAttr(k))
		}
		return cty.ObjectVal(attrs)
	case ty.IsTupleType():
		elems := make([]cty.Value, 0, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			elems = append(elems, zeroNulls(e))
		}
		return cty.TupleVal(elems)
	case ty.IsListType() || ty.IsSetType():
		if v.LengthInt() == 0 {
			return v
		}
		elems := make([]cty.Value, 0, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			elems = append(elems, zeroNulls(e))
		}
		if ty.IsSetType() {
			return cty.SetVal(elems)
		}
		return cty.ListVal(elems)
	case ty.IsMapType():
		if v.LengthInt() == 0 {
			return v
		}
		elems := make(map[string]cty.Value, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			elems[k.AsString()] = zeroNulls(e)
		}
		return cty.MapVal(elems)
	}
	return v
}

// pathError renders a cty path error as "path: message", the path in
// HCL's terms (gpu[0].memory).
func pathError(err error) error {
	pe, ok := err.(cty.PathError)
	if !ok || len(pe.Path) == 0 {
		return err
	}
	return fmt.Errorf("%s: %w", FormatPath(pe.Path), err)
}

// FormatPath renders p as HCL would name it: attributes as .name (or
// ["name"] where the key is a map key), indices as [i].
func FormatPath(p cty.Path) string {
	var b strings.Builder
	for _, step := range p {
		switch s := step.(type) {
		case cty.GetAttrStep:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.Name)
		case cty.IndexStep:
			switch {
			case s.Key.IsNull() || !s.Key.IsKnown():
				b.WriteString("[?]")
			case s.Key.Type() == cty.Number:
				fmt.Fprintf(&b, "[%s]", s.Key.AsBigFloat().Text('f', -1))
			case s.Key.Type() == cty.String:
				// cty's msgpack names object attributes by index.
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(s.Key.AsString())
			default:
				b.WriteString("[?]")
			}
		}
	}
	return b.String()
}
