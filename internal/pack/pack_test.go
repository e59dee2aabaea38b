package pack

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

const dir = "../../deploy/pack/hadar"

// The hadar pack renders, with its defaults and with every branch its
// variables take, to a jobspec HCL parses and an auth method whose JWKS
// URL is the cluster's address, whatever its port; it offers every
// variable of the plain jobspec of deploy/.
func TestHadarPackRenders(t *testing.T) {
	p, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "hadar" || p.Meta["pack.version"] == "" {
		t.Fatalf("metadata %v", p.Meta)
	}
	plain, err := os.ReadFile("../../deploy/hadar-sidecar.nomad.hcl")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^variable "([^"]+)"`).FindAllSubmatch(plain, -1) {
		if _, ok := p.Defaults[string(m[1])]; !ok {
			t.Errorf("the pack lacks the jobspec's variable %s", m[1])
		}
	}
	for name, tc := range map[string]struct {
		vars map[string]any
		want []string
	}{
		"defaults": {nil, []string{`job "hadar-sidecar"`, `command = "/usr/local/bin/hadar"`, `count = 2`, `datacenters = ["*"]`,
			`auth_method = "hadar-workload"`, `nomad_auth = true`, `allow_insecure_http = true`, `name     = "hadar-leader"`, `path            = "/v1/leader"`, `on_update       = "ignore"`, `"http://${attr.unique.advertise.address}"`, `JWKSURL": "http://127.0.0.1:4646/.well-known/jwks.json"`}},
		"artifact, TLS, queues, another port": {map[string]any{
			"hadar_artifact": "https://files.example/hadar_v0.3.0_linux_amd64.tar.gz?checksum=sha256:00", "count": 3,
			"status_tls_cert": "/etc/hadar/tls.crt", "status_tls_key": "/etc/hadar/tls.key", "auth_method": "", "job_name": "hadar-b",
			"namespace": "ops", "state_namespace": "team", "watch_namespaces": []any{"team", "cv"}, "status_nomad_auth": false,
			"queues": "queue \"cv\" {\n  namespaces = [\"cv\"]\n}", "cluster_address": "https://nomad.example:14646/", "nomad_address": "https://nomad.example:14646"},
			[]string{`job "hadar-b"`, `source      = "https://files.example/hadar_v0.3.0_linux_amd64.tar.gz?checksum=sha256:00"`, `command = "local/hadar-release/hadar"`,
				`count = 3`, `namespace   = "ops"`, `namespace  = "team"`, `namespaces = ["team","cv"]`, `nomad_auth = false`, `tls_cert   = "/etc/hadar/tls.crt"`,
				`protocol        = "https"`, `        queue "cv" {` + "\n" + `          namespaces = ["cv"]`, `NOMAD_ADDR   = "https://nomad.example:14646"`,
				`JWKSURL": "https://nomad.example:14646/.well-known/jwks.json"`}},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := p.Render(tc.vars)
			if err != nil {
				t.Fatal(err)
			}
			job, method := out["hadar-sidecar.nomad"], out["hadar-auth-method.json"]
			if len(out) != 2 || job == "" || method == "" {
				t.Fatalf("rendered %d files", len(out))
			}
			if _, diags := hclsyntax.ParseConfig([]byte(job), "hadar-sidecar.nomad", hcl.InitialPos); diags.HasErrors() {
				t.Fatalf("the rendered job does not parse: %s\n%s", diags.Error(), job)
			}
			var m struct{ JWKSURL string }
			if err := json.Unmarshal([]byte(method), &m); err != nil || m.JWKSURL == "" {
				t.Fatalf("the rendered auth method: %v\n%s", err, method)
			}
			both := job + method
			for _, w := range tc.want {
				if !strings.Contains(both, w) {
					t.Errorf("the render lacks %q:\n%s\n%s", w, job, method)
				}
			}
			if name == "defaults" && (strings.Contains(job, "artifact {") || strings.Contains(job, "tls_cert")) {
				t.Errorf("defaults render an artifact or TLS:\n%s", job)
			}
		})
	}
	if _, err := p.Render(map[string]any{"no_such": 1}); err == nil {
		t.Fatal("an unknown variable rendered")
	}
}

// The pack is rendered from the release archive's copy: Load works on
// any folder holding it (filepath.Abs of the repository's here).
func TestLoadAbsolute(t *testing.T) {
	abs, _ := filepath.Abs(dir)
	if _, err := Load(abs); err != nil {
		t.Fatal(err)
	}
}
