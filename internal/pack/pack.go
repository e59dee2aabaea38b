// Package pack renders a Nomad Pack (deploy/pack/hadar) as the nomad-pack
// CLI does, for the tests: Go text/template with Pack's delimiters [[ ]],
// its var and meta functions, and the few Sprig functions the hadar pack
// uses (quote, toJson, trimSuffix, indent). The nomad-pack CLI itself is
// not built here: the Go module proxy does not serve
// github.com/hashicorp/nomad-pack, so the tests cannot fetch it. A
// function the pack uses beyond these fails its render, in the tests,
// rather than in an operator's nomad-pack run.
package pack

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Pack is a pack's metadata, its variables' defaults and its templates.
type Pack struct {
	Name string
	// Meta is metadata.hcl flattened: "pack.name", "pack.version",
	// "app.url".
	Meta map[string]string
	// Defaults are variables.hcl's defaults.
	Defaults map[string]any
	dir      string
}

// Load reads the pack in dir.
func Load(dir string) (*Pack, error) {
	p := &Pack{Meta: map[string]string{}, Defaults: map[string]any{}, dir: dir}
	meta, err := parse(filepath.Join(dir, "metadata.hcl"))
	if err != nil {
		return nil, err
	}
	for _, b := range meta.Blocks {
		for name, a := range b.Body.Attributes {
			v, diags := a.Expr.Value(nil)
			if diags.HasErrors() {
				return nil, fmt.Errorf("pack %s: metadata %s.%s: %s", dir, b.Type, name, diags.Error())
			}
			if v.Type() == cty.String {
				p.Meta[b.Type+"."+name] = v.AsString()
			}
		}
	}
	p.Name = p.Meta["pack.name"]
	vars, err := parse(filepath.Join(dir, "variables.hcl"))
	if err != nil {
		return nil, err
	}
	for _, b := range vars.Blocks {
		if b.Type != "variable" || len(b.Labels) != 1 {
			continue
		}
		d, ok := b.Body.Attributes["default"]
		if !ok {
			continue
		}
		v, diags := d.Expr.Value(nil)
		if diags.HasErrors() {
			return nil, fmt.Errorf("pack %s: variable %s: %s", dir, b.Labels[0], diags.Error())
		}
		if p.Defaults[b.Labels[0]], err = goValue(v); err != nil {
			return nil, fmt.Errorf("pack %s: variable %s: %w", dir, b.Labels[0], err)
		}
	}
	return p, nil
}

func parse(path string) (*hclsyntax.Body, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the pack: %w", err)
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("parsing %s: %s", path, diags.Error())
	}
	return f.Body.(*hclsyntax.Body), nil
}

func goValue(v cty.Value) (any, error) {
	switch {
	case v.IsNull():
		return nil, nil
	case v.Type() == cty.String:
		return v.AsString(), nil
	case v.Type() == cty.Bool:
		return v.True(), nil
	case v.Type() == cty.Number:
		f := v.AsBigFloat()
		if f.IsInt() {
			i, _ := f.Int64()
			return i, nil
		}
		x, _ := f.Float64()
		return x, nil
	case v.Type().IsTupleType() || v.Type().IsListType() || v.Type().IsSetType():
		out := []any{}
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			g, err := goValue(e)
			if err != nil {
				return nil, err
			}
			out = append(out, g)
		}
		return out, nil
	}
	return nil, fmt.Errorf("a default of type %s: not supported here", v.Type().FriendlyName())
}

// context is what the templates see as "." (Pack passes its own).
type context struct {
	vars map[string]any
	meta map[string]string
}

// Render renders every template of the pack with the defaults overridden
// by vars (the -var of nomad-pack render), keyed by the template's file
// name less ".tpl" (hadar-sidecar.nomad, hadar-auth-method.json); the
// helpers (files starting with _) render nothing of their own.
func (p *Pack) Render(vars map[string]any) (map[string]string, error) {
	ctx := context{vars: map[string]any{}, meta: p.Meta}
	for k, v := range p.Defaults {
		ctx.vars[k] = v
	}
	for k, v := range vars {
		if _, ok := p.Defaults[k]; !ok {
			return nil, fmt.Errorf("pack %s has no variable %q", p.Name, k)
		}
		ctx.vars[k] = v
	}
	funcs := template.FuncMap{
		"var": func(name string, c context) (any, error) {
			v, ok := c.vars[name]
			if !ok {
				return nil, fmt.Errorf("no variable %q", name)
			}
			return v, nil
		},
		"meta": func(name string, c context) (string, error) {
			v, ok := c.meta[name]
			if !ok {
				return "", fmt.Errorf("no metadata %q", name)
			}
			return v, nil
		},
		"quote":      func(v any) string { return fmt.Sprintf("%q", fmt.Sprint(v)) },
		"trimSuffix": func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },
		"toJson": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"indent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
	}
	files, err := filepath.Glob(filepath.Join(p.dir, "templates", "*.tpl"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	set := template.New(p.Name).Delims("[[", "]]").Funcs(funcs).Option("missingkey=error")
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading the pack: %w", err)
		}
		if _, err := set.New(filepath.Base(f)).Parse(string(src)); err != nil {
			return nil, fmt.Errorf("pack %s: %w", p.Name, err)
		}
	}
	out := map[string]string{}
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "_") {
			continue
		}
		var b strings.Builder
		if err := set.ExecuteTemplate(&b, base, ctx); err != nil {
			return nil, fmt.Errorf("pack %s: rendering %s: %w", p.Name, base, err)
		}
		out[strings.TrimSuffix(base, ".tpl")] = b.String()
	}
	return out, nil
}
