package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2/hclsimple"
)

// An explicit min_run_time of 0 is none and stays 0 through the defaults;
// left out, it is the default. The cap's default follows either.
func TestMinRunTimeZeroIsKept(t *testing.T) {
	for _, tc := range []struct {
		path, src   string
		want, limit time.Duration
	}{
		{"s.hcl", `min_run_time = "0s"`, 0, DefaultMaxMinRunTime},
		{"s.hcl", `min_run_time = "0"`, 0, DefaultMaxMinRunTime},
		{"s.json", `{"min_run_time": "0s"}`, 0, DefaultMaxMinRunTime},
		{"s.hcl", ``, DefaultMinRunTime, DefaultMaxMinRunTime},
		{"s.json", `{}`, DefaultMinRunTime, DefaultMaxMinRunTime},
		{"s.hcl", `min_run_time = "3h"`, 3 * time.Hour, 3 * time.Hour},
	} {
		c, err := ParseConfig(tc.path, []byte(tc.src))
		if err != nil {
			t.Fatalf("%s %q: %v", tc.path, tc.src, err)
		}
		s, err := c.Resolve()
		if err != nil {
			t.Fatalf("%s %q: %v", tc.path, tc.src, err)
		}
		if got := s.MinRunTime.Duration(); got != tc.want || s.MinRunTime == "" {
			t.Errorf("%s %q: min_run_time %q (%v), want %v", tc.path, tc.src, s.MinRunTime, got, tc.want)
		}
		if got := s.MaxMinRunTime.Duration(); got != tc.limit {
			t.Errorf("%s %q: max_min_run_time %v, want %v", tc.path, tc.src, got, tc.limit)
		}
	}
	// Built in code rather than decoded, the same holds.
	s, err := Config{RunLimits: RunLimits{MinRunTime: "0s"}}.Resolve()
	if err != nil || s.MinRunTime.Duration() != 0 || s.MinRunTime != "0s" {
		t.Fatalf("Config{MinRunTime: 0s}: %q, %v", s.MinRunTime, err)
	}
}

// optionRows are every option of the file, each with a value other than
// its default and where it lands in Config: TestEveryOptionDecodes fails
// when an option stops decoding, and TestOptionRowsCoverConfig when a
// field of Config has no row.
var optionRows = []struct {
	name, src string
	get       func(Config) any
	want      any
}{
	{"nomad.address", "nomad {\n address = \"https://n:4646\"\n}", func(c Config) any { return c.Nomad.Address }, "https://n:4646"},
	{"nomad.region", "nomad {\n region = \"eu\"\n}", func(c Config) any { return c.Nomad.Region }, "eu"},
	{"nomad.token", "nomad {\n token = \"tok\"\n}", func(c Config) any { return c.Nomad.Token }, "tok"},
	{"nomad.token_file", "nomad {\n token_file = \"/t\"\n}", func(c Config) any { return c.Nomad.TokenFile }, "/t"},
	{"nomad.auth_method", "nomad {\n auth_method = \"jwt\"\n}", func(c Config) any { return c.Nomad.AuthMethod }, "jwt"},
	{"nomad.ca_cert", "nomad {\n ca_cert = \"/ca\"\n}", func(c Config) any { return c.Nomad.CACert }, "/ca"},
	{"nomad.client_cert", "nomad {\n client_cert = \"/cc\"\n}", func(c Config) any { return c.Nomad.ClientCert }, "/cc"},
	{"nomad.client_key", "nomad {\n client_key = \"/ck\"\n}", func(c Config) any { return c.Nomad.ClientKey }, "/ck"},
	{"namespaces", `namespaces = ["a", "b"]`, func(c Config) any { return c.Namespaces }, []string{"a", "b"}},
	{"policy", `policy = "fifo"`, func(c Config) any { return c.Policy }, "fifo"},
	{"placement", `placement = "pack"`, func(c Config) any { return c.Placement }, "pack"},
	{"round", `round = "90s"`, func(c Config) any { return c.Round }, Duration("90s")},
	{"profile", `profile = "/p.json"`, func(c Config) any { return c.Profile }, "/p.json"},
	{"profile_overlay", `profile_overlay = "/o.json"`, func(c Config) any { return c.ProfileOverlay }, "/o.json"},
	{"gpu_types", `gpu_types = { "X" = "x1" }`, func(c Config) any { return c.GPUTypes }, map[string]string{"X": "x1"}},
	{"rack_meta_key", `rack_meta_key = "row"`, func(c Config) any { return c.RackMetaKey }, "row"},
	{"min_run_time", `min_run_time = "0s"`, func(c Config) any { return c.MinRunTime }, Duration("0s")},
	{"max_min_run_time", `max_min_run_time = "3h"`, func(c Config) any { return c.MaxMinRunTime }, Duration("3h")},
	{"restart_cost", `restart_cost = "0s"`, func(c Config) any { return c.RestartCost }, Duration("0s")},
	{"merge_cost", `merge_cost = "1s"`, func(c Config) any { return c.MergeCost }, Duration("1s")},
	{"gang_timeout", `gang_timeout = "3m"`, func(c Config) any { return c.GangTimeout }, Duration("3m")},
	{"stop_timeout", `stop_timeout = "4m"`, func(c Config) any { return c.StopTimeout }, Duration("4m")},
	{"learn", `learn = false`, func(c Config) any { return c.Learn != nil && !*c.Learn }, true},
	{"learn_warmup", `learn_warmup = "5s"`, func(c Config) any { return c.LearnWarmup }, Duration("5s")},
	{"learn_evidence", `learn_evidence = "20s"`, func(c Config) any { return c.LearnEvidence }, Duration("20s")},
	{"rendezvous_ports", `rendezvous_ports = "30000-30010"`, func(c Config) any { return c.RendezvousPorts }, PortRange("30000-30010")},
	{"http.address", "http {\n address = \"0.0.0.0:1\"\n}", func(c Config) any { return c.HTTP.Address }, "0.0.0.0:1"},
	{"http.tls_cert", "http {\n tls_cert = \"/c\"\n}", func(c Config) any { return c.HTTP.TLSCert }, "/c"},
	{"http.tls_key", "http {\n tls_key = \"/k\"\n}", func(c Config) any { return c.HTTP.TLSKey }, "/k"},
	{"http.allow_insecure_http", "http {\n allow_insecure_http = true\n}", func(c Config) any { return c.HTTP.AllowInsecureHTTP }, true},
	{"http.client_ca", "http {\n client_ca = \"/ca\"\n}", func(c Config) any { return c.HTTP.ClientCA }, "/ca"},
	{"http.auth_token", "http {\n auth_token = \"t\"\n}", func(c Config) any { return c.HTTP.AuthToken }, "t"},
	{"http.nomad_auth", "http {\n nomad_auth = true\n}", func(c Config) any { return c.HTTP.NomadAuth }, true},
	{"state.store", "state {\n store = \"none\"\n}", func(c Config) any { return c.State.Store }, "none"},
	{"state.path", "state {\n path = \"/s.db\"\n}", func(c Config) any { return c.State.Path }, "/s.db"},
	{"state.namespace", "state {\n namespace = \"ops\"\n}", func(c Config) any { return c.State.Namespace }, "ops"},
	{"state.prefix", "state {\n prefix = \"p\"\n}", func(c Config) any { return c.State.Prefix }, "p"},
	{"leader.enabled", "leader {\n enabled = true\n}", func(c Config) any { return c.Leader.Enabled }, true},
	{"leader.ttl", "leader {\n ttl = \"20s\"\n}", func(c Config) any { return c.Leader.TTL }, Duration("20s")},
	{"leader.lock_delay", "leader {\n lock_delay = \"2s\"\n}", func(c Config) any { return c.Leader.LockDelay }, Duration("2s")},
	{"leader.path", "leader {\n path = \"l\"\n}", func(c Config) any { return c.Leader.Path }, "l"},
	{"leader.namespace", "leader {\n namespace = \"ops\"\n}", func(c Config) any { return c.Leader.Namespace }, "ops"},
	{"dry_run", `dry_run = true`, func(c Config) any { return c.DryRun }, true},
	{"log_level", `log_level = "debug"`, func(c Config) any { return c.LogLevel }, "debug"},
	{"queue", "queue \"q\" {\n weight = 2\n}", func(c Config) any { return len(c.Queues) == 1 && c.Queues[0].Name == "q" }, true},
	{"storage", "storage {}", func(c Config) any { return c.Storage != nil }, true},
	{"storage.checkpoint_volume", "storage {\n checkpoint_volume = \"v\"\n}", func(c Config) any { return c.Storage.CheckpointVolume }, "v"},
	{"storage.merge_volume", "storage {\n merge_volume = \"m\"\n}", func(c Config) any { return c.Storage.MergeVolume }, "m"},
	{"storage.mount_dir", "storage {\n mount_dir = \"/h\"\n}", func(c Config) any { return c.Storage.MountDir }, "/h"},
	{"storage.checkpoint_meta", "storage {\n checkpoint_meta = \"a.b\"\n}", func(c Config) any { return c.Storage.CheckpointMeta }, "a.b"},
	{"storage.merge_meta", "storage {\n merge_meta = \"c.d\"\n}", func(c Config) any { return c.Storage.MergeMeta }, "c.d"},
	{"storage.kill_timeout", "storage {\n kill_timeout = \"45s\"\n}", func(c Config) any { return c.Storage.KillTimeout }, Duration("45s")},
}

// Every option decodes from the file into its field, and survives the
// defaults (a value given is never replaced by one).
func TestEveryOptionDecodes(t *testing.T) {
	for _, r := range optionRows {
		t.Run(r.name, func(t *testing.T) {
			c, err := ParseConfig("s.hcl", []byte(r.src+"\n"))
			if err != nil {
				t.Fatalf("%q: %v", r.src, err)
			}
			if got := r.get(c); !reflect.DeepEqual(got, r.want) {
				t.Fatalf("%q decoded to %#v, want %#v", r.src, got, r.want)
			}
			c.Default()
			if got := r.get(c); !reflect.DeepEqual(got, r.want) {
				t.Fatalf("%q: the defaults changed it to %#v, want %#v", r.src, got, r.want)
			}
		})
	}
}

// hclPaths are the options Config decodes, by their hcl tags: nested
// blocks' fields as block.field, the queue block (planner/queue's schema)
// as one, and the fields of Config's embedded groups as Config's own.
func hclPaths(ty reflect.Type, prefix string) []string {
	var out []string
	for i := range ty.NumField() {
		f := ty.Field(i)
		name, kind, _ := strings.Cut(f.Tag.Get("hcl"), ",")
		if f.Anonymous && f.Tag.Get("hcl") == "" && f.Type.Kind() == reflect.Struct {
			out = append(out, hclPaths(f.Type, prefix)...)
			continue
		}
		if name == "" {
			continue
		}
		out = append(out, prefix+name)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if kind == "block" && ft.Kind() == reflect.Struct {
			out = append(out, hclPaths(ft, prefix+name+".")...)
		}
	}
	return out
}

// The rows cover every option Config has, and only those.
func TestOptionRowsCoverConfig(t *testing.T) {
	var rows []string
	for _, r := range optionRows {
		rows = append(rows, r.name)
	}
	paths := hclPaths(reflect.TypeFor[Config](), "")
	for _, p := range paths {
		// A block's own row is needed only where its presence means
		// something (storage, queue); its fields have rows.
		if !slices.Contains(rows, p) && !slices.Contains([]string{"nomad", "http", "state", "leader"}, p) {
			t.Errorf("option %s has no row in optionRows", p)
		}
	}
	for _, r := range rows {
		if !slices.Contains(paths, r) {
			t.Errorf("row %s is no option of Config", r)
		}
	}
}

// docs/sidecar.md's options are Config's: every name its configuration
// table lists is an option, and its HCL examples decode and resolve.
func TestDocumentedOptionsDecode(t *testing.T) {
	doc, err := os.ReadFile("../../docs/sidecar.md")
	if err != nil {
		t.Fatal(err)
	}
	paths := hclPaths(reflect.TypeFor[Config](), "")
	text := string(doc)
	start := strings.Index(text, "## Configuration")
	end := strings.Index(text[start:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("docs/sidecar.md has no Configuration section")
	}
	// The table's first column: `round`, `restart_cost`, `merge_cost`,
	// `storage { ... }`, `queue "NAME" { ... }`.
	row := regexp.MustCompile("(?m)^\\| (`[^|]*`) \\|")
	name := regexp.MustCompile("`([a-z_.]+)[^`]*`")
	n := 0
	for _, m := range row.FindAllStringSubmatch(text[start:start+end], -1) {
		for _, f := range name.FindAllStringSubmatch(m[1], -1) {
			n++
			if !slices.Contains(paths, f[1]) {
				t.Errorf("docs/sidecar.md documents %s: no option of Config", f[1])
			}
		}
	}
	if n < 40 {
		t.Errorf("read %d options from docs/sidecar.md's table: the table's format changed?", n)
	}
	blocks := regexp.MustCompile("(?s)```hcl\n(.*?)```").FindAllStringSubmatch(text, -1)
	if len(blocks) < 2 {
		t.Fatalf("docs/sidecar.md has %d HCL examples, want the configuration's and the leader's", len(blocks))
	}
	for _, b := range blocks {
		c, err := ParseConfig("sidecar.md.hcl", []byte(b[1]))
		if err == nil {
			_, err = c.Resolve()
		}
		if err != nil {
			t.Errorf("an example of docs/sidecar.md: %v", err)
		}
	}
}

// A bad value's error names the field, says what is wanted, and wraps
// what the decoder said.
func TestBadValueErrorNamesTheField(t *testing.T) {
	for _, tc := range []struct{ src, field string }{
		{`min_run_time = "-1s"`, "min_run_time"},
		{`min_run_time = "soon"`, "min_run_time"},
		{`max_min_run_time = "1000h"`, "max_min_run_time"},
		{`restart_cost = "x"`, "restart_cost"},
		{`merge_cost = "-2s"`, "merge_cost"},
		{`stop_timeout = "0s"`, "stop_timeout"},
		{"leader {\n lock_delay = \"25h\"\n}", "leader.lock_delay"},
		{"nomad {\n auth_method = \"jwt\"\n}", "nomad.auth_method"},
		{"nomad {\n token = \"a\"\n token_file = \"/b\"\n}", "nomad.token"},
		{"http {\n client_ca = \"/ca\"\n}", "http.client_ca"},
		{"http {\n auth_token = \"short\"\n}", "http.auth_token"},
	} {
		c, err := ParseConfig("s.hcl", []byte(tc.src))
		if err == nil {
			_, err = c.Resolve()
		}
		if err == nil || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), "want") && !strings.Contains(err.Error(), "needs") && !strings.Contains(err.Error(), "keep one") {
			t.Errorf("%q: err = %v, want it to name %s and the fix", tc.src, err, tc.field)
		}
	}
	// A value of the wrong type fails in the decoder, which names the
	// file and the place in it (hclsimple's error decoding round's group,
	// Scheduling, alone).
	_, err := ParseConfig("s.hcl", []byte(`round = ["6m"]`))
	if err == nil || !strings.Contains(err.Error(), "sidecar config: s.hcl:1,9") {
		t.Errorf("a list for round: %v", err)
	}
	if err2 := hclsimple.Decode("s.hcl", []byte(`round = ["6m"]`), nil, &Scheduling{}); err2 == nil || !strings.Contains(err.Error(), err2.Error()) {
		t.Errorf("the decoder's error %v is not wrapped in %v", err2, err)
	}
}

// Resolve leaves the Config it was given as it was, blocks included.
func TestResolveKeepsItsInput(t *testing.T) {
	in := Config{Service: Service{HTTP: &HTTPConfig{}, State: &StateConfig{Store: "none"}}}
	s, err := in.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if in.HTTP.Address != "" || in.State.Path != "" || in.Nomad != nil || in.Round != "" {
		t.Fatalf("Resolve changed its input: %+v, http %+v, state %+v", in, in.HTTP, in.State)
	}
	if s.HTTP.Address != DefaultHTTPAddress || s.State.Path != DefaultStatePath || s.Nomad == nil {
		t.Fatalf("resolved %+v", s)
	}
}

// TestValidateBeforeDefault: a caller that skips Default gets an error
// naming the fix, not a nil dereference.
func TestValidateBeforeDefault(t *testing.T) {
	var c Config
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "call Default") {
		t.Fatalf("Validate of a raw Config: %v; want an error saying to call Default", err)
	}
}
