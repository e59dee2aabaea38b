// Package config is the sidecar's configuration: one Config decoded once
// from the HCL (or JSON) file, its defaults filled in one place (Default)
// and checked field by field in another (Validate); docs/sidecar.md lists
// every field.
package config

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/placement"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/planner/registry"
)

// Config is the sidecar's configuration (docs/sidecar.md lists every
// field with its default): one struct, decoded once from the file
// (ParseConfig), the flags set over it, then Resolve fills what was left
// unset (Default) and checks the rest (Validate). Unset is the zero value
// (an empty string, a nil block or *bool), so an explicit 0 such as
// min_run_time = "0s" stays 0. The Nomad connection also follows Nomad's
// own environment variables: NOMAD_ADDR, NOMAD_TOKEN, NOMAD_REGION,
// NOMAD_NAMESPACE, NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY; a
// value in the file wins over the environment.
//
// Its fields are grouped by concern in embedded structs, so that cfg.Policy
// reads as before; the file stays flat (ParseConfig decodes each group from
// the one body, see decodeGroups). The blocks (nomad, http, state, leader,
// storage) are pointers: optional in the file. Default makes Nomad, HTTP,
// State and Leader non-nil; Storage stays nil without a block.
type Config struct {
	Cluster
	Scheduling
	RunLimits
	Learning
	Workers
	Service
	TeamQueues
}

// Cluster is the Nomad cluster the sidecar plans for: how it reaches it,
// which namespaces it watches, and whether it writes to it.
type Cluster struct {
	// Nomad is how the sidecar reaches Nomad.
	Nomad *NomadConfig `hcl:"nomad,block"`
	// Namespaces watched for managed jobs; ["*"] is every namespace.
	Namespaces []string `hcl:"namespaces,optional"`
	// DryRun plans and serves the plan without writing anything to Nomad.
	DryRun bool `hcl:"dry_run,optional"`
}

// Scheduling is how jobs are planned: the policy, the placement, the
// round, and what the planner knows of models and GPUs.
type Scheduling struct {
	// Policy is the scheduler: one of `hadar policies`, with its switches
	// (sia:rigid, hadar:h8) as hadar sim takes them.
	Policy string `hcl:"policy,optional"`
	// Placement is the placement policy (docs/placement.md).
	Placement string `hcl:"placement,optional"`
	// Round is the round length.
	Round Duration `hcl:"round,optional"`
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
}

// RunLimits are the times the planner holds jobs to and charges them:
// minimum run times, the costs of restarts and merges, and the timeouts
// of starting and stopping.
type RunLimits struct {
	// MinRunTime is the least time a job runs before it may be preempted
	// (a job's hadar.min_run_time overrides it); "0s" is none.
	MinRunTime Duration `hcl:"min_run_time,optional"`
	// MaxMinRunTime caps the minimum run time a job asks for itself
	// (hadar.min_run_time): the author sets it, the operator bounds it,
	// or one job could opt out of time-slicing and every preemption but
	// reclaim. A queue's max_min_run_time may cap its jobs lower.
	MaxMinRunTime Duration `hcl:"max_min_run_time,optional"`
	// RestartCost is what a (re)start costs a job: checkpoint restore and
	// warm-up. The schedulers weigh moves with it.
	RestartCost Duration `hcl:"restart_cost,optional"`
	// MergeCost is what each HadarE copy spends merging per round.
	MergeCost Duration `hcl:"merge_cost,optional"`
	// GangTimeout bounds how long a started unit may have workers placed
	// while others are not: then all of it is rolled back.
	GangTimeout Duration `hcl:"gang_timeout,optional"`
	// StopTimeout bounds the wait for evicted workers to checkpoint and end
	// before their GPUs go to the next job.
	StopTimeout Duration `hcl:"stop_timeout,optional"`
}

// Learning is online learning of throughputs from progress.
type Learning struct {
	// Learn turns on online learning of throughputs from progress (a
	// pointer: false is not unset).
	Learn *bool `hcl:"learn,optional"`
	// LearnWarmup is the time after a (re)start whose progress is not
	// learned from (checkpoint restore and warm-up).
	LearnWarmup Duration `hcl:"learn_warmup,optional"`
	// LearnEvidence is the observed running a (model, width, GPU type)
	// needs before what was measured corrects a profile figure; a key no
	// profile has takes its measured rate after the lesser of this and 60s.
	LearnEvidence Duration `hcl:"learn_evidence,optional"`
}

// Workers is what the sidecar gives the jobs' workers: rendezvous
// ports and shared storage.
type Workers struct {
	// RendezvousPorts is the range MASTER_PORT is taken from, "LOW-HIGH".
	RendezvousPorts PortRange `hcl:"rendezvous_ports,optional"`
	// Storage is where workers on Nomad's own task drivers (exec, docker,
	// raw_exec) find checkpoint and merge storage, and how long they get
	// to checkpoint (docs/pytorch.md, "Which task driver"); nil: no
	// shared storage (checkpoints in the allocation, lost on a move).
	Storage *StorageConfig `hcl:"storage,block"`
}

// Service is the sidecar as a service: its status API, its state, its
// replicas and its log.
type Service struct {
	// HTTP is the status API's listener.
	HTTP *HTTPConfig `hcl:"http,block"`
	// State is where the sidecar keeps what must outlive a restart.
	State *StateConfig `hcl:"state,block"`
	// Leader runs several replicas with one acting.
	Leader *LeaderConfig `hcl:"leader,block"`
	// LogLevel is hclog's: trace, debug, info, warn, error.
	LogLevel string `hcl:"log_level,optional"`
}

// TeamQueues are the teams sharing the fleet (docs/queues.md).
type TeamQueues struct {
	// Queues are the teams sharing the fleet (docs/queues.md): none, no
	// queues (one policy over every job).
	Queues []queue.Block `hcl:"queue,block"`
	// QueueConfig is Queues as planner/queue reads them, set by Validate:
	// converting the blocks is planner/queue's check of them. Not in the
	// file (no hcl tag).
	QueueConfig queue.Config
}

// Duration is a duration as the file spells it ("90s", "6m"): a string,
// so that unset ("") differs from "0s". Validate parses every one, so
// Duration is only read after it.
type Duration string

// Duration is d parsed; 0 when d does not parse (Validate refuses that).
func (d Duration) Duration() time.Duration {
	v, _ := time.ParseDuration(string(d))
	return v
}

// durationOf spells a default the way the file would.
func durationOf(d time.Duration) Duration { return Duration(d.String()) }

// PortRange is a port range as the file spells it, "LOW-HIGH".
type PortRange string

// Bounds is the range parsed; ok is false when it does not parse or is
// out of 1024..65535 (Validate refuses that).
func (p PortRange) Bounds() (lo, hi int, ok bool) {
	l, h, found := strings.Cut(string(p), "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(l))
	hi, err2 := strconv.Atoi(strings.TrimSpace(h))
	if !found || err1 != nil || err2 != nil || lo < 1024 || hi > math.MaxUint16 || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
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
	KillTimeout Duration `hcl:"kill_timeout,optional"`
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
	TTL       Duration `hcl:"ttl,optional"`
	LockDelay Duration `hcl:"lock_delay,optional"`
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

// Defaults: what Default fills in for an option left unset.
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

// LoadConfig reads and decodes an HCL (or, named *.json, JSON) config
// file; an empty path is an empty file. Nothing is defaulted yet: flags go
// over it, then Resolve.
func LoadConfig(path string) (Config, error) {
	if path == "" {
		return Config{}, nil
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("sidecar config: %w", err)
	}
	return ParseConfig(path, src)
}

// ParseConfig decodes a config file's contents (path names it in errors,
// and its extension picks HCL or JSON).
func ParseConfig(path string, src []byte) (Config, error) {
	var c Config
	if err := decodeFile(path, src, &c.Cluster, &c.Scheduling, &c.RunLimits, &c.Learning, &c.Workers, &c.Service, &c.TeamQueues); err != nil {
		return Config{}, fmt.Errorf("sidecar config: %w", err)
	}
	return c, nil
}

// Resolve is the configuration the sidecar runs with: c with its defaults
// (Default), checked (Validate).
func (c Config) Resolve() (Config, error) {
	// The blocks are pointers: defaulting them in place would change the
	// caller's Config too.
	c.Nomad, c.HTTP, c.State, c.Leader, c.Storage = clone(c.Nomad), clone(c.HTTP), clone(c.State), clone(c.Leader), clone(c.Storage)
	c.Default()
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// clone is a copy of *p, or nil.
func clone[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// Default fills every field left unset with its default; what is set,
// 0 included, is kept. The one place defaults live (docs/sidecar.md
// lists them).
func (c *Config) Default() {
	if len(c.Namespaces) == 0 {
		c.Namespaces = []string{"*"}
	}
	c.Policy = cmp.Or(c.Policy, DefaultPolicy)
	c.Placement = cmp.Or(c.Placement, DefaultPlacement)
	c.RackMetaKey = cmp.Or(c.RackMetaKey, DefaultRackMetaKey)
	c.Round = cmp.Or(c.Round, durationOf(DefaultRound))
	c.MinRunTime = cmp.Or(c.MinRunTime, durationOf(DefaultMinRunTime))
	// Unset, the cap is never below the default a job gets.
	c.MaxMinRunTime = cmp.Or(c.MaxMinRunTime, durationOf(max(DefaultMaxMinRunTime, c.MinRunTime.Duration())))
	c.RestartCost = cmp.Or(c.RestartCost, durationOf(DefaultRestartCost))
	c.MergeCost = cmp.Or(c.MergeCost, durationOf(DefaultMergeCost))
	c.GangTimeout = cmp.Or(c.GangTimeout, durationOf(DefaultGangTimeout))
	c.StopTimeout = cmp.Or(c.StopTimeout, durationOf(DefaultStopTimeout))
	if c.Learn == nil {
		on := true
		c.Learn = &on
	}
	c.LearnWarmup = cmp.Or(c.LearnWarmup, durationOf(DefaultLearnWarmup))
	c.LearnEvidence = cmp.Or(c.LearnEvidence, durationOf(DefaultLearnEvidence))
	c.RendezvousPorts = cmp.Or(c.RendezvousPorts, DefaultRendezvousPorts)
	c.LogLevel = cmp.Or(c.LogLevel, DefaultLogLevel)
	c.Nomad = cmp.Or(c.Nomad, &NomadConfig{})
	c.HTTP = cmp.Or(c.HTTP, &HTTPConfig{})
	c.HTTP.Address = cmp.Or(c.HTTP.Address, DefaultHTTPAddress)
	c.State = cmp.Or(c.State, &StateConfig{})
	c.Leader = cmp.Or(c.Leader, &LeaderConfig{})
	if c.State.Store == "" {
		switch {
		case c.Leader.Enabled:
			// Replicas share one state: each taking over must read the
			// last leader's, which a local file is not.
			c.State.Store = "nomad"
		case c.DryRun:
			c.State.Store = "none" // a dry run changes nothing, its own state included
		default:
			c.State.Store = "file"
		}
	}
	c.State.Path = cmp.Or(c.State.Path, DefaultStatePath)
	c.State.Prefix = cmp.Or(c.State.Prefix, DefaultStatePrefix)
	c.Leader.Path = cmp.Or(c.Leader.Path, DefaultLeaderPath)
	c.Leader.TTL = cmp.Or(c.Leader.TTL, durationOf(DefaultLeaderTTL))
	c.Leader.LockDelay = cmp.Or(c.Leader.LockDelay, durationOf(DefaultLeaderTTL))
	// Storage: nil is no shared storage, and an empty field keeps
	// sidecar/jobform's default, so neither is filled here.
}

// Validate checks every field of a defaulted Config (Default), naming the
// one that is wrong and what would fix it, and sets QueueConfig from the
// queue blocks.
func (c *Config) Validate() error {
	// A Config straight from decoding has nil blocks: an error, not a
	// panic, for a caller that skipped Default.
	if c.Nomad == nil || c.HTTP == nil || c.State == nil || c.Leader == nil {
		return fmt.Errorf("sidecar config: not defaulted (a nomad, http, state or leader block is nil): call Default before Validate, or use Resolve")
	}
	if err := registry.Check(c.Policy); err != nil {
		return fmt.Errorf("sidecar config: policy %q: %w", c.Policy, err)
	}
	if !slices.Contains(placement.Names(), c.Placement) {
		return fmt.Errorf("sidecar config: placement %q: want one of %s", c.Placement, strings.Join(placement.Names(), ", "))
	}
	const month = 30 * 24 * time.Hour
	for _, d := range []struct {
		field    string
		v        Duration
		min, max time.Duration
		eg       string
	}{
		{"round", c.Round, time.Second, month, DefaultRound.String()},
		{"min_run_time", c.MinRunTime, 0, month, DefaultMinRunTime.String()},
		{"max_min_run_time", c.MaxMinRunTime, time.Second, month, DefaultMaxMinRunTime.String()},
		{"restart_cost", c.RestartCost, 0, month, DefaultRestartCost.String()},
		{"merge_cost", c.MergeCost, 0, month, DefaultMergeCost.String()},
		{"gang_timeout", c.GangTimeout, time.Second, month, DefaultGangTimeout.String()},
		{"stop_timeout", c.StopTimeout, time.Second, month, DefaultStopTimeout.String()},
		{"learn_warmup", c.LearnWarmup, time.Second, month, DefaultLearnWarmup.String()},
		{"learn_evidence", c.LearnEvidence, time.Second, month, DefaultLearnEvidence.String()},
		{"leader.ttl", c.Leader.TTL, 10 * time.Second, 24 * time.Hour, "15s"},
		{"leader.lock_delay", c.Leader.LockDelay, time.Second, 24 * time.Hour, "15s"},
	} {
		v, err := time.ParseDuration(string(d.v))
		if err != nil || v < d.min || v > d.max {
			return fmt.Errorf("sidecar config: %s = %q: want a duration from %v to %s, e.g. %q", d.field, d.v, d.min, fmtHours(d.max), d.eg)
		}
	}
	if c.MaxMinRunTime.Duration() < c.MinRunTime.Duration() {
		// Only an explicit cap can be below: Default's is not.
		return fmt.Errorf("sidecar config: max_min_run_time = %q is below min_run_time %v: want a cap on what jobs ask for themselves no lower than the default they get", c.MaxMinRunTime, c.MinRunTime.Duration())
	}
	if _, _, ok := c.RendezvousPorts.Bounds(); !ok {
		return fmt.Errorf("sidecar config: rendezvous_ports = %q: want LOW-HIGH with 1024 <= LOW <= HIGH <= 65535, e.g. %q", c.RendezvousPorts, DefaultRendezvousPorts)
	}
	for model, t := range c.GPUTypes {
		if strings.TrimSpace(model) == "" || !planner.GPUType(t).ValidName() {
			return fmt.Errorf("sidecar config: gpu_types[%q] = %q: want a device model mapped to a GPU type name of lowercase letters, digits, '-' and '_' such as \"v100\" (what hadar.throughput names)", model, t)
		}
	}
	if err := c.validateStorage(); err != nil {
		return err
	}
	if c.Nomad.Token != "" && c.Nomad.TokenFile != "" {
		return fmt.Errorf("sidecar config: nomad.token and nomad.token_file both set: keep one (token_file for a workload identity Nomad renews)")
	}
	if c.Nomad.AuthMethod != "" && c.Nomad.TokenFile == "" {
		return fmt.Errorf("sidecar config: nomad.auth_method = %q needs nomad.token_file, the workload identity to log in with", c.Nomad.AuthMethod)
	}
	if c.HTTP.ClientCA != "" && c.HTTP.TLSCert == "" {
		return fmt.Errorf("sidecar config: http.client_ca = %q needs TLS on the listener: give http.tls_cert and http.tls_key too (client certificates are checked in the TLS handshake)", c.HTTP.ClientCA)
	}
	if t := c.HTTP.AuthToken; t != "" && len(t) < 16 {
		return fmt.Errorf("sidecar config: http.auth_token is %d characters: want at least 16 (e.g. the output of `openssl rand -hex 32`)", len(t))
	}
	switch c.State.Store {
	case "file":
		if c.Leader.Enabled {
			return fmt.Errorf("sidecar config: state.store = \"file\" with leader.enabled: each replica would take over from its own stale file; want state { store = \"nomad\" } (Nomad Variables, shared by the replicas) or \"none\"")
		}
	case "nomad", "none":
	default:
		return fmt.Errorf("sidecar config: state.store = %q: want \"file\" (a local file), \"nomad\" (Nomad Variables) or \"none\"", c.State.Store)
	}
	switch strings.ToLower(c.LogLevel) {
	case "trace", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("sidecar config: log_level = %q: want trace, debug, info, warn or error", c.LogLevel)
	}
	return c.validateQueues()
}

// fmtHours spells a bound as the messages always have: "720h", "24h".
func fmtHours(d time.Duration) string { return strconv.Itoa(int(d.Hours())) + "h" }

// storageName is what a host volume's name or a node meta key may be:
// Nomad's own rules are looser, but these names go into HCL
// interpolations (${meta.KEY}) and volume blocks the sidecar writes.
var storageName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// validateStorage checks the storage block; empty fields keep jobform's
// defaults.
func (c *Config) validateStorage() error {
	if c.Storage == nil {
		return nil
	}
	st := *c.Storage
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
		v, err := time.ParseDuration(string(st.KillTimeout))
		if err != nil || v < time.Second || v > time.Hour {
			return fmt.Errorf("sidecar config: storage.kill_timeout = %q: want a duration from 1s to 1h, e.g. %q (Nomad caps it at the client's max_kill_timeout)", st.KillTimeout, "30s")
		}
	}
	return nil
}
