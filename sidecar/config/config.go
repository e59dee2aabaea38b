// Package config is the sidecar's configuration: the HCL file and its
// defaults, checked field by field (docs/sidecar.md lists every field).
package config

import (
	"fmt"
	"math"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hclsimple"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
)

// Config is the sidecar's configuration (docs/sidecar.md lists every
// field with its default). The Nomad connection also follows Nomad's own
// environment variables: NOMAD_ADDR, NOMAD_TOKEN, NOMAD_REGION,
// NOMAD_NAMESPACE, NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY; a
// value in the file wins over the environment.
type Config struct {
	Nomad NomadConfig `hcl:"nomad,block"`
	// (Blocks are optional in the file: LoadConfig decodes through
	// fileConfig.)
	// Namespaces watched for managed jobs; ["*"] is every namespace.
	Namespaces []string `hcl:"namespaces,optional"`
	// Policy is the scheduler: one of `hadar policies`.
	Policy string `hcl:"policy,optional"`
	// Placement is the placement policy (docs/placement.md).
	Placement string `hcl:"placement,optional"`
	// Round is the round length.
	Round string `hcl:"round,optional"`
	// Profile is a throughput profile file (Gavel JSON or hadar's);
	// empty: Gavel's measured throughputs, embedded.
	Profile string `hcl:"profile,optional"`
	// ProfileOverlay is a profile file laid over Profile (figures and
	// relative speeds of GPU types, docs/formats.md "Overlays"), reloaded
	// when it changes; empty: none.
	ProfileOverlay string `hcl:"profile_overlay,optional"`
	// GPUTypes maps a device model (the device group name, what
	// ${device.model} matches) to the planner's GPU type name, for models
	// the built-in rules do not recognise.
	GPUTypes map[string]string `hcl:"gpu_types,optional"`
	// RackMetaKey is the node meta key naming a node's rack.
	RackMetaKey string `hcl:"rack_meta_key,optional"`
	// MinRunTime is the least time a job runs before it may be preempted
	// (a job's hadar.min_run_time overrides it).
	MinRunTime string `hcl:"min_run_time,optional"`
	// MaxMinRunTime caps the minimum run time a job asks for itself
	// (hadar.min_run_time): the author sets it, the operator bounds it,
	// or one job could opt out of time-slicing and every preemption but
	// reclaim. A queue's max_min_run_time may cap its jobs lower.
	MaxMinRunTime string `hcl:"max_min_run_time,optional"`
	// RestartCost is what a (re)start costs a job: checkpoint restore and
	// warm-up. The schedulers weigh moves with it.
	RestartCost string `hcl:"restart_cost,optional"`
	// MergeCost is what each HadarE copy spends merging per round.
	MergeCost string `hcl:"merge_cost,optional"`
	// GangTimeout bounds how long a started unit may have workers placed
	// while others are not: then all of it is rolled back.
	GangTimeout string `hcl:"gang_timeout,optional"`
	// StopTimeout bounds the wait for evicted workers to checkpoint and end
	// before their GPUs go to the next job.
	StopTimeout string `hcl:"stop_timeout,optional"`
	// Learn turns on online learning of throughputs from progress.
	Learn *bool `hcl:"learn,optional"`
	// LearnWarmup is the time after a (re)start whose progress is not
	// learned from (checkpoint restore and warm-up).
	LearnWarmup string `hcl:"learn_warmup,optional"`
	// LearnEvidence is the observed running a (model, width, GPU type)
	// needs before what was measured corrects a profile figure; a key no
	// profile has takes its measured rate after the lesser of this and 60s.
	LearnEvidence string `hcl:"learn_evidence,optional"`
	// RendezvousPorts is the range MASTER_PORT is taken from, "LOW-HIGH".
	RendezvousPorts string `hcl:"rendezvous_ports,optional"`
	// HTTP is the status API's listener.
	HTTP HTTPConfig `hcl:"http,block"`
	// State is where the sidecar keeps what must outlive a restart.
	State StateConfig `hcl:"state,block"`
	// Leader runs several replicas with one acting.
	Leader LeaderConfig `hcl:"leader,block"`
	// DryRun plans and serves the plan without writing anything to Nomad.
	DryRun bool `hcl:"dry_run,optional"`
	// LogLevel is hclog's: trace, debug, info, warn, error.
	LogLevel string `hcl:"log_level,optional"`
	// Queues are the teams sharing the fleet (docs/queues.md): none, no
	// queues (one policy over every job).
	Queues []queue.Block `hcl:"queue,block"`
	// Storage is where workers on Nomad's own task drivers (exec, docker,
	// raw_exec) find checkpoint and merge storage, and how long they get
	// to checkpoint (docs/pytorch.md, "Which task driver"); nil: no
	// shared storage (checkpoints in the allocation, lost on a move).
	Storage *StorageConfig `hcl:"storage,block"`
}

// StorageConfig says where the sidecar's generated tasks on Nomad's own
// task drivers find shared storage (hadar-train tasks use the plugin's
// checkpoint_root and merge_root instead). Empty fields keep the defaults
// of sidecar/jobform.
type StorageConfig struct {
	// CheckpointVolume and MergeVolume are client host volumes (the same
	// shared storage on every node) mounted into tasks of drivers that
	// mount volumes, under MountDir.
	CheckpointVolume string `hcl:"checkpoint_volume,optional"`
	MergeVolume      string `hcl:"merge_volume,optional"`
	MountDir         string `hcl:"mount_dir,optional"`
	// CheckpointMeta and MergeMeta are node meta keys holding the host
	// paths of that storage, for raw_exec tasks (which see the host).
	CheckpointMeta string `hcl:"checkpoint_meta,optional"`
	MergeMeta      string `hcl:"merge_meta,optional"`
	// KillTimeout is the least kill_timeout of a generated task: the time
	// a stopped worker has to checkpoint.
	KillTimeout string `hcl:"kill_timeout,optional"`
}

// NomadConfig is the connection to Nomad.
type NomadConfig struct {
	// Address is Nomad's HTTP API, or the Task API's socket
	// (unix://<secrets dir>/api.sock) for a sidecar deployed as a job.
	Address string `hcl:"address,optional"`
	Region  string `hcl:"region,optional"`
	Token   string `hcl:"token,optional"`
	// TokenFile holds the token instead, read on every request: a
	// workload identity's token, which Nomad rewrites when it renews it
	// (docs/deploy.md).
	TokenFile string `hcl:"token_file,optional"`
	// AuthMethod, with TokenFile, logs in to this Nomad JWT auth method
	// with the workload identity and uses the ACL token it gives: Nomad up
	// to 1.11.3 refuses a workload identity for planning a job
	// (docs/deploy.md, "The auth method").
	AuthMethod string `hcl:"auth_method,optional"`
	CACert     string `hcl:"ca_cert,optional"`
	ClientCert string `hcl:"client_cert,optional"`
	ClientKey  string `hcl:"client_key,optional"`
}

// StateConfig is the sidecar's state store.
type StateConfig struct {
	// Store is "file" (a local bbolt file, the default), "nomad" (Nomad
	// Variables, for a sidecar without a local disk) or "none" (nothing
	// kept: a restart rebuilds from Nomad alone).
	Store string `hcl:"store,optional"`
	// Path is the file for "file".
	Path string `hcl:"path,optional"`
	// Namespace and Prefix place the variables for "nomad".
	Namespace string `hcl:"namespace,optional"`
	Prefix    string `hcl:"prefix,optional"`
}

// LeaderConfig is leader election among sidecar replicas.
type LeaderConfig struct {
	// Enabled: the sidecar acts only while it holds the lock; without it,
	// a single replica acts (never run two then).
	Enabled bool `hcl:"enabled,optional"`
	// TTL and LockDelay of the lock (10s..24h; 15s and 15s).
	TTL       string `hcl:"ttl,optional"`
	LockDelay string `hcl:"lock_delay,optional"`
	// Path is the Nomad variable (or Consul key, with CONSUL_HTTP_ADDR
	// set) of the lock; Namespace the Nomad namespace of the variable.
	Path      string `hcl:"path,optional"`
	Namespace string `hcl:"namespace,optional"`
}

// HTTPConfig is the status API listener.
type HTTPConfig struct {
	// Address is host:port; loopback by default. Any other address needs
	// TLS (TLSCert and TLSKey) or AllowInsecureHTTP.
	Address string `hcl:"address,optional"`
	// TLSCert and TLSKey are PEM files; with both the listener serves
	// HTTPS (TLS 1.2 or later).
	TLSCert string `hcl:"tls_cert,optional"`
	TLSKey  string `hcl:"tls_key,optional"`
	// AllowInsecureHTTP serves plain HTTP beyond loopback: an operator's
	// explicit choice (a private network, or a proxy in front).
	AllowInsecureHTTP bool `hcl:"allow_insecure_http,optional"`
	// Authentication of the status API's callers (docs/status.md,
	// "Authentication"); with none of these set, every caller that reaches
	// the listener sees everything (loopback by default).
	// ClientCA is a PEM bundle: callers presenting a certificate it signed
	// (mutual TLS; needs TLSCert) see everything.
	ClientCA string `hcl:"client_ca,optional"`
	// AuthToken is a bearer token (Authorization: Bearer <token>) whose
	// holder sees everything.
	AuthToken string `hcl:"auth_token,optional"`
	// NomadAuth accepts Nomad ACL tokens (Authorization: Bearer, or
	// X-Nomad-Token): Nomad must know the token, and its holder sees the
	// jobs of the namespaces it may read in Nomad, and the cluster's nodes
	// only with node read.
	NomadAuth bool `hcl:"nomad_auth,optional"`
}

// Defaults.
const (
	DefaultPolicy      = "hadar"
	DefaultPlacement   = placement.Delay
	DefaultRound       = 6 * time.Minute
	DefaultRackMetaKey = "rack"
	DefaultMinRunTime  = 30 * time.Minute
	// DefaultMaxMinRunTime is max_min_run_time when unset, or min_run_time
	// when that is longer.
	DefaultMaxMinRunTime   = 2 * time.Hour
	DefaultRestartCost     = 20 * time.Second
	DefaultMergeCost       = 10 * time.Second
	DefaultGangTimeout     = 2 * time.Minute
	DefaultStopTimeout     = 2 * time.Minute
	DefaultLearnWarmup     = time.Minute
	DefaultLearnEvidence   = 5 * time.Minute
	DefaultRendezvousPorts = "29500-31999"
	DefaultHTTPAddress     = "127.0.0.1:4650"
	DefaultStatePath       = "/var/lib/hadar/sidecar.db"
	DefaultStatePrefix     = "hadar/sidecar"
	DefaultLeaderPath      = "hadar/sidecar/leader"
	DefaultLeaderTTL       = 15 * time.Second
	DefaultLogLevel        = "info"
)

// Settings is a Config with defaults applied and values parsed.
type Settings struct {
	Config
	RoundD, MinRunTimeD, RestartCostD, MergeCostD, GangTimeoutD, StopTimeoutD time.Duration
	// MaxMinRunTimeD is MaxMinRunTime parsed (the default when empty).
	MaxMinRunTimeD time.Duration
	LearnOn        bool
	// LearnWarmupD and LearnEvidenceD are LearnWarmup and LearnEvidence
	// parsed (the defaults when empty).
	LearnWarmupD, LearnEvidenceD time.Duration
	PortLow, PortHigh            int
	LeaderTTL, LeaderDelay       time.Duration
	// QueueConfig is Queues resolved (no queue: queues are off).
	QueueConfig queue.Config
	// StorageKillTimeoutD is Storage.KillTimeout parsed (0: the default).
	StorageKillTimeoutD time.Duration
}

// fileConfig is Config as a file holds it: every block optional.
type fileConfig struct {
	Nomad           *NomadConfig      `hcl:"nomad,block"`
	Namespaces      []string          `hcl:"namespaces,optional"`
	Policy          string            `hcl:"policy,optional"`
	Placement       string            `hcl:"placement,optional"`
	Round           string            `hcl:"round,optional"`
	Profile         string            `hcl:"profile,optional"`
	ProfileOverlay  string            `hcl:"profile_overlay,optional"`
	GPUTypes        map[string]string `hcl:"gpu_types,optional"`
	RackMetaKey     string            `hcl:"rack_meta_key,optional"`
	MinRunTime      string            `hcl:"min_run_time,optional"`
	MaxMinRunTime   string            `hcl:"max_min_run_time,optional"`
	RestartCost     string            `hcl:"restart_cost,optional"`
	MergeCost       string            `hcl:"merge_cost,optional"`
	GangTimeout     string            `hcl:"gang_timeout,optional"`
	StopTimeout     string            `hcl:"stop_timeout,optional"`
	Learn           *bool             `hcl:"learn,optional"`
	LearnWarmup     string            `hcl:"learn_warmup,optional"`
	LearnEvidence   string            `hcl:"learn_evidence,optional"`
	RendezvousPorts string            `hcl:"rendezvous_ports,optional"`
	HTTP            *HTTPConfig       `hcl:"http,block"`
	State           *StateConfig      `hcl:"state,block"`
	Leader          *LeaderConfig     `hcl:"leader,block"`
	DryRun          bool              `hcl:"dry_run,optional"`
	LogLevel        string            `hcl:"log_level,optional"`
	Queues          []queue.Block     `hcl:"queue,block"`
	Storage         *StorageConfig    `hcl:"storage,block"`
}

// LoadConfig reads an HCL config file; an empty path gives the defaults.
func LoadConfig(path string) (Config, error) {
	var c Config
	if path == "" {
		return c, nil
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("sidecar config: %w", err)
	}
	return ParseConfig(path, src)
}

// ParseConfig decodes a config file's contents (path names it in errors).
func ParseConfig(path string, src []byte) (Config, error) {
	var f fileConfig
	if err := hclsimple.Decode(path, src, nil, &f); err != nil {
		return Config{}, fmt.Errorf("sidecar config: %w", err)
	}
	c := Config{Namespaces: f.Namespaces, Policy: f.Policy, Placement: f.Placement, Round: f.Round, Profile: f.Profile,
		ProfileOverlay: f.ProfileOverlay, GPUTypes: f.GPUTypes, RackMetaKey: f.RackMetaKey, MinRunTime: f.MinRunTime, MaxMinRunTime: f.MaxMinRunTime, RestartCost: f.RestartCost,
		MergeCost: f.MergeCost, GangTimeout: f.GangTimeout, StopTimeout: f.StopTimeout, Learn: f.Learn,
		LearnWarmup: f.LearnWarmup, LearnEvidence: f.LearnEvidence,
		RendezvousPorts: f.RendezvousPorts, DryRun: f.DryRun, LogLevel: f.LogLevel, Queues: f.Queues, Storage: f.Storage}
	if f.Nomad != nil {
		c.Nomad = *f.Nomad
	}
	if f.HTTP != nil {
		c.HTTP = *f.HTTP
	}
	if f.State != nil {
		c.State = *f.State
	}
	if f.Leader != nil {
		c.Leader = *f.Leader
	}
	return c, nil
}

// Resolve applies defaults and checks every field, naming the one that is
// wrong and what would fix it.
func (c Config) Resolve() (Settings, error) {
	s := Settings{Config: c}
	if len(s.Namespaces) == 0 {
		s.Namespaces = []string{"*"}
	}
	if s.Policy == "" {
		s.Policy = DefaultPolicy
	}
	if !slices.Contains(registry.Names(), s.Policy) {
		return s, fmt.Errorf("sidecar config: policy %q: want one of %s", s.Policy, strings.Join(registry.Names(), ", "))
	}
	if s.Placement == "" {
		s.Placement = DefaultPlacement
	}
	if !slices.Contains(placement.Names(), s.Placement) {
		return s, fmt.Errorf("sidecar config: placement %q: want one of %s", s.Placement, strings.Join(placement.Names(), ", "))
	}
	if s.RackMetaKey == "" {
		s.RackMetaKey = DefaultRackMetaKey
	}
	durations := []struct {
		field string
		in    string
		def   time.Duration
		min   time.Duration
		out   *time.Duration
	}{
		{"round", s.Round, DefaultRound, time.Second, &s.RoundD},
		{"min_run_time", s.MinRunTime, DefaultMinRunTime, 0, &s.MinRunTimeD},
		{"max_min_run_time", s.MaxMinRunTime, DefaultMaxMinRunTime, time.Second, &s.MaxMinRunTimeD},
		{"restart_cost", s.RestartCost, DefaultRestartCost, 0, &s.RestartCostD},
		{"merge_cost", s.MergeCost, DefaultMergeCost, 0, &s.MergeCostD},
		{"gang_timeout", s.GangTimeout, DefaultGangTimeout, time.Second, &s.GangTimeoutD},
		{"stop_timeout", s.StopTimeout, DefaultStopTimeout, time.Second, &s.StopTimeoutD},
		{"learn_warmup", s.LearnWarmup, DefaultLearnWarmup, time.Second, &s.LearnWarmupD},
		{"learn_evidence", s.LearnEvidence, DefaultLearnEvidence, time.Second, &s.LearnEvidenceD},
	}
	for _, d := range durations {
		*d.out = d.def
		if d.in == "" {
			continue
		}
		v, err := time.ParseDuration(d.in)
		if err != nil || v < d.min || v > 30*24*time.Hour {
			return s, fmt.Errorf("sidecar config: %s = %q: want a duration from %v to 720h, e.g. %q", d.field, d.in, d.min, d.def.String())
		}
		*d.out = v
	}
	switch {
	case s.MaxMinRunTime == "" && s.MaxMinRunTimeD < s.MinRunTimeD:
		s.MaxMinRunTimeD = s.MinRunTimeD
	case s.MaxMinRunTimeD < s.MinRunTimeD:
		return s, fmt.Errorf("sidecar config: max_min_run_time = %q is below min_run_time %v: want a cap on what jobs ask for themselves no lower than the default they get", s.MaxMinRunTime, s.MinRunTimeD)
	}
	s.LearnOn = c.Learn == nil || *c.Learn
	ports := s.RendezvousPorts
	if ports == "" {
		ports = DefaultRendezvousPorts
	}
	lo, hi, ok := strings.Cut(ports, "-")
	l, err1 := strconv.Atoi(strings.TrimSpace(lo))
	h, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if !ok || err1 != nil || err2 != nil || l < 1024 || h > math.MaxUint16 || l > h {
		return s, fmt.Errorf("sidecar config: rendezvous_ports = %q: want LOW-HIGH with 1024 <= LOW <= HIGH <= 65535, e.g. %q", ports, DefaultRendezvousPorts)
	}
	s.PortLow, s.PortHigh = l, h
	for model, t := range s.GPUTypes {
		if strings.TrimSpace(model) == "" || !planner.GPUType(t).ValidName() {
			return s, fmt.Errorf("sidecar config: gpu_types[%q] = %q: want a device model mapped to a GPU type name of lowercase letters, digits, '-' and '_' such as \"v100\" (what hadar.throughput names)", model, t)
		}
	}
	if err := s.resolveStorage(); err != nil {
		return s, err
	}
	if s.HTTP.Address == "" {
		s.HTTP.Address = DefaultHTTPAddress
	}
	if s.Nomad.Token != "" && s.Nomad.TokenFile != "" {
		return s, fmt.Errorf("sidecar config: nomad.token and nomad.token_file both set: keep one (token_file for a workload identity Nomad renews)")
	}
	if s.Nomad.AuthMethod != "" && s.Nomad.TokenFile == "" {
		return s, fmt.Errorf("sidecar config: nomad.auth_method = %q needs nomad.token_file, the workload identity to log in with", s.Nomad.AuthMethod)
	}
	if s.HTTP.ClientCA != "" && s.HTTP.TLSCert == "" {
		return s, fmt.Errorf("sidecar config: http.client_ca = %q needs TLS on the listener: give http.tls_cert and http.tls_key too (client certificates are checked in the TLS handshake)", s.HTTP.ClientCA)
	}
	if t := s.HTTP.AuthToken; t != "" && len(t) < 16 {
		return s, fmt.Errorf("sidecar config: http.auth_token is %d characters: want at least 16 (e.g. the output of `openssl rand -hex 32`)", len(t))
	}
	switch s.State.Store {
	case "":
		s.State.Store = "file"
		if s.DryRun {
			s.State.Store = "none" // a dry run changes nothing, its own state included
		}
		if s.Leader.Enabled {
			// Replicas share one state: each taking over must read the
			// last leader's, which a local file is not.
			s.State.Store = "nomad"
		}
	case "file":
		if s.Leader.Enabled {
			return s, fmt.Errorf("sidecar config: state.store = \"file\" with leader.enabled: each replica would take over from its own stale file; want state { store = \"nomad\" } (Nomad Variables, shared by the replicas) or \"none\"")
		}
	case "nomad", "none":
	default:
		return s, fmt.Errorf("sidecar config: state.store = %q: want \"file\" (a local file), \"nomad\" (Nomad Variables) or \"none\"", s.State.Store)
	}
	if s.State.Path == "" {
		s.State.Path = DefaultStatePath
	}
	if s.State.Prefix == "" {
		s.State.Prefix = DefaultStatePrefix
	}
	if s.Leader.Path == "" {
		s.Leader.Path = DefaultLeaderPath
	}
	for _, d := range []struct {
		field, in string
		min       time.Duration
		out       *time.Duration
	}{{"leader.ttl", s.Leader.TTL, 10 * time.Second, &s.LeaderTTL}, {"leader.lock_delay", s.Leader.LockDelay, time.Second, &s.LeaderDelay}} {
		*d.out = DefaultLeaderTTL
		if d.in == "" {
			continue
		}
		v, err := time.ParseDuration(d.in)
		if err != nil || v < d.min || v > 24*time.Hour {
			return s, fmt.Errorf("sidecar config: %s = %q: want a duration from %v to 24h, e.g. \"15s\"", d.field, d.in, d.min)
		}
		*d.out = v
	}
	if s.LogLevel == "" {
		s.LogLevel = DefaultLogLevel
	}
	switch strings.ToLower(s.LogLevel) {
	case "trace", "debug", "info", "warn", "error":
	default:
		return s, fmt.Errorf("sidecar config: log_level = %q: want trace, debug, info, warn or error", s.LogLevel)
	}
	if err := s.resolveQueues(); err != nil {
		return s, err
	}
	return s, nil
}

// storageName is what a host volume's name or a node meta key may be:
// Nomad's own rules are looser, but these names go into HCL
// interpolations (${meta.KEY}) and volume blocks the sidecar writes.
var storageName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// resolveStorage checks the storage block; empty fields keep jobform's
// defaults.
func (s *Settings) resolveStorage() error {
	if s.Storage == nil {
		return nil
	}
	st := *s.Storage
	for _, f := range []struct{ field, v string }{
		{"checkpoint_volume", st.CheckpointVolume}, {"merge_volume", st.MergeVolume},
		{"checkpoint_meta", st.CheckpointMeta}, {"merge_meta", st.MergeMeta},
	} {
		if f.v != "" && !storageName.MatchString(f.v) {
			return fmt.Errorf("sidecar config: storage.%s = %q: want a name of letters, digits, '.', '_' and '-' (a Nomad host volume's name, or a node meta key), e.g. %q", f.field, f.v, "hadar-checkpoints")
		}
	}
	if st.CheckpointVolume != "" && st.CheckpointVolume == st.MergeVolume {
		return fmt.Errorf("sidecar config: storage.checkpoint_volume and storage.merge_volume are both %q: want two volumes (a job's copies must not read its checkpoints as merge files)", st.CheckpointVolume)
	}
	if d := st.MountDir; d != "" && (!path.IsAbs(d) || path.Clean(d) != d || d == "/") {
		return fmt.Errorf("sidecar config: storage.mount_dir = %q: want a clean absolute path other than /, e.g. %q", d, "/hadar")
	}
	if st.KillTimeout != "" {
		v, err := time.ParseDuration(st.KillTimeout)
		if err != nil || v < time.Second || v > time.Hour {
			return fmt.Errorf("sidecar config: storage.kill_timeout = %q: want a duration from 1s to 1h, e.g. %q (Nomad caps it at the client's max_kill_timeout)", st.KillTimeout, "30s")
		}
		s.StorageKillTimeoutD = v
	}
	return nil
}
