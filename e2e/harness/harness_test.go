package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNomadVersionPinned keeps NomadVersion and the wrapper module in
// step: bin/nomad is rebuilt by version, and the module decides what is
// built.
func TestNomadVersionPinned(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "e2e", "tools", "nomad", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "github.com/hashicorp/nomad v" + NomadVersion + "\n"; !strings.Contains(string(b), want) {
		t.Fatalf("e2e/tools/nomad/go.mod does not require %q", strings.TrimSpace(want))
	}
	mk, err := os.ReadFile(filepath.Join(root, "GNUmakefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "NOMAD_VERSION := "+NomadVersion+"\n") {
		t.Fatalf("GNUmakefile's NOMAD_VERSION is not %s", NomadVersion)
	}
}

func TestAgentConfig(t *testing.T) {
	tests := []struct {
		name    string
		meta    map[string]string
		plugins map[string]string
		mode    Mode
		servers []string
		want    []string
		notWant []string
	}{
		{
			name: "plugins and meta",
			meta: map[string]string{"rack": "r1"},
			plugins: map[string]string{
				"hadar-train": `checkpoint_root = "/ck"`,
				"hadar-gpu":   `gpu { id = "g0" }`,
			},
			want: []string{
				"ports {\n  http = 1\n  rpc  = 2\n  serf = 3\n}",
				`"fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"`,
				`"driver.denylist"      = "docker,java,qemu"`,
				"meta {\n    \"rack\" = \"r1\"\n  }",
				"plugin \"hadar-gpu\" {\n  config {\ngpu { id = \"g0\" }\n  }\n}\nplugin \"hadar-train\"",
				"disable_update_check = true",
			},
		},
		{
			name:    "no plugins",
			want:    []string{`name = "n"`},
			notWant: []string{"plugin \"", "meta {", "server {"},
		},
		{
			name: "persistent",
			mode: ModePersistent,
			want: []string{"server {\n  enabled          = true\n  bootstrap_expect = 1\n}", "  enabled           = true\n  network_interface = \"lo\"", "advertise {"},
		},
		{
			name:    "server only",
			mode:    ModeServer,
			plugins: map[string]string{"hadar-gpu": ""},
			want:    []string{"server {\n  enabled          = true"},
			notWant: []string{"client {", "plugin \""},
		},
		{
			name:    "client joining",
			mode:    ModeClient,
			servers: []string{"127.0.0.1:9", "127.0.0.1:10"},
			want:    []string{`servers           = ["127.0.0.1:9", "127.0.0.1:10"]`, "advertise {"},
			notWant: []string{"server {"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AgentConfig(Options{Name: "n", Mode: tc.mode, Servers: tc.servers, Meta: tc.meta, Plugins: tc.plugins}, 1, 2, 3)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("config lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(got, w) {
					t.Errorf("config has %q:\n%s", w, got)
				}
			}
		})
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: want 5 distinct", ports)
		}
		seen[p] = true
	}
}
