package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsimple"

	"github.com/hadar-sched/hadar/planner/queue"
)

// everyOption is a file with every option of docs/sidecar.md's table set,
// each to a value other than its default.
const everyOption = `
nomad {
  address     = "https://n:4646"
  region      = "eu"
  token_file  = "/t"
  auth_method = "jwt"
  ca_cert     = "/ca"
  client_cert = "/cc"
  client_key  = "/ck"
}
namespaces       = ["a", "b"]
dry_run          = true
policy           = "fifo"
placement        = "pack"
round            = "90s"
profile          = "/p.json"
profile_overlay  = "/o.json"
gpu_types        = { "X" = "x1" }
rack_meta_key    = "row"
min_run_time     = "0s"
max_min_run_time = "3h"
restart_cost     = "1s"
merge_cost       = "2s"
gang_timeout     = "3m"
stop_timeout     = "4m"
learn            = false
learn_warmup     = "5s"
learn_evidence   = "20s"
rendezvous_ports = "30000-30010"
log_level        = "debug"
http {
  address             = "0.0.0.0:1"
  tls_cert            = "/c"
  tls_key             = "/k"
  allow_insecure_http = true
  client_ca           = "/hca"
  auth_token          = "0123456789abcdef"
  nomad_auth          = true
}
state {
  store     = "nomad"
  path      = "/s.db"
  namespace = "ops"
  prefix    = "p"
}
leader {
  enabled    = true
  ttl        = "20s"
  lock_delay = "2s"
  path       = "l"
  namespace  = "ops"
}
storage {
  checkpoint_volume = "v"
  merge_volume      = "m"
  mount_dir         = "/h"
  checkpoint_meta   = "a.b"
  merge_meta        = "c.d"
  kill_timeout      = "45s"
}
queue "q" {
  weight = 2
}
`

// A file with every option decodes each into its group, the groups
// holding nothing else.
func TestEveryOptionLandsInItsGroup(t *testing.T) {
	c, err := ParseConfig("s.hcl", []byte(everyOption))
	if err != nil {
		t.Fatal(err)
	}
	off, two := false, 2.0
	want := Config{
		Cluster: Cluster{Nomad: &NomadConfig{Address: "https://n:4646", Region: "eu", TokenFile: "/t", AuthMethod: "jwt", CACert: "/ca", ClientCert: "/cc", ClientKey: "/ck"},
			Namespaces: []string{"a", "b"}, DryRun: true},
		Scheduling: Scheduling{Policy: "fifo", Placement: "pack", Round: "90s", Profile: "/p.json", ProfileOverlay: "/o.json",
			GPUTypes: map[string]string{"X": "x1"}, RackMetaKey: "row"},
		RunLimits: RunLimits{MinRunTime: "0s", MaxMinRunTime: "3h", RestartCost: "1s", MergeCost: "2s", GangTimeout: "3m", StopTimeout: "4m"},
		Learning:  Learning{Learn: &off, LearnWarmup: "5s", LearnEvidence: "20s"},
		Workers: Workers{RendezvousPorts: "30000-30010", Storage: &StorageConfig{CheckpointVolume: "v", MergeVolume: "m", MountDir: "/h",
			CheckpointMeta: "a.b", MergeMeta: "c.d", KillTimeout: "45s"}},
		Service: Service{HTTP: &HTTPConfig{Address: "0.0.0.0:1", TLSCert: "/c", TLSKey: "/k", AllowInsecureHTTP: true, ClientCA: "/hca",
			AuthToken: "0123456789abcdef", NomadAuth: true},
			State:    &StateConfig{Store: "nomad", Path: "/s.db", Namespace: "ops", Prefix: "p"},
			Leader:   &LeaderConfig{Enabled: true, TTL: "20s", LockDelay: "2s", Path: "l", Namespace: "ops"},
			LogLevel: "debug"},
		TeamQueues: TeamQueues{Queues: []queue.Block{{Name: "q", Weight: &two}}},
	}
	for _, g := range []struct {
		name      string
		got, want any
	}{
		{"Cluster", c.Cluster, want.Cluster}, {"Scheduling", c.Scheduling, want.Scheduling}, {"RunLimits", c.RunLimits, want.RunLimits},
		{"Learning", c.Learning, want.Learning}, {"Workers", c.Workers, want.Workers}, {"Service", c.Service, want.Service},
		{"TeamQueues", c.TeamQueues, want.TeamQueues},
	} {
		if !reflect.DeepEqual(g.got, g.want) {
			t.Errorf("%s = %+v, want %+v", g.name, g.got, g.want)
		}
	}
	// Every option of the docs' table is in the file.
	for _, p := range hclPaths(reflect.TypeFor[Config](), "") {
		name := p[strings.LastIndex(p, ".")+1:]
		if !strings.Contains(everyOption, name+" ") && !strings.Contains(everyOption, name+"\n") {
			t.Errorf("option %s is not in the test's file", p)
		}
	}
	if _, err := c.Resolve(); err != nil {
		t.Errorf("the file does not resolve: %v", err)
	}
}

// flatConfig is a struct type with every hcl-tagged field of Config's
// groups as its own: what Config was before its fields were grouped, the
// struct hclsimple decodes into in one go.
func flatConfig() reflect.Type {
	var fields []reflect.StructField
	for _, g := range reflect.VisibleFields(reflect.TypeFor[Config]()) {
		if len(g.Index) == 2 && g.Tag.Get("hcl") != "" {
			fields = append(fields, reflect.StructField{Name: g.Name, Type: g.Type, Tag: g.Tag})
		}
	}
	return reflect.StructOf(fields)
}

// What is not an option is refused as gohcl refuses it in one struct,
// naming the file, the line and the attribute or block; and every other
// error is the one gohcl gives for the flat struct, first diagnostic
// first.
func TestUnknownOptionRefused(t *testing.T) {
	flat := flatConfig()
	for _, tc := range []struct{ path, src, want string }{
		{"s.hcl", "policy = \"fifo\"\npolicee = \"fifo\"\n", `s.hcl:2,1-8: Unsupported argument; An argument named "policee" is not expected here.`},
		{"s.hcl", "learn = true\nfoo = 1\n", `s.hcl:2,1-4: Unsupported argument; An argument named "foo" is not expected here.`},
		{"s.hcl", "bogus {\n}\n", `s.hcl:1,1-6: Unsupported block type; Blocks of type "bogus" are not expected here.`},
		{"s.hcl", "nomad {\n adress = \"x\"\n}\n", `s.hcl:2,2-8: Unsupported argument; An argument named "adress" is not expected here. Did you mean "address"?`},
		{"s.json", `{"policy": "fifo", "nope": 1}`, `s.json:1,20-26: Extraneous JSON object property; No argument or block type is named "nope".`},
		{"s.hcl", "round = [\"6m\"]\nfoo = 1\n", ""},
		{"s.hcl", "nomad {\n}\nnomad {\n}\n", ""},
		{"s.hcl", "learn = \"maybe\"\nround = 3\n", ""},
		{"s.hcl", "queue {\n}\n", ""},
		{"s.hcl", "policy = \n", ""},
		{"s.yaml", "policy: fifo\n", ""},
		{"s.json", `{"round": ["6m"], "queue": {"q": {"weight": "x"}}}`, ""},
		{"s.json", `{"nomad": [{"address": 1}, {"address": 2}]}`, ""},
	} {
		_, err := ParseConfig(tc.path, []byte(tc.src))
		if err == nil {
			t.Errorf("%s %q: no error", tc.path, tc.src)
			continue
		}
		if tc.want != "" && err.Error() != "sidecar config: "+tc.want {
			t.Errorf("%s %q:\n got %v\nwant sidecar config: %s", tc.path, tc.src, err, tc.want)
		}
		werr := hclsimple.Decode(tc.path, []byte(tc.src), nil, reflect.New(flat).Interface())
		if werr == nil || err.Error() != "sidecar config: "+werr.Error() {
			t.Errorf("%s %q:\n got %v\nwant gohcl's for one struct, %v", tc.path, tc.src, err, werr)
		}
	}
}
