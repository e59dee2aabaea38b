package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	// Every block is optional; values reach the settings.
	c, err := ParseConfig("s.hcl", []byte(`
policy    = "hadar"
round     = "90s"
gpu_types = { "NVIDIA RTX A6000" = "a6000" }
leader {
  enabled = true
  ttl     = "20s"
}
state {
  store = "nomad"
}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.Policy != "hadar" || s.Round.Duration() != 90*time.Second || s.GPUTypes["NVIDIA RTX A6000"] != "a6000" || !s.Leader.Enabled ||
		s.Leader.TTL.Duration() != 20*time.Second || s.Leader.LockDelay.Duration() != DefaultLeaderTTL || s.State.Store != "nomad" || s.HTTP.Address != DefaultHTTPAddress {
		t.Fatalf("settings %+v", s)
	}
	// An empty file is the defaults.
	c, err = ParseConfig("empty.hcl", nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = c.Resolve(); err != nil || s.Policy != DefaultPolicy || s.State.Store != "file" || s.RendezvousPorts != "29500-31999" {
		t.Fatalf("defaults %+v, %v", s, err)
	}
	// With an election and no store named, the replicas share Nomad
	// Variables.
	c, _ = ParseConfig("ha.hcl", []byte("leader {\n  enabled = true\n}\n"))
	if s, err = c.Resolve(); err != nil || s.State.Store != "nomad" {
		t.Fatalf("leader without a store: %q, %v; want the shared \"nomad\" store", s.State.Store, err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`policy = "fastest"`, "policy"},
		{`policy = "sia:fast"`, `policy "sia:fast": unknown Sia switch "fast"`},
		{`queue "a" { policy = "hadar:nope" }`, `queue "a": policy "hadar:nope": unknown Hadar switch "nope"`},
		{`placement = "anywhere"`, "placement"},
		{`round = "6"`, "round"},
		{`round = "0s"`, "round"},
		{`gang_timeout = "-1s"`, "gang_timeout"},
		{`learn_warmup = "60"`, "learn_warmup"},
		{`learn_warmup = "0s"`, "learn_warmup"},
		{`learn_evidence = "500ms"`, "learn_evidence"},
		{`learn_evidence = "1000h"`, "learn_evidence"},
		{`rendezvous_ports = "80-90"`, "rendezvous_ports"},
		{`rendezvous_ports = "30000"`, "rendezvous_ports"},
		{`gpu_types = { "X" = "V100" }`, "gpu_types"},
		{`log_level = "loud"`, "log_level"},
		{"state {\n  store = \"s3\"\n}", "state.store"},
		{"leader {\n  ttl = \"1s\"\n}", "leader.ttl"},
		// A type name hadar.throughput would refuse.
		{`gpu_types = { "NVIDIA A100" = "a100.80g" }`, "gpu_types"},
		// Replicas each with a file of their own would take over from a
		// stale state.
		{"leader {\n  enabled = true\n}\nstate {\n  store = \"file\"\n}", "leader.enabled"},
		{`unknown_field = 1`, "unknown_field"},
		{"storage {\n  checkpoint_volume = \"ck pts\"\n}", "storage.checkpoint_volume"},
		{"storage {\n  merge_meta = \"meta/x\"\n}", "storage.merge_meta"},
		{"storage {\n  checkpoint_volume = \"v\"\n  merge_volume = \"v\"\n}", "storage.checkpoint_volume and storage.merge_volume"},
		{"storage {\n  mount_dir = \"hadar\"\n}", "storage.mount_dir"},
		{"storage {\n  mount_dir = \"/\"\n}", "storage.mount_dir"},
		{"storage {\n  kill_timeout = \"10\"\n}", "storage.kill_timeout"},
		{"storage {\n  kill_timeout = \"2h\"\n}", "storage.kill_timeout"},
		{`policy = `, "s.hcl"},
	} {
		c, err := ParseConfig("s.hcl", []byte(tc.src))
		if err == nil {
			_, err = c.Resolve()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want it to name %q", tc.src, err, tc.want)
		}
	}
}

// FuzzConfig: any bytes as a config file give settings or an error, never
// a panic, and settings that resolve are usable.
func FuzzConfig(f *testing.F) {
	for _, seed := range []string{"", `policy = "hadar"`, "leader {\n  enabled = true\n}\n", `round = "6m"` + "\n" + `rendezvous_ports = "30000-30010"`,
		"state {\n  store = \"none\"\n}\n", `gpu_types = { "a" = "b" }`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		c, err := ParseConfig("f.hcl", src)
		if err != nil {
			return
		}
		s, err := c.Resolve()
		if err != nil {
			return
		}
		lo, hi, ok := s.RendezvousPorts.Bounds()
		if s.Round.Duration() <= 0 || !ok || lo > hi || s.Leader.TTL.Duration() < 10*time.Second || s.HTTP.Address == "" || s.Learn == nil {
			t.Fatalf("resolved settings out of range: %+v", s)
		}
	})
}

// TestLearnTiming: learn_warmup and learn_evidence reach the settings;
// left out, they are the engine's own defaults (60 s and 300 s), so a
// state saved before they existed restores.
func TestLearnTiming(t *testing.T) {
	for _, tc := range []struct {
		src              string
		warmup, evidence time.Duration
	}{
		{"", time.Minute, 5 * time.Minute},
		{`learn_warmup = "5s"`, 5 * time.Second, 5 * time.Minute},
		{"learn_warmup = \"10s\"\nlearn_evidence = \"20s\"", 10 * time.Second, 20 * time.Second},
		{"learn = false\nlearn_evidence = \"2h\"", time.Minute, 2 * time.Hour},
	} {
		c, err := ParseConfig("s.hcl", []byte(tc.src))
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Resolve()
		if err != nil {
			t.Fatalf("%q: %v", tc.src, err)
		}
		if s.LearnWarmup.Duration() != tc.warmup || s.LearnEvidence.Duration() != tc.evidence {
			t.Errorf("%q: warm-up %v, evidence %v; want %v, %v", tc.src, s.LearnWarmup, s.LearnEvidence, tc.warmup, tc.evidence)
		}
	}
}

func TestStorageBlock(t *testing.T) {
	src := `storage {
  checkpoint_volume = "team-ckpt"
  merge_volume      = "team-merge"
  mount_dir         = "/mnt/hadar"
  checkpoint_meta   = "team.ckpt_root"
  merge_meta        = "team.merge_root"
  kill_timeout      = "2m"
}
`
	c, err := ParseConfig("s.hcl", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	want := StorageConfig{CheckpointVolume: "team-ckpt", MergeVolume: "team-merge", MountDir: "/mnt/hadar",
		CheckpointMeta: "team.ckpt_root", MergeMeta: "team.merge_root", KillTimeout: "2m"}
	if s.Storage == nil || *s.Storage != want || s.Storage.KillTimeout.Duration() != 2*time.Minute {
		t.Fatalf("storage %+v; want %+v, a kill timeout of 2m", s.Storage, want)
	}
	// No block: no shared storage. An empty block: shared storage with
	// jobform's defaults.
	s, err = Config{}.Resolve()
	if err != nil || s.Storage != nil {
		t.Fatalf("no storage block: %+v, %v", s.Storage, err)
	}
	if c, err = ParseConfig("s.hcl", []byte("storage {}\n")); err != nil {
		t.Fatal(err)
	}
	if s, err = c.Resolve(); err != nil || s.Storage == nil || *s.Storage != (StorageConfig{}) {
		t.Fatalf("an empty storage block: %+v, %v", s.Storage, err)
	}
}

// max_min_run_time bounds what a job asks for itself: 2h by default, or
// min_run_time when that is longer; never set below min_run_time.
func TestMaxMinRunTime(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want time.Duration
		err  string
	}{
		{"", 2 * time.Hour, ""},
		{`max_min_run_time = "90m"`, 90 * time.Minute, ""},
		{`min_run_time = "3h"`, 3 * time.Hour, ""},
		{"min_run_time = \"1h\"\nmax_min_run_time = \"30m\"", 0, "below min_run_time"},
		{`max_min_run_time = "0s"`, 0, "max_min_run_time"},
	} {
		c, err := ParseConfig("s.hcl", []byte(tc.src))
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Resolve()
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one containing %q", tc.src, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.src, err)
		case tc.err == "" && s.MaxMinRunTime.Duration() != tc.want:
			t.Errorf("%q: max_min_run_time %v, want %v", tc.src, s.MaxMinRunTime, tc.want)
		}
	}
}

// A policy's switches, as hadar sim takes them, are taken by the sidecar
// too: Sia's rigid mode, a fairness exponent, a Hadar ablation.
func TestConfigTakesPolicySwitches(t *testing.T) {
	for _, p := range []string{"sia:rigid", "sia:p1", "hadar:h8", "hadare"} {
		c, err := ParseConfig("s.hcl", []byte(fmt.Sprintf("policy = %q\nqueue \"a\" { policy = %q }\n", p, p)))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if _, err := c.Resolve(); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
}
