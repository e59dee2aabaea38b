package config

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/json"
)

// decodeFile parses a config file, HCL or (named *.json) JSON as
// hclsimple.Decode does, and decodes its one flat body into groups, each a
// pointer to a struct of hcl-tagged fields (decodeGroups).
func decodeFile(filename string, src []byte, groups ...any) error {
	var file *hcl.File
	var diags hcl.Diagnostics
	switch suffix := strings.ToLower(filepath.Ext(filename)); suffix {
	case ".hcl":
		file, diags = hclsyntax.ParseConfig(src, filename, hcl.Pos{Line: 1, Column: 1})
	case ".json":
		file, diags = json.Parse(src, filename)
	default:
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Unsupported file format",
			Detail:   fmt.Sprintf("Cannot read from %s: unrecognized file format suffix %q.", filename, suffix),
		}}
	}
	if diags.HasErrors() {
		return diags
	}
	if diags = decodeGroups(file.Body, groups...); diags.HasErrors() {
		return diags
	}
	return nil
}

// decodeGroups decodes one body into several structs, as gohcl.DecodeBody
// would decode it into one struct holding all their fields: gohcl skips
// untagged embedded structs, so Config's groups are decoded one by one.
// The body is first checked against every group's schema at once, so an
// attribute or block no group has is refused with hcl's usual error (an
// argument named X is not expected here, with its file and line, and a
// suggestion), in the order gohcl would give it; then each group takes
// its part of the body.
func decodeGroups(body hcl.Body, groups ...any) hcl.Diagnostics {
	all := &hcl.BodySchema{}
	for _, g := range groups {
		s, _ := gohcl.ImpliedBodySchema(g)
		all.Attributes = append(all.Attributes, s.Attributes...)
		all.Blocks = append(all.Blocks, s.Blocks...)
	}
	_, diags := body.Content(all)
	for _, g := range groups {
		for _, d := range decodePart(body, g) {
			// A block's own errors (a missing label) come from reading
			// the body's structure, the check above and the group's
			// decoding alike: keep one.
			if !slices.ContainsFunc(diags, func(e *hcl.Diagnostic) bool { return sameDiag(d, e) }) {
				diags = append(diags, d)
			}
		}
	}
	return diags
}

// sameDiag: a and b say the same of the same place.
func sameDiag(a, b *hcl.Diagnostic) bool {
	return a.Severity == b.Severity && a.Summary == b.Summary && a.Detail == b.Detail && rangeString(a.Subject) == rangeString(b.Subject)
}

func rangeString(r *hcl.Range) string {
	if r == nil {
		return ""
	}
	return r.String()
}

// decodePart decodes into the struct g points to the part of body its
// fields name, leaving the rest: gohcl decodes only a whole body or, for
// a struct with a remain field, part of one, so g's fields are decoded
// through a struct built like g's with such a field added.
func decodePart(body hcl.Body, g any) hcl.Diagnostics {
	v := reflect.ValueOf(g).Elem()
	var fields []reflect.StructField
	var from []int
	for i := range v.NumField() {
		if f := v.Type().Field(i); f.Tag.Get("hcl") != "" {
			fields = append(fields, reflect.StructField{Name: f.Name, Type: f.Type, Tag: f.Tag})
			from = append(from, i)
		}
	}
	fields = append(fields, reflect.StructField{Name: "Remain", Type: reflect.TypeFor[hcl.Body](), Tag: `hcl:",remain"`})
	part := reflect.New(reflect.StructOf(fields))
	diags := gohcl.DecodeBody(body, nil, part.Interface())
	for i, j := range from {
		v.Field(j).Set(part.Elem().Field(i))
	}
	return diags
}
