package observability

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// The Prometheus job holds no token: the task's template reads it from the
// job's Nomad Variable into the secrets directory, readable by the task's
// user alone, and prometheus.yml names that file (credentials_file) for the
// scrapes; no variable of the jobspec could carry a token in clear.
// TestLeaderServiceAddress (e2e) runs the job and looks for the token in
// what Nomad stores and renders.
func TestPrometheusJobReadsTokenFromVariable(t *testing.T) {
	src, err := os.ReadFile("../../" + PrometheusJobFile)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := hclsyntax.ParseConfig(src, PrometheusJobFile, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	text := func(e hclsyntax.Expression) string { return string(e.Range().SliceBytes(src)) }
	templates := map[string]*hclsyntax.Body{}
	var walk func(b *hclsyntax.Body)
	walk = func(b *hclsyntax.Body) {
		for _, blk := range b.Blocks {
			switch blk.Type {
			case "variable":
				if name := blk.Labels[0]; strings.Contains(name, "token") || strings.Contains(name, "credential") {
					t.Errorf("variable %q: a token given as a variable is in the job Nomad stores", name)
				}
			case "template":
				if d, ok := blk.Body.Attributes["destination"]; ok {
					templates[strings.Trim(text(d.Expr), `"`)] = blk.Body
				}
			}
			walk(blk.Body)
		}
	}
	walk(f.Body.(*hclsyntax.Body))

	tok, cfg := templates["secrets/hadar-token"], templates["local/prometheus.yml"]
	if tok == nil || cfg == nil {
		t.Fatalf("templates %v: want secrets/hadar-token and local/prometheus.yml", templates)
	}
	attr := func(b *hclsyntax.Body, name string) string {
		if a, ok := b.Attributes[name]; ok {
			return text(a.Expr)
		}
		return ""
	}
	if data := attr(tok, "data"); !strings.Contains(data, `nomadVar "nomad/jobs/prometheus"`) || !strings.Contains(data, ".hadar_token") {
		t.Errorf("the token template does not read the job's variable:\n%s", data)
	}
	if perms := attr(tok, "perms"); perms != `"0400"` || attr(tok, "uid") == "" {
		t.Errorf("the token file: perms %s, uid %q: want 0400, the task's user's", perms, attr(tok, "uid"))
	}
	data := attr(cfg, "data")
	files := regexp.MustCompile(`credentials_file: (.*)`).FindAllStringSubmatch(data, -1)
	if len(files) == 0 {
		t.Fatalf("prometheus.yml sends no token:\n%s", data)
	}
	for _, m := range files {
		if m[1] != `{{ env "NOMAD_SECRETS_DIR" }}/hadar-token` {
			t.Errorf("credentials_file %s: want the rendered token file", m[1])
		}
	}
	if regexp.MustCompile(`(?m)^\s*(credentials|bearer_token|password):`).MatchString(data) {
		t.Errorf("prometheus.yml carries a secret inline:\n%s", data)
	}
}
